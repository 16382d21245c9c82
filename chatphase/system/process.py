"""Process and system figures for the dashboard, via psutil, sampled at a bounded rate.

No Textual here: :class:`ProcessSampler` is a plain object the UI polls from a timer (and that
``ask``/``bench`` could use too). Sampling costs a few ``/proc`` reads; :meth:`ProcessSampler.sample`
returns the previous sample when called again within ``min_interval_s``, so a caller that polls too
often cannot make it cost more.

CPU % follows psutil's ``Process.cpu_percent(interval=None)``: the process's CPU time since the previous
sample divided by the wall time in between, in percent of ONE core (a process using two cores fully
reads 200 %). The first sample of a process has no previous one, so its CPU % is ``None``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class SystemSample:
    """One sample of the engine process and the system.

    ``rss_bytes`` resident set size of the process (bytes); ``cpu_percent`` percent of one core since the
    previous sample (``None`` on the first sample or without a process); ``num_threads`` OS threads of
    the process; ``process_alive`` False when the pid is gone or not readable (the process fields are
    then ``None``); ``mem_available_bytes`` / ``mem_total_bytes`` system memory (psutil
    ``virtual_memory().available`` / ``.total``); ``t_s`` the sampler clock's time of the sample (s);
    ``gpu_memory_bytes`` GPU memory the process holds (bytes; NVIDIA via NVML, see :mod:`chatphase.system.gpu`),
    ``None`` when not asked for or unknown.
    """

    pid: int | None
    process_alive: bool
    rss_bytes: int | None
    cpu_percent: float | None
    num_threads: int | None
    mem_available_bytes: int
    mem_total_bytes: int
    t_s: float
    gpu_memory_bytes: int | None = None


class ProcessSampler:
    """Samples one process (the engine's child process) and system memory, at most once per interval.

    Args:
        pid: the process to watch; ``None`` or ``<= 0`` samples system memory only
            (``LoadedModel.pid`` is 0 when an engine does not report one).
        min_interval_s: minimum seconds between real samples (default 1 s).
        clock: monotonic clock in seconds (injectable for tests).
        gpu_memory: ``pid -> bytes or None``, called once per real sample of a live process to fill
            ``gpu_memory_bytes`` (e.g. :func:`chatphase.system.gpu.gpu_memory_used_bytes`); ``None`` = not sampled.

    Raises:
        ValueError: when ``min_interval_s`` is negative.
    """

    def __init__(
        self,
        pid: int | None,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        gpu_memory: Callable[[int], int | None] | None = None,
    ) -> None:
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0 (got {min_interval_s})")
        self.pid = pid if pid and pid > 0 else None
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._gpu_memory = gpu_memory
        self._last: SystemSample | None = None
        self._proc: psutil.Process | None = None
        self._primed = False
        self._count = 0
        if self.pid is not None:
            try:
                self._proc = psutil.Process(self.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self._proc = None

    @property
    def samples_taken(self) -> int:
        """How many real (non-cached) samples were taken; for callers checking the rate bound."""
        return self._count

    def sample(self) -> SystemSample:
        """The current figures, or the previous sample if it is younger than ``min_interval_s``."""
        now = self._clock()
        if self._last is not None and now - self._last.t_s < self.min_interval_s:
            return self._last
        self._count += 1
        vm = psutil.virtual_memory()
        rss = cpu = threads = None
        alive = False
        if self._proc is not None:
            try:
                with self._proc.oneshot():
                    rss = int(self._proc.memory_info().rss)
                    raw_cpu = float(self._proc.cpu_percent(interval=None))
                    threads = int(self._proc.num_threads())
                cpu = raw_cpu if self._primed else None
                self._primed = True
                alive = self._proc.is_running()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                rss = cpu = threads = None
                alive = False
            if not alive:
                rss = cpu = threads = None
        gpu_bytes = None
        if alive and self._gpu_memory is not None and self.pid is not None:
            gpu_bytes = self._gpu_memory(self.pid)
        self._last = SystemSample(
            pid=self.pid,
            process_alive=alive,
            rss_bytes=rss,
            cpu_percent=cpu,
            num_threads=threads,
            mem_available_bytes=int(vm.available),
            mem_total_bytes=int(vm.total),
            t_s=now,
            gpu_memory_bytes=gpu_bytes,
        )
        return self._last
