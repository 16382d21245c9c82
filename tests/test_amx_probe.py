"""Intel AMX: extra buffer types follow a crash-contained probe of this llama.cpp build
(chatphase/engine/local/amx_probe.py), asked only on AMX CPUs and kept per library file."""

from __future__ import annotations

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
