"""How long the engine's thread was blocked: neither on a CPU nor waiting for one.

With llama.cpp's RPC backend the thread that runs ``llama_decode`` sends each remote device its part of the graph
and then blocks in ``recv`` until the device answers: that wait is the network's share of the phase (the round
trips, the transfers, and the remote devices' compute). A local phase computes or spins on its threads, so the
thread hardly blocks (a local decode measured here: under 1 % of its time). The kernel counts, per thread, the
time it ran and the time it waited in a run queue (``/proc/thread-self/schedstat``, Linux); what the wall clock
adds to those two is the time it was blocked — so a busy machine's preemption is not counted as network.
Elsewhere, or where the file cannot be read, the figures are ``None``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

SCHEDSTAT = "/proc/thread-self/schedstat"


def thread_sample() -> tuple[int, int, int] | None:
    """``(wall ns, on-CPU ns, run-queue ns)`` of the calling thread now (``None``: not measurable here)."""
    try:
        with open(SCHEDSTAT, encoding="ascii") as f:
            run_ns, queue_ns, _ = f.read().split()
        return time.perf_counter_ns(), int(run_ns), int(queue_ns)
    except (OSError, ValueError):
        return None


def blocked_ms(a: tuple[int, int, int] | None, b: tuple[int, int, int] | None) -> float | None:
    """Milliseconds the thread was blocked between samples ``a`` and ``b`` (``None`` without both); never
    below 0 (the counters and the clock are read a few µs apart)."""
    if a is None or b is None:
        return None
    wall, run, queue = (y - x for x, y in zip(a, b, strict=True))
    return max(0, wall - run - queue) / 1e6


class PhaseWaits:
    """The engine thread's blocked time in a turn's prefill (from :meth:`start` to the first :meth:`mark`) and
    decode (from the first mark to the last): call :meth:`start` as the prefill starts and :meth:`mark` after
    each token (or speculative step), on the thread that evaluates."""

    def __init__(self) -> None:
        self._start: tuple[int, int, int] | None = None
        self._first: tuple[int, int, int] | None = None
        self._last: tuple[int, int, int] | None = None

    def start(self) -> None:
        self._start, self._first, self._last = thread_sample(), None, None

    def mark(self, *_: object) -> None:
        sample = thread_sample()
        if self._first is None:
            self._first = sample
        self._last = sample

    def before(self, call: Callable[..., None]) -> Callable[..., None]:
        """``call`` (the per-token hook: the thread policy's) with :meth:`mark` first."""

        def marked(*args: Any) -> None:
            self.mark()
            call(*args)

        return marked

    def prefill_ms(self) -> float | None:
        return blocked_ms(self._start, self._first)

    def decode_ms(self) -> float | None:
        return None if self._first is self._last else blocked_ms(self._first, self._last)
