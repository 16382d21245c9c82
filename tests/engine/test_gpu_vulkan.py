"""The GPU tier: chatphase on llama.cpp's Vulkan backend, on whatever Vulkan device the machine has — on a
CPU machine Mesa's software device llvmpipe, a real ggml GPU backend (device buffers, the layer split,
host↔device copies, per-device memory) whose speed says nothing about a GPU.

Runs against the libraries ``scripts/llama_build.sh`` built (``LLAMA_CPP_LIB_PATH``), in child processes
with ``GGML_VK_VISIBLE_DEVICES=0`` (ggml skips CPU-type Vulkan devices otherwise). Deselected by default
(``-m "not gpu_vulkan"`` in pyproject.toml); run with ``python3 -m pytest -m gpu_vulkan`` after the script.
Without the build the tests skip, unless ``CHATPHASE_REQUIRE_VULKAN=1`` (CI) makes that a failure.
Every figure is checked against llama.cpp's own log lines, read here with this file's own patterns.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu_vulkan

ROOT = Path(__file__).resolve().parents[2]
BUFFER_LINE = re.compile(r"^\w+:\s+(\S+)\s+(model|KV|compute|output) buffer size =\s*([\d.]+) MiB", re.M)
OFFLOADED_LINE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
GREEDY_STEPS = 12


@pytest.fixture(scope="module")
def vulkan_lib() -> str:
    done = subprocess.run([str(ROOT / "scripts" / "llama_build.sh"), "--cached"], capture_output=True, text=True)
    if done.returncode != 0:
        if os.environ.get("CHATPHASE_REQUIRE_VULKAN") == "1":
            pytest.fail(f"no Vulkan build: {done.stderr.strip()}")
        pytest.skip(f"no Vulkan build: {done.stderr.strip()}")
    return done.stdout.strip()


@pytest.fixture
def vk_env(vulkan_lib, tmp_path) -> dict:
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=vulkan_lib, GGML_VK_VISIBLE_DEVICES="0")
    env["CHATPHASE_LOG_DIR"] = str(tmp_path / "log")  # one engine.log per test: its lines are this run's
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def run(env: dict, *args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def ask_json(env: dict, *flags: str) -> tuple[dict, str, str]:
    """``chatphase ask --json`` of a short greedy turn: (report, stderr, engine.log text)."""
    done = run(env, "-m", "chatphase", "ask", "--json", "--no-save", "--max-tokens", "4", "--temperature", "0",
               "--n-ctx", "512", *flags, "Hi")  # fmt: skip
    assert done.returncode == 0, done.stderr
    log = (Path(env["CHATPHASE_LOG_DIR"]) / "engine.log").read_text()
    return json.loads(done.stdout), done.stderr, log


def log_buffers(log: str) -> dict[tuple[str, str], int]:
    """llama.cpp's printed buffers, bytes by (kind, buffer type); compute as last printed."""
    out: dict[tuple[str, str], int] = {}
    for buffer, kind, mib in BUFFER_LINE.findall(log):
        value = round(float(mib) * 2**20)
        out[(kind, buffer)] = value if kind == "compute" else out.get((kind, buffer), 0) + value
    return out


