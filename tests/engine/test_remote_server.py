"""Remote engine against a real OpenAI-compatible server on loopback: llama-cpp-python's server serving
the bundled default model, started by these tests (once per module; a second one for the kill test).

llama-cpp-python's server sends no ``usage`` in streams (it ignores ``stream_options``) and no timings,
so here the reply's tokens are counted by its tokenizer endpoint (``/extras/tokenize``), labelled so, and
the prompt's count stays unknown (``None``), never zero or counted from chunks; the client clock figures
(TTFT, ITL, decode time) must be filled and consistent.
"""

from __future__ import annotations

import httpx
import pytest
from remote_support import free_port, start_llama_cpp_server, stop_process

from chatphase.engine.events import (
    EngineFailed,
    FirstToken,
    Message,
    ModelLoaded,
    PrefillStarted,
    SamplingParams,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.remote.engine import RemoteEngine

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, seed=1)


@pytest.fixture(scope="module")
def server(default_model_path):
    proc, url = start_llama_cpp_server(default_model_path)
    yield url
    stop_process(proc)


@pytest.fixture
def engine(server):
    eng = RemoteEngine(server, remote_model="smol", read_timeout_s=60)
    events = list(eng.load())
    assert isinstance(events[-1], ModelLoaded), events
    yield eng
    eng.close()


def _turn(engine, turn_id, messages, sampling=GREEDY):
    return list(engine.run_turn(TurnRequest(turn_id, tuple(messages), sampling)))


def test_two_turn_chat_metrics_filled_and_consistent(engine):
    conversation = [Message("user", "What is the capital of France?")]
    for turn_id in (1, 2):
        events = _turn(engine, turn_id, conversation)
        assert isinstance(events[0], PrefillStarted) and isinstance(events[-1], TurnFinished), events[-1]
        first = next(e for e in events if isinstance(e, FirstToken))
        texts = [first.text] + [e.text for e in events if isinstance(e, TokensDecoded)]
        done = events[-1]
        m = done.metrics
        assert done.turn_id == turn_id and done.reply == "".join(texts) and done.reply.strip()
        assert m.stop_reason in ("stop", "length")
        assert m.ttft_ms == pytest.approx(first.ttft_ms) and m.ttft_ms > 0
        arrivals = [first.t_ns] + [e.t_ns for e in events if isinstance(e, TokensDecoded)]
        assert m.decode_ms == pytest.approx((arrivals[-1] - arrivals[0]) / 1e6)
        if len(arrivals) >= 2:
            assert 0 <= m.itl_ms_p50 <= m.itl_ms_p95 <= m.itl_ms_max <= m.decode_ms + 1e-9
        # this server reports no usage in streams: the reply is counted by its /extras/tokenize (labelled
        # so), never by chunks; the prompt's count stays unknown, not zero or guessed
        counted = httpx.post(f"{engine.url.root}extras/tokenize", json={"input": done.reply}, trust_env=False)
        bos = len(httpx.post(f"{engine.url.root}extras/tokenize", json={"input": ""}, trust_env=False).json()["tokens"])
        assert m.decode_tokens == len(counted.json()["tokens"]) - bos and m.decode_tokens_source == "tokenizer"
        assert engine.tokenizer.endpoint == "/extras/tokenize"
        if m.decode_tokens >= 2:
            assert m.decode_tokens_per_s == pytest.approx((m.decode_tokens - 1) / (m.decode_ms / 1000))
        assert m.prompt_tokens is None and done.server_timings is None
        conversation += [Message("assistant", done.reply), Message("user", "And of Italy?")]


def test_cancel_mid_stream_then_next_turn_works(engine):
    events = []
    for event in engine.run_turn(
        TurnRequest(1, (Message("user", "Count from 1 to 100."),), SamplingParams(max_tokens=200, temperature=0.0))
    ):
        events.append(event)
        if isinstance(event, TokensDecoded) and event.decode_tokens >= 3:
            engine.cancel()
    done = events[-1]
    assert isinstance(done, TurnFinished) and done.metrics.stop_reason == "cancelled"
    assert not any(isinstance(e, EngineFailed) for e in events) and done.reply
    again = _turn(engine, 2, [Message("user", "Hi")])
    assert isinstance(again[-1], TurnFinished) and again[-1].metrics.stop_reason in ("stop", "length")


def test_wrong_model_name_fails_at_load_naming_what_is_served(server):
    eng = RemoteEngine(server, remote_model="no-such-model")
    events = list(eng.load())
    assert len(events) == 1 and isinstance(events[0], EngineFailed) and events[0].fatal
    assert "'no-such-model'" in events[0].message and "smol" in events[0].message


def test_wrong_url_connection_refused_is_one_clear_message():
    eng = RemoteEngine(f"http://127.0.0.1:{free_port()}")
    events = list(eng.load())
    assert len(events) == 1 and isinstance(events[0], EngineFailed)
    assert "connection refused" in events[0].message and "Traceback" not in events[0].message


def test_server_killed_mid_stream_keeps_partial_reply(default_model_path):
    proc, url = start_llama_cpp_server(default_model_path)
    try:
        eng = RemoteEngine(url, read_timeout_s=30)
        assert isinstance(list(eng.load())[-1], ModelLoaded)
        events = []
        request = TurnRequest(
            1, (Message("user", "Count from 1 to 100."),), SamplingParams(max_tokens=300, temperature=0.0)
        )
        for event in eng.run_turn(request):
            events.append(event)
            if isinstance(event, TokensDecoded) and event.decode_tokens == 3:
                proc.kill()
        failed, done = events[-2], events[-1]
        assert isinstance(failed, EngineFailed) and not failed.fatal
        assert "cut mid-reply" in failed.message and "partial reply is kept" in failed.message
        assert isinstance(done, TurnFinished) and done.metrics.stop_reason == "error" and done.reply
        after = list(eng.run_turn(TurnRequest(2, (Message("user", "Hi"),), GREEDY)))
        assert isinstance(after[-1], EngineFailed) and "connection refused" in after[-1].message
        eng.close()
    finally:
        stop_process(proc)
