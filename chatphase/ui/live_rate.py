"""Live decode tokens/s: a label and Textual's ``Sparkline`` of the recent rate samples.

:meth:`LiveRate.push` only records a sample; a timer repaints at most :data:`REFRESH_HZ` times a second
when something changed, so however often the app reports a rate, the UI cost stays bounded. Repaints never
ask for a screen layout pass: Textual lays out the whole screen then, a cost that grows with the chat log.
"""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Label, Sparkline

#: repaints per second at most.
REFRESH_HZ = 4
#: rate samples kept (the sparkline's history).
HISTORY = 120


class LiveRate(Widget):
    """``decode 48.2 tok/s`` and a sparkline of the last :data:`HISTORY` samples (tokens/s)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.samples: deque[float] = deque(maxlen=HISTORY)
        self._dirty = False

    def compose(self) -> ComposeResult:
        yield Label("decode – tok/s", id="live-rate-label")
        yield Sparkline([], id="live-rate-sparkline")

    def on_mount(self) -> None:
        self.set_interval(1 / REFRESH_HZ, self._flush)

    def push(self, tokens_per_s: float) -> None:
        """Record one live decode-rate sample (tokens/s); non-finite or negative values are ignored."""
        if tokens_per_s >= 0 and tokens_per_s != float("inf"):
            self.samples.append(float(tokens_per_s))
            self._dirty = True

    def clear(self) -> None:
        """Forget the samples (new chat)."""
        self.samples.clear()
        self._dirty = True
        self._flush()

    def _flush(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        last = f"{self.samples[-1]:.1f}" if self.samples else "–"
        # fixed-size label (dashboard.tcss): repaint only, no screen layout pass (whose cost grows with the chat log)
        self.query_one("#live-rate-label", Label).update(f"decode {last} tok/s", layout=False)
        self.query_one("#live-rate-sparkline", Sparkline).data = list(self.samples)