@pytest.mark.parametrize("ngl", ["-1", "8", "0"])
def test_all_some_and_no_layers_offloaded_as_llama_cpp_says(vk_env, ngl):
    report, stderr, log = ask_json(vk_env, "--n-gpu-layers", ngl)
    model = report["model"]
    x, y = map(int, OFFLOADED_LINE.search(log).groups())
    assert (model["layers_offloaded"], model["layers_total"]) == (x, y)
    assert x == {"-1": y, "8": 8, "0": 0}[ngl]
    assert "Vulkan" in model["backends"]
    (vk,) = [d for d in model["devices"] if d["name"] == "Vulkan0"]
    assert vk["type"] in ("gpu", "igpu") and 0 < vk["free_bytes"] <= vk["total_bytes"]

    # per-kind memory on device and host equals llama.cpp's buffer lines
    printed = log_buffers(log)
    assert {(b["kind"], b["buffer"]): b["bytes"] for b in model["buffers"]} == printed
    device_weights = sum(v for (kind, buf), v in printed.items() if kind == "model" and buf == "Vulkan0")
    assert model["memory"]["device"].get("weights", 0) == device_weights
    assert (device_weights > 0) == (x > 0)
    if x == y:  # everything on the device: weights, KV cache and compute buffers
        assert set(model["memory"]["device"]) >= {"weights", "kv_cache", "compute"}
    if 0 < x < y:
        assert any(p.startswith(f"partial offload: {x}/{y} layers on Vulkan0") for p in model["slow_paths"])
        assert "slow path: partial offload" in stderr
    else:
        assert not any(p.startswith("partial offload") for p in model["slow_paths"])

    # prefill and decode completed, metrics filled and consistent
    (turn,) = report["turns"]
    m = turn["metrics"]
    assert turn["reply"].strip()
    assert m["prefill_tokens"] > 0 and m["prefill_ms"] > 0 and m["decode_tokens"] >= 2
    assert m["ttft_ms"] >= m["prefill_ms"] > 0
    assert m["prefill_tokens_per_s"] == pytest.approx(m["prefill_tokens"] / (m["prefill_ms"] / 1000), rel=1e-3)
    assert m["decode_tokens_per_s"] == pytest.approx((m["decode_tokens"] - 1) / (m["decode_ms"] / 1000), rel=1e-3)
    assert m["stop_reason"] in ("stop", "length")


def test_kv_cache_on_the_host_with_no_kv_offload_and_said_so(vk_env):
    report, stderr, log = ask_json(vk_env, "--no-kv-offload")
    model = report["model"]
    printed = log_buffers(log)
    assert [buf for kind, buf in printed if kind == "KV"] == ["CPU"]
    assert "kv_cache" not in model["memory"]["device"] and model["memory"]["host"]["kv_cache"] == printed[("KV", "CPU")]
    assert model["memory"]["device"]["weights"] > 0  # the layers still run on the device
    assert any(p.startswith("KV cache on the host (CPU)") for p in model["slow_paths"])
    assert "slow path: KV cache on the host" in stderr


def test_the_panel_shows_the_device_and_its_memory(vk_env):
    done = run(vk_env, "tests/vulkan_probe.py", "panel", json.dumps({"n_ctx": 512, "n_gpu_layers": 8}))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    (device,) = shown["devices"]
    assert device.startswith("Vulkan0 · ") and (" free of " in device or " reports no usage " in device)
    log = Path(shown["log_path"]).read_text()
    vk_model_mib = float(re.findall(r"Vulkan0 model buffer size =\s*([\d.]+) MiB", log)[-1])
    assert shown["memory"].startswith("device: weights ") and f"{vk_model_mib:.1f} MiB" in shown["memory"]
    assert "; host: weights " in shown["memory"]
    # n_gpu_layers counts the output layer, which llama.cpp offloads first: 8 = 7 repeating layers + output
    assert shown["offload"].startswith("on (7/30 layers + output)")
    assert any(p.startswith("partial offload: 8/") for p in shown["slow_paths"])


