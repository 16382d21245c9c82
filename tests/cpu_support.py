"""The machine's CPU in tests: faked whole, or read for real, never half of each.

The engine's CPU-dependent choice (llama.cpp's extra buffer types on an Intel AMX CPU,
``chatphase/engine/local/llama_params.py``) reads three things about this machine: the kernel's CPU flags
(``read_cpu_flags``), llama.cpp's system info (``cpu_system_info``) and, on an AMX CPU, the AMX probe's verdict
on this llama.cpp build (``amx_verdict``, which runs ``amx_probe._run_probe`` or reads its cache). A test that
fakes one of them, or the logic over them (``detect_amx``), and lets another be read for real passes on one
kind of machine and fails on the other: that happened (the AMX probe said "safe" on an AMD CPU a test
pretended was Intel).

So:

- :func:`fake_cpu` (the ``fake_cpu`` fixture) fakes every reading at once, for ``"amx"`` (an Intel CPU with
  AMX, with the probe's verdict given) or ``"other"`` (an AMD EPYC with AVX-512); the test runs the same on
  every machine.
- :func:`guard_cpu_readers` (autouse, ``tests/conftest.py``) makes every real reading fail the test with
  :class:`HalfFakedCpu` while any of those names is replaced by something other than :func:`fake_cpu`.
  Tests that fake nothing read the real CPU as the product does (real-model tests, the probe's own test).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

import pytest

from chatphase.engine.local import amx_probe, llama_params
from chatphase.engine.local.amx_probe import AmxVerdict

#: the functions through which the product reads this machine's CPU
READERS: tuple[tuple[ModuleType, str], ...] = (
    (llama_params, "read_cpu_flags"),
    (llama_params, "cpu_system_info"),
    (llama_params, "amx_verdict"),
    (amx_probe, "_run_probe"),
)
#: the logic over those readings, which a test may be tempted to fake instead of the readings
LOGIC: tuple[tuple[ModuleType, str], ...] = ((llama_params, "detect_amx"),)

#: what the two kinds of machine report (abridged from the kernel's flags and llama.cpp's system info)
KINDS: dict[str, tuple[frozenset[str], str]] = {
    "amx": (
        frozenset({"avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"}),
        "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | "
        "OPENMP = 1 | REPACK = 1 |",
    ),
    "other": (
        frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}),
        "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | AVX512_VNNI = 1 | "
        "AVX512_BF16 = 1 | OPENMP = 1 | REPACK = 1 |",
    ),
}


class HalfFakedCpu(AssertionError):
    """A test faked part of the CPU's readings and then read the real CPU."""


class FakeCpu:
    """What :func:`fake_cpu` installed: ``kind``, the probe's ``verdict``, and ``probes``, how often the engine
    asked for it (the probe runs only on AMX CPUs with ``extra_bufts = auto``)."""

    def __init__(self, kind: str, verdict: AmxVerdict) -> None:
        self.kind, self.verdict, self.probes = kind, verdict, 0
        self.flags, self.system_info = KINDS[kind]

    def amx_verdict(self, *_: Any) -> AmxVerdict:
        self.probes += 1
        return self.verdict


def _never_probe(*_: Any) -> AmxVerdict:
    raise HalfFakedCpu("the real AMX probe ran under fake_cpu: the fake verdict should have answered")


def fake_cpu(monkeypatch: pytest.MonkeyPatch, kind: Literal["amx", "other"], probe_safe: bool = False) -> FakeCpu:
    """Fake every reading of the CPU (:data:`READERS`) as on a machine of ``kind``; on ``"amx"`` the AMX probe
    says ``probe_safe``. Returns the :class:`FakeCpu`."""
    cpu = FakeCpu(kind, AmxVerdict(probe_safe, "fake probe: " + ("the AMX path matched" if probe_safe else "crash")))
    monkeypatch.setattr(llama_params, "read_cpu_flags", lambda *_: cpu.flags)
    monkeypatch.setattr(llama_params, "cpu_system_info", lambda: cpu.system_info)
    monkeypatch.setattr(llama_params, "amx_verdict", cpu.amx_verdict)
    monkeypatch.setattr(amx_probe, "_run_probe", _never_probe)
    return cpu


def guard_cpu_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wrap each real reader of :data:`READERS` so that it raises :class:`HalfFakedCpu` when called while a name
    of :data:`READERS` or :data:`LOGIC` holds something other than what the test started with."""
    start: dict[tuple[int, str], Any] = {}

    def faked() -> list[str]:
        return [name for mod, name in READERS + LOGIC if getattr(mod, name) is not start[id(mod), name]]

    def guarded(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def read(*args: Any, **kwargs: Any) -> Any:
            if fakes := faked():
                raise HalfFakedCpu(
                    f"this test fakes {', '.join(fakes)} and then reads the real CPU through {name}: on another "
                    "kind of machine it would see something else. Fake the whole CPU with the fake_cpu fixture "
                    "(tests/cpu_support.py), or fake nothing."
                )
            return real(*args, **kwargs)

        return read

    for mod, name in READERS:
        monkeypatch.setattr(mod, name, guarded(name, getattr(mod, name)))
    for mod, name in READERS + LOGIC:
        start[id(mod), name] = getattr(mod, name)
