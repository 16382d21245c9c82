"""After the UI process is killed, nothing prints on the user's shell: the engine child uses no named
semaphores (cancel goes over a pipe, chatphase/engine/process/cancel_pipe.py), so the resource tracker has no
"leaked semaphore objects" to warn about, and the child ends by itself. Real processes, SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from chatphase.engine.process.cancel_pipe import ALL, CancelFlag, CancelSender

UI = """
import sys, time
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import Message, SamplingParams, TurnRequest
from chatphase.engine.process.host import EngineHost
from chatphase.models.gguf_meta import read_model_info
if __name__ == "__main__":
    host = EngineHost(read_model_info(sys.argv[1]), EngineConfig(n_ctx=256), log_path=sys.argv[2])
    list(host.load())
    turn = host.run_turn(TurnRequest(1, (Message("user", "Hi"),), SamplingParams(max_tokens=4, temperature=0)))
    list(turn)
    print(host.pid, flush=True)
    time.sleep(120)
"""


@pytest.mark.timeout(120)
def test_a_killed_ui_leaves_no_semaphore_warnings_and_no_engine(default_model_path, tmp_path):
    script = tmp_path / "ui.py"
    script.write_text(textwrap.dedent(UI))
    ui = subprocess.Popen(
        [sys.executable, str(script), default_model_path, str(tmp_path / "engine.log")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child_pid = int(ui.stdout.readline())
    assert psutil.pid_exists(child_pid)
    os.kill(ui.pid, signal.SIGKILL)  # the UI only: its engine child and the resource tracker live on
    _out, err = ui.communicate(timeout=60)  # returns when every process holding the pipe has ended
    assert "leaked semaphore" not in err and "resource_tracker" not in err, err
    assert err == ""
    deadline = time.monotonic() + 10
    while psutil.pid_exists(child_pid) and psutil.Process(child_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the engine child outlived its UI"
        time.sleep(0.1)


def test_cancel_counts_turns_so_a_late_cancel_never_stops_the_next_one():
    import multiprocessing as mp

    reader, writer = mp.get_context("spawn").Pipe(duplex=False)
    sender, flag = CancelSender(writer), CancelFlag(reader)
    flag.begin(1)
    assert not flag.is_set()
    sender.cancel(1)
    assert flag.is_set()
    flag.begin(2)  # the cancel of turn 1 arrived; turn 2 runs untouched
    assert not flag.is_set()
    sender.cancel(3)  # sent for the turn after, before it began: it applies to it (and to 2, earlier)
    assert flag.is_set()
    flag.begin(4)
    assert not flag.is_set()
    sender.cancel(ALL)
    flag.begin(5)
    assert flag.is_set()
    sender.close()
    flag.begin(6)
    assert flag.is_set()  # the parent is gone: stop