def test_the_device_memory_shown_is_read_after_the_load_beside_what_the_engine_holds(vk_env, capsys):
    """Issue 32 ("free memory not refreshed after the load"): the loaded event's reading is ggml's after the
    load, and the panel's device line says what llama.cpp allocated on the device (its buffer lines) beside
    it; on llvmpipe, which has no memory budget, ggml reports free = total before and after, and the line
    says so rather than "2.0 GiB free of 2.0 GiB"."""
    done = run(vk_env, "tests/vulkan_probe.py", "panel", json.dumps({"n_ctx": 512, "n_gpu_layers": -1}))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    (before_free, total), (after_free, _) = shown["read_before"]["Vulkan0"], shown["read_after"]["Vulkan0"]
    assert shown["loaded_devices"]["Vulkan0"] == [after_free, total]  # not a reading taken before the load
    log = Path(shown["log_path"]).read_text()
    held = sum(v for (kind, buffer), v in log_buffers(log).items() if buffer == "Vulkan0")
    assert held > 0
    with capsys.disabled():
        print(f"\nVulkan0 free before the load {before_free:,} B, after {after_free:,} B, of {total:,} B; "
              f"llama.cpp's buffers on it {held:,} B")  # fmt: skip
    (device,) = shown["devices"]
    assert device.endswith(f" · engine holds {held / 2**20:.1f} MiB")
    if after_free == total:
        assert before_free == total  # a device that reports no usage at all: free never moves
        assert f" · {total / 2**30:.1f} GiB · reports no usage (free = total) · " in device
    else:
        assert f" · {after_free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB · " in device


def test_a_request_the_device_cannot_hold_is_one_plain_line(vk_env):
    """A KV cache larger than the device's memory (llvmpipe reports 2 GiB and would over-commit into host
    memory), every layer asked for: refused before llama.cpp allocates it, in one line, with the device's figure.
    With n_gpu_layers auto (the default) the same context loads, with the layers that fit on the device."""
    done = run(vk_env, "-m", "chatphase", "ask", "--no-save", "--max-tokens", "2", "--n-ctx", "262144",
               "--n-batch", "64", "--n-gpu-layers", "-1", "Hi")  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    # the memory plan's refusal (llama.cpp's own projection), before any weight is read
    assert re.search(
        r"n_gpu_layers \d+ \(30/30 layers \+ output\) would not fit Vulkan0: it needs [\d.]+ GiB", lines[0]
    )
    assert "use fewer --n-gpu-layers (auto chooses)" in lines[0]
    assert "slow path" not in done.stderr  # nothing was loaded
    fits = run(vk_env, "-m", "chatphase", "ask", "--no-save", "--max-tokens", "2", "--n-ctx", "262144",
               "--n-batch", "64", "--no-kv-offload", "--n-gpu-layers", "0", "--json", "Hi")  # fmt: skip
    assert fits.returncode == 0, fits.stderr  # on the host it fits
    auto = run(vk_env, "-m", "chatphase", "ask", "--no-save", "--max-tokens", "2", "--n-ctx", "262144",
               "--n-batch", "64", "--json", "Hi")  # fmt: skip
    assert auto.returncode == 0, auto.stderr
    settings, model = json.loads(auto.stdout)["settings"], json.loads(auto.stdout)["model"]
    assert 0 < settings["n_gpu_layers"] < model["layers_total"], settings
    assert settings["n_gpu_layers_why"].startswith(f"auto: {settings['n_gpu_layers']} ")
    assert f"n_gpu_layers auto: {settings['n_gpu_layers']} " in auto.stderr


@pytest.fixture(scope="module")
def synth_8b_path(tmp_path_factory) -> str:
    """A synthetic Llama 3.1 8B (Q4_0), its tensor data a hole of zeros (no disk used)."""
    from chatphase.models.synth import plan, write_synthetic
    from chatphase.models.synth_shapes import SHAPES

    target = tmp_path_factory.mktemp("synth") / "8b.gguf"
    return str(write_synthetic(plan(SHAPES["llama-3.1-8b"], "Q4_0"), target, layout_only=True))


