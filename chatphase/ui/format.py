"""Short, unit-bearing text for the numbers the TUI shows (``None`` -> an em dash).

Bytes use decimal units (kB, MB, GB: :func:`rich.filesize.decimal`), as llama.cpp's "MiB" figures are
converted for display only; times are ms below 10 s and s above; rates are tokens per second.
"""

from __future__ import annotations

from rich.filesize import decimal

DASH = "—"


def fmt_ms(ms: float | None) -> str:
    """``412 ms``, ``9.87 s``, ``12.3 s``; ``—`` for ``None``."""
    if ms is None:
        return DASH
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 10_000:
        return f"{ms:,.0f} ms"
    return f"{ms / 1000:.1f} s"


def fmt_rate(per_s: float | None) -> str:
    """``48.2 tok/s`` (``1,234 tok/s`` above 1000); ``—`` for ``None``."""
    if per_s is None:
        return DASH
    return f"{per_s:,.0f} tok/s" if per_s >= 1000 else f"{per_s:.1f} tok/s"


def fmt_bytes(n: int | None) -> str:
    """Decimal size, e.g. ``94.4 MB``; ``—`` for ``None``."""
    return DASH if n is None else decimal(n, precision=1)


def fmt_int(n: int | None) -> str:
    """Thousands-separated integer; ``—`` for ``None``."""
    return DASH if n is None else f"{n:,}"


def fmt_params(n: int) -> str:
    """Parameter count in M or B, e.g. ``135M``, ``1.5B``."""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
