"""KV-cache reuse across turns on the real default model: a follow-up keeps the whole previous turn
(prompt and the reply's tokens as sampled), a regenerate the whole prompt, an edit everything before it.

The previous reply comes back as text; re-tokenising it may give other ids than the sampled ones
(seed 0 below does so on the build this was written on, after the reply's first 91 tokens), and the engine
must still reuse the reply's cached tokens (see :mod:`chatphase.engine.local.prefix`).
"""

from __future__ import annotations

import pytest

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import Message, ModelLoaded, SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.local.llama import LlamaEngine

STORY = (Message("user", "Write a long story about a lighthouse keeper and a storm."),)


@pytest.fixture
def llama_engine(default_model_info, tmp_path):
    engine = LlamaEngine(default_model_info, EngineConfig(n_ctx=1024), log_path=tmp_path / "engine.log")
    assert isinstance(list(engine.load())[-1], ModelLoaded)
    yield engine
    engine.close()


def run(engine, turn_id, messages, sampling):
    events = list(engine.run_turn(TurnRequest(turn_id, tuple(messages), sampling)))
    assert isinstance(events[-1], TurnFinished), events
    m = events[-1].metrics
    assert m.prefill_tokens == m.prompt_tokens - m.cached_tokens
    # the model sees exactly the templated conversation
    text, _ = engine.template.render(messages)
    assert b"".join(engine.vocab.render(t) for t in engine.cached_tokens[: m.prompt_tokens]) == text.encode()
    return events[-1]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_tokens=250, temperature=0),
        SamplingParams(max_tokens=250, temperature=0.7, seed=0),
    ],
    ids=["greedy", "sampled"],
)
def test_follow_up_regenerate_and_edit_reuse_the_cache(llama_engine, sampling):
    engine = llama_engine
    first = run(engine, 1, STORY, sampling)
    m1 = first.metrics
    assert m1.decode_tokens >= 200, "a long reply is the point of this test"
    sampled = engine.cached_tokens[m1.prompt_tokens :]  # the reply's tokens the cache holds
    assert m1.kv_cache_tokens == m1.prompt_tokens + m1.decode_tokens - (m1.stop_reason == "length")

    conv = STORY + (Message("assistant", first.reply), Message("user", "Give it a title."))
    short = SamplingParams(max_tokens=8, temperature=0)
    m2 = run(engine, 2, conv, short).metrics
    assert m2.cached_tokens == m1.kv_cache_tokens  # the whole previous prompt and reply
    assert engine.cached_tokens[m1.prompt_tokens : m1.kv_cache_tokens] == sampled
    assert m2.prefill_tokens < 20

    m3 = run(engine, 3, conv, short).metrics  # regenerate: the same conversation again
    assert (m3.prompt_tokens, m3.cached_tokens) == (m2.prompt_tokens, m2.prompt_tokens - 1)

    edited = conv[:-1] + (Message("user", "Give it a short title."),)
    m4 = run(engine, 4, edited, short).metrics  # edit-and-resend: kept up to "Give it a"
    assert m4.cached_tokens >= m1.kv_cache_tokens + len(engine.tokenize("<|im_end|>\n<|im_start|>user\nGive it a"))
    assert m4.prefill_tokens < 10