def test_auto_fits_a_synthetic_8b_and_two_layers_more_are_refused_before_the_load(vk_env, synth_8b_path):
    """Issue 42: on the 2 GiB device, ``n_gpu_layers auto`` (no margin: the most the device holds) chooses a count
    and that load succeeds; forcing two layers more is refused before the load with the plan's numbers: llvmpipe
    would over-commit into host memory rather than refuse, so the plan, planned against its total, says it."""
    flags = ("--model", synth_8b_path, "--n-ctx", "512", "--gpu-margin-mib", "0")
    info = run(vk_env, "-m", "chatphase", "info", *flags, "--plan", "--json")
    assert info.returncode == 0, info.stderr
    fit = json.loads(info.stdout)["plan"]
    k = fit["n_gpu_layers"]
    assert 0 < k < 33 and fit["why"].startswith(f"auto: {k} ({k - 1}/32 layers + output) fit: Vulkan0 "), fit
    (vk,) = [d for d in fit["plan"]["devices"] if d["name"] == "Vulkan0"]
    assert vk["left_bytes"] >= 0 and vk["weights_bytes"] > 0

    forced = run(vk_env, "-m", "chatphase", "ask", "--no-save", "--max-tokens", "1", *flags,
                 "--n-gpu-layers", str(k + 2), "Hi")  # fmt: skip
    lines = forced.stderr.strip().splitlines()
    assert forced.returncode != 0 and "Traceback" not in forced.stderr and len(lines) == 1, forced.stderr
    assert re.search(
        rf"n_gpu_layers {k + 2} \({k + 1}/32 layers \+ output\) would not fit Vulkan0: it needs [\d.]+ [MG]iB there "
        r"\(weights [\d.]+ [MG]iB \+ KV [\d.]+ [KMG]?i?B \+ compute [\d.]+ [MG]iB.*\) and has [\d.]+ [MG]iB",
        lines[0],
    ), lines[0]
    if vk["free_bytes"] == vk["total_bytes"]:  # llvmpipe: no usage counted, so the plan is what refuses
        assert "(Vulkan0 reports free = total (it counts no usage)); use fewer --n-gpu-layers" in lines[0]
    assert "slow path" not in forced.stderr  # nothing was loaded

    settings = {"n_ctx": 512, "gpu_margin_mib": 0, "model_path": synth_8b_path}
    done = run(vk_env, "tests/vulkan_probe.py", "panel", json.dumps(settings))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert "error" not in shown, shown
    assert shown["n_gpu_layers"] == k and shown["n_gpu_layers_why"] == fit["why"]
    assert shown["offload"].startswith(f"on ({k - 1}/32 layers + output)")
    log = Path(shown["log_path"]).read_text()
    assert OFFLOADED_LINE.findall(log)[-1] == (str(k), "33")


def test_a_synthetic_moe_keeps_its_experts_on_the_host_and_every_layer_on_the_device(vk_env, tmp_path):
    """Issue 42: a synthetic Qwen3-30B-A3B (17 GiB, a hole of zeros) does not fit the 2 GiB device with its
    experts, but every layer does with the experts on the host (llama.cpp's -ot exps=CPU): auto plans that, and the
    load puts every layer on Vulkan0, with the device's weights llama.cpp's own buffer line within 3 % of the plan's."""
    from chatphase.models.synth import plan, write_synthetic
    from chatphase.models.synth_shapes import SHAPES

    path = str(write_synthetic(plan(SHAPES["qwen3-30b-a3b"], "Q4_0"), tmp_path / "moe.gguf", layout_only=True))
    info = run(vk_env, "-m", "chatphase", "info", "--model", path, "--n-ctx", "512", "--gpu-margin-mib", "0",
               "--plan", "--json")  # fmt: skip
    assert info.returncode == 0, info.stderr
    fit = json.loads(info.stdout)["plan"]
    assert fit["experts_on_host"] and fit["n_gpu_layers"] == 49, fit["why"]
    assert fit["why"].startswith("auto: all 48 layers + output fit with the experts on the host (llama.cpp's -ot exps")
    (vk,) = [d for d in fit["plan"]["devices"] if d["name"] == "Vulkan0"]
    assert fit["plan"]["experts_on_host"] and 0 < vk["weights_bytes"] < 2**31

    settings = {"n_ctx": 512, "gpu_margin_mib": 0, "model_path": path}
    done = run(vk_env, "tests/vulkan_probe.py", "panel", json.dumps(settings))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert "error" not in shown, shown
    assert shown["n_gpu_layers"] == -1 and shown["n_gpu_layers_why"] == fit["why"]
    log = Path(shown["log_path"]).read_text()
    assert OFFLOADED_LINE.findall(log)[-1] == ("49", "49")
    printed = log_buffers(log)
    assert printed[("model", "Vulkan0")] == pytest.approx(vk["weights_bytes"], rel=0.03)
    assert printed[("model", "CPU_Mapped")] > 10 * printed[("model", "Vulkan0")]  # the experts: mapped on the host


