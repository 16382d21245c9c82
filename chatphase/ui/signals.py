"""SIGTERM and SIGHUP end the TUI as Ctrl+Q does.

Python's default for both is to die at once, which leaves the terminal in Textual's modes (the
alternate screen, mouse reporting, a hidden cursor), the session file unflushed and the engine's child
process to find out by itself. Here each becomes a quit on the event loop: the engine is cancelled and
closed, the app exits (Textual restores the terminal, the session recording is closed on unmount), and
the exit code is the shell's for a signal, ``128 + signum`` (143 for SIGTERM), so whoever sent it sees
that it ended by it.

Once the app has unmounted (the session closed, the engine closed), :func:`exit_within` bounds what is
left: Textual putting the terminal back. When the terminal itself has gone (tmux killed, an SSH link
dropped), that can block for ever (seen: its output thread's queue full, with nothing draining it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable

#: the signals that quit the app (SIGHUP: the terminal went away).
QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def quit_on_signals(close: Callable[[], None], exit: Callable[..., None]) -> Callable[[], None]:
    """On a :data:`QUIT_SIGNALS` signal, on the running loop: ``close()`` (the engine), then
    ``exit(return_code=128 + signum)`` (the app). Returns the function that puts the previous handling
    back. Where the loop cannot take signal handlers (not the main thread, no Unix signals), nothing
    changes."""
    loop = asyncio.get_running_loop()
    installed = []

    def quit(signum: int) -> None:
        close()
        exit(return_code=128 + signum)

    for sig in QUIT_SIGNALS:
        try:
            loop.add_signal_handler(sig, quit, sig)
        except (NotImplementedError, RuntimeError, ValueError):
            continue
        installed.append(sig)

    def restore() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return restore


#: seconds the process may take to end after the app unmounted, before it ends at once.
EXIT_GRACE_S = 5.0


def exit_within(seconds: float, code: Callable[[], int]) -> threading.Timer:
    """End the process with ``code()`` in ``seconds`` unless it has ended by then (a daemon timer: a
    normal exit does not wait for it). Call once nothing is left to save."""
    timer = threading.Timer(seconds, lambda: os._exit(code()))
    timer.daemon = True
    timer.start()
    return timer
