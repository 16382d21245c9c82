"""TTFT predicted before sending (chatphase.engine.ttft_prediction) and the budget line (chatphase.chat.budget),
with scripted timings and the fake engine's counts."""

from __future__ import annotations

import pytest

from chatphase.chat.budget import Budget, budget_of
from chatphase.engine.events import PromptCount
from chatphase.engine.ttft_prediction import (
    PrefillPoint,
    TtftModel,
    TtftPredictor,
    attention_ratio,
    fit,
    prior_from_sweep,
    remaining_ms,
)


def scripted(n: int, depth: int, a=40.0, b=2.0, k=1e-4) -> PrefillPoint:
    """A turn timed by the law the fit assumes: prefill b·n·(1 + k·(depth + n/2)), TTFT a more."""
    prefill = b * n * (1 + k * (depth + n / 2))
    return PrefillPoint(n, depth, prefill, a + prefill)


def test_the_fit_recovers_a_and_b_of_scripted_turns_and_predicts_a_long_message_at_depth():
    turns = [(30, 0), (42, 60), (38, 110)]  # a chat's first turns: all short
    model = fit([scripted(n, d) for n, d in turns], 1e-4, "this chat, 3 turns")
    assert model is not None
    assert model.a_ms == pytest.approx(40.0) and model.b_ms_per_token == pytest.approx(2.0)
    assert model.c_ms_per_token2 == pytest.approx(2e-4)
    assert model.ttft_ms(1200, 400) == pytest.approx(scripted(1200, 400).ttft_ms)


def test_turns_of_many_sizes_fit_the_prefill_s_fixed_cost_so_a_long_prompt_is_not_predicted_high():
    """A prefill with a fixed cost (15 ms a call) and 2 ms a token: through the origin, short turns put the fixed
    cost in the slope and a 2,600-token prompt is predicted a quarter high; with turns of many sizes, the line's
    intercept takes it."""
    timed = [PrefillPoint(n, 0, 15.0 + 2.0 * n, 35.0 + 2.0 * n) for n in (20, 35, 60, 110)]
    model = fit(timed, 0.0, "s")
    assert model is not None and model.prefill_once_ms == pytest.approx(15.0) and model.a_ms == pytest.approx(20.0)
    assert model.ttft_ms(2600, 0) == pytest.approx(35.0 + 2.0 * 2600)
    origin = fit(timed[:1] + timed[1:2], 0.0, "s")  # two turns: too few for an intercept
    assert origin is not None and origin.prefill_once_ms == 0.0 and origin.ttft_ms(2600, 0) > 1.2 * (35.0 + 5200)
    # the same span with a noisy, falling prefill: a negative intercept is not kept
    noisy = [PrefillPoint(n, 0, ms, ms + 20) for n, ms in ((20, 20.0), (35, 30.0), (90, 160.0))]
    kept = fit(noisy, 0.0, "s")  # the line through them crosses at −31 ms
    assert kept is not None and kept.prefill_once_ms == 0.0 and kept.b_ms_per_token == pytest.approx(1.63, abs=0.01)
    # the time left mid-prefill counts the fixed cost as spent with the first chunk
    assert remaining_ms(model, 2600, 0, 100, 215.0) == pytest.approx(2.0 * 2500 + 20.0)


def test_depth_makes_the_same_message_slower():
    model = TtftModel(10.0, 1.0, 1e-3, 3, "x")
    assert model.ttft_ms(100, 4000) > model.ttft_ms(100, 0) + 100 * 1.0 * 1e-3 * 3999


def test_one_turn_is_enough_and_noisy_turns_keep_a_sensible_rate():
    one = fit([PrefillPoint(100, 0, 200.0, 250.0)], 0.0, "s")
    assert one is not None and (one.a_ms, one.b_ms_per_token) == (50.0, 2.0)
    # three short turns 3 ms apart in TTFT: a slope fitted to TTFT would say 0.1 or 10 ms a token; this stays ~2
    noisy = [PrefillPoint(30, 0, 63.0, 80.0), PrefillPoint(40, 0, 77.0, 95.0), PrefillPoint(45, 0, 88.0, 104.0)]
    model = fit(noisy, 0.0, "s")
    assert model is not None and model.b_ms_per_token == pytest.approx(1.96, abs=0.05) and model.a_ms == 17.0
    assert fit([PrefillPoint(0, 0, 5.0, 5.0)], 0.0, "s") is None
    assert fit([PrefillPoint(10, 0, 9.0, 5.0)], 0.0, "s") is None  # a prefill longer than its TTFT: not a turn


def test_the_predictor_uses_the_chat_once_it_has_a_turn_else_the_prior():
    prior = TtftModel(0.0, 9.0, 0.0, 12, "bench results x.json")
    p = TtftPredictor(0.0, prior)
    assert p.predict_ms(100, 0) == 900.0 and p.model is prior
    p.add(100, 0, 150.0, 200.0)
    assert p.model is not None and p.model.source == "this chat, 1 turn" and p.predict_ms(100, 0) == 200.0
    p.add(None, 0, None, 5.0)  # a remote turn without counts: not a point
    p.add(50, 0, 75.0, 125.0)
    assert p.model.source == "this chat, 2 turns"
    p.clear()
    assert p.model is prior


