"""Python's full garbage collections moved out of the UI's frames into its pauses.

A full collection walks every object the collector tracks that is not frozen (the app freezes its start-up objects,
``chatphase/ui/app.py``); what a screen of Textual keeps (its drawn lines, each with its caches) is some 30,000
objects, 15–45 ms of one core on the benchmark's machine, and Python starts one whenever a quarter of that many have
survived two younger collections, often in the middle of a frame: a key's frame of ~10 ms then blocks the UI 50 ms
and more (``benchmarks/token_view.py``). :class:`IdleCollector` raises the threshold of the oldest generation so that
Python itself runs one only as a safety net, and runs one when no key or mouse input came for :data:`IDLE_S`. The
younger generations, where most cycles die, are collected as before.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

#: no input for this long: the user is reading, a collection now delays nothing they wait for
IDLE_S = 1.0
#: how often the app asks whether to collect (s)
CHECK_S = 2.0
#: the oldest generation's threshold while the collector is on: Python's own full collection after this many
#: collections of the middle generation (default 10; ~70,000 objects allocated and kept per collection of it)
SAFETY_THRESHOLD = 1000


class IdleCollector:
    """Full collections in the UI's pauses: :meth:`start` raises the oldest generation's threshold, :meth:`input`
    is told of each key or mouse event, :meth:`check` (every :data:`CHECK_S`) collects when there was no input for
    :data:`IDLE_S` and the middle generation was collected as often since the last full collection as Python's
    own threshold asks before one (``gc.get_count()[2]``: only its collections move objects to the oldest);
    :meth:`stop` puts Python's threshold back. ``clock`` (s) and ``collect`` are injectable."""

    def __init__(
        self,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
        collect: Callable[[int], int] = gc.collect,
    ) -> None:
        self.idle_s = idle_s
        self._clock, self._collect = clock, collect
        self._input_at = clock()
        self._saved: tuple[int, int, int] | None = None
        self._due = gc.get_threshold()[2]  # Python's threshold of the oldest generation, before start()
        self.collections = 0  # the full collections it ran

    def start(self) -> None:
        if self._saved is None:
            self._saved = gc.get_threshold()
            self._due = self._saved[2]
            gc.set_threshold(self._saved[0], self._saved[1], max(self._saved[2], SAFETY_THRESHOLD))

    def stop(self) -> None:
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None

    def input(self) -> None:
        self._input_at = self._clock()

    def check(self) -> bool:
        """Collect now if the user is idle and something may be waiting; whether it did."""
        if self._clock() - self._input_at < self.idle_s or gc.get_count()[2] < self._due:
            return False
        self._collect(2)
        self.collections += 1
        return True
