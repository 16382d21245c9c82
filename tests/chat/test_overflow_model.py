"""Overflow and cache-miss reasons on the real default model (and Gemma 3 for the sliding window).

A 22-turn chat at ``n_ctx=512`` (over three times its context) runs to its end under ``drop-oldest`` and ``shift``, each overflow noticed with
its cost; ``shift`` evaluates no history again (the engine's own counts); ``stop`` refuses with the numbers; and
every cache-miss reason is produced by the situation it names.
"""

from __future__ import annotations

from types import SimpleNamespace

import llama_cpp as lc
import pytest
from chat_support import Calls

from chatphase.chat.budget import budget_of
from chatphase.chat.controller import ChatController
from chatphase.chat.dispatch import InlineDispatcher
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import (
    EngineFailed,
    Message,
    ModelLoaded,
    PrefillStarted,
    SamplingParams,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.local import llama_params
from chatphase.engine.local.llama import LlamaEngine
from chatphase.engine.tokens import TurnTokens
from chatphase.settings.schema import Settings

FILLER = "Here is some more of my notes about the harbour, the boats, the tides and the weather this week."


def chat_on(info, tmp_path, **overrides):
    # the prefix store off, as conftest.py means it for chats (its env var reaches only the config's layers, not
    # Settings()): its folder is shared by the run, so one test's saved prefix was restored in another's turn
    defaults = {"n_ctx": 1024, "temperature": 0, "max_tokens": 24, "prefix_cache": "off"}
    settings = Settings().with_overrides(**defaults | overrides)
    calls = Calls()

    def factory(model_info, s):
        return LlamaEngine(model_info, s.engine, log_path=tmp_path / "engine.log")

    chat = ChatController(settings, info, factory, InlineDispatcher(), [calls])
    chat.start_engine()
    assert chat.ready
    return chat, calls


def finished(calls: Calls) -> list:
    return [ev.metrics for _turn, ev in calls.args_of("turn_finished")]


def run_long_chat(chat, calls, turns=22):
    for i in range(turns):
        chat.send(f"Note {i}: {FILLER} {FILLER} What is {i} plus {i}?")
    return finished(calls)


@pytest.mark.parametrize("policy", ["drop-oldest", "shift"])
def test_a_long_chat_runs_past_n_ctx_and_says_each_overflow_and_its_cost(default_model_info, tmp_path, policy):
    chat, calls = chat_on(default_model_info, tmp_path, overflow=policy, n_ctx=512)
    try:
        metrics = run_long_chat(chat, calls)
        assert len(metrics) == 22 and not calls.args_of("turn_failed")
        conversation = chat.engine.template.tokens([Message("system", ""), *chat.conversation])
        assert len(conversation) > 3 * 512  # the chat went on for several times n_ctx
        overflows = [m for m in metrics if m.overflow is not None]
        assert len(overflows) >= 3 and all(m.overflow == policy for m in overflows)
        notices = [n.text for n in calls.notices() if n.kind == "dropped"]
        assert len(notices) == len(overflows)
        for m, text in zip(overflows, notices, strict=True):
            assert f"oldest {m.overflow_dropped_messages} messages ({m.overflow_dropped_tokens:,} tok)" in text
            assert m.cache_miss_reason == ("overflow_shift" if policy == "shift" else "overflow_drop")
            if policy == "shift":
                assert m.overflow_reprefill_tokens == 0 and "KV shift · 0 tok re-prefilled" in text
            else:
                assert m.overflow_reprefill_tokens > 100 and f"re-prefill {m.overflow_reprefill_tokens:,} tok" in text
                assert m.overflow_reprefill_ms > 0
        newest = len(chat.engine.tokenize(f"Note 21: {FILLER} {FILLER} What is 21 plus 21?"))
        for m in metrics[1:]:  # the engine's own count of evaluated tokens
            if policy == "shift" or m.overflow is None:
                assert m.prefill_tokens <= newest + 16, m  # the new message and the template's markers only
        left_out = calls.args_of("history_left_out")
        assert left_out and left_out[-1][0] > 0  # the transcript marks the turns the model no longer sees
        assert chat.history.left_out == metrics[-1].dropped_messages
    finally:
        chat.close()


def test_stop_refuses_with_the_numbers_and_gives_the_message_back(default_model_info, tmp_path):
    chat, calls = chat_on(default_model_info, tmp_path, overflow="stop")
    try:
        for i in range(30):
            chat.send(f"Note {i}: {FILLER} {FILLER}")
            if calls.args_of("turn_failed"):
                break
        ((_turn, message),) = calls.args_of("turn_failed")
        assert "n_ctx 1,024, 24 kept for the reply" in message and "the conversation is" in message
        assert "room for 1,000" in message
        assert all(m.overflow is None and m.dropped_messages == 0 for m in finished(calls))
    finally:
        chat.close()


@pytest.mark.parametrize("policy", ["shift", "drop-oldest"])
def test_a_reply_that_fills_the_context_goes_on(default_model_info, tmp_path, policy):
    engine = LlamaEngine(default_model_info, EngineConfig(n_ctx=512), log_path=tmp_path / "engine.log")
    assert isinstance(list(engine.load())[-1], ModelLoaded)
    try:
        sp = SamplingParams(max_tokens=300, temperature=0)
        msgs = [Message("system", "You tell stories.")]
        first = 0
        for i in range(2):
            msgs.append(Message("user", f"Write a very long story number {i} about a lighthouse keeper."))
            req = TurnRequest(i + 1, tuple(msgs), sp, ignore_eos=True, overflow=policy, first_message=first)
            fin = list(engine.run_turn(req))[-1]
            assert isinstance(fin, TurnFinished) and fin.tokens is not None
            t, m = fin.tokens, fin.metrics
            assert t.view_counts() == TurnTokens.metric_counts(m)  # the token view's counts are the metrics'
            first = m.dropped_messages
            msgs.append(Message("assistant", fin.reply))
        # turn 2's prompt fits, its reply does not: the first exchange leaves mid-reply and the reply goes on
        assert (m.stop_reason, m.decode_tokens, m.overflow, m.dropped_messages) == ("length", 300, policy, 2)
        # the token view's left-out tokens are the cells that left: the first exchange less the text it shares
        # with the second's start, as many as overflow_dropped_tokens says
        assert len(t.left_out_ids) == m.overflow_dropped_tokens > 0
        assert t.left_out_how == ("shifted" if policy == "shift" else "dropped")
        left = "".join(t.text(i) for i in t.left_out_ids)
        assert left.startswith("0 about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"), left
        assert m.kv_cache_tokens < 512
        assert (m.overflow_reprefill_tokens == 0) == (policy == "shift")
        # the cache still spells what the next prompt starts with: the next turn reuses it
        msgs.append(Message("user", "Give it a title."))
        nxt = list(engine.run_turn(TurnRequest(3, tuple(msgs), SamplingParams(max_tokens=8), overflow=policy,
                                               first_message=first)))[-1]  # fmt: skip
        assert nxt.metrics.cached_tokens == m.kv_cache_tokens and nxt.metrics.cache_miss_reason is None
    finally:
        engine.close()


def test_shift_is_refused_with_the_reason_where_llama_cpp_cannot_shift(default_model_info, tmp_path, monkeypatch):
    monkeypatch.setattr(lc, "llama_memory_can_shift", lambda mem: False)
    chat, calls = chat_on(default_model_info, tmp_path, overflow="shift", n_ctx=256)
    try:
        assert any("cannot shift its KV cache" in n.text for n in calls.notices())
        for i in range(8):
            chat.send(f"Note {i}: {FILLER}")
            if calls.args_of("turn_failed"):
                break
        ((_turn, message),) = calls.args_of("turn_failed")
        assert "overflow shift refused: llama.cpp cannot shift this model's KV cache" in message
    finally:
        chat.close()


# -- every cache-miss reason, from the situation it names ----------------------------------------------------
def reasons(calls: Calls) -> list[str | None]:
    return [m.cache_miss_reason for m in finished(calls)]


def test_edit_regenerate_restart_model_switch_and_resume_are_the_reasons(default_model_info, tmp_path):
    # the prefix store off: a restore after a restart, a switch or a resume is its own case
    # (tests/engine/test_prefix_store_model.py)
    chat, calls = chat_on(default_model_info, tmp_path)
    try:
        chat.send("Name a colour.")
        chat.send("Name another.")
        chat.regenerate()
        chat.take_back_last()
        chat.send("Name a fruit.")
        chat.restart_engine()
        chat.send("Name a tree.")
        chat.switch_model(default_model_info)
        chat.send("Name a bird.")
        chat.restart_engine()  # a resumed session starts on an empty cache (its restore says so, not the restart)
        turn = SimpleNamespace(index=7, in_conversation=True, metrics=None)
        chat.restore(SimpleNamespace(history=lambda: list(chat.conversation), turns=[turn], settings={}))
        chat.send("Name a fish.")
        chat.new_chat()
        chat.send("Name a fish.")  # a new chat on a cache that holds the last one: nothing of it was missed
        assert reasons(calls) == [None, None, "regenerated", "edited", "restarted", "model_switch", "resumed", None]
        misses = [n for n in calls.notices() if n.kind in ("cache_miss", "reuse")]
        assert any("the reply was regenerated" in n.text for n in misses)
        assert any("the engine was restarted" in n.text for n in misses)
    finally:
        chat.close()


def test_a_restore_from_disk_that_holds_less_is_restored(default_model_info, tmp_path):
    engine = LlamaEngine(default_model_info, EngineConfig(n_ctx=512), log_path=tmp_path / "engine.log")
    list(engine.load())
    try:
        msgs = (Message("user", "Hi"), Message("assistant", "Hello!"), Message("user", "Bye"))
        req = TurnRequest(1, msgs, SamplingParams(max_tokens=4), history_change="restored")
        fin = list(engine.run_turn(req))[-1]
        assert fin.metrics.cache_miss_reason == "restored"
    finally:
        engine.close()


def test_thinking_left_out_of_the_history_is_the_template(thinking_model_info, tmp_path):
    chat, calls = chat_on(thinking_model_info, tmp_path, max_tokens=40, think_budget=8)
    try:
        chat.send("What is 2 + 2?")
        assert finished(calls)[0].thinking_tokens  # the cache holds the thinking, the next prompt does not
        chat.send("And 3 + 3?")
        assert reasons(calls) == [None, "template"]
        assert any("renders an earlier turn differently" in n.text for n in calls.notices())
    finally:
        chat.close()


def test_a_memory_that_cannot_drop_a_tail_is_recurrent(default_model_info, tmp_path, monkeypatch):
    engine = LlamaEngine(default_model_info, EngineConfig(n_ctx=512), log_path=tmp_path / "engine.log")
    list(engine.load())
    try:
        msgs = [Message("user", "Name a colour.")]
        fin = list(engine.run_turn(TurnRequest(1, tuple(msgs), SamplingParams(max_tokens=8, temperature=0))))[-1]
        monkeypatch.setattr(lc, "llama_memory_seq_rm", lambda *a: False)  # as a recurrent model's memory answers
        msgs[1:] = [Message("assistant", "Something else " + fin.reply), Message("user", "Another.")]
        fin = list(engine.run_turn(TurnRequest(2, tuple(msgs), SamplingParams(max_tokens=4))))[-1]
        assert (fin.metrics.cached_tokens, fin.metrics.cache_miss_reason) == (0, "recurrent")
    finally:
        engine.close()


def test_a_sliding_window_cache_that_evicted_the_window_is_swa(gemma_model_info, tmp_path, monkeypatch):
    original = llama_params.context_params

    def small_swa(settings):  # llama-server's default: an SWA cache of the window, not of n_ctx
        params = original(settings)
        params.swa_full = False
        return params

    monkeypatch.setattr("chatphase.engine.local.llama.context_params", small_swa)
    engine = LlamaEngine(gemma_model_info, EngineConfig(n_ctx=2048, n_batch=256), log_path=tmp_path / "engine.log")
    assert isinstance(list(engine.load())[-1], ModelLoaded)
    try:
        assert "sliding-window KV cache is smaller than n_ctx" in engine.loaded.kv_shift_refusal  # shift refused
        long = " ".join(f"word{i}" for i in range(400))
        sp = SamplingParams(max_tokens=2, temperature=0)
        hello = (Message("user", "Hi"), Message("assistant", "Hello!"))
        first = list(engine.run_turn(TurnRequest(1, (*hello, Message("user", "A: " + long)), sp)))[-1]
        assert first.metrics.prompt_tokens > 1100 and lc.llama_memory_seq_pos_min(engine._kv.mem, 0) > 0
        edited = list(engine.run_turn(TurnRequest(2, (*hello, Message("user", "A: " + long[:200])), sp)))[-1]
        assert not isinstance(edited, EngineFailed)
        assert (edited.metrics.cached_tokens, edited.metrics.cache_miss_reason) == (0, "swa")
    finally:
        engine.close()


@pytest.mark.parametrize("policy", ["shift", "drop-oldest", "stop"])
def test_the_budget_line_counts_the_messages_the_turn_then_leaves_out(default_model_info, tmp_path, policy):
    """Seen: under shift the budget line said "leaves out the oldest 4 messages" and the turn then shifted out 2:
    the count fitted the whole conversation (the messages already left out counted again) and without the
    turn's low-water mark. It now fits as the turn does, and says what sending newly leaves out.

    Seen too: under shift the line said "+231 tok · … TTFT ≈ 1.4 s" and the turn prefilled 17 (TTFT 160 ms): the
    count took the cache as a prefix, so only the system prompt was cached, as if the kept history were evaluated
    again. Each turn's count (tokens, cached, new, the TTFT priced on them) is now what the turn then did (the
    prefix store off: an earlier test's saved prefix restored would add its predicted and measured restore)."""
    chat, calls = chat_on(default_model_info, tmp_path, overflow=policy, n_ctx=512)
    try:
        said, done, counted, turned = [], [], [], []
        for i in range(14):
            message = f"Note {i}: {FILLER} What is {i} plus {i}?"
            request = chat.draft_request(message)
            assert request is not None and request.first_message == chat.history.left_out
            count = chat.count(request)
            assert count is not None
            if count.prompt_tokens is None:  # stop: the line says it does not fit, and the turn is refused
                assert policy == "stop" and count.too_long
                chat.send(message)
                assert calls.args_of("turn_failed")
                break
            said.append(count.dropped_messages)
            budget = budget_of(count, chat.ttft)
            chat.send(message)
            m = finished(calls)[-1]
            done.append(m.overflow_dropped_messages or 0)
            counted.append((count.prompt_tokens, count.cached_tokens, count.new_tokens, budget.ttft_ms))
            turned.append((m.prompt_tokens, m.cached_tokens, m.prefill_tokens, m.ttft_predicted_ms))
        assert said == done and (sum(done) > 0) == (policy != "stop"), (said, done)
        assert counted == turned
        assert policy != "stop" or calls.args_of("turn_failed")
    finally:
        chat.close()


def test_an_overflow_on_an_empty_cache_reprefills_nothing(default_model_info, tmp_path):
    # a resumed conversation's first turn on a fresh engine: what its fit drops was never in this cache, so no
    # token is evaluated "again" (it used to count every prompt token but the last, the new message's included)
    engine = LlamaEngine(default_model_info, EngineConfig(n_ctx=512), log_path=tmp_path / "engine.log")
    list(engine.load())
    try:
        old = [Message(r, f"Note {i}: {FILLER} {FILLER}") for i in range(6) for r in ("user", "assistant")]
        req = TurnRequest(1, (*old, Message("user", "Bye")), SamplingParams(max_tokens=4))
        events = list(engine.run_turn(req))
        (pre,) = [ev for ev in events if isinstance(ev, PrefillStarted)]
        assert pre.overflow == "drop-oldest" and pre.overflow_dropped_messages > 0 and pre.cached_tokens == 0
        assert pre.overflow_reprefill_tokens == 0 and events[-1].metrics.overflow_reprefill_tokens == 0
    finally:
        engine.close()


@pytest.mark.parametrize("how", ["restart", "switch", "larger", "smaller"])
def test_a_fresh_engine_reports_no_overflow_for_what_the_chat_had_left_out(default_model_info, tmp_path, how):
    """Seen: after an engine restart or a model switch the first turn's fit (from message 0 on an empty cache) left
    out the same messages again and reported them as a new overflow: a "Context full" notice and
    overflow_dropped_messages counted again in stats. Only messages left out beyond the chat's own count are an
    overflow; a larger n_ctx brings them back and the transcript's marks follow, a smaller one leaves out more."""
    chat, calls = chat_on(default_model_info, tmp_path, n_ctx=512)
    try:
        for i in range(30):  # up to the first overflow: the next short message fits after it
            chat.send(f"Note {i}: {FILLER} What is {i} plus {i}?")
            if finished(calls)[-1].overflow is not None:
                break
        left_out, said = chat.history.left_out, len(calls.notices())
        assert left_out > 0
        if how in ("larger", "smaller"):
            chat.settings = chat.settings.with_overrides(n_ctx=2048 if how == "larger" else 256)
        chat.restart_engine() if how != "switch" else chat.switch_model(chat.model_info)
        count = chat.count(chat.draft_request("Thanks."))  # type: ignore[arg-type]
        assert count is not None
        chat.send("Thanks.")
        m = finished(calls)[-1]
        dropped = [n for n in calls.notices()[said:] if n.kind == "dropped"]
        assert count.dropped_messages == m.overflow_dropped_messages  # the budget line said what the turn did
        if how == "smaller":  # only the messages left out beyond the chat's own are this turn's overflow
            assert m.overflow == "drop-oldest" and m.overflow_dropped_messages == m.dropped_messages - left_out > 0
            assert chat.history.left_out == m.dropped_messages and len(dropped) == 1
            assert f"the oldest {m.overflow_dropped_messages} messages ({m.overflow_dropped_tokens:,} tok)" in (
                dropped[0].text
            )
            return
        assert (m.overflow, m.overflow_dropped_messages) == (None, 0)
        if how == "larger":
            assert m.dropped_messages == chat.history.left_out == 0
            assert calls.args_of("history_left_out")[-1] == (0,)
            assert [n.severity for n in dropped] == ["information"] and "back in the context" in dropped[0].text
        else:
            assert m.dropped_messages == chat.history.left_out == left_out and dropped == []
    finally:
        chat.close()
