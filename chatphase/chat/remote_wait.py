"""The words for the time a turn waited on RPC devices (``TurnMetrics.remote_wait_prefill_ms`` /
``remote_wait_decode_ms``, measured by the engine: :mod:`chatphase.engine.local.thread_clock`): the turn
detail's rows and ``ask``'s words, one place."""

from __future__ import annotations

from chatphase.engine.metrics import TurnMetrics
from chatphase.units import DASH, fmt_ms


def decode_share(m: TurnMetrics) -> float | None:
    """The part of the decode (first token to last) spent waiting on RPC devices, 0–1 (``None``: unknown)."""
    if m.remote_wait_decode_ms is None or not m.decode_ms:
        return None
    return min(1.0, m.remote_wait_decode_ms / m.decode_ms)


def remote_wait_pairs(m: TurnMetrics) -> list[tuple[str, str]]:
    """The turn detail's rows (none without RPC devices)."""
    if m.remote_wait_prefill_ms is None and m.remote_wait_decode_ms is None:
        return []
    share = decode_share(m)
    return [
        ("RPC wait prefill ms", DASH if m.remote_wait_prefill_ms is None else f"{m.remote_wait_prefill_ms:,.1f}"),
        ("RPC wait decode ms", DASH if m.remote_wait_decode_ms is None else f"{m.remote_wait_decode_ms:,.1f}"),
        ("RPC share of decode", DASH if share is None else f"{share:.0%}"),
    ]


def remote_wait_words(m: TurnMetrics) -> str:
    """``waited on RPC devices 212 ms of the TTFT, 64 % of the decode · `` (``""`` without RPC devices)."""
    if m.remote_wait_prefill_ms is None and m.remote_wait_decode_ms is None:
        return ""
    parts = []
    if m.remote_wait_prefill_ms is not None:
        parts.append(f"{fmt_ms(m.remote_wait_prefill_ms)} of the TTFT")
    if (share := decode_share(m)) is not None:
        parts.append(f"{share:.0%} of the decode")
    return f"waited on RPC devices {', '.join(parts)} · " if parts else ""
