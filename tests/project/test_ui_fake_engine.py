"""FakeEngine (the UI tests' engine): event order, exact scripted metrics, prefix reuse, context rules,
cancel, hold/release and crashes."""

from __future__ import annotations

import threading

from fake_engine import (
    FakeEngine,
    FakeTiming,
    fake_model_info,
    split_reply,
    template_tokens,
)

from chatphase.engine.base import Engine
from chatphase.engine.events import (
    EngineFailed,
    FirstToken,
    Message,
    ModelLoaded,
    PrefillProgress,
    PrefillStarted,
    SamplingParams,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.models.kv import kv_capacity_bytes


class Cfg:
    def __init__(self, n_ctx=4096, n_batch=256):
        self.n_ctx, self.n_batch = n_ctx, n_batch


def turn(engine, turn_id, *contents, max_tokens=512):
    roles = ["user", "assistant"]
    msgs = tuple(Message(roles[i % 2], c) for i, c in enumerate(contents))
    return list(engine.run_turn(TurnRequest(turn_id, msgs, SamplingParams(max_tokens=max_tokens))))


def test_is_an_engine_and_loads():
    engine = FakeEngine(fake_model_info(), Cfg(n_ctx=1000))
    assert isinstance(engine, Engine)
    (loaded,) = list(engine.load())
    assert isinstance(loaded, ModelLoaded)
    assert loaded.model.kv_capacity_bytes == kv_capacity_bytes(23_040, 1000) == 23_040 * 1024


def test_event_order_and_exact_metrics():
    engine = FakeEngine(
        fake_model_info(),
        Cfg(n_batch=4),
        replies=["a b c d"],
        timing=FakeTiming(tokenize_ms=1, prefill_ms_per_token=2, decode_ms_per_token=10),
    )
    events = turn(engine, 1, "one two three four five")
    kinds = [type(e) for e in events]
    assert kinds == [
        PrefillStarted,
        PrefillProgress,
        PrefillProgress,
        PrefillProgress,
        FirstToken,
        TokensDecoded,
        TokensDecoded,
        TokensDecoded,
        TurnFinished,
    ]
    start, *_ = events
    assert (start.prompt_tokens, start.cached_tokens, start.prefill_tokens) == (10, 0, 10)
    assert [e.done_tokens for e in events[1:4]] == [4, 8, 10]
    m = events[-1].metrics
    assert events[-1].reply == "a b c d"
    assert m.ttft_ms == 1 + 10 * 2 + 10  # tokenise + prefill + first token
    assert m.decode_tokens == 4 and m.decode_ms == 30 and m.decode_tokens_per_s == 100.0
    assert m.prefill_tokens_per_s == 500.0 and m.itl_ms_p95 == 10.0
    assert m.kv_cache_tokens == 14 and m.kv_cache_bytes == 14 * 23_040
    assert m.stop_reason == "stop"


def test_second_turn_reuses_the_prefix():
    engine = FakeEngine(fake_model_info(), Cfg(), replies=["sure thing"])
    first = turn(engine, 1, "hello")[-1]
    second = turn(engine, 2, "hello", first.reply, "more")
    start = second[0]
    # turn 1's prompt (<|im_start|> user hello <|im_end|> <|im_start|> assistant) + its 2 reply tokens
    assert start.cached_tokens == len(template_tokens([Message("user", "hello")])) + 2 == 8
    assert start.prefill_tokens == start.prompt_tokens - start.cached_tokens


def test_context_rules():
    engine = FakeEngine(fake_model_info(), Cfg(n_ctx=20), replies=["x " * 30])
    refused = turn(engine, 1, " ".join(["w"] * 30))
    assert isinstance(refused[-1], EngineFailed) and not refused[-1].fatal
    full = turn(engine, 2, "short")[-1]
    assert full.metrics.stop_reason == "context_full" and full.metrics.kv_cache_tokens == 20
    trimmed = turn(engine, 3, "a b c d e f", "ok", "g h i j k l")
    assert trimmed[0].dropped_messages == 1  # the oldest message went; 15 tokens now fit
    assert (
        turn(FakeEngine(fake_model_info(), Cfg(), replies=["a b c"]), 1, "x", max_tokens=2)[-1].metrics.stop_reason
        == "length"
    )


def test_cancel_during_hold_and_crash():
    engine = FakeEngine(fake_model_info(), Cfg(), hold="decode", hold_after_tokens=2)
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(turn(engine, 1, "hi")))
    worker.start()
    assert engine.held.wait(5)
    engine.cancel()
    worker.join(5)
    m = out[-1].metrics
    assert (m.stop_reason, m.decode_tokens) == ("cancelled", 2)
    assert out[-1].reply == "".join(split_reply(out[-1].reply))

    crashing = FakeEngine(fake_model_info(), Cfg(), crash_at="decode")
    failed = turn(crashing, 1, "hi")[-1]
    assert isinstance(failed, EngineFailed) and failed.fatal and crashing.dead
    assert turn(crashing, 2, "again")[-1].fatal
    assert next(iter(FakeEngine(fake_model_info(), crash_at="load").load())).fatal