def test_info_lists_the_vulkan_device_and_keeps_llama_cpp_off_stderr(vk_env):
    done = run(dict(vk_env, CHATPHASE_LOG_LEVEL="debug"), "-m", "chatphase", "info")  # ggml_vulkan logs at debug
    assert done.returncode == 0, done.stderr
    assert "ggml_vulkan" not in done.stderr and done.stderr.strip() == ""
    assert re.search(r"^backends\s+.*Vulkan", done.stdout, re.M)
    assert re.search(r"^device\s+Vulkan0 · .* · (gpu|igpu) · .* (free of |reports no usage )", done.stdout, re.M)
    assert "ggml_vulkan" in (Path(vk_env["CHATPHASE_LOG_DIR"]) / "engine.log").read_text()
    hidden = run(dict(vk_env, GGML_VK_VISIBLE_DEVICES=""), "-m", "chatphase", "info")
    assert re.search(r"^GPU offload\s+none: the Vulkan backend found no GPU device", hidden.stdout, re.M), hidden.stdout


def test_op_offload_sends_the_cpu_layers_prefill_to_the_device_unless_turned_off(vk_env, tmp_path, capsys):
    """At 0 layers llama.cpp still runs a large batch's matrix products on the GPU (its op_offload), with a
    compute buffer there: said as a slow path (on llvmpipe the prefill ran at 8 tok/s against the CPU's 478);
    ``--no-op-offload`` keeps it on the CPU, with no compute buffer on the device."""
    doc = tmp_path / "doc.txt"
    doc.write_text("The prefill reads the whole prompt in one parallel pass before the first token. " * 3)
    rates = {}
    for flag in ("", "--no-op-offload"):
        report, stderr, log = ask_json(vk_env, "--n-gpu-layers", "0", "--prefix-cache", "off", "-f", str(doc),
                                       *([flag] if flag else []))  # fmt: skip
        model, printed = report["model"], log_buffers(log.rsplit("--- chatphase: loading", 1)[-1])
        rates[flag or "op offload"] = report["turns"][0]["metrics"]["prefill_tokens_per_s"]
        assert model["layers_offloaded"] == 0 and report["turns"][0]["metrics"]["prompt_tokens"] > 32
        said = [p for p in model["slow_paths"] if p.startswith("prefill of the CPU layers on Vulkan0")]
        if flag:
            assert ("compute", "Vulkan0") not in printed and not said and "op offload" not in stderr
        else:
            assert printed[("compute", "Vulkan0")] > 0 and said and "slow path: prefill of the CPU layers" in stderr
    with capsys.disabled():
        print(f"\nprefill at 0 layers on llvmpipe, tok/s: {rates}")


def test_a_vulkan_build_with_no_driver_is_not_called_cpu_only(vk_env):
    """No Vulkan driver at all (the loader is pointed at none): ggml registers no Vulkan backend, as on an
    NVIDIA machine whose driver's Vulkan library could not load. The turn runs on the CPU and the one line
    says the device is missing, not the build's GPU support."""
    done = run(dict(vk_env, VK_DRIVER_FILES="/nonexistent/icd.json"), "-m", "chatphase", "ask", "--no-save",
               "--max-tokens", "2", "--n-ctx", "512", "--n-gpu-layers", "-1", "Hi")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "CPU-only build" not in done.stderr
    assert (
        "n_gpu_layers=-1 ignored: the Vulkan backend found no GPU device; a GPU needs its Vulkan driver" in done.stderr
    )


