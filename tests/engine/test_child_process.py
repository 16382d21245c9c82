"""The child-process helper the engine host and the bench's jobs share (chatphase/engine/process/child.py):
what a child sent before it died is still read, its death is named, and an unexpected exception reaches the
parent as one message, the traceback left to the log."""

from __future__ import annotations

import os
import signal
import time

from chatphase.engine.process.cancel_pipe import CancelFlag
from chatphase.engine.process.child import Child, quiet, reporting


def _send_then_exit(conn, cancel_conn, n: int, code: int) -> None:
    for i in range(n):
        conn.send(i)
    os._exit(code)


def _send_then_kill(conn, cancel_conn) -> None:
    conn.send("last words")
    os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_cancel_then_fail(conn, cancel_conn, log_path: str) -> None:
    log_path = quiet(log_path)
    with reporting(conn, lambda exc: f"failed: {exc} (details in {log_path})"):
        cancel = CancelFlag(cancel_conn)
        conn.send("ready")
        while not cancel.is_set():
            time.sleep(0.01)
        print("to the log, not the terminal")
        raise RuntimeError("boom")


def test_what_a_child_sent_before_it_exited_is_read_and_its_exit_code_named():
    child = Child(_send_then_exit, (50, 3), name="chatphase-test", duplex=False)
    try:
        assert list(child.messages()) == list(range(50))
        assert child.exit_reason() == "exit code 3"
    finally:
        child.stop(polite_s=1.0)


def test_a_killed_child_is_named_by_its_signal():
    child = Child(_send_then_kill, (), name="chatphase-test", duplex=False)
    try:
        assert list(child.messages()) == ["last words"]
        assert child.exit_reason() == "SIGKILL"
    finally:
        child.stop(polite_s=1.0)


def test_cancel_crosses_and_an_exception_is_one_message_with_the_traceback_in_the_log(tmp_path):
    log = tmp_path / "engine.log"
    child = Child(_wait_for_cancel_then_fail, (str(log),), name="chatphase-test", duplex=False)
    try:
        messages = child.messages()
        assert next(messages) == "ready"
        child.cancel()
        assert list(messages) == [f"failed: boom (details in {log})"]
        assert child.exit_reason() == "exit code 0"
    finally:
        child.stop(polite_s=1.0)
    text = log.read_text()
    assert "to the log, not the terminal" in text and "RuntimeError: boom" in text
