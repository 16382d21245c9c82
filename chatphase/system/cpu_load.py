"""CPU that other processes use, in cores, for the engine's thread policy (:mod:`chatphase.engine.threads.policy`).

"Other" is the whole machine's busy CPU time (``/proc/stat`` via ``psutil.cpu_times()``: user, nice,
system, irq, softirq and steal — a vCPU the hypervisor takes away is as lost as one another process
uses) minus the CPU time of the processes named in ``exclude_pids`` (chatphase's own: the engine and
the process that started it, whose UI work is budgeted separately), divided by the wall time between
two samples. One sample is three small ``/proc`` reads (about 0.06 ms), so the engine takes one per turn
and, while decoding with fewer threads than cores, at most one every 0.25 s — never one per token.

So that a sample before a turn tells the load of the last second or so, not the average over a long
idle time (a compile that ended a minute ago, or began a second ago), :meth:`OtherCpuLoad.tick` records
a snapshot without estimating anything; the engine's child process calls it once a second while it
waits for a turn, and a sample measures from the newest snapshot at least ``min_window_s`` old.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable

import psutil


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot, summed over CPUs."""
    t = psutil.cpu_times()
    busy = t.user + t.system
    for name in ("nice", "irq", "softirq", "steal"):  # Linux fields; guest time is already in user
        busy += getattr(t, name, 0.0)
    return busy


class ProcessCpu:
    """User + system CPU seconds of processes by pid (their threads included), ``None`` for one that is
    gone; keeps one ``psutil.Process`` per pid, so a call is one ``/proc/<pid>/stat`` read."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process | None] = {}

    def __call__(self, pid: int) -> float | None:
        proc = self._procs.get(pid, False)
        try:
            if proc is False:
                proc = self._procs[pid] = psutil.Process(pid)
            if proc is None:
                return None
            t = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._procs[pid] = None
            return None
        return t.user + t.system


class OtherCpuLoad:
    """Cores used by processes other than ``exclude_pids``, averaged between successive samples.

    Args:
        exclude_pids: processes whose CPU is not "other" (default: this process and its parent).
        min_window_s: the shortest window a sample measures; with no snapshot that old it returns the
            last estimate (the kernel counts CPU time in 10 ms ticks: ±0.04 cores over 0.25 s on 2 CPUs).
            The first sample takes a quarter of that, so that a turn right after loading (``ask``) has
            a coarse figure rather than none.
        keep: snapshots kept for the next sample's window.
        clock, busy_s, process_s: injectable for tests (seconds; :func:`machine_busy_s`,
            :class:`ProcessCpu`).
    """

    def __init__(
        self,
        exclude_pids: Iterable[int] | None = None,
        min_window_s: float = 0.25,
        keep: int = 4,
        clock: Callable[[], float] = time.monotonic,
        busy_s: Callable[[], float] = machine_busy_s,
        process_s: Callable[[int], float | None] | None = None,
    ) -> None:
        pids = (os.getpid(), os.getppid()) if exclude_pids is None else exclude_pids
        self.exclude_pids = tuple(dict.fromkeys(p for p in pids if p and p > 0))
        self.min_window_s = min_window_s
        self._clock, self._busy_s, self._process_s = clock, busy_s, process_s or ProcessCpu()
        self._snaps: deque[tuple[float, float, dict[int, float]]] = deque(maxlen=max(2, keep))
        self.estimate: float | None = None
        self.tick()

    def _own(self) -> dict[int, float]:
        out = {}
        for pid in self.exclude_pids:
            seconds = self._process_s(pid)
            if seconds is not None:
                out[pid] = seconds
        return out

    def tick(self) -> None:
        """Record a snapshot, so that the next sample's window starts no earlier than this."""
        self._snaps.append((self._clock(), self._busy_s(), self._own()))

    def sample(self) -> float | None:
        """Cores (≥ 0) that other processes used from the newest snapshot at least ``min_window_s`` old
        until now; the last estimate (``None`` at first) when no snapshot is that old."""
        now = self._clock()
        shortest = self.min_window_s if self.estimate is not None else self.min_window_s / 4
        start = next((snap for snap in reversed(self._snaps) if now - snap[0] >= shortest), None)
        if start is None:
            return self.estimate
        t0, busy0, own0 = start
        busy1, own1 = self._busy_s(), self._own()
        self._snaps.append((now, busy1, own1))
        own = sum(own1[p] - own0[p] for p in own1 if p in own0)  # a process that ended is not counted
        self.estimate = max(0.0, (busy1 - busy0 - own) / (now - t0))
        return self.estimate