def test_the_amx_probe_runs_the_cpu_path_with_or_without_the_device(vk_env):
    """The AMX probe judges the CPU's own path whatever devices the build sees: with llvmpipe visible and with
    no Vulkan driver it runs the same kernels, so it ends the same way (a crash of the AMX path both times, or
    the same buffers and figures both times), and no load of it puts weights on the device. It once compared
    two device runs (max |Δlogit| 0), kept 'safe', and the next driverless run died (SIGILL)."""
    probe = ("-m", "chatphase.engine.local.amx_probe")
    outcomes = []
    for env in (vk_env, dict(vk_env, VK_DRIVER_FILES="/nonexistent/icd.json")):
        done = run(env, *probe)
        if done.returncode < 0:
            outcomes.append(("crash", done.returncode))
            continue
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert not any(b.startswith("Vulkan") for b in result["extra_buffers"]), result
        assert result["max_abs_diff"] != 0.0 or not any(b.startswith("AMX") for b in result["extra_buffers"]), result
        outcomes.append(("ran", tuple(result["extra_buffers"])))
    assert outcomes[0] == outcomes[1], outcomes


def test_greedy_tokens_on_vulkan_and_on_the_cpu(vk_env, capsys):
    """Greedy decoding of one prompt on the Vulkan device (all layers) and on the CPU build: the tokens are
    equal, or the first difference is reported with both backends' logits and must be a near tie (a real
    kernel bug diverges by whole logits, not by the rounding that differs between backends)."""
    vk = run(vk_env, "tests/vulkan_probe.py", "greedy", "-1", str(GREEDY_STEPS))
    cpu_env = {k: v for k, v in vk_env.items() if k not in ("LLAMA_CPP_LIB_PATH", "GGML_VK_VISIBLE_DEVICES")}
    cpu = run(cpu_env, "tests/vulkan_probe.py", "greedy", "0", str(GREEDY_STEPS))
    assert vk.returncode == 0 and cpu.returncode == 0, vk.stderr + cpu.stderr
    a, b = (
        [{**s, "top": {int(t): v for t, v in s["top"].items()}} for s in json.loads(p.stdout)["steps"]]
        for p in (vk, cpu)
    )
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x["token"] != y["token"]), None)

    def logit(step: dict, token: int) -> str:
        v = step["top"].get(token)
        return "not in its top 20" if v is None else f"{v:.4f}"

    top0 = {t: (v, b[0]["top"].get(t)) for t, v in a[0]["top"].items() if t in b[0]["top"]}
    drift = max(abs(x - y) for x, y in top0.values())
    with capsys.disabled():
        print(
            f"\ngreedy Vulkan vs CPU over {GREEDY_STEPS} tokens: first-step top logits differ by at most {drift:.4f}; ",
            end="",
        )
        if first is None:
            print(f"tokens equal ({json.loads(vk.stdout)['text']!r})")
        else:
            tv, tc = a[first]["token"], b[first]["token"]
            print(
                f"first difference at token {first}: Vulkan chose {tv} (Vulkan {logit(a[first], tv)}, CPU "
                f"{logit(b[first], tv)}), the CPU chose {tc} (Vulkan {logit(a[first], tc)}, CPU {logit(b[first], tc)})"
            )
    assert a[0]["token"] == b[0]["token"] and len(top0) >= 10 and drift < 1.0  # the first step agrees
    if first is not None:  # a near tie on at least one side, not a divergence
        tv, tc = a[first]["token"], b[first]["token"]
        gaps = [s["top"][t] - s["top"][u] for s, t, u in ((a[first], tv, tc), (b[first], tc, tv)) if u in s["top"]]
        assert gaps and min(gaps) < 1.0, (first, a[first], b[first])


