"""``chatphase info`` and ``chatphase models`` on the bundled default model, and the memory estimate.

Figures are checked against llama.cpp's own: 23,040 KV bytes per token for SmolLM2-135M, and the KV cache
size llama.cpp prints at context creation (``llama_kv_cache: size = 11.25 MiB`` at n_ctx 512)."""

from __future__ import annotations

import json

import pytest

from chatphase import cli
from chatphase.models.memory import assess, estimate
from chatphase.models.resolve import list_models
from chatphase.units import fmt_count, fmt_params, parse_counts

MIB = 1024 * 1024


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_info_json_reports_model_kv_memory_and_build(capsys, default_model_info):
    code, out, err = run(capsys, "info", "--n-ctx", "512", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["model"]["architecture"] == "llama" and r["model"]["quantization"] == "Q4_1"
    assert r["kv"]["kv_bytes_per_token"] == 23_040
    assert r["kv"]["kv_capacity_bytes"] == 11.25 * MIB  # llama.cpp: "llama_kv_cache: size = 11.25 MiB"
    mem = r["memory"]
    assert mem["total_bytes"] == mem["weights_bytes"] + mem["kv_cache_bytes"] + mem["compute_bytes"]
    assert mem["weights_bytes"] == default_model_info.size_bytes and mem["verdict"] in ("ok", "warn")
    s = r["system"]
    assert isinstance(s["amx_detected"], bool) and isinstance(s["gpu_offload_supported"], bool)
    assert "AVX" in s["system_info"] or s["system_info"]


def test_info_text_and_quantised_kv(capsys):
    code, out, _ = run(capsys, "info", "--n-ctx", "1000", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0")
    assert code == 0
    # q8_0 = 34/32 bytes per element: 23,040 × 17/32 = 12,240 bytes per token; 1000 -> 1024 cells
    assert "12.0 KiB per token (q8_0/q8_0)" in out and "1024 KV cells" in out
    assert "AMX" in out and "GPU offload" in out


def test_info_says_when_the_config_file_does_not_exist_yet(capsys, tmp_path, monkeypatch):
    config = tmp_path / "x" / "config.toml"
    monkeypatch.setenv("CHATPHASE_CONFIG", str(config))
    _, out, _ = run(capsys, "info", "--n-ctx", "512")
    assert f"config file    {config} (none yet: defaults apply; sessions: " in out
    config.parent.mkdir()
    config.write_text("")
    _, out, _ = run(capsys, "info", "--n-ctx", "512")
    assert f"config file    {config} (sessions: " in out


def test_info_says_which_devices_report_no_usage(capsys, monkeypatch):
    """ggml's CPU device, and Vulkan devices without a memory budget (llvmpipe), report free = total: that
    is no reading of what is free, and the line says so instead of "2.0 GiB free of 2.0 GiB"."""
    from chatphase.engine.events import DeviceInfo
    from chatphase.engine.local import ggml_devices

    devices = (
        DeviceInfo("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "gpu", 2 * 2**30, 2 * 2**30),
        DeviceInfo("Vulkan1", "NVIDIA H200", "gpu", 139 * 2**30, 140 * 2**30),
        DeviceInfo("CPU", "AMD EPYC", "cpu", 0, 0),
    )
    monkeypatch.setattr(ggml_devices, "devices", lambda: devices)
    code, out, err = run(capsys, "info", "--n-ctx", "512")
    assert code == 0, err
    assert (
        "device         Vulkan0 · llvmpipe (LLVM 15.0.6, 256 bits) · gpu · 2.0 GiB · reports no usage (free = total)\n"
        in out
    )
    assert "device         Vulkan1 · NVIDIA H200 · gpu · 139.0 GiB free of 140.0 GiB\n" in out
    assert "device         CPU · AMD EPYC · cpu · memory not reported\n" in out


def test_info_refuses_a_context_that_cannot_be_allocated(capsys):
    code, _out, err = run(capsys, "info", "--n-ctx", "200000000")
    assert code == 2
    assert err.startswith("chatphase: model will not fit: KV cache + compute alone need") and err.count("\n") == 1
    assert "lower --n-ctx" in err


def test_info_unknown_model_name(capsys, tmp_path):
    code, _, err = run(capsys, "info", "--model", "no-such-model", "--models-dir", str(tmp_path))
    assert code == 2 and "model not found: no-such-model" in err


def test_models_lists_the_default_marked(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("*"))
    assert "llama" in line and "135M" in line and "Q4_1" in line and "22.5 KiB" in line and "8192" in line
    code, out, _ = run(capsys, "models", "--json")
    listed = json.loads(out)
    default = [m for m in listed if m["default"]]
    assert len(default) == 1 and default[0]["info"]["kv_bytes_per_token"] == 23_040


def test_models_dir_files_listed_and_broken_ones_explained(capsys, tmp_path, default_model_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.gguf").symlink_to(default_model_path)  # same file as the default: listed once
    (tmp_path / "page.gguf").write_text("<html>not a model</html>")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "x.gguf").write_text("hidden partial")
    (tmp_path / "self.gguf").symlink_to("self.gguf")  # a loop: listed as unusable too, not skipped silently
    entries = list_models(tmp_path)
    assert [e.source for e in entries] == ["default", "models-dir", "models-dir"]
    assert entries[1].info is None and "not a GGUF file" in entries[1].error
    assert entries[2].info is None and entries[2].spec == "self.gguf" and "symlink loop" in entries[2].error
    code, out, _ = run(capsys, "models", "--models-dir", str(tmp_path))
    assert code == 0 and "unusable: not a GGUF file" in out and "unusable: model file is a symlink loop" in out


def test_memory_estimate_terms(default_model_info):
    est = estimate(default_model_info, n_ctx=4096, n_ubatch=256)
    assert est.kv_cache_bytes == 90 * MIB  # llama.cpp: 90.00 MiB at 4096 cells
    # compute: within 10 % above llama.cpp's "CPU compute buffer size = 49.69 MiB" (n_ubatch 256)
    assert 49.69 * MIB <= est.compute_bytes <= 1.1 * 49.69 * MIB
    assert estimate(default_model_info, 4096, n_ubatch=64).compute_bytes < est.compute_bytes


@pytest.mark.parametrize(
    "available_mib, swap_mib, level",
    [(10_000, 0, "ok"), (200, 0, "warn"), (100, 0, "refuse"), (100, 100, "warn")],
)
def test_memory_verdicts(default_model_info, available_mib, swap_mib, level):
    est = estimate(default_model_info, n_ctx=4096)  # ~236 MiB in all, KV + compute ~143 MiB
    verdict = assess(est, available_bytes=available_mib * MIB, swap_free_bytes=swap_mib * MIB)
    assert verdict.level == level
    assert "MiB" in verdict.message


def test_fmt_params():
    assert [fmt_params(n) for n in (134_515_008, 1_235_814_400, 7_241_732_096, 999)] == ["135M", "1.2B", "7.2B", "999"]


def test_preflight_refuses_only_the_impossible(default_model_info):
    from chatphase.errors import ModelError
    from chatphase.models.memory import preflight

    assert preflight(default_model_info, 512).level in ("ok", "warn")
    with pytest.raises(ModelError, match="model will not fit"):
        preflight(default_model_info, 200_000_000)


def test_counts_are_written_and_read_one_way_everywhere():
    assert [fmt_count(n, "turn") for n in (0, 1, 2, 1200)] == ["0 turns", "1 turn", "2 turns", "1,200 turns"]
    assert parse_counts(" 64, 256 1024") == (64, 256, 1024)
    assert parse_counts("") == parse_counts(" none ") == ()
    with pytest.raises(ValueError, match=r"whole numbers like 64,256,1024 \(got '1,x'\)"):
        parse_counts("1,x")


def test_the_pre_start_memory_check_uses_the_physical_batch_llama_cpp_runs(default_model_info):
    """llama.cpp runs at most ``n_batch`` tokens per micro-batch, whatever ``n_ubatch`` says: the engine,
    ``info``'s estimate and the check before a chat or ``ask`` starts all count the clamped one (one clamp,
    ``EngineConfig.n_ubatch_used``), so a huge ``--n-ubatch`` under a small ``--n-batch`` is no refusal."""
    from chatphase.commands.server_options import model_info_for
    from chatphase.settings.schema import Settings

    settings = Settings().with_overrides(n_ctx=512, n_batch=64, n_ubatch=100_000_000)
    assert settings.engine.n_ubatch_used == settings.engine.resolved()["n_ubatch"] == 64
    assert model_info_for(settings).path == default_model_info.path  # no "model will not fit"


def test_info_plan_is_llama_cpps_projection_per_device(capsys, default_model_info):
    """``--plan`` asks a child process for llama.cpp's own projection: on this CPU-only build, the host alone,
    every layer and the output layer there, the KV cache llama.cpp prints at n_ctx 512 (11.25 MiB), and auto's 0."""
    code, out, err = run(capsys, "info", "--n-ctx", "512", "--plan", "--json")
    assert code == 0, err
    fit = json.loads(out)["plan"]
    if json.loads(out)["system"]["gpu_offload_supported"]:
        pytest.skip("a GPU build: the plan has its devices (tests/engine/test_gpu_vulkan.py)")
    assert fit["n_gpu_layers"] == 0 and fit["why"] == "auto: 0 layers, CPU-only build: no GPU support in this llama.cpp"
    plan = fit["plan"]
    [host] = plan["devices"]
    assert host["name"] == "host" and host["layers"] == "0-29" and host["output_layer"]
    assert host["kv_cache_bytes"] == 11.25 * MIB == sum(c["bytes"] for c in plan["kv_caches"])
    assert host["planned_bytes"] == sum(
        host[k] for k in ("weights_bytes", "kv_cache_bytes", "compute_bytes", "output_bytes")
    )
    assert host["left_bytes"] == host["budget_bytes"] - host["planned_bytes"]
    assert plan["n_ctx"] == 512 and plan["n_layer"] == 30 and fit["refusal"] is None
    code, out, err = run(capsys, "info", "--n-ctx", "512", "--plan")
    assert code == 0, err
    assert "n_gpu_layers   auto: 0 layers, CPU-only build: no GPU support in this llama.cpp\n" in out
    assert "memory plan    n_gpu_layers 0 (0/30 layers) · n_ctx 512 · projected in " in out
    assert "host           weights 92.1 MiB (layers 0-29 + output), 92.1 MiB mapped from the file · KV 11.2 MiB" in out
    assert "KV caches      full 11.2 MiB (512 cells × 30 layers, K f16 / V f16)\n" in out


def test_info_plan_refusal_is_one_line_and_exit_2(capsys, monkeypatch):
    """A count a GPU device cannot hold is refused as a load would refuse it: the report, then the plan's line."""
    from chatphase.engine import memory_plan
    from chatphase.engine.memory_plan import DevicePlan, FitResult, MemoryPlan

    gpu = DevicePlan("Vulkan0", "llvmpipe", "gpu", 3 * 2**30, 2**29, 2**28, layers=tuple(range(30)),
                     output_layer=True, free_bytes=2**31, total_bytes=2**31, budget_bytes=2**31,
                     budget_note="free as the device reports it")  # fmt: skip
    plan = MemoryPlan("m.gguf", 30, 31, 512, (gpu,))
    fit = FitResult(31, None, plan, refusal=plan.overflow_line())
    monkeypatch.setattr(memory_plan, "plan_in_child", lambda path, engine: fit)
    code, out, err = run(capsys, "info", "--n-ctx", "512", "--plan", "-ngl", "-1")
    assert code == 2 and err.count("\n") == 1
    assert err == f"chatphase: {plan.overflow_line()}\n"
    assert err.startswith("chatphase: n_gpu_layers 31 (30/30 layers + output) would not fit Vulkan0: it needs 3.8 GiB")
    assert f"refused        {plan.overflow_line()}\n" in out


def test_info_plan_child_that_dies_is_one_line_after_the_report(capsys, monkeypatch):
    """The projection's child crashing (a native fault in llama.cpp) leaves the rest of the report and exit 2."""
    import subprocess

    from chatphase.engine import memory_plan

    real_run = subprocess.run

    def crashed(cmd, *args, **kwargs):  # only the projection's child dies (the AMX probe, say, runs as it does)
        if "chatphase.engine.local.projection" in cmd:
            return subprocess.CompletedProcess(cmd, -11, stdout="", stderr="")
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(memory_plan.subprocess, "run", crashed)
    code, out, err = run(capsys, "info", "--n-ctx", "512", "--plan")
    assert code == 2 and err == "chatphase: llama.cpp's memory plan failed (signal 11); see the engine log\n"
    assert "memory plan    failed: llama.cpp's memory plan failed (signal 11); see the engine log\n" in out
    assert "KV cache       22.5 KiB per token" in out
