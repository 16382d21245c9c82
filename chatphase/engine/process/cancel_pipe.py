"""Cancel across a process boundary over a pipe, without named semaphores.

A ``multiprocessing.Event`` is a lock, a condition and a semaphore, each a named POSIX semaphore that
the resource tracker registers; when the UI process is killed, the tracker outlives it and prints
"leaked semaphore objects" warnings on the user's shell. A pipe needs none of that: the parent writes
the sequence number of the turn to cancel (:class:`CancelSender`), the child's :class:`CancelFlag`
reads whatever has arrived each time it is asked (a non-blocking ``poll``, a microsecond) and is set
while the cancelled number is at least the one of the turn it runs. A cancel that arrives late, for a
turn already over, so never touches the next one, and no ``clear()`` has to cross the pipe.
"""

from __future__ import annotations

import struct
import threading
from multiprocessing.connection import Connection

_SEQ = struct.Struct("<q")
#: cancels every turn, now and later (the engine is closing).
ALL = 2**62


class CancelSender:
    """Parent side: :meth:`cancel` asks the child to stop turn ``seq`` (and any earlier one)."""

    def __init__(self, conn: Connection[bytes, object]) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def cancel(self, seq: int) -> None:
        """Send the request (thread-safe; a child that is gone is ignored)."""
        with self._lock:
            try:
                self._conn.send_bytes(_SEQ.pack(seq))
            except (BrokenPipeError, OSError, ValueError):
                pass

    def close(self) -> None:
        self._conn.close()


class CancelFlag:
    """Child side, with the ``is_set()`` / ``set()`` / ``clear()`` of a ``threading.Event`` as the engine
    uses it; :meth:`begin` says which turn now runs."""

    def __init__(self, conn: Connection[object, bytes]) -> None:
        self._conn = conn
        self._cancelled = -1
        self._running = 0
        self._local = False

    def begin(self, seq: int) -> None:
        """Turn ``seq`` starts: it is cancelled only by a request for ``seq`` or later."""
        self._running, self._local = seq, False

    def is_set(self) -> bool:
        try:
            while self._conn.poll(0):
                self._cancelled = max(self._cancelled, _SEQ.unpack(self._conn.recv_bytes())[0])
        except (EOFError, OSError):  # the parent is gone: stop whatever runs
            self._cancelled = ALL
        return self._local or self._cancelled >= self._running

    def set(self) -> None:
        self._local = True

    def clear(self) -> None:
        self._local = False