def test_remaining_time_is_corrected_by_the_chunks_done():
    model = TtftModel(100.0, 1.0, 0.0, 3, "s")  # predicts 100 + n ms
    assert remaining_ms(model, 1000, 0, 0, 0.0) == 1100.0
    assert remaining_ms(model, 1000, 0, 500, 500.0) == pytest.approx(600.0)  # on time: 500 left + a
    assert remaining_ms(model, 1000, 0, 500, 1000.0) == pytest.approx(1100.0)  # twice as slow: 1000 left + a
    assert remaining_ms(model, 1000, 0, 1000, 5000.0) == pytest.approx(100.0)


def test_attention_ratio_and_a_prior_from_a_sweeps_samples():
    assert attention_ratio(0, 10) == 0.0 and attention_ratio(100, None) == 0.0
    assert attention_ratio(1000, 500) == 1.0
    samples = [
        {"prompt_tokens": 64, "depth": 0, "warmup": True, "ttft_ms": 999.0, "prefill_tokens_per_s": 1.0},
        {"prompt_tokens": 64, "depth": 0, "warmup": False, "ttft_ms": 50.0 + 64 * 2, "prefill_tokens_per_s": 500.0},
        {"prompt_tokens": 256, "depth": 0, "warmup": False, "ttft_ms": 50.0 + 256 * 2, "prefill_tokens_per_s": 500.0},
        {"prompt_tokens": 32, "depth": 512, "warmup": False, "ttft_ms": None, "prefill_tokens_per_s": 500.0},
    ]
    prior = prior_from_sweep(samples, 0.0, "bench results s.json")
    assert prior is not None and prior.a_ms == pytest.approx(50.0) and prior.b_ms_per_token == pytest.approx(2.0)
    assert prior_from_sweep([], 0.0, "s") is None


def test_the_budget_line_says_tokens_context_and_ttft_with_its_source():
    count = PromptCount(prompt_tokens=2600, cached_tokens=1000, kv_cache_tokens=1680, n_ctx=4096)
    p = TtftPredictor(0.0)
    assert budget_of(count, p).line() == "+1,600 tok · context 41 % → 63 % · TTFT: after the first turn"
    p.add(100, 0, 525.0, 525.0)  # 5.25 ms a token
    assert budget_of(count, p).line() == "+1,600 tok · context 41 % → 63 % · TTFT ≈ 8.4 s (this chat, 1 turn)"
    dropped = PromptCount(4000, 0, 3900, 4096, dropped_messages=4)
    assert budget_of(dropped, p).line().endswith("· leaves out the oldest 4 messages")


def test_a_prefix_the_store_would_restore_is_predicted_as_a_restore_not_a_prefill():
    """A resumed chat whose conversation is saved: the line says what comes from disk, and the TTFT is the
    restore's predicted time plus the prefill of the rest (not a cold prefill of it all)."""
    p = TtftPredictor(0.0)
    p.add(100, 0, 525.0, 525.0)  # 5.25 ms a token
    count = PromptCount(2872, 0, 0, 4096, restore_tokens=2855, restore_ms=20.0)
    budget = budget_of(count, p)
    assert count.new_tokens == 17 and budget.ttft_ms == pytest.approx(20.0 + 17 * 5.25)
    assert (
        budget.line() == "+17 tok · 2,855 restored from disk · context 0 % → 70 % · TTFT ≈ 109 ms (this chat, 1 turn)"
    )


def test_a_prediction_under_a_second_is_said_in_ms():
    """A short edit predicted at 40 ms read "TTFT ≈ 0.0 s": under a second the line says ms."""
    p = TtftPredictor(0.0)
    p.add(100, 0, 300.0, 320.0)  # 3 ms a token, 20 ms before the prefill
    line = budget_of(PromptCount(414, 400, 400, 4096), p).line()
    assert line.endswith("TTFT ≈ 62 ms (this chat, 1 turn)")  # 20 + 14 × 3


def test_a_message_that_does_not_fit_says_so_with_the_numbers():
    count = PromptCount(None, 0, 100, 512, too_long="the message is 900 tokens; the context leaves room for 384")
    budget = budget_of(count, TtftPredictor(0.0))
    assert not budget.fits and budget == Budget(count)
    assert budget.line() == "Does not fit: the message is 900 tokens; the context leaves room for 384"


# -- the chat: counts from the engine, predictions in the turns' metrics --------------------------------------
def _chat(**kw):
    from chat_support import make_chat

    from chatphase.chat.dispatch import InlineDispatcher

    chat, engines, calls = make_chat(dispatcher=InlineDispatcher(), **kw)
    chat.start_engine()
    return chat, engines[0], calls


