"""The token view's counts equal the turn's metrics, for every kind of turn, on the real default model.

Fresh, cached (a second turn), regenerated, edited, overflowed (drop-oldest and shift), restored from the disk
prefix store in a new engine, and a speculative (lookup) turn: each ``TurnFinished.tokens`` shows the counts
its ``metrics`` hold, its prompt spells the templated conversation, and its reply is the tokens the cache got.
A reply that runs past n_ctx is checked where the overflow tests run it (tests/chat/test_overflow_model.py).
Nothing here depends on how fast the machine is: the counts and ids are compared, never times.
"""

from __future__ import annotations

import pytest
from chat_support import Calls
from conftest import own_cache_dir

from chatphase.chat.controller import ChatController
from chatphase.chat.dispatch import InlineDispatcher
from chatphase.chat.turn import Turn
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import Message, ModelLoaded, PrefillProgress, SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.local.llama import LlamaEngine
from chatphase.engine.tokens import TurnTokens
from chatphase.settings.schema import Settings

pytestmark = pytest.mark.model

FILLER = "Here is some more of my notes about the harbour, the boats, the tides and the weather this week."


def chat_on(info, tmp_path, **overrides):
    defaults = {"n_ctx": 1024, "temperature": 0, "max_tokens": 24, "prefix_cache": "off"}
    settings = Settings().with_overrides(**defaults | overrides)
    calls = Calls()
    engines: list[LlamaEngine] = []

    def factory(model_info, s):
        engines.append(LlamaEngine(model_info, s.engine, log_path=tmp_path / "engine.log"))
        return engines[-1]

    chat = ChatController(settings, info, factory, InlineDispatcher(), [calls])
    chat.start_engine()
    assert chat.ready
    return chat, calls, engines


def last(calls: Calls) -> tuple[Turn, TurnFinished]:
    return calls.args_of("turn_finished")[-1]


def check(done: tuple[Turn, TurnFinished], engine: LlamaEngine) -> TurnTokens:
    """The view's counts are the metrics'; the prompt is the templated conversation; the reply is what was
    sampled (the cache holds it after the prompt, but for the last token, which is never evaluated)."""
    turn, ev = done
    t, m = ev.tokens, ev.metrics
    assert t is not None
    assert t.view_counts() == TurnTokens.metric_counts(m)
    assert sum(end - start for start, end, _ in t.spans()) == len(t.prompt_ids) == m.prompt_tokens
    text, _ = engine.template.render(turn.request.messages)
    if m.overflow is None and not m.dropped_messages:
        assert "".join(t.text(i) for i in t.prompt_ids) == text
    assert all(i in t.pieces for i in (*t.prompt_ids, *t.left_out_ids, *t.reply_ids))
    assert any(t.special(i) and t.text(i) == "<|im_start|>" for i in t.prompt_ids)
    assert not any(t.special(i) for i in t.prompt_ids if t.text(i).strip() == "user")
    n = m.prompt_tokens or 0
    cache = engine.cached_tokens
    if not m.dropped_messages:
        assert cache[:n] == list(t.prompt_ids)
        assert cache[n : n + len(t.reply_ids) - 1] == list(t.reply_ids[:-1])
    itls = [t.itl_ms(i) for i in range(1, len(t.reply_ids))]
    if itls:
        assert max(x for x in itls if x is not None) == pytest.approx(m.itl_ms_max)
    assert t.t_ms(0) == pytest.approx(m.ttft_ms)
    return t


def test_fresh_cached_regenerated_and_edited_turns_show_the_metrics_counts(default_model_info, tmp_path):
    chat, calls, engines = chat_on(default_model_info, tmp_path)
    try:
        chat.send("Name three colours.")
        fresh = check(last(calls), engines[-1])
        assert fresh.counts()["prefilled"] == len(fresh.prompt_ids) and fresh.cached == 0
        assert [s for _, _, s in fresh.spans()] == ["prefilled"]

        chat.send("And three animals?")
        cached = check(last(calls), engines[-1])
        assert cached.cached > len(fresh.prompt_ids)  # the first prompt and its reply
        assert [s for _, _, s in cached.spans()] == ["cached", "prefilled"]

        chat.regenerate()
        again = check(last(calls), engines[-1])
        assert again.prompt_ids == cached.prompt_ids and again.prefilled >= 1

        chat.take_back_last()
        chat.send("And three trees?")
        edited = check(last(calls), engines[-1])
        assert 0 < edited.cached < len(edited.prompt_ids) - 2
        assert edited.prompt_ids[: edited.cached] == cached.prompt_ids[: edited.cached]
    finally:
        chat.close()


