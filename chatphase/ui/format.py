"""Short, unit-bearing text for the TUI's numbers: the CLI's formatters of :mod:`chatphase.units`
(binary byte units, as llama.cpp prints them; ``None`` -> a dash) plus counts and parameter sizes."""

from __future__ import annotations

from chatphase.units import fmt_bytes, fmt_ms, fmt_rate

__all__ = ["DASH", "fmt_bytes", "fmt_int", "fmt_ms", "fmt_params", "fmt_rate"]

#: what an undefined figure shows (the same dash as :mod:`chatphase.units`).
DASH = "–"


def fmt_int(n: int | None) -> str:
    """Thousands-separated integer; :data:`DASH` for ``None``."""
    return DASH if n is None else f"{n:,}"


def fmt_params(n: int | None) -> str:
    """Parameter count in M or B, e.g. ``135M``, ``1.5B``."""
    if n is None:
        return DASH
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