def test_the_chat_counts_a_draft_with_the_engine_and_its_files_alone():
    chat, engine, _calls = _chat(replies=["one two three"])
    chat.send("hello there")
    request = chat.draft_request("summarise this please", ("a b c d",))
    assert request is not None and request.messages[-1].content == "summarise this please"
    count = chat.count(request)
    # the fake's template: 3 tokens a message + its words, 2 for the assistant header; the cache holds turn 1
    assert count is not None and count.text_tokens == (4,)
    assert count.prompt_tokens == (3 + 2) + (3 + 3) + (3 + 3) + 2 and count.kv_cache_tokens == (3 + 2) + 2 + 3
    assert count.new_tokens == count.prompt_tokens - count.cached_tokens
    assert engine.counts == [request]


def test_no_count_without_an_engine_that_counts_or_while_it_is_gone():
    chat, engine, _calls = _chat()
    engine.kill()
    request = chat.draft_request("hi")
    assert request is not None and chat.count(request) is None
    chat._let_go()
    assert chat.draft_request("hi") is None and chat.count(request) is None


def test_each_turn_after_the_first_carries_its_predicted_ttft_next_to_the_measured():
    chat, _engine, calls = _chat(replies=["a b c d e"])
    for text in ("first message", "second message here", "a third and longer message than before"):
        chat.send(text)
    finished = [args[1].metrics for args in calls.args_of("turn_finished")]
    assert finished[0].ttft_predicted_ms is None  # nothing measured before the first turn, no prior
    for m in finished[1:]:
        assert m.ttft_predicted_ms is not None and m.ttft_prediction_source.startswith("this chat, ")
    # the fake's prefill is 2 ms a token, and 1 ms tokenise + 20 ms the first token around it: predicted exactly
    last = finished[2]
    assert last.ttft_predicted_ms == pytest.approx(last.ttft_ms, rel=0.02)
    assert "ttft_predicted_ms" in last.to_dict()
    chat.new_chat()
    assert chat.ttft.model is None


def test_the_turn_detail_shows_the_predicted_ttft_and_the_prefill_bar_the_time_left():
    from dataclasses import replace

    from chatphase.chat.turn import Turn
    from chatphase.engine.events import PrefillProgress, PrefillStarted, TurnRequest
    from chatphase.engine.metrics import TurnMetrics
    from chatphase.ui.dashboard.turn_detail import metric_pairs
    from chatphase.ui.phases.indicator import _left

    m = TurnMetrics(49, 42, 7, 14.0, 500.0, 35.0, 3, 40.0, 50.0, 20.0, 20.0, 20.0, 52, 1, 52, 4096, "stop")
    assert "TTFT pred. ms" not in dict(metric_pairs(m))
    assert dict(metric_pairs(replace(m, ttft_predicted_ms=33.25)))["TTFT pred. ms"] == "33.2"
    turn = Turn(1, 1, "send", "hi", 0, TurnRequest(1))
    assert turn.ttft_left_ms() is None
    turn.prefill = PrefillStarted(1, 1000, 0, 1000, 0, 0)
    turn.ttft_model = TtftModel(100.0, 1.0, 0.0, 3, "s")
    assert turn.ttft_left_ms() == 1100.0
    turn.progress = PrefillProgress(1, 500, 1000, 1000.0)  # twice as slow as predicted
    assert turn.ttft_left_ms() == pytest.approx(1100.0)
    assert _left(1100.0) == " · ≈ 1.1 s left" and _left(None) == ""


def test_before_the_first_turn_the_prior_comes_from_the_models_saved_sweep():
    import json

    from fake_engine import fake_model_info

    from chatphase.chat.ttft_prior import results_dir

    folder = results_dir()
    folder.mkdir(parents=True)
    (folder / "junk.json").write_text("{not json")
    (folder / "parallel.json").write_text(json.dumps({"kind": "parallel", "samples": []}))
    other = {"kind": "sweep", "model": {"path": "/models/other.gguf"}, "samples": [{"prompt_tokens": 9, "ttft_ms": 1}]}
    (folder / "other.json").write_text(json.dumps(other))
    samples = [
        {"prompt_tokens": n, "depth": 0, "warmup": False, "ttft_ms": 30.0 + 3.0 * n, "prefill_tokens_per_s": 1000 / 3}
        for n in (64, 256, 512)
    ]
    mine = {"kind": "sweep", "model": {"path": "/elsewhere/SmolLM2-135M-Instruct.Q4_1.gguf"}, "samples": samples}
    (folder / "smollm.json").write_text(json.dumps(mine))
    chat, _engine, calls = _chat(replies=["ok"])
    assert fake_model_info().path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    model = chat.ttft.model
    assert model is not None and model.source == "bench results smollm.json"
    assert model.a_ms == pytest.approx(30.0) and model.b_ms_per_token == pytest.approx(3.0)  # no attention shape: k = 0
    chat.send("hello")
    first = calls.args_of("turn_finished")[0][1].metrics
    assert first.ttft_predicted_ms is not None and first.ttft_prediction_source == "bench results smollm.json"
    assert chat.ttft.model.source == "this chat, 1 turn"
