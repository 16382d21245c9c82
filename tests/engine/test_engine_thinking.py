"""Thinking on real tokens: the default model with a template that opens a thinking block
(``thinking_model_info``), in the engine, over the next turn's KV reuse, and through ``ask``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import (
    FirstToken,
    Message,
    ModelLoaded,
    SamplingParams,
    ThinkingEnded,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.local.llama import LlamaEngine

QUESTION = Message("user", "What is the capital of France?")


@pytest.fixture(scope="module")
def engine(thinking_model_info, tmp_path_factory):
    engine = LlamaEngine(
        thinking_model_info, EngineConfig(n_ctx=1024), log_path=tmp_path_factory.mktemp("log") / "e.log"
    )
    (loaded,) = list(engine.load())
    assert isinstance(loaded, ModelLoaded)
    yield engine
    engine.close()


def turn(engine, turn_id, messages, budget=6, max_tokens=32, **kw):
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0, think_budget=budget)
    return list(engine.run_turn(TurnRequest(turn_id, tuple(messages), sampling, reset_cache=turn_id == 1, **kw)))


def test_the_model_reports_its_thinking_format(engine):
    loaded = engine.loaded
    assert (loaded.thinking_format, loaded.thinking_switch) == ("think", True)
    assert any(note.startswith("thinking: <think>…</think>") for note in loaded.notes)


def test_a_budget_closes_the_block_on_real_tokens_and_the_answer_follows(engine):
    events = turn(engine, 1, [QUESTION])
    first = next(e for e in events if isinstance(e, FirstToken))
    assert first.text == "" and first.thinking  # the template opened the block: the reply starts in it
    (ended,) = [e for e in events if isinstance(e, ThinkingEnded)]
    assert ended.forced and ended.thinking_tokens == 6
    finished = events[-1]
    assert isinstance(finished, TurnFinished) and finished.thinking and finished.reply.strip()
    assert "<think>" not in finished.reply + finished.thinking and "</think>" not in finished.reply + finished.thinking
    streamed = "".join(e.text for e in events if isinstance(e, (FirstToken, TokensDecoded)))
    assert streamed == finished.reply
    m = finished.metrics
    assert (m.thinking_tokens, m.answer_tokens) == (6, m.decode_tokens - 6) and not m.thinking_cut_short
    assert m.ttfa_ms > m.ttft_ms and m.thinking_ms == pytest.approx(ended.thinking_ms)
    tokens = [e for e in events if isinstance(e, TokensDecoded)]
    assert tokens[-1].thinking_tokens == 6
    # the token view: the reply's first 6 tokens are the thinking (the template opened the block, the budget's
    # forced close is evaluated, not sampled), the rest the answer
    record = finished.tokens
    assert record is not None and record.thinking_tokens == 6
    assert [record.thinking(i) for i in range(8)] == [True] * 6 + [False] * 2
    assert "".join(record.text(t) for t in record.reply_ids[:6]).strip() == finished.thinking.strip()


def test_the_next_prompt_leaves_the_thinking_out_and_reuses_the_cache_up_to_it(engine):
    events = turn(engine, 1, [QUESTION])
    first = events[-1]
    history = [QUESTION, Message("assistant", first.reply, first.thinking), Message("user", "And of Italy?")]
    second = turn(engine, 2, history)[-1].metrics
    text, add_special = engine.template.render([QUESTION])  # turn 1's prompt, ending in "<think>\n"
    expected = len(engine.vocab.tokenize(text[: text.rindex("<think>")], add_special))
    assert second.cached_tokens == expected  # the cache holds turn 1's thinking; the template dropped it
    rendered, _ = engine.template.render(history)
    assert first.thinking not in rendered and first.reply in rendered


def test_thinking_off_through_the_template_switch(engine):
    finished = turn(engine, 1, [QUESTION], enable_thinking=False)[-1]
    m = finished.metrics
    assert finished.thinking == "" and finished.reply.strip()
    assert (m.thinking_tokens, m.answer_tokens) == (None, None)


def test_a_reply_cut_short_while_thinking(engine):
    finished = turn(engine, 1, [QUESTION], budget=None, max_tokens=5)[-1]
    m = finished.metrics
    assert (m.stop_reason, m.thinking_tokens, m.thinking_cut_short, m.answer_tokens) == ("length", 5, True, 0)
    assert finished.reply == "" and finished.thinking


def test_ask_gives_the_thinking_apart(thinking_model_info):
    base = [
        sys.executable,
        "-m",
        "chatphase",
        "ask",
        "--model",
        thinking_model_info.path,
        "--temperature",
        "0",
        "--max-tokens",
        "24",
        "--think-budget",
        "4",
        "--no-save",
    ]
    result = subprocess.run([*base, "--json", "Hi!"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (t,) = json.loads(result.stdout)["turns"]
    assert t["thinking"] and t["metrics"]["thinking_tokens"] == 4 and "<think>" not in t["reply"]
    plain = subprocess.run([*base, "--show-thinking", "Hi!"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and "[thought for" in plain.stderr and "(budget spent)" in plain.stderr
    assert t["thinking"].strip()[:10] in plain.stderr and "thinking 4 tok" in plain.stderr
