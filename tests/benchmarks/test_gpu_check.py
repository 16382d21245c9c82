"""The GPU device check (benchmarks/gpu_check.sh + gpu_summary.py), every part that needs no GPU.

A fake ``nvidia-smi`` on PATH stands in for the GPU's name and compute capability; the run stage
then runs the real ``chatphase ask --json`` / ``bench --format json`` on this CPU-only build with tiny
settings (GPU_CHECK_QUICK=1), so the summariser reads real output and must report that -ngl -1
offloaded nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_summary

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "benchmarks" / "gpu_check.sh"
PREPARE = ROOT / "benchmarks" / "gpu_prepare.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def fake_gpu_env(tmp: Path, cap: str = "8.6") -> dict[str, str]:
    """Environment with a fake nvidia-smi (an 'NVIDIA Fake' GPU of compute capability ``cap``) first on
    PATH and chatphase's files kept under ``tmp``."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "NVIDIA Fake, {cap}, 580.159.04, 143771 MiB"\n')
    smi.chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        PYTHON=sys.executable,
        GPU_CHECK_WORK=str(tmp / "work"),
        CHATPHASE_DATA_DIR=str(tmp / "data"),
        CHATPHASE_LOG_DIR=str(tmp / "log"),
        CHATPHASE_CONFIG=str(tmp / "config.toml"),
    )
    env.pop("OUT", None)
    return env


def check(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CHECK), *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
    )


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
@pytest.mark.parametrize("script", [CHECK, PREPARE])
def test_scripts_are_shellcheck_clean(script):
    result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    carry_a, carry_b = tmp_path / "a", tmp_path / "b"
    carry_a.mkdir()
    carry_b.mkdir()
    (carry_a / "llama_cpp_python-0.3.36.tar.gz").write_bytes(b"")
    (carry_a / "textual-8.2.8-py3-none-any.whl").write_bytes(b"")
    (carry_a / "model.gguf.part-1").write_bytes(b"GGUF")
    (carry_a / "model.gguf.sha256").write_text("0  model.gguf\n")
    (carry_b / "model.gguf.part-2").write_bytes(b"rest")
    out = tmp_path / "out"
    result = check(
        "--dry-run",
        "--carry",
        str(carry_a),
        "--carry",
        str(carry_b),
        "--out",
        str(out),
        env=fake_gpu_env(tmp_path, cap="8.6"),
    )
    assert result.returncode == 0, result.stderr
    plan = result.stdout
    assert "NVIDIA Fake · compute capability 8.6" in plan
    assert "CMAKE_ARGS='-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=86'" in plan  # that GPU's arch only
    assert f"--no-index --no-deps --no-build-isolation --no-cache-dir --target {tmp_path}/work/site" in plan
    assert "textual-8.2.8-py3-none-any.whl" in plan
    assert f"cat {tmp_path}/work/model/model.gguf.part-1 {tmp_path}/work/model/model.gguf.part-2 >" in plan
    for ngl, mode in (("-1", "gpu"), ("0", "cpu")):
        assert f"-m chatphase ask --json --model {tmp_path}/work/model/model.gguf -ngl {ngl} " in plan
        assert f"bench --format json --output {out}/bench_{mode}.json" in plan
    assert "gpu_summary.py" in plan
    assert not out.exists() and not (tmp_path / "work").exists()  # nothing ran


def test_extra_cmake_args_are_appended(tmp_path):
    env = fake_gpu_env(tmp_path, cap="9.0")
    env["GPU_CHECK_CMAKE_EXTRA"] = "-DGGML_CUDA_FA=OFF"
    result = check("--dry-run", "--stage", "build", env=env)
    assert result.returncode == 0, result.stderr
    assert "CMAKE_ARGS='-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF'" in result.stdout
    assert "chatphase ask" not in result.stdout  # build stage only


