"""Intel AMX: extra buffer types follow a crash-contained probe of this llama.cpp build
(chatphase/engine/local/amx_probe.py), asked only on AMX CPUs and kept per library file."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from chatphase.engine.local import amx_probe
from chatphase.engine.local.amx_probe import AmxVerdict
from chatphase.engine.local.llama_params import offload_plan
from chatphase.engine.slow_paths import slow_paths

AUTO = {"extra_bufts": "auto", "n_gpu_layers": 0}


def _on_cpu(fake_cpu, amx: bool):
    fake_cpu("amx" if amx else "other")


def _never():
    raise AssertionError("the probe is asked only on AMX CPUs with extra_bufts auto")


@pytest.mark.parametrize("safe", [True, False])
def test_auto_follows_the_probe_on_amx_cpus(fake_cpu, safe):
    _on_cpu(fake_cpu, True)
    plan = offload_plan(AUTO, "", False, amx_check=lambda: AmxVerdict(safe, "the probe said so"))
    assert plan.use_extra_bufts is safe and plan.amx
    assert plan.extra_bufts_why == "the probe said so"
    if safe:
        assert plan.notes == (
            "AMX CPU: llama.cpp extra buffer types on: the probe said so; --extra-bufts off overrides",
        )
    else:  # said once, as a slow path, with the probe's reason
        assert plan.notes == ()
        slow = slow_paths(
            layers_offloaded=0,
            layers_total=31,
            buffers=(),
            amx=plan.amx,
            use_extra_bufts=plan.use_extra_bufts,
            flash_attn="auto",
            flash_attn_mismatch=None,
            type_k="f16",
            type_v="f16",
            amx_why=plan.extra_bufts_why,
        )
        assert slow == (
            "AMX off: llama.cpp's extra buffer types are off on this AMX CPU — the probe said so; prefill runs "
            "without the AMX kernels; --extra-bufts on overrides",
        )


def test_no_probe_without_amx_or_with_a_setting(fake_cpu):
    _on_cpu(fake_cpu, False)
    assert offload_plan(AUTO, "", False, amx_check=_never).use_extra_bufts is True
    _on_cpu(fake_cpu, True)
    assert offload_plan(dict(AUTO, extra_bufts="off"), "", False, amx_check=_never).use_extra_bufts is False
    on = offload_plan(dict(AUTO, extra_bufts="on"), "", False, amx_check=_never)
    assert on.use_extra_bufts is True and "may crash" in on.notes[0]


def test_the_verdict_is_kept_per_library_file(monkeypatch, tmp_path):
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    runs = []

    def probe(timeout_s):
        runs.append(timeout_s)
        return AmxVerdict(False, f"crash #{len(runs)}")

    monkeypatch.setattr(amx_probe, "_run_probe", probe)
    monkeypatch.setattr(amx_probe, "library_key", lambda: "libggml-cpu.so:1:1")
    assert amx_probe.amx_verdict() == AmxVerdict(False, "crash #1")
    assert amx_probe.amx_verdict() == AmxVerdict(False, "crash #1") and len(runs) == 1
    monkeypatch.setattr(amx_probe, "library_key", lambda: "libggml-cpu.so:1:2")  # a reinstalled llama.cpp
    assert amx_probe.amx_verdict() == AmxVerdict(False, "crash #2") and len(runs) == 2
    (tmp_path / "amx-probe.json").write_text("{not json")  # a damaged cache is probed again, not an error
    assert amx_probe.amx_verdict().why == "crash #3"


def test_a_probe_that_could_not_conclude_is_not_kept(monkeypatch, tmp_path):
    """A time-out, or a probe that could not run at all (exit 1: no bundled model, say), is no verdict on the
    build: it is asked again next time, not kept as 'unsafe' for good."""
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(amx_probe, "library_key", lambda: "k")
    for done in (subprocess.TimeoutExpired("probe", 1), subprocess.CompletedProcess([], 1, "", "Traceback …")):

        def run(*args, done=done, **kwargs):
            if isinstance(done, Exception):
                raise done
            return done

        monkeypatch.setattr(amx_probe.subprocess, "run", run)
        verdict = amx_probe.amx_verdict(1)
        assert not verdict.safe and not verdict.conclusive, verdict
        assert not (tmp_path / "amx-probe.json").exists()


@pytest.mark.model
def test_the_real_probe_reaches_a_verdict():
    """On this machine's llama.cpp build: the probe finishes (a crash of the AMX path is a verdict, not a
    failure); on a CPU without AMX, 'extra buffer types on' is the CPU repack path, which must match."""
    from chatphase.system.cpu_features import AMX_CPU_FLAGS, read_cpu_flags

    verdict = amx_probe._run_probe(300)
    assert "probe failed" not in verdict.why and "did not finish" not in verdict.why, verdict.why
    if not AMX_CPU_FLAGS & read_cpu_flags():
        assert verdict.safe, verdict.why
    else:
        assert verdict.safe or "crash" in verdict.why or "other logits" in verdict.why


def _probe_printed(monkeypatch, **result):
    """The probe child's run faked: it printed ``result`` (the JSON line) and exited 0."""
    line = json.dumps(
        dict(
            {"max_abs_diff": 0.9, "argmax_same": 61, "ref_max_abs_diff": 1.0, "ref_argmax_same": 61, "positions": 64},
            **result,
        )
    )
    monkeypatch.setattr(amx_probe.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess([], 0, line, ""))


