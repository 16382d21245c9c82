"""Human-readable figures, shared by the CLI and the TUI (binary units for bytes, as llama.cpp prints)."""

from __future__ import annotations


def fmt_bytes(n: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; ``None`` -> ``"–"``."""
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def fmt_ms(ms: float | None) -> str:
    """Milliseconds with sensible precision; ``None`` -> ``"–"``."""
    if ms is None:
        return "–"
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:,.0f} ms"


def fmt_rate(tokens_per_s: float | None) -> str:
    """Tokens per second; ``None`` (undefined) -> ``"–"``."""
    return "–" if tokens_per_s is None else f"{tokens_per_s:,.1f} tok/s"
