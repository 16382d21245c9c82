"""A child process with a message pipe and a cancel pipe: what the engine host and the bench's jobs share.

Parent side, :class:`Child`: the child is started with the ``spawn`` method (the UI process has threads;
``fork`` would copy them half-way); its messages come back over a ``multiprocessing`` pipe, read with a
0.1 s poll that notices the child's death (what it sent before dying is still read); cancel travels on a
second pipe (:mod:`chatphase.engine.process.cancel_pipe`: no ``multiprocessing`` lock or event, so no named
semaphore the resource tracker would report as leaked when the UI process is killed). Ending it is polite
first, then by force.

Child side: :func:`quiet` points fds 1/2 at the engine log (llama.cpp writes there; a Textual screen must
not be drawn over) and leaves Ctrl+C to the UI; :func:`reporting` turns an unexpected exception into one
message for the parent, the traceback left to the log.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import signal
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Generic, TypeVar

from chatphase.engine.process.cancel_pipe import ALL, CancelSender

SendT = TypeVar("SendT")
RecvT = TypeVar("RecvT")


def exit_reason(exitcode: int | None) -> str:
    """A child's ``exitcode`` in words: the signal's name (``SIGSEGV``) or ``exit code N``."""
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class Child(Generic[SendT, RecvT]):
    """A started child process running ``target(conn, cancel_conn, *args)``; the parent sends it ``SendT``
    messages and receives ``RecvT`` ones.

    Args:
        target: a module-level function (picklable); ``conn`` is its end of the message pipe,
            ``cancel_conn`` the read end of the cancel pipe
            (:class:`~chatphase.engine.process.cancel_pipe.CancelFlag` reads it).
        args: the rest of its arguments (picklable). name: the process's name.
        duplex: the parent sends on the message pipe too (commands), not only receives.
    """

    def __init__(self, target: Callable[..., None], args: tuple[object, ...], *, name: str, duplex: bool) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=duplex)
        cancel_in, cancel_out = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=target, name=name, daemon=True, args=(child, cancel_in, *args))
        self._proc.start()
        child.close()
        cancel_in.close()
        self._conn: Connection[SendT, RecvT] = parent
        self._cancel = CancelSender(cancel_out)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def is_alive(self) -> bool:
        return self._proc.is_alive()

    def send(self, message: SendT) -> None:
        """Send ``message`` to the child. Raises ``BrokenPipeError``/``OSError`` when it is gone."""
        self._conn.send(message)

    def cancel(self, seq: int = ALL) -> None:
        """Ask the child to cancel its run number ``seq`` (or any run, :data:`ALL`)."""
        self._cancel.cancel(seq)

    def messages(self) -> Iterator[RecvT]:
        """Yield what the child sends, in order, until it ends (what it sent before it died included); the
        caller stops reading at the message that ends its exchange."""
        conn, proc = self._conn, self._proc
        while True:
            try:
                if conn.poll(0.1):
                    yield conn.recv()
                    continue
            except (EOFError, OSError):
                pass
            if not proc.is_alive():
                try:
                    while conn.poll(0):
                        yield conn.recv()
                except (EOFError, OSError):
                    pass
                return

    def wait(self) -> None:
        """Block until the child ends (on the process's sentinel: no wake-ups)."""
        mp.connection.wait([self._proc.sentinel])

    def reap(self) -> None:
        """Collect an ended child's exit status, so that :meth:`exit_reason` knows it (waits up to 1 s)."""
        self._proc.join(1.0)

    def exit_reason(self) -> str:
        """How the child ended, in words (:func:`exit_reason`)."""
        return exit_reason(self._proc.exitcode)

    def stop(self, polite_s: float, farewell: SendT | None = None) -> None:
        """Cancel whatever runs, send ``farewell`` (if any) on the message pipe, wait ``polite_s`` seconds for
        the child to end, then kill it; close both pipes."""
        self._cancel.cancel(ALL)
        if farewell is not None:
            try:
                self._conn.send(farewell)
            except (BrokenPipeError, OSError):
                pass
        self._proc.join(polite_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(2.0)
        self._conn.close()
        self._cancel.close()


def quiet(log_path: str | Path | None) -> str | Path:
    """In the child, first: fds 1/2 to ``log_path`` (default :func:`~chatphase.engine.logfile.default_log_path`),
    Ctrl+C ignored (it belongs to the UI, which cancels and closes us). Returns the log's path."""
    from chatphase.engine.logfile import default_log_path, redirect_stdio

    log_path = log_path or default_log_path()
    redirect_stdio(log_path)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return log_path


@contextmanager
def reporting(conn: Connection[RecvT, object], failure: Callable[[BaseException], RecvT]) -> Iterator[None]:
    """In the child, around its work: a parent gone away (a broken pipe) ends it quietly; any other exception
    prints its traceback to fd 2 (the engine log) and sends ``failure(exc)`` (the words for the user)."""
    try:
        yield
    except (BrokenPipeError, EOFError):
        pass  # the parent went away
    except Exception as exc:
        traceback.print_exc()
        try:
            conn.send(failure(exc))
        except Exception:
            pass
