"""KV cache gauge: tokens and bytes used against n_ctx, and when the conversation will fill it.

The forecast itself is pure (:func:`chatphase.timing.forecast.forecast_kv`); this widget shows it with Textual's
``ProgressBar`` and one line of text.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Label, ProgressBar

from chatphase.chat.overflow import OVERFLOW_AHEAD
from chatphase.engine.overflow import DEFAULT_OVERFLOW
from chatphase.timing.forecast import KvForecast
from chatphase.units import fmt_bytes


def forecast_text(
    f: KvForecast,
    kv_bytes_per_token: int,
    kv_capacity_bytes: int | None,
    usage: bool = True,
    overflow: str = DEFAULT_OVERFLOW,
) -> str:
    """``KV 1,234/4,096 tok · 27.1 MiB/90.0 MiB · ~9 turns left at +137 tok/turn``; when the next turn may not
    fit, what the ``overflow`` policy will then do (:data:`chatphase.chat.overflow.OVERFLOW_AHEAD`).

    Used bytes = used tokens × ``kv_bytes_per_token``; capacity = ``kv_capacity_bytes``, the cache llama.cpp
    allocated (n_ctx padded to 256 cells, :func:`chatphase.models.kv.kv_capacity_bytes`). With
    ``usage=False`` only the forecast is given (``KV forecast: ~9 turns left …``).
    """
    if usage:
        used_b = fmt_bytes(f.used_tokens * kv_bytes_per_token)
        cap_b = fmt_bytes(kv_capacity_bytes)
        text = f"KV {f.used_tokens:,}/{f.n_ctx:,} tok · {used_b}/{cap_b}"
    else:
        text = "KV forecast:"
    sep = " · " if usage else " "
    if f.growth_tokens_per_turn is None:
        return text if usage else f"{text} after the first turn"
    if f.turns_left == 0:
        return f"{text}{sep}the next turn may not fit: {OVERFLOW_AHEAD[overflow]}"
    if f.turns_left is None:
        return f"{text}{sep}not growing"
    turns = "turn" if f.turns_left == 1 else "turns"
    return f"{text}{sep}~{f.turns_left} {turns} left at +{f.growth_tokens_per_turn:,.0f} tok/turn"


class KvGauge(Widget):
    """A bar of KV cache use and the forecast line; call :meth:`update_forecast` after each turn."""

    DEFAULT_CSS = """
    KvGauge { height: auto; }
    KvGauge #kv-bar {
        height: 1;
        width: 1fr;
    }
    KvGauge #kv-bar Bar { width: 1fr; }
    KvGauge #kv-text {
        width: 1fr;
        color: $text-muted;
    }
    """

    def compose(self) -> ComposeResult:
        yield ProgressBar(total=1, show_eta=False, id="kv-bar")
        yield Label("KV – (no model)", id="kv-text")

    def update_forecast(
        self,
        forecast: KvForecast,
        kv_bytes_per_token: int,
        kv_capacity_bytes: int | None,
        usage: bool = True,
        overflow: str = DEFAULT_OVERFLOW,
    ) -> None:
        """Show ``forecast``; text as in :func:`forecast_text`."""
        self.query_one("#kv-bar", ProgressBar).update(total=forecast.n_ctx, progress=forecast.used_tokens)
        text = forecast_text(forecast, kv_bytes_per_token, kv_capacity_bytes, usage, overflow)
        self.query_one("#kv-text", Label).update(text)
