"""The suite runs the same on every kind of CPU: a test of CPU-dependent logic fakes the whole CPU
(tests/cpu_support.py), and one that fakes only part of it fails on any machine, not only on the other kind."""

from __future__ import annotations

import pytest
from cpu_support import HalfFakedCpu

from chatphase.engine.local import amx_probe, llama_params
from chatphase.engine.local.amx_probe import AmxVerdict

AUTO = {"extra_bufts": "auto", "n_gpu_layers": 0}


@pytest.mark.parametrize(
    "fake",
    [
        ("detect_amx", lambda *_: True),  # the pattern that failed on AMD: the real probe then said "safe"
        ("amx_verdict", lambda *_: AmxVerdict(False, "crash")),  # the real flags and system info then decide
        ("read_cpu_flags", lambda *_: frozenset({"amx_tile"})),  # the real probe then runs
    ],
    ids=lambda f: f[0] if isinstance(f, tuple) else "",
)
def test_a_half_faked_cpu_fails_on_every_machine(monkeypatch, fake):
    name, value = fake
    monkeypatch.setattr(llama_params, name, value)
    with pytest.raises(HalfFakedCpu, match=f"fakes {name}"):
        plan = llama_params.offload_plan(AUTO, llama_params.cpu_system_info(), False)
        llama_params.amx_verdict()  # where the plan did not ask the probe itself
        raise AssertionError(f"read the real CPU unnoticed: {plan}")


def test_nothing_faked_reads_the_real_cpu(monkeypatch):
    """A real-model test fakes nothing and reads the machine as the product does."""
    monkeypatch.setattr(amx_probe, "library_key", lambda: "not a CPU reading")  # faking other names is fine
    plan = llama_params.offload_plan(
        AUTO, llama_params.cpu_system_info(), False, amx_check=lambda: AmxVerdict(True, "")
    )
    assert plan.use_extra_bufts  # whatever the machine: on AMX the check said safe


@pytest.mark.parametrize("kind", ["amx", "other"])
@pytest.mark.parametrize("probe_safe", [True, False])
def test_each_kind_decides_on_any_machine(fake_cpu, kind, probe_safe):
    cpu = fake_cpu(kind, probe_safe)
    plan = llama_params.offload_plan(AUTO, llama_params.cpu_system_info(), False)
    assert plan.amx is (kind == "amx")
    assert plan.use_extra_bufts is (probe_safe if kind == "amx" else True)
    assert cpu.probes == (kind == "amx")
    third_party = llama_params.cpu_safe_model_defaults(lambda: type("P", (), {"use_extra_bufts": True})())
    assert third_party().use_extra_bufts is plan.use_extra_bufts


@pytest.mark.parametrize("kind", ["amx", "other"])
def test_info_reports_the_kind(fake_cpu, kind):
    from chatphase.commands.info import system_report

    fake_cpu(kind, probe_safe=False)
    report = system_report()
    assert report["amx_detected"] is (kind == "amx")
    assert ("AMX_INT8" in report["cpu_features"]) is (kind == "amx")
    assert report["extra_bufts_auto"] == ("off (fake probe: crash)" if kind == "amx" else "on (no AMX)")
