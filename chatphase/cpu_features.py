"""CPU features that change how llama.cpp must be configured.

Intel AMX: llama.cpp's CPU backend registers an AMX "extra buffer type" for quantised weights, and on
these CPUs its batched prompt evaluation segfaults (llama.cpp issue #20824; the same crash was worked
around in dspy PR #10079). Turning extra buffer types off (``llama_model_params.use_extra_bufts = false``)
avoids it, so the engine detects AMX and does that unless the user overrides it.
"""

from __future__ import annotations

import re
from pathlib import Path

#: /proc/cpuinfo flags that mean the CPU has AMX tiles.
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})


def read_cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The ``flags`` of the first CPU in ``/proc/cpuinfo`` (empty where the file does not exist, e.g. macOS)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return frozenset()
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.MULTILINE)
    return frozenset(m.group(1).split()) if m else frozenset()


def detect_amx(system_info: str, cpu_flags: frozenset[str] | set[str] = frozenset()) -> bool:
    """True when llama.cpp (``llama_print_system_info()``: ``AMX_INT8 = 1``) or the CPU flags report AMX."""
    if re.search(r"\bAMX\w*\s*=\s*1", system_info):
        return True
    return bool(AMX_FLAGS & set(cpu_flags))
