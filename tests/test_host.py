"""The engine in its child process: crash isolation, cancel across the process boundary, quiet output."""

from __future__ import annotations

import os
import signal

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import (
    EngineFailed,
    FirstToken,
    Message,
    ModelLoaded,
    SamplingParams,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.process.host import EngineHost

LONG = TurnRequest(
    1, (Message("user", "Write a long story about a dragon."),), SamplingParams(max_tokens=300, temperature=0)
)


def start(info, tmp_path):
    host = EngineHost(info, EngineConfig(n_ctx=512), log_path=str(tmp_path / "engine.log"))
    events = list(host.load())
    assert isinstance(events[-1], ModelLoaded), events
    assert events[-1].model.pid == host.pid != os.getpid()
    return host


def test_sigsegv_mid_turn_is_reported_and_a_fresh_engine_works(default_model_info, tmp_path, capfd):
    host = start(default_model_info, tmp_path)
    try:
        events = []
        for event in host.run_turn(LONG):
            events.append(event)
            if isinstance(event, FirstToken):
                os.kill(host.pid, signal.SIGSEGV)
        failed = events[-1]
        assert isinstance(failed, EngineFailed) and failed.fatal
        # what and where, not what to do: the TUI says its restart key, ask exits
        assert failed.message == f"the engine process died (SIGSEGV; details in {tmp_path / 'engine.log'})"
        again = list(host.run_turn(LONG))
        assert isinstance(again[-1], EngineFailed) and again[-1].fatal
    finally:
        host.close()
    fresh = start(default_model_info, tmp_path)
    try:
        events = list(fresh.run_turn(TurnRequest(2, LONG.messages, SamplingParams(max_tokens=8, temperature=0))))
        assert isinstance(events[-1], TurnFinished) and events[-1].metrics.decode_tokens >= 1
    finally:
        fresh.close()
    out, err = capfd.readouterr()
    assert "llama_" not in out + err  # llama.cpp's log goes to the log file, never to the terminal
    assert "llama_kv_cache" in (tmp_path / "engine.log").read_text()


def test_cancel_crosses_the_process_and_tokens_are_coalesced(default_model_info, tmp_path):
    host = start(default_model_info, tmp_path)
    try:
        batches, n_tokens = 0, 0
        for event in host.run_turn(LONG):
            if isinstance(event, TokensDecoded):
                batches += 1
                n_tokens = event.decode_tokens
                if n_tokens >= 40:
                    host.cancel()
            if isinstance(event, TurnFinished):
                fin = event
        assert fin.metrics.stop_reason == "cancelled"
        assert fin.metrics.decode_tokens >= 40
        assert batches < fin.metrics.decode_tokens - 1  # several tokens per pipe message
        events = list(host.run_turn(TurnRequest(2, LONG.messages, SamplingParams(max_tokens=4, temperature=0))))
        assert events[-1].metrics.stop_reason == "length" and events[-1].metrics.cached_tokens > 0
    finally:
        host.close()
    assert host.pid is None


def test_a_caller_that_stops_reading_early_does_not_empty_the_next_turn(default_model_info, tmp_path):
    host = start(default_model_info, tmp_path)
    try:
        short = SamplingParams(max_tokens=4, temperature=0)
        for event in host.run_turn(TurnRequest(1, LONG.messages, short)):
            if isinstance(event, TurnFinished):
                break  # the end-of-turn marker is left in the pipe
        events = list(host.run_turn(TurnRequest(2, LONG.messages, short)))
        assert events and isinstance(events[-1], TurnFinished) and events[-1].turn_id == 2
        assert all(getattr(e, "turn_id", 2) == 2 for e in events)
    finally:
        host.close()
