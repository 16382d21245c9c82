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
from chatphase.engine.process.host import EngineHost, coalesced
from chatphase.engine.tokens import TurnTokens

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


def test_cancel_crosses_the_process_and_every_token_arrives(default_model_info, tmp_path):
    host = start(default_model_info, tmp_path)
    try:
        carried, text = 0, ""
        for event in host.run_turn(LONG):
            if isinstance(event, FirstToken):
                carried, text = 1, event.text
            if isinstance(event, TokensDecoded):
                carried += event.n_tokens
                text += event.text
                assert event.decode_tokens == carried  # the running count matches what crossed so far
                if carried >= 40:
                    host.cancel()
            if isinstance(event, TurnFinished):
                fin = event
        assert fin.metrics.stop_reason == "cancelled"
        assert fin.metrics.decode_tokens >= 40
        # however the messages were grouped (that depends on the machine's speed: the rule is tested with
        # scripted times below), every token and every character crossed the pipe
        assert carried == fin.metrics.decode_tokens and text == fin.reply
        # the turn's tokens crossed too, their counts the metrics' (the token view)
        assert fin.tokens is not None and fin.tokens.view_counts() == TurnTokens.metric_counts(fin.metrics)
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


def _tokens(times_ms):
    return [TokensDecoded(1, f"t{i} ", 1, i + 1, int(t * 1e6)) for i, t in enumerate(times_ms)]


def test_tokens_are_coalesced_by_the_engine_s_clock_not_the_machine_s_speed():
    """The child's rule on scripted token times (ms): a token at least the interval (25 ms) after the last
    message goes out with those held before it; so a fast engine's tokens travel together, a slow one's
    (a busy machine: 30 ms a token) one by one; any other event first sends what is held, in order."""
    every_ns = int(25e6)
    fast = list(
        coalesced([FirstToken(1, "", 1.0, int(1000e6)), *_tokens([1001, 1002, 1003, 1026, 1027, 1028, 1060])], every_ns)
    )
    assert isinstance(fast[0], FirstToken)
    assert [(m.n_tokens, m.decode_tokens, m.text) for m in fast[1:]] == [
        (4, 4, "t0 t1 t2 t3 "),
        (3, 7, "t4 t5 t6 "),
    ]
    slow = list(coalesced([FirstToken(1, "", 1.0, int(1000e6)), *_tokens([1030, 1060, 1090, 1120])], every_ns))
    assert [m.n_tokens for m in slow[1:]] == [1, 1, 1, 1]
    end = FirstToken(2, "", 1.0, int(2000e6))  # any other event: what is held goes out before it
    held = list(coalesced([*_tokens([1000, 1001, 1002]), end], every_ns))
    assert [getattr(m, "n_tokens", None) for m in held] == [3, None] and held[-1] is end
    assert sum(m.n_tokens for m in coalesced(_tokens([1000, 1001]), every_ns)) == 2  # nothing left behind
