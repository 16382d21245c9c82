"""EngineHost.start(): the child starts loading before anyone waits for it; load() then takes it over."""

from __future__ import annotations

import time

import psutil

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import Message, ModelLoaded, SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.process.host import EngineHost


def test_start_then_load_uses_the_started_child_and_load_again_restarts(default_model_info, tmp_path):
    host = EngineHost(default_model_info, EngineConfig(n_ctx=256), log_path=str(tmp_path / "engine.log"))
    try:
        host.start()
        pid = host.pid
        assert pid is not None and psutil.pid_exists(pid)
        host.start()  # not loaded yet: the same child
        assert host.pid == pid
        deadline = time.monotonic() + 60
        log = tmp_path / "engine.log"
        while not (log.exists() and "llama_kv_cache" in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)  # the child loads the model with nobody reading its pipe
        events = list(host.load())
        assert isinstance(events[-1], ModelLoaded) and events[-1].model.pid == pid == host.pid
        turn = TurnRequest(1, (Message("user", "Hi"),), SamplingParams(max_tokens=4, temperature=0))
        assert isinstance(list(host.run_turn(turn))[-1], TurnFinished)
        events = list(host.load())  # a second load is a restart
        assert isinstance(events[-1], ModelLoaded) and host.pid != pid
    finally:
        host.close()
    assert host.pid is None
