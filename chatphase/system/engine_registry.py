"""Which chatphase engines are running on this machine, so a measurement of the machine's peaks can
wait for them (an engine's OpenMP workers spin after each turn and halve a bandwidth test beside them).

Each process that holds a loaded llama.cpp engine writes a file named after its pid, holding the
process's start time, into :func:`registry_dir` (``$CHATPHASE_RUNTIME_DIR`` or the platform's user
runtime directory), and removes it on close. A file whose process is gone (a SIGKILL leaves one) or
whose pid now belongs to another process (the start time differs) is ignored and removed.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

import psutil


def registry_dir() -> Path:
    """``$CHATPHASE_RUNTIME_DIR/engines`` or ``<user runtime dir>/chatphase/engines`` (platformdirs;
    the temporary directory where the platform has none)."""
    env = os.environ.get("CHATPHASE_RUNTIME_DIR")
    if env:
        return Path(env).expanduser() / "engines"
    import platformdirs

    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset, then falls back
        warnings.simplefilter("ignore")
        base = platformdirs.user_runtime_dir("chatphase")
    return Path(base or tempfile.gettempdir()) / "engines"


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


def wait_until_no_engines(
    timeout_s: float, exclude: Iterable[int] = (), poll_s: float = 0.2
) -> tuple[float, list[int]]:
    """Wait up to ``timeout_s`` seconds for every other chatphase engine to end.

    Returns ``(seconds waited, pids still running)`` (``[]`` when none runs).
    """
    skip = tuple(exclude)
    t0 = time.monotonic()
    while True:
        pids = running_engines(skip)
        waited = time.monotonic() - t0
        if not pids or waited >= timeout_s:
            return waited, pids
        time.sleep(min(poll_s, max(timeout_s - waited, 0.0)))