def test_identical_runs_are_not_tested_and_not_kept(monkeypatch, tmp_path):
    """A difference of exactly 0 means the AMX kernels did not run (a device took the batch, as on a Vulkan
    build with llvmpipe visible): no verdict, asked again next time, extra buffer types off meanwhile."""
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(amx_probe, "library_key", lambda: "k")
    _probe_printed(monkeypatch, max_abs_diff=0.0, argmax_same=64, extra_buffers=["AMX", "CPU_Mapped"])
    verdict = amx_probe.amx_verdict()
    assert not verdict.safe and not verdict.conclusive and "not tested" in verdict.why
    assert not (tmp_path / "amx-probe.json").exists()


def test_a_verdict_needs_the_amx_buffer_in_llama_cpp_s_own_load_lines(monkeypatch, tmp_path):
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(amx_probe, "library_key", lambda: "k")
    _probe_printed(monkeypatch, extra_buffers=["AMX", "CPU_Mapped"])
    assert amx_probe.amx_verdict().safe
    _probe_printed(monkeypatch, extra_buffers=["CPU_Mapped"])  # a build without AMX kernels: nothing to guard
    monkeypatch.setattr(amx_probe, "library_key", lambda: "k2")
    verdict = amx_probe.amx_verdict()
    assert verdict.safe and verdict.why == "this llama.cpp build has no AMX kernels (its load made no AMX buffer)"


def test_a_gpu_less_run_after_a_gpu_present_probe_asks_again(monkeypatch, tmp_path):
    """The Intel kind's CI failure: a probe run with llvmpipe visible kept 'safe' (max |Δlogit| 0) for the
    Vulkan build's library; the next run, with no driver, took the AMX path and died (SIGILL). A verdict from
    that probe is no verdict now: the probe (CPU only) is asked again, and its crash is what counts."""
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(amx_probe, "library_key", lambda: "vulkan-build/libggml-cpu.so:1:1")
    stale = {
        "safe": True,
        "why": "this llama.cpp build's AMX kernels agree with the plain CPU path (max |Δlogit| 0, …)",
    }
    (tmp_path / "amx-probe.json").write_text(json.dumps({"vulkan-build/libggml-cpu.so:1:1": stale}))
    monkeypatch.setattr(
        amx_probe.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess([], -signal.SIGILL, "", "")
    )
    verdict = amx_probe.amx_verdict()
    assert not verdict.safe and verdict.why == "this llama.cpp build's AMX kernels crash (SIGILL in the probe)"
    kept = json.loads((tmp_path / "amx-probe.json").read_text())
    assert kept == {"vulkan-build/libggml-cpu.so:1:1": {"safe": False, "why": verdict.why, "probe": 2}}


def test_the_probe_loads_on_the_cpu_alone(monkeypatch):
    """Both probe loads name no GPU device (an empty, NULL-terminated ``devices`` list: llama.cpp then adds the
    CPU's extra buffer types) and keep every op on the CPU (``op_offload`` off), whatever the build has."""
    import ctypes

    import llama_cpp as lc

    seen = {}

    def load(path, params):
        first = ctypes.cast(params.devices, ctypes.POINTER(ctypes.c_void_p))[0] if params.devices else "all"
        seen["devices"], seen["extra"] = first, params.use_extra_bufts
        return 1

    def init(model, params):
        seen["op_offload"] = params.op_offload
        return None

    monkeypatch.setattr(lc, "llama_model_load_from_file", load)
    monkeypatch.setattr(lc, "llama_init_from_model", init)
    with pytest.raises(RuntimeError, match="context could not be made"):
        amx_probe._logits("model.gguf", True, [1, 2, 3], 3)
    assert seen == {"devices": None, "extra": True, "op_offload": False}


def test_model_buffers_reads_llama_cpp_s_load_lines():
    from chatphase.engine.llamalog import model_buffers

    log = (
        "load_tensors: loading model tensors, this can take a while... (mmap = true)\n"
        "load_tensors:          AMX model buffer size =    69.38 MiB\n"
        "load_tensors:   CPU_Mapped model buffer size =    92.12 MiB\n"
        "llama_kv_cache:        CPU KV buffer size =     3.00 MiB\n"
        "load_tensors:          AMX model buffer size =     1.00 MiB\n"
    )
    assert model_buffers(log) == ["AMX", "CPU_Mapped"]
