"""Live decode tokens/s: a label and Textual's ``Sparkline`` of the recent rate samples.

:meth:`LiveRate.push` records a sample and repaints. Its caller (the app's redraw tick) calls it at a
bounded rate, in the same frame as the other live figures, so the sparkline costs no frame of its own.
Repaints never ask for a screen layout pass: Textual lays out the whole screen then, a cost that grows with
the chat log.
"""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Label, Sparkline

from chatphase.units import DASH

#: rate samples kept (the sparkline's history).
HISTORY = 120


class LiveRate(Widget):
    """``decode 48.2 tok/s`` and a sparkline of the last :data:`HISTORY` samples (tokens/s)."""

    DEFAULT_CSS = """
    LiveRate {
        height: 1;
        layout: horizontal;
    }
    LiveRate #live-rate-label {
        width: 20;
        color: $text-accent;
        text-style: bold;
    }
    LiveRate #live-rate-sparkline {
        width: 1fr;
        height: 1;
    }
    LiveRate #live-rate-sparkline > .sparkline--max-color { color: $success; }
    LiveRate #live-rate-sparkline > .sparkline--min-color { color: $success 30%; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.samples: deque[float] = deque(maxlen=HISTORY)

    def compose(self) -> ComposeResult:
        yield Label("decode – tok/s", id="live-rate-label")
        yield Sparkline([], id="live-rate-sparkline")

    def push(self, tokens_per_s: float) -> None:
        """Record one live decode-rate sample (tokens/s) and repaint; non-finite or negative values are
        ignored. Call it at a bounded rate (it repaints every time)."""
        if tokens_per_s >= 0 and tokens_per_s != float("inf"):
            self.samples.append(float(tokens_per_s))
            self._draw()

    def settle(self, tokens_per_s: float | None) -> None:
        """A turn is over: the label shows its decode rate (the turn table's figure, ``–`` when undefined),
        not the last live sample, which lags it or, for a short turn, was never taken."""
        self._label(tokens_per_s)

    def clear(self) -> None:
        """Forget the samples (new chat)."""
        self.samples.clear()
        self._draw()

    def _draw(self) -> None:
        self._label(self.samples[-1] if self.samples else None)
        self.query_one("#live-rate-sparkline", Sparkline).data = list(self.samples)

    def _label(self, tokens_per_s: float | None) -> None:
        rate = DASH if tokens_per_s is None else f"{tokens_per_s:.1f}"
        # fixed-size label (DEFAULT_CSS): repaint only, no screen layout pass (whose cost grows with the chat log)
        self.query_one("#live-rate-label", Label).update(f"decode {rate} tok/s", layout=False)
