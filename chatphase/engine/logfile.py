"""The engine log file: where it is, its rotation, and pointing a process's fds 1 and 2 at it.

No llama.cpp here (its callback is :mod:`chatphase.engine.llamalog`): the UI process names the log and
appends tracebacks to it, and must not load libllama to do so. The file is shared by every engine
process; before a process appends to it, a file over :data:`LOG_CAP_BYTES` is rotated (``engine.log`` ->
``engine.log.1`` -> ``engine.log.2``, the oldest dropped), so the log stays under about three caps.
"""

from __future__ import annotations

import os
from pathlib import Path

from chatphase.system.paths import log_dir

#: a log file larger than this is rotated when the next engine process starts (bytes).
LOG_CAP_BYTES = 2 * 2**20
#: rotated files kept beside the log (``engine.log.1`` … ``.N``).
LOG_KEEP = 2


def default_log_path() -> Path:
    """``engine.log`` in :func:`chatphase.system.paths.log_dir` (``$CHATPHASE_LOG_DIR``)."""
    return log_dir() / "engine.log"


def rotate_log(path: str | os.PathLike[str], cap_bytes: int = LOG_CAP_BYTES, keep: int = LOG_KEEP) -> bool:
    """Rotate ``path`` when it is larger than ``cap_bytes``: ``.N-1`` -> ``.N`` … ``path`` -> ``.1``
    (the oldest dropped). Returns whether it rotated. A process that still holds the old file open
    keeps writing to it under its new name, which is fine for a log."""
    p = Path(path)
    try:
        if p.stat().st_size <= cap_bytes:
            return False
        for n in range(keep, 0, -1):
            older = p.with_name(f"{p.name}.{n}")
            newer = p.with_name(f"{p.name}.{n - 1}") if n > 1 else p
            if newer.exists():
                os.replace(newer, older)
        return True
    except OSError:  # another process rotated it first, or the directory is read-only: keep appending
        return False


def redirect_stdio(path: str | os.PathLike[str]) -> None:
    """Point this process's fds 1 and 2 at the log ``path`` (appending, rotated first), so that what
    llama.cpp or a crash prints never reaches the terminal (engine and bench child processes)."""
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    rotate_log(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
