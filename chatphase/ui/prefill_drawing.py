"""Drawing the prefill: its start, progress and notes, from the app's redraw tick, not per event.

Mixin for :class:`~chatphase.ui.app.ChatPhaseApp`: the ``PrefillBegan``/``PrefillAdvanced`` handlers only
record the events; :meth:`PrefillDrawing._draw_prefill` draws them in the phase indicator and the side
panel (and shows the context-trimmed and cache-reuse notes) when the app's tick calls it, and once more
at the first token. With no core to spare, a prefill younger than :data:`PREFILL_QUIET_S` is not drawn:
the paint would run on a core the engine evaluates the prompt on, and lengthen the very pause it shows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from chatphase.engine.events import PrefillProgress, PrefillStarted
from chatphase.ui import messages as msg

#: with no core to spare, a prefill shows its progress once it has run this long (seconds).
PREFILL_QUIET_S = 0.25


@dataclass
class _Prefill:
    """The running turn's prefill: its start event, latest progress, and what of it is drawn."""

    began: PrefillStarted
    t_began: float
    progress: PrefillProgress | None = None
    dirty: bool = True
    began_drawn: bool = False


class PrefillDrawing:
    """Mixin: records the prefill's events and draws them at a bounded rate (see the module docstring).

    Uses the app's ``indicator``, ``panel``, ``notify``, ``_current``, ``_tick_stride``, ``_reuse_note``
    and ``_prefill`` (a :class:`_Prefill` or ``None``).
    """

    def on_prefill_began(self, message: msg.PrefillBegan) -> None:
        ev = message.event
        if self._current(ev.turn_id):
            self._prefill = _Prefill(ev, time.monotonic())  # drawn by _draw_prefill

    def on_prefill_advanced(self, message: msg.PrefillAdvanced) -> None:
        ev = message.event
        if self._current(ev.turn_id) and self._prefill is not None:
            self._prefill.progress, self._prefill.dirty = ev, True

    def _draw_prefill(self, now: float | None = None) -> None:
        """Draw the prefill's start and latest progress, if not drawn yet.

        Called from the redraw tick (``now``: the tick's clock) and, with ``now=None``, at the first
        token. With no core to spare, a prefill younger than ``PREFILL_QUIET_S`` is not drawn by the tick:
        the paint would run on a core the engine is evaluating the prompt on, and lengthen the pause.
        """
        p = self._prefill
        if p is None or not p.dirty:
            return
        if not self._current(p.began.turn_id):  # the turn ended or was abandoned during its prefill
            self._prefill = None
            return
        if now is not None and self._tick_stride > 1 and now - p.t_began < PREFILL_QUIET_S:
            return
        p.dirty = False
        ev = p.began
        if not p.began_drawn:
            p.began_drawn = True
            self.indicator.prefill_started(ev)
            self.panel.turn_started(ev.turn_id, ev)
            if ev.dropped_messages:
                self.notify(
                    f"The context is full: the {ev.dropped_messages} oldest message(s) were left out of "
                    "the prompt (system prompt kept).",
                    title="Context trimmed",
                    severity="warning",
                )
            if self._reuse_note and ev.prompt_tokens is not None:
                self.notify(
                    f"{ev.cached_tokens:,} of {ev.prompt_tokens:,} prompt tokens reused from the KV cache; "
                    f"{ev.prefill_tokens:,} to evaluate.",
                    title=self._reuse_note,
                )
                self._reuse_note = None
        if p.progress is not None:
            self.indicator.prefill_progress(p.progress)
            self.panel.prefill_progress(p.progress.done_tokens, p.progress.total_tokens, p.progress.elapsed_ms)
