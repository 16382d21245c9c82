"""Which chatphase engines are running on this machine, so a measurement of the machine's peaks can
wait for them (an engine's OpenMP workers spin after each turn and halve a bandwidth test beside them).

Each process that holds a loaded llama.cpp engine writes a file named after its pid, holding the
process's start time, into :func:`registry_dir` (in :func:`chatphase.system.paths.runtime_dir`), and removes it on close. A file whose process is gone (a SIGKILL leaves one) or
whose pid now belongs to another process (the start time differs) is ignored and removed.

Only a *busy* engine matters to a measurement: one that uses at least :data:`IDLE_CORES` of CPU (its
threads together, user + system time) over a window. An engine waiting for a turn (the chat TUI's own,
while a sweep runs from its Experiments screen) uses next to none, cannot lower a peak, and is not
waited for nor named.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from chatphase.system.paths import runtime_dir


def registry_dir() -> Path:
    """``engines`` in :func:`chatphase.system.paths.runtime_dir` (``$CHATPHASE_RUNTIME_DIR``)."""
    return runtime_dir() / "engines"


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def register(pid: int | None = None) -> Path | None:
    """Record that process ``pid`` (default: this one) runs an engine; returns the file, or ``None``
    when the directory cannot be written (the registry is advisory: an engine still runs)."""
    pid = os.getpid() if pid is None else pid
    started = _start_time(pid)
    try:
        d = registry_dir()
        d.mkdir(parents=True, exist_ok=True)
        path = d / str(pid)
        path.write_text(f"{started!r}\n", encoding="utf-8")
        return path
    except OSError:
        return None


def unregister(pid: int | None = None) -> None:
    """Remove ``pid``'s record (default: this process). Idempotent."""
    try:
        (registry_dir() / str(os.getpid() if pid is None else pid)).unlink()
    except OSError:
        pass


def running_engines(exclude: Iterable[int] = ()) -> list[int]:
    """Pids of the chatphase engines running now (stale records removed), ``exclude`` left out."""
    skip = set(exclude)
    try:
        entries = list(registry_dir().iterdir())
    except OSError:
        return []
    pids = []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            recorded = float(entry.read_text(encoding="utf-8").strip() or "nan")
        except (OSError, ValueError):
            recorded = float("nan")
        started = _start_time(pid)
        if started is None or abs(started - recorded) > 1.0:  # gone, or the pid was reused
            try:
                entry.unlink()
            except OSError:
                pass
            continue
        if pid not in skip:
            pids.append(pid)
    return sorted(pids)


#: below this average CPU use (cores) an engine is idle: it cannot lower a measurement beside it.
IDLE_CORES = 0.1
#: the window over which :func:`busy_engines_now` averages an engine's CPU use (seconds; /proc counts
#: CPU time in 10 ms ticks, so an idle engine's rare tick stays under :data:`IDLE_CORES`).
BUSY_WINDOW_S = 0.25


def engine_cpu_s(exclude: Iterable[int] = ()) -> dict[int, float]:
    """``{pid: CPU seconds used so far}`` (user + system, all threads) of the chatphase engines running now."""
    used = {}
    for pid in running_engines(exclude):
        try:
            t = psutil.Process(pid).cpu_times()
        except (psutil.Error, OSError):
            continue  # ended meanwhile
        used[pid] = t.user + t.system
    return used


def busy_engines(before: dict[int, float], elapsed_s: float, exclude: Iterable[int] = ()) -> list[int]:
    """The engines that used at least :data:`IDLE_CORES` on average since ``before`` (an
    :func:`engine_cpu_s` snapshot taken ``elapsed_s`` seconds ago), and any that started since (a model
    load is busy); engines that ended since are left out."""
    now = engine_cpu_s(exclude)
    return sorted(pid for pid, used in now.items() if pid not in before or used - before[pid] >= IDLE_CORES * elapsed_s)


def busy_engines_now(exclude: Iterable[int] = (), window_s: float = BUSY_WINDOW_S) -> list[int]:
    """The chatphase engines busy over the next ``window_s`` seconds (returns at once when none runs)."""
    before = engine_cpu_s(exclude)
    if not before:
        return []
    t = time.monotonic()
    time.sleep(window_s)
    return busy_engines(before, time.monotonic() - t, exclude)


def wait_until_quiet(timeout_s: float, exclude: Iterable[int] = ()) -> tuple[float, list[int]]:
    """Wait up to ``timeout_s`` seconds until no other chatphase engine is busy (each has ended or is
    idle; see the module docstring).

    Returns ``(seconds waited, pids still busy)`` (``[]`` when none is).
    """
    skip = tuple(exclude)
    t0 = time.monotonic()
    while True:
        busy = busy_engines_now(skip)
        waited = time.monotonic() - t0
        if not busy or waited >= timeout_s:
            return waited, busy
