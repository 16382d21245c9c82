"""CPU features that change how llama.cpp must be configured.

Intel AMX: llama.cpp's CPU backend registers an AMX "extra buffer type" for quantised weights, and on
these CPUs its batched prompt evaluation segfaults (llama.cpp issue #20824; the same crash was worked
around in dspy PR #10079). Turning extra buffer types off (``llama_model_params.use_extra_bufts = false``)
avoids it, so the engine detects AMX and does that unless the user overrides it.
No llama.cpp import here: callers pass ``llama_cpp.llama_print_system_info()``'s text in.
Also the machine's core count (:func:`physical_cores`) and the cores this process may use (:func:`usable_cores`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

#: /proc/cpuinfo flags of Intel AMX (Linux ``arch/x86`` names).
AMX_CPU_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "amx_complex"})
AMX_FLAGS = AMX_CPU_FLAGS
_AMX_SYSINFO_RE = re.compile(r"\bAMX(?:_INT8)?\s*=\s*1\b")
_FEATURE_RE = re.compile(r"([A-Za-z0-9_]+)\s*=\s*1\b")


def read_cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The ``flags`` of the first CPU in ``/proc/cpuinfo`` (empty where the file does not exist, e.g. macOS)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 | arm64
            return frozenset(value.split())
    return frozenset()


def cpu_name(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name (``/proc/cpuinfo``), else :func:`platform.processor`, else ``"unknown"``:
    benchmark results name the machine they were measured on."""
    import platform

    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def detect_amx(system_info: str | bytes, cpuinfo_flags: Iterable[str] = ()) -> bool:
    """Whether the CPU has Intel AMX: ``AMX_INT8 = 1`` (or ``AMX = 1``) in llama.cpp's system info string,
    or any of :data:`AMX_CPU_FLAGS` (``amx_tile``, ``amx_int8``, ...) in the kernel's CPU flags.

    ``system_info`` is ``llama_cpp.llama_print_system_info()`` (bytes or str); either source suffices,
    because llama.cpp lists AMX only when its build includes the AMX backend.
    """
    if isinstance(system_info, bytes):
        system_info = system_info.decode(errors="replace")
    if _AMX_SYSINFO_RE.search(system_info or ""):
        return True
    return bool(AMX_CPU_FLAGS & {f.lower() for f in cpuinfo_flags})


def enabled_features(system_info: str | bytes) -> list[str]:
    """Feature names llama.cpp reports as ``NAME = 1`` (``AVX2``, ``AVX512``, ``AMX_INT8``, ``OPENMP``, ...)."""
    if isinstance(system_info, bytes):
        system_info = system_info.decode(errors="replace")
    return _FEATURE_RE.findall(system_info or "")


def physical_cores() -> int:
    """Physical CPU cores (psutil), falling back to logical CPUs, at least 1."""
    import psutil

    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def cgroup_cpu_limit(cpu_max: str | Path = "/sys/fs/cgroup/cpu.max") -> int | None:
    """CPUs a cgroup v2 quota allows (``quota period`` in ``cpu.max``, rounded up), ``None`` without one."""
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        return max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):  # no file, "max" (no quota), or not cgroup v2
        return None


def usable_cores() -> int:
    """The cores this process may run threads on: physical cores, but no more than the CPUs its affinity
    mask allows (``taskset``) or its cgroup's quota gives (a container's ``--cpus``), at least 1."""
    cores = physical_cores()
    if hasattr(os, "sched_getaffinity"):
        cores = min(cores, len(os.sched_getaffinity(0)) or cores)
    limit = cgroup_cpu_limit()
    return max(1, min(cores, limit) if limit else cores)
