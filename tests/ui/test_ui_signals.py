"""SIGTERM and SIGHUP end the TUI as Ctrl+Q does, in a real terminal (tmux): the terminal's modes are put
back (no alternate screen, no mouse reporting, the cursor shown), the session is on disk and the engine's
child process is gone. A reply is streaming when the signal comes (the case where most is at stake).

The app runs under a shell that prints its exit status and then waits, so that the pane (and its
modes, as a user's shell would find them) outlives the app. Every wait is bounded; the tmux server is
killed whatever happens.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from chatphase.sessions.store import parse_records, sessions_dir

pytestmark = [pytest.mark.model, pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]

PROMPT = "Write a very long story about a dragon and a knight."


class Tmux:
    """``command`` in a detached tmux server of its own, under a shell that then says ``exited N`` and waits."""

    def __init__(self, command: list[str], bare: bool = False) -> None:
        """``bare``: ``command`` is the pane's process itself (the terminal's session leader), no shell."""
        self.socket = f"chatphase-signals-{os.getpid()}-{time.monotonic_ns()}"
        script = f"exec {shlex.join(command)}" if bare else f"{shlex.join(command)}; echo exited $?; sleep 300"
        self.tmux("-f", os.devnull, "new-session", "-d", "-x", "100", "-y", "30", script)

    def tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def pane(self, fmt: str) -> str:
        return self.tmux("display-message", "-p", fmt)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout_s} s")
        time.sleep(0.1)


def records() -> list[dict]:
    files = list(sessions_dir().glob("*.jsonl"))
    if not files:
        return []
    with open(files[0], encoding="utf-8") as fh:
        return parse_records(fh)[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_quits_as_ctrl_q_does(sig, tmp_path):
    command = [sys.executable, "-m", "chatphase", "--max-tokens", "400", "--temperature", "0", "--n-ctx", "1024"]
    term = Tmux(command)
    try:
        shell = psutil.Process(int(term.pane("#{pane_pid}")))
        wait_until(lambda: shell.children(), 10, "the app did not start")
        (ui,) = shell.children()
        # the app is up (alternate screen, mouse on) and its engine child has started
        wait_until(lambda: term.pane("#{alternate_on}#{mouse_any_flag}") == "11", 60, "the TUI did not start")
        wait_until(lambda: "READY" in term.tmux("capture-pane", "-p"), 60, "the model did not load")
        engines = ui.children(recursive=True)
        assert engines, "no engine process"
        time.sleep(0.5)  # nobody types in the instant the model is ready
        term.tmux("send-keys", "-t", "0", "-l", PROMPT)
        term.tmux("send-keys", "-t", "0", "Enter")
        wait_until(lambda: any(r["type"] == "text" for r in records()), 120, "no reply text on disk")
        os.kill(ui.pid, sig)
        wait_until(lambda: "exited" in term.tmux("capture-pane", "-p"), 30, "the TUI did not end")
        screen = term.tmux("capture-pane", "-p")
        assert f"exited {128 + sig}" in screen and "Traceback" not in screen
        # the terminal is as Ctrl+Q leaves it
        assert term.pane("#{alternate_on} #{mouse_any_flag} #{cursor_flag}") == "0 0 1"
        # the engine ended with the app, and the session holds the turn as far as it got
        wait_until(
            lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in engines), 15, "engine"
        )
        recs = records()
        assert [r["user"] for r in recs if r["type"] == "turn_start"] == [PROMPT]
        assert "".join(r["text"] for r in recs if r["type"] == "text").strip()
    finally:
        term.close()


def test_the_terminal_going_away_ends_the_app(tmp_path):
    """The terminal itself goes (the tmux server killed: a real hangup, as when an SSH link drops) with the
    app as the terminal's own process, idle after a reply: the app and its engine end, the session on disk.
    (Seen twice by hand, not on demand: Textual's putting back of the terminal's modes then blocked for
    ever, which :func:`chatphase.ui.signals.exit_within` now bounds; its own test is below.)"""
    from chatphase.ui.signals import EXIT_GRACE_S

    command = [sys.executable, "-m", "chatphase", "--max-tokens", "60", "--temperature", "0", "--n-ctx", "1024"]
    term = Tmux(command, bare=True)
    try:
        ui = psutil.Process(int(term.pane("#{pane_pid}")))
        wait_until(lambda: "READY" in term.tmux("capture-pane", "-p"), 60, "the model did not load")
        engines = ui.children(recursive=True)
        time.sleep(0.5)
        term.tmux("send-keys", "-t", "0", "-l", PROMPT)
        term.tmux("send-keys", "-t", "0", "Enter")
        wait_until(lambda: "DONE" in term.tmux("capture-pane", "-p"), 60, "the reply did not end")
    finally:
        term.close()
    wait_until(lambda: not ui.is_running() or ui.status() == psutil.STATUS_ZOMBIE, EXIT_GRACE_S + 15, "app")
    wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in engines), 15, "engine")
    assert "".join(r["text"] for r in records() if r["type"] == "text").strip()


def test_exit_within_ends_a_process_whose_main_thread_never_returns():
    """What the app arms once unmounted: a main thread blocked for ever (as in Textual's terminal restore)
    still ends, with the app's exit code, after the grace."""
    code = "from chatphase.ui.signals import exit_within; import threading; exit_within(0.3, lambda: 129); threading.Event().wait()"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], timeout=30)
    assert done.returncode == 129 and time.monotonic() - started < 20
