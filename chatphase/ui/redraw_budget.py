"""A CPU budget for the chat log's redraws, so streaming a reply does not slow the model down.

Every hand-over of streamed text to Textual's Markdown costs a parse and a layout of the screen
(tens of ms of CPU for a long reply with code blocks at 150×45). On a machine whose cores all run the
engine's threads (n_threads = physical cores, the default), that CPU is taken from decode: the
engine's threads wait for each other at every token, so even a quarter of a core of UI work cost the
2-core development machine well over 3 % of its decode rate (``benchmarks/tui_overhead.py``).

:class:`RedrawBudget` lets a redraw run only while the UI process has used at most ``share`` of one
core since the previous redraw (process CPU time / wall time, which includes the redraw's own layout
and render), and at least every ``max_interval_s``. Cheap redraws keep the full rate; costly ones are
spaced out, so the text arrives in larger pieces instead of slowing the tokens.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

#: UI CPU share (of one core) when the engine's threads leave no core free / when one is free.
SHARE_NO_SPARE_CORE = 0.03
SHARE_SPARE_CORE = 0.5


def spare_core(engine_threads: int | None, cpu_count: int | None = None) -> bool:
    """Whether a machine of ``cpu_count`` logical CPUs (default ``os.cpu_count()``) has one left over
    when the engine runs ``engine_threads`` threads (``None``: as many as CPUs)."""
    cpus = cpu_count or os.cpu_count() or 1
    return cpus - (engine_threads or cpus) >= 1


def ui_cpu_share(engine_threads: int | None, cpu_count: int | None = None) -> float:
    """The budget for a machine of ``cpu_count`` logical CPUs (default ``os.cpu_count()``) whose engine
    runs ``engine_threads`` threads: generous when a core is spare, tight when none is."""
    return SHARE_SPARE_CORE if spare_core(engine_threads, cpu_count) else SHARE_NO_SPARE_CORE


class RedrawBudget:
    """Rate governor for one kind of redraw (see the module docstring).

    Args:
        share: CPU seconds the process may use per wall second between redraws (0..1).
        max_interval_s: a redraw is always due after this long, whatever it costs.
        clock / cpu_clock: wall and process-CPU clocks in seconds (injectable for tests).
    """

    def __init__(
        self,
        share: float,
        max_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
    ):
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.share, self.max_interval_s = share, max_interval_s
        self._clock, self._cpu_clock = clock, cpu_clock
        self.mark()

    def due(self) -> bool:
        """Whether a redraw may run now."""
        elapsed = self._clock() - self._wall
        if elapsed >= self.max_interval_s:
            return True
        return self._cpu_clock() - self._cpu <= self.share * elapsed

    def mark(self) -> None:
        """Record that a redraw ran now."""
        self._wall, self._cpu = self._clock(), self._cpu_clock()