def test_the_offload_sweep_writes_one_placement_per_layer_count_and_its_plot(vk_env, tmp_path):
    out, plot = tmp_path / "offload.json", tmp_path / "offload.svg"
    done = run(vk_env, "-m", "chatphase", "bench", "--gpu-layers", "0,all", "--prompt-lengths", "16", "--depths",
               "none", "--gen", "2", "--reps", "1", "--warmup", "0", "--n-ctx", "512", "--format", "json",
               "-o", str(out), "--plot", str(plot), timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    none, every = json.loads(out.read_text())["offload"]
    log = (Path(vk_env["CHATPHASE_LOG_DIR"]) / "engine.log").read_text()
    assert [tuple(map(int, m)) for m in OFFLOADED_LINE.findall(log)] == [
        (none["layers_offloaded"], none["layers_total"]),
        (every["layers_offloaded"], every["layers_total"]),
    ]
    assert none["layers_offloaded"] == 0 and every["layers_offloaded"] == every["layers_total"] > 0
    for p in (none, every):
        assert p["prefill_tokens_per_s"] > 0 and p["decode_tokens_per_s"] > 0
        # one cell's rate and TTFT: its prefill fits within its TTFT
        assert p["prefill_prompt_tokens"] / p["prefill_tokens_per_s"] * 1000 <= p["ttft_ms"] * 1.001
        r = p["roofline"]
        assert r["host_bandwidth_bytes_per_s"] > 0
        if r["device_bytes_per_token"] and r["device_bandwidth_bytes_per_s"] is None:  # unknown stays unknown
            assert r["decode_bound_tokens_per_s"] is None and r["bound_by"].startswith("unknown")
        else:
            assert r["decode_bound_tokens_per_s"] > 0
        assert r["device_bytes_per_token"] >= p["memory"]["device"].get("weights", 0)
        size = json.loads(out.read_text())["offload"][0]["result"]["model"]["size_bytes"]
        assert r["host_bytes_per_token"] >= size - p["memory"]["device"].get("weights", 0)
    assert none["roofline"]["device_bytes_per_token"] == 0 and every["roofline"]["device_bytes_per_token"] > 0
    assert plot.read_text().lstrip().startswith("<?xml")


def test_auto_agrees_with_llama_fit_params_within_one_layer(vk_env, synth_8b_path):
    """Issue 42: chatphase's ``auto`` against llama.cpp's own fit, ``llama-fit-params`` of the tools build (the same
    vendored source) run on the Vulkan build's libraries (``LD_LIBRARY_PATH`` wins over the tool's RUNPATH), on the
    synthetic 8B at three contexts and margins: the layer counts agree within one. (With no ``-c`` both fit the
    training context, 131,072 tokens, whose KV buffer llvmpipe cannot hold: llama.cpp aborts in both, so that is not
    compared here.)"""
    from tests.engine.test_rpc_servers import _tools

    fit_params = _tools() / "llama-fit-params"
    env = {**vk_env, "LD_LIBRARY_PATH": vk_env["LLAMA_CPP_LIB_PATH"]}
    for n_ctx, margin_mib in ((512, 0), (4096, 1024), (8192, 256)):
        theirs = subprocess.run(
            [str(fit_params), "-m", synth_8b_path, "-c", str(n_ctx), "-fitt", str(margin_mib)],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        fitted = re.search(r"-ngl (\d+)", theirs.stdout)
        assert theirs.returncode == 0 and fitted, theirs.stderr[-2000:]
        info = run(vk_env, "-m", "chatphase", "info", "--model", synth_8b_path, "--n-ctx", str(n_ctx),
                   "--gpu-margin-mib", str(margin_mib), "--plan", "--json")  # fmt: skip
        assert info.returncode == 0, info.stderr
        ours = json.loads(info.stdout)["plan"]["n_gpu_layers"]
        assert abs(ours - int(fitted.group(1))) <= 1, (n_ctx, margin_mib, ours, fitted.group(0))