@pytest.mark.parametrize("policy", ["drop-oldest", "shift"])
def test_overflowed_turns_show_the_tokens_they_left_out(default_model_info, tmp_path, policy):
    chat, calls, engines = chat_on(default_model_info, tmp_path, n_ctx=512, overflow=policy)
    try:
        overflowed: list[TurnTokens] = []
        for i in range(12):
            chat.send(f"Note {i}: {FILLER} {FILLER} What is {i} plus {i}?")
            done = last(calls)
            t, ev = check(done, engines[-1]), done[1]
            if ev.metrics.overflow is not None:
                overflowed.append(t)
                assert len(t.left_out_ids) == ev.metrics.overflow_dropped_tokens > 0
                assert t.counts()["shifted" if policy == "shift" else "dropped"] == len(t.left_out_ids)
                # the oldest note left: its words are among the left-out tokens
                left = "".join(t.text(i) for i in t.left_out_ids)
                assert left.startswith("<|im_start|>user\nNote ") and left.endswith("<|im_end|>\n"), left
            if len(overflowed) >= 2:
                break
        assert len(overflowed) >= 2, "the chat never overflowed"
    finally:
        chat.close()


def test_a_prefix_restored_in_a_new_engine_shows_as_restored(default_model_info, tmp_path, monkeypatch):
    own_cache_dir(monkeypatch, tmp_path / "cache")
    doc = " ".join(f"Item {i}: the lamp is on shelf {i % 7}." for i in range(40))
    chat, calls, engines = chat_on(default_model_info, tmp_path, prefix_cache="on")
    try:
        chat.send(f"Read this list.\n{doc}\nWhich shelf holds item 4?")
        check(last(calls), engines[-1])
        conversation = list(chat.conversation)
    finally:
        chat.close()  # the engine saves its prefix
    chat, calls, engines = chat_on(default_model_info, tmp_path, prefix_cache="on")
    try:
        chat.history.add("user", conversation[0].content)
        chat.history.add("assistant", conversation[1].content)
        chat.send("And item 5?")
        done = last(calls)
        t, ev = check(done, engines[-1]), done[1]
        assert ev.metrics.restored_tokens and t.restored == ev.metrics.restored_tokens > 100
        assert t.spans()[0] == (0, t.restored, "restored")
    finally:
        chat.close()


def test_a_speculative_turn_shows_its_drafted_and_accepted_tokens(default_model_info, tmp_path):
    chat, calls, engines = chat_on(default_model_info, tmp_path, spec="lookup", max_tokens=120)
    try:
        chat.send("Count from 1 to 30, separated by commas: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,")
        done = last(calls)
        t, ev = check(done, engines[-1]), done[1]
        assert ev.metrics.spec_mode == "lookup" and t.spec_steps
        assert t.spec_drafted == ev.metrics.spec_drafted and t.spec_accepted == ev.metrics.spec_accepted
        assert all(0 <= i < len(t.reply_ids) for i in t.reply_accepted)
    finally:
        chat.close()


def test_a_turn_stopped_during_its_prefill_shows_the_tokens_it_never_evaluated(default_model_info, tmp_path):
    """Stopped after its first chunk of 16 (the cancel is asked while the engine waits on that chunk's event, so
    the count does not depend on speed): 16 prefilled, the rest not evaluated, no reply."""
    engine = LlamaEngine(default_model_info, EngineConfig(n_ctx=512, n_batch=16), log_path=tmp_path / "e.log")
    assert isinstance(list(engine.load())[-1], ModelLoaded)
    try:
        request = TurnRequest(1, (Message("user", FILLER),), SamplingParams(max_tokens=8, temperature=0))
        finished = None
        for ev in engine.run_turn(request):
            if isinstance(ev, PrefillProgress) and ev.done_tokens == 16:
                engine.cancel()
            if isinstance(ev, TurnFinished):
                finished = ev
        assert finished is not None and finished.tokens is not None
        t, m = finished.tokens, finished.metrics
        assert m.stop_reason == "cancelled" and t.view_counts() == TurnTokens.metric_counts(m)
        assert t.counts()["prefilled"] == 16 and t.counts()["unevaluated"] == len(t.prompt_ids) - 16 > 0
        assert [s for _, _, s in t.spans()] == ["prefilled", "unevaluated"] and not t.reply_ids
    finally:
        engine.close()