def test_bad_stage_is_one_line_error(tmp_path):
    result = check("--stage", "deploy", env=fake_gpu_env(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == "gpu_check: --stage must be all, build or run (got deploy)"


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_without_nvidia_smi_the_check_refuses(tmp_path):
    env = fake_gpu_env(tmp_path)
    env["PATH"] = env["PATH"].split(":", 1)[1]
    result = check("--stage", "build", "--out", str(tmp_path / "out"), env=env)
    assert result.returncode == 1
    assert "nvidia-smi not found" in result.stderr


def test_incomplete_model_parts_are_caught(tmp_path):
    """Only the first part stashed (the second call's .whl/b missing): the sha256 check says so."""
    carry = tmp_path / "a"
    carry.mkdir()
    (carry / "model.gguf.part-1").write_bytes(b"GGUF first half")
    digest = hashlib.sha256(b"GGUF first half" + b" second half").hexdigest()
    (carry / "model.gguf.sha256").write_text(f"{digest}  model.gguf\n")
    result = check("--stage", "run", "--carry", str(carry), "--out", str(tmp_path / "out"), env=fake_gpu_env(tmp_path))
    assert result.returncode == 1
    assert "the carried model is incomplete (sha256 differs)" in result.stderr


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory, request):
    """The run stage on this CPU-only build with the bundled model and tiny settings: (result, out dir)."""
    from chatphase.models.resolve import default_model_path

    tmp = tmp_path_factory.mktemp("gpucheck")
    env = fake_gpu_env(tmp, cap="9.0")
    env["GPU_CHECK_QUICK"] = "1"
    out = tmp / "out"
    result = check("--stage", "run", "--model", str(default_model_path()), "--out", str(out), env=env, timeout=300)
    return result, out


@pytest.mark.model
def test_run_stage_on_a_cpu_build_reports_no_offload(cpu_run):
    result, out = cpu_run
    assert result.returncode == 1, result.stderr
    assert "gpu_check: the check does not show GPU offload" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "ask_cpu.json",
        "ask_gpu.json",
        "bench_cpu.json",
        "bench_gpu.json",
        "gpu_env.json",
        "gpu_summary.json",
    ]
    summary = json.loads((out / "gpu_summary.json").read_text())
    assert summary["gpu_name"] == "NVIDIA Fake" and summary["compute_cap"] == "9.0"
    env = json.loads((out / "gpu_env.json").read_text())
    assert (env["cuda_architectures"], env["stage"], env["build_s"]) == ("90", "run", None)
    assert not summary["offload_ok"]
    gpu, cpu = summary["runs"]["gpu"], summary["runs"]["cpu"]
    assert (gpu["n_gpu_layers"], cpu["n_gpu_layers"]) == (0, 0)  # -1 resolves to 0 on a CPU-only build
    assert gpu["layers_offloaded"] == 0 and gpu["layers_total"] == 31  # 30 blocks + output layer
    assert gpu["gpu_offload_supported"] is False
    assert any("no GPU support" in note for note in gpu["notes"])  # the CPU-only notice
    assert [r["prompt_tokens"] for r in gpu["prompt_sweep"]] == [16, 48]
    assert [r["depth"] for r in cpu["depth_sweep"]] == [0]
    ratio = summary["speedup_gpu_over_cpu"]["prefill_tokens_per_s"]["16"]
    assert ratio == pytest.approx(
        gpu["prompt_sweep"][0]["prefill_tokens_per_s"] / cpu["prompt_sweep"][0]["prefill_tokens_per_s"]
    )
    assert "| prefill, 16-token prompt (tok/s) |" in result.stdout


@pytest.mark.model
def test_summary_of_an_offloaded_run_passes(cpu_run, tmp_path):
    """The same real output, with ask_gpu.json edited as a GPU build reports it: exit 0, memory shown."""
    _, out = cpu_run
    for f in out.glob("*.json"):
        shutil.copy(f, tmp_path / f.name)
    ask = json.loads((tmp_path / "ask_gpu.json").read_text())
    ask["settings"]["gpu_offload_supported"] = True
    ask["model"]["layers_offloaded"] = ask["model"]["layers_total"]
    ask["model"]["gpu_memory_bytes"] = 300 * 2**20
    (tmp_path / "ask_gpu.json").write_text(json.dumps(ask))
    assert gpu_summary.main([str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "gpu_summary.json").read_text())
    assert summary["offload_ok"] and summary["problems"] == []
    assert "offloaded 31/31 layers, GPU memory 300 MiB" in gpu_summary.markdown(summary)


def test_summariser_missing_or_bad_files_exit_2(tmp_path, capsys):
    assert gpu_summary.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"gpu_summary: {tmp_path}/ask_gpu.json is missing"
    for name in ("ask_gpu.json", "ask_cpu.json", "bench_gpu.json", "bench_cpu.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "ask_gpu.json").write_text("{not json")
    assert gpu_summary.main([str(tmp_path)]) == 2
    assert "ask_gpu.json is not valid JSON" in capsys.readouterr().err
    (tmp_path / "ask_gpu.json").write_text("{}")
    assert gpu_summary.main([str(tmp_path)]) == 2
    assert "ask JSON lacks model, settings or a turn's metrics" in capsys.readouterr().err
    assert gpu_summary.main([]) == 2
