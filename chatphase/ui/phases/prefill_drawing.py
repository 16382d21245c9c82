"""Drawing the prefill: its start and progress, from the app's redraw tick, not per event.

The chat view records the prefill's events here (:meth:`PrefillDrawing.began`, :meth:`advanced`);
:meth:`PrefillDrawing.draw` draws them in the phase indicator and the side panel when the tick calls it,
and once more at the first token. With no core to spare (:meth:`PrefillDrawing.spare_core`), a prefill
younger than :data:`PREFILL_QUIET_S` is not drawn: the paint would run on a core the engine evaluates the prompt on, and lengthen
the very pause it shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from chatphase.engine.events import PrefillProgress, PrefillStarted
from chatphase.ui.phases.indicator import PhaseIndicator
from chatphase.ui.phases.panel import PhasePanel

#: with no core to spare, a prefill shows its progress once it has run this long (seconds).
PREFILL_QUIET_S = 0.25


@dataclass
class _Prefill:
    """The running turn's prefill: its number, start event, latest progress, and what of it is drawn."""

    number: int
    began: PrefillStarted
    t_began: float
    progress: PrefillProgress | None = None
    dirty: bool = True
    began_drawn: bool = False
    left_ms: Callable[[], float | None] = lambda: None


class PrefillDrawing:
    """Records a turn's prefill and draws it at a bounded rate (see the module docstring)."""

    def __init__(self, indicator: PhaseIndicator, panel: PhasePanel) -> None:
        self.indicator = indicator
        self.panel = panel
        self.quiet_s = 0.0
        self._prefill: _Prefill | None = None

    @property
    def waiting(self) -> bool:
        """Whether a prefill has begun that is not drawn yet."""
        return self._prefill is not None and not self._prefill.began_drawn

    @property
    def progress(self) -> PrefillProgress | None:
        """The newest progress recorded (drawn or not)."""
        return self._prefill.progress if self._prefill is not None else None

    def began(self, number: int, event: PrefillStarted, left_ms: Callable[[], float | None] | None = None) -> None:
        """``left_ms``: the predicted time to the first token now (``Turn.ttft_left_ms``), drawn with the bar."""
        self._prefill = _Prefill(number, event, time.monotonic())
        if left_ms is not None:
            self._prefill.left_ms = left_ms

    def advanced(self, event: PrefillProgress) -> None:
        if self._prefill is not None:
            self._prefill.progress, self._prefill.dirty = event, True

    def spare_core(self, spare: bool) -> None:
        """Whether the engine leaves a core for the UI (no quiet period then)."""
        self.quiet_s = 0.0 if spare else PREFILL_QUIET_S

    def clear(self) -> None:
        """The prefill is over (the first token came, or the turn ended)."""
        self._prefill = None

    def draw(self, now: float | None = None) -> bool:
        """Draw the prefill's start and latest progress, if not drawn yet; returns whether its start
        is drawn now (so the notices that go with it may be shown).

        ``now``: the tick's clock; ``None`` (at the first token) draws whatever the quiet period held back.
        """
        p = self._prefill
        if p is None or not p.dirty:
            return p is not None
        if now is not None and self.quiet_s and now - p.t_began < self.quiet_s:
            return False
        p.dirty = False
        if not p.began_drawn:
            p.began_drawn = True
            self.indicator.prefill_started(p.began, p.left_ms())
            self.panel.turn_started(p.number, p.began)
        if p.progress is not None:
            self.indicator.prefill_progress(p.progress, p.left_ms())
            self.panel.prefill_progress(p.progress.done_tokens, p.progress.total_tokens, p.progress.elapsed_ms)
        return True
