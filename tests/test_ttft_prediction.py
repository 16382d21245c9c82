"""TTFT predicted before sending (chatphase.engine.ttft_prediction), the budget line (chatphase.chat.budget) and the
turn's one prediction, with scripted timings: points made by a known law, and the fake engine's scripted clock
(``FakeTiming``: a fixed cost, a cost per token, the attention's per token × context, a restore's)."""

from __future__ import annotations

import json
import math

import pytest
from test_ttft_trust import _chat, finished, words

from chatphase.chat.budget import Budget, budget_of, duration_range, ttft_text
from chatphase.engine.events import PromptCount
from chatphase.engine.ttft_prediction import (
    MIN_HALF_WIDTH,
    PrefillPoint,
    TtftBound,
    TtftPredictor,
    attention_ratio,
    fit,
    points_from_sweep,
    predict,
    remaining_ms,
    t95,
)


def chunked_context(n: int, depth: int, chunk: int = 256) -> float:
    """``Σ (start + u/2)`` over the prefill's chunks of ``chunk`` tokens: the KV context each one reads."""
    return sum(depth + start + min(chunk, n - start) / 2 for start in range(0, n, chunk))


def law(n: int, depth: int, a=20.0, p0=15.0, b=2.0, c=0.05, origin="this chat") -> PrefillPoint:
    """A prefill timed by the model's own law: ``p0 + b·n + c·Σ chunk context``, TTFT ``a`` more."""
    prefill = p0 + b * n + c * chunked_context(n, depth)
    return PrefillPoint(n, depth, prefill, a + prefill, origin=origin)


# -- the model ---------------------------------------------------------------------------------------------------
def test_the_fit_recovers_the_fixed_cost_the_weights_and_the_attention_of_prefills_spanning_sizes_and_depths():
    points = [law(n, d) for n, d in ((600, 0), (20, 640), (18, 1200), (25, 1900), (300, 400))]
    model = fit(points, 0.0)
    assert model is not None and model.free == (True, True) and model.source == "this chat, 5 turns"
    assert (model.a_ms, model.p0_ms, model.b_ms_per_token) == pytest.approx((20.0, 15.0, 2.0))
    assert model.c_ms_per_token2 == pytest.approx(0.05)
    p = predict(model, points, 18, 2500)
    assert p.ttft_ms == pytest.approx(law(18, 2500).ttft_ms) and p.withheld is None
    # exact points: the narrowest range, ±5 %
    assert p.low_ms == pytest.approx(p.ttft_ms / (1 + MIN_HALF_WIDTH)) and p.high_ms == pytest.approx(
        p.ttft_ms * (1 + MIN_HALF_WIDTH)
    )


def test_points_of_one_size_and_one_context_tie_the_attention_to_the_shape_and_have_no_fixed_cost():
    k = 1e-4
    tied = [(n, d, 2.0 * n * (1 + k * (d + n / 2))) for n, d in ((30, 100), (42, 110), (38, 120))]
    points = [PrefillPoint(n, d, ms, ms + 20.0) for n, d, ms in tied]  # b·n·(1 + k·ctx): the FLOPs' shape
    model = fit(points, k)
    assert model is not None and model.free == (False, False)
    assert model.b_ms_per_token == pytest.approx(2.0) and model.c_ms_per_token2 == pytest.approx(2.0 * k)


def test_a_negative_fixed_cost_is_not_kept():
    noisy = [PrefillPoint(n, 0, ms, ms + 20) for n, ms in ((20, 20.0), (35, 30.0), (90, 160.0))]
    model = fit(noisy, 0.0)  # the line through them crosses at −31 ms
    assert model is not None and model.p0_ms == 0.0


def test_one_point_is_not_enough_and_is_said_so_with_the_bounds_it_gives():
    one = [PrefillPoint(100, 0, 200.0, 250.0)]
    assert fit(one, 0.0) is None
    p = predict(None, one, 300, 50)
    assert p.ttft_ms is None and p.withheld is not None and (p.withheld.why, p.withheld.n_points) == ("turns", 1)
    assert (p.low_ms, p.high_ms) == (200.0 + 50.0, None)  # no fewer tokens, no less depth: at least its prefill
    smaller = predict(None, one, 50, 0)
    assert (smaller.low_ms, smaller.high_ms) == (None, 250.0)  # fewer tokens at no more depth: at most its TTFT
    roof = predict(None, [], 1000, 0, bound=TtftBound(1e11, 4e7, 0.0))
    assert roof.low_ms == pytest.approx(400.0) and roof.bound_source == "roofline"
    assert fit([PrefillPoint(0, 0, 5.0, 5.0), PrefillPoint(10, 0, 9.0, 5.0)], 0.0) is None  # no usable point


def test_far_beyond_the_measured_sizes_or_contexts_the_prediction_is_withheld():
    points = [law(n, d) for n, d in ((40, 0), (120, 30), (200, 100), (60, 400))]
    model = fit(points, 0.0)
    assert model is not None
    assert predict(model, points, 400, 0).withheld is None  # twice the largest: still in reach
    far = predict(model, points, 401, 0)
    assert (
        far.ttft_ms is None
        and far.withheld is not None
        and (far.withheld.why, far.withheld.limit)
        == (
            "tokens_above",
            200,
        )
    )
    deep = predict(model, points, 60, 1000)  # context 1,030 > 2 × 430
    assert deep.withheld is not None and deep.withheld.why == "context" and deep.low_ms is not None


def test_the_range_is_the_leave_one_out_spread_and_wide_disagreement_is_no_prediction():
    rng = [1.00, 1.08, 0.93, 1.05, 0.96, 1.10, 0.91, 1.02, 0.98, 1.06]  # ±10 % around the law
    points = []
    for i, f in enumerate(rng):
        base = law(30 + 60 * i, 50 * i)
        points.append(PrefillPoint(base.tokens, base.depth, base.prefill_ms * f, base.ttft_ms * f))
    model = fit(points, 0.0)
    assert model is not None and 0.03 < model.log_spread < 0.3
    p = predict(model, points, 300, 200)
    assert p.ttft_ms is not None and p.low_ms is not None and p.high_ms is not None
    half = math.log(p.high_ms / p.ttft_ms)
    widening = math.sqrt((1 + model.leverage(300, 200)) / (1 + model.n_params / len(points)))
    assert half == pytest.approx(math.log(p.ttft_ms / p.low_ms))
    assert half == pytest.approx(t95(len(points) - model.n_params) * model.log_spread * widening)
    wild = [
        PrefillPoint(q.tokens, q.depth, q.prefill_ms * f**12, q.ttft_ms * f**12)
        for q, f in zip(points, rng, strict=True)
    ]
    bad = predict(fit(wild, 0.0), wild, 300, 200)
    assert bad.ttft_ms is None and bad.withheld is not None and bad.withheld.why == "uneven"


def restored(t: int, n: int = 20, read=0.01, after=120.0) -> PrefillPoint:
    """A turn restoring ``t`` tokens (read at ``read`` ms a token), whose prefill of ``n`` after it is ``after`` ms
    slower than the law's (the first prefill after a restore)."""
    base = law(n, t)
    return PrefillPoint(n, t, base.prefill_ms + after, base.ttft_ms + after + read * t, t, read * t)


def test_a_restore_adds_its_read_and_a_fixed_part_and_its_slow_prefill_does_not_bend_the_fit():
    plain = [law(n, d) for n, d in ((40, 0), (300, 20), (30, 500), (50, 900), (25, 1500))]
    points = plain + [restored(t) for t in (1000, 3000)]
    model = fit(points, 0.0)
    assert model is not None and model.restore is not None and model.n_points == 5
    assert (model.p0_ms, model.b_ms_per_token, model.c_ms_per_token2) == pytest.approx((15.0, 2.0, 0.05))
    assert (model.restore.once_ms, model.restore.ms_per_token) == (pytest.approx(120.0), pytest.approx(0.01))
    p = predict(model, points, 17, 2000, restore_tokens=2000, restore_estimate_ms=5.0)
    assert p.restore_ms == pytest.approx(140.0) and p.ttft_ms == pytest.approx(law(17, 2000).ttft_ms + 140.0)
    one = plain + [restored(1000)]
    withheld = predict(fit(one, 0.0), one, 17, 2000, restore_tokens=2000, restore_estimate_ms=5.0)
    assert withheld.ttft_ms is None and ttft_text(withheld) == "TTFT: not enough restores yet (1)"
    assert withheld.high_ms is None  # what a restore adds is not known: no upper bound
    spanning = plain + [restored(t, read=0.0, after=40.0 + 0.01 * t) for t in (400, 1000, 3000)]
    term = fit(spanning, 0.0).restore
    assert term is not None and (term.once_ms, term.ms_per_token) == (pytest.approx(40.0), pytest.approx(0.01))


def test_remaining_time_is_corrected_by_the_chunks_done_and_counts_the_fixed_cost_as_spent():
    points = [law(n, 0, a=20.0, p0=15.0, b=2.0, c=0.0) for n in (20, 35, 60, 110, 900)]
    model = fit(points, 0.0)
    p = predict(model, points, 1000, 0)
    assert p.ttft_ms == pytest.approx(20.0 + 15.0 + 2000.0)
    assert remaining_ms(p, 0, 0.0) == pytest.approx(2035.0)
    assert remaining_ms(p, 500, 1015.0) == pytest.approx(1000.0 + 20.0)  # on time: 500 tokens left + a
    assert remaining_ms(p, 500, 2030.0) == pytest.approx(2000.0 + 20.0)  # twice as slow
    assert remaining_ms(predict(None, [], 10, 0), 5, 5.0) is None  # nothing predicted, no time left


def test_attention_ratio_and_the_points_of_a_sweeps_samples():
    assert attention_ratio(0, 10) == 0.0 and attention_ratio(100, None) == 0.0
    assert attention_ratio(1000, 500) == 1.0
    samples = [
        {"prompt_tokens": 64, "depth": 0, "warmup": True, "ttft_ms": 999.0, "prefill_tokens_per_s": 1.0},
        {"prompt_tokens": 64, "depth": 0, "warmup": False, "ttft_ms": 50.0 + 64 * 2, "prefill_tokens_per_s": 500.0},
        {"prompt_tokens": 32, "depth": 512, "warmup": False, "ttft_ms": None, "prefill_tokens_per_s": 500.0},
        {"prompt_tokens": 40, "depth": 512, "prefill_tokens": 8, "cached_tokens": 32, "ttft_ms": 70.0,
         "prefill_tokens_per_s": 400.0},
    ]  # fmt: skip
    assert points_from_sweep(samples, "bench results s.json") == [
        PrefillPoint(64, 0, 128.0, 178.0, origin="bench results s.json"),
        PrefillPoint(8, 32, 20.0, 70.0, origin="bench results s.json"),
    ]


def test_the_predictor_fits_the_prior_and_the_chat_together_and_names_both():
    prior = [law(n, d, origin="earlier chats") for n, d in ((40, 0), (300, 20), (30, 500), (50, 900))]
    p = TtftPredictor(0.0, prior)
    assert p.model is not None and p.model.source == "earlier chats, 4 turns"
    first = p.predict(20, 100)
    assert p.predict(20, 100) is first  # the same question on the same fit: the same object
    p.add(100, 0, law(100, 0).prefill_ms, law(100, 0).ttft_ms)
    p.add(None, 0, None, 5.0)  # a remote turn without counts: not a point
    assert p.model.source == "this chat + earlier chats, 5 turns" and p.predict(20, 100) is not first
    p.prior = [*prior, *points_from_sweep([], "x")]
    p.clear()
    assert p.model.source == "earlier chats, 4 turns" and p.n_points == 4
    bench = TtftPredictor(0.0, [law(n, 0, origin="bench results s.json") for n in (10, 100)])
    assert bench.model is not None and bench.model.source == "bench results s.json, 2 prefills"


# -- the budget line ---------------------------------------------------------------------------------------------
def exact_chat_predictor() -> TtftPredictor:
    """Three prefills at 5.25 ms a token, 20 ms around them: a prediction with the narrowest range."""
    p = TtftPredictor(0.0)
    for n, depth in ((100, 0), (180, 600), (260, 1200)):
        p.add(n, depth, 5.25 * n, 5.25 * n + 20)
    return p


def test_the_budget_line_says_tokens_context_and_ttft_with_its_range_and_source():
    count = PromptCount(prompt_tokens=1300, cached_tokens=1000, kv_cache_tokens=1100, n_ctx=4096)
    p = TtftPredictor(0.0)
    assert budget_of(count, p).line() == "+300 tok · context 27 % → 32 % · TTFT: not enough turns yet (0)"
    p.add(100, 0, 525.0, 545.0)
    line = budget_of(count, p).line()
    assert line == "+300 tok · context 27 % → 32 % · TTFT ≥ 545 ms (not enough turns yet: 1)"
    line = budget_of(count, exact_chat_predictor()).line()
    assert line == "+300 tok · context 27 % → 32 % · TTFT ≈ 1.6 s (1.5–1.7 s; this chat, 3 turns)"
    dropped = PromptCount(4000, 3800, 3900, 4096, dropped_messages=4)
    assert budget_of(dropped, exact_chat_predictor()).line().endswith("· leaves out the oldest 4 messages")
    assert duration_range(850.0, 1200.0) == "850 ms–1.2 s" and duration_range(90.0, 110.0) == "90–110 ms"
    assert duration_range(61_000, 65_000) == "1 min 1 s–1 min 5 s"


def test_the_roofline_bound_is_said_with_its_source_before_anything_is_measured():
    budget = budget_of(PromptCount(1000, 0, 0, 4096), TtftPredictor(0.0, (), TtftBound(1e11, 4e7, 0.0)))
    assert budget.ttft_ms is None and budget.line().endswith("TTFT ≥ 400 ms (roofline)")


def test_a_prefix_the_store_would_restore_is_predicted_as_a_restore_not_a_prefill():
    """A resumed chat whose conversation is saved: the line says what comes from disk, and the TTFT is what a
    restore adds (its read and a fixed part, from the restores measured) plus the prefill of the rest at the restored
    depth; with no restore measured, nothing."""
    plain = [law(n, d) for n, d in ((40, 0), (300, 20), (30, 1500), (50, 2900))]
    count = PromptCount(2872, 0, 0, 4096, restore_tokens=2855, restore_ms=20.0)
    budget = budget_of(count, TtftPredictor(0.0, plain))
    assert count.new_tokens == 17 and budget.ttft_ms is None  # no restore measured yet: what it adds is unknown
    assert (
        budget.line() == "+17 tok · 2,855 restored from disk · context 0 % → 70 % · TTFT: not enough restores yet (0)"
    )
    budget = budget_of(count, TtftPredictor(0.0, plain + [restored(1000), restored(2000)]))
    assert budget.ttft_ms == pytest.approx(120.0 + 0.01 * 2855 + law(17, 2855).ttft_ms)
    assert budget.line().startswith("+17 tok · 2,855 restored from disk · context 0 % → 70 % · TTFT ≈ 361 ms (")


def test_a_message_that_does_not_fit_says_so_with_the_numbers():
    count = PromptCount(None, 0, 100, 512, too_long="the message is 900 tokens; the context leaves room for 384")
    budget = budget_of(count, TtftPredictor(0.0))
    assert not budget.fits and budget == Budget(count)
    assert budget.line() == "Does not fit: the message is 900 tokens; the context leaves room for 384"


# -- the chat: counts from the engine, one prediction per turn ---------------------------------------------------
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


def test_turns_carry_their_prediction_next_to_the_measured_from_the_third_on():
    chat, _engine, calls = _chat(replies=["a b c d e"])
    for text in ("first message", "second message here", "a third and longer message than before"):
        chat.send(text)
    first, second, third = finished(calls)
    assert first.ttft_predicted_ms is None and first.ttft_prediction_note == "not enough turns yet (0)"
    assert second.ttft_predicted_ms is None and second.ttft_prediction_note == "not enough turns yet (1)"
    # the fake's prefill is 2 ms a token, and 1 ms tokenise + 20 ms the first token around it: predicted exactly
    assert third.ttft_predicted_ms == pytest.approx(third.ttft_ms, rel=0.001)
    assert third.ttft_predicted_low_ms < third.ttft_ms < third.ttft_predicted_high_ms
    assert third.ttft_prediction_source == "this chat, 2 turns" and "ttft_predicted_ms" in third.to_dict()
    chat.new_chat()
    assert chat.ttft.model is None


def test_one_prediction_per_turn_the_budget_line_the_eta_the_turn_detail_and_ask_read_the_same():
    """The budget line, the prefill bar's time left (at its start, nothing restored), the turn detail, ask's line
    and ask --json all say the prediction made when the message was counted: one object, carried on the turn."""
    from chatphase.chat.listener import ChatListener
    from chatphase.commands.ask import metrics_line
    from chatphase.ui.dashboard.turn_detail import metric_pairs
    from chatphase.ui.phases.indicator import _left
    from chatphase.units import fmt_duration_ms, fmt_ms

    class AtPrefill(ChatListener):
        def prefill_started(self, turn, event) -> None:
            self.seen = (turn.ttft_prediction, turn.ttft_left_ms())

    at = AtPrefill()
    chat, _engine, calls = _chat(replies=["a b c"])
    chat.add_listener(at)
    chat.send(words(40))
    chat.send(words(150, "x"))
    message = words(60, "y")
    count = chat.count(chat.draft_request(message))
    budget = budget_of(count, chat.ttft)
    predicted = budget.ttft_ms
    assert predicted is not None and fmt_duration_ms(predicted) in budget.line()
    chat.send(message)
    prediction, left = at.seen
    assert prediction is budget.prediction and left == pytest.approx(predicted) and _left(left) != ""
    m = finished(calls)[-1]
    assert m.ttft_predicted_ms == predicted and m.to_dict()["ttft_predicted_ms"] == predicted
    assert dict(metric_pairs(m))["TTFT pred. ms"] == f"{predicted:,.1f}"
    assert f"(predicted {fmt_ms(predicted)}, " in metrics_line(3, m)
    assert m.ttft_predicted_ms == pytest.approx(m.ttft_ms, rel=0.01)  # the scripted law: exact


def test_a_turn_sent_without_a_count_is_predicted_once_when_its_prefill_starts():
    chat, _engine, calls = _chat(replies=["a b c"])
    chat.send(words(40))
    chat.send(words(150, "x"))
    chat.count(chat.draft_request("something else"))  # another draft's count: not this turn's
    chat.send(words(60, "y"))
    m = finished(calls)[-1]
    assert m.ttft_predicted_ms == pytest.approx(m.ttft_ms, rel=0.01)


def test_the_turn_detail_shows_the_prediction_its_range_or_why_it_was_withheld():
    from dataclasses import replace

    from chatphase.engine.metrics import TurnMetrics
    from chatphase.ui.dashboard.turn_detail import metric_pairs

    m = TurnMetrics(49, 42, 7, 14.0, 500.0, 35.0, 3, 40.0, 50.0, 20.0, 20.0, 20.0, 52, 1, 52, 4096, "stop")
    assert "TTFT pred. ms" not in dict(metric_pairs(m))
    shown = dict(metric_pairs(replace(m, ttft_predicted_ms=33.25, ttft_predicted_low_ms=30.0,
                                      ttft_predicted_high_ms=36.5)))  # fmt: skip
    assert shown["TTFT pred. ms"] == "33.2" and shown["TTFT pred. range ms"] == "30.0–36.5"
    withheld = dict(
        metric_pairs(replace(m, ttft_prediction_note="not enough turns yet (1)", ttft_predicted_low_ms=9.0))
    )
    assert withheld["TTFT pred. ms"] == "withheld" and withheld["TTFT bound ms"] == "≥ 9.0"


def test_the_words_of_a_withheld_prediction():
    points = [law(n, d) for n, d in ((40, 0), (120, 30), (200, 100), (60, 400))]
    model = fit(points, 0.0)
    assert ttft_text(predict(model, points, 900, 0)) == "TTFT ≥ 116 ms (beyond the prompts measured: up to 200 tok)"
    assert ttft_text(predict(model, points, 20, 5000)) == "TTFT: deeper than the context measured (up to 460 tok)"
    assert ttft_text(predict(None, [], 20, 0)) == "TTFT: not enough turns yet (0)"


def test_before_the_first_turn_the_saved_sweep_is_fitted_and_the_chats_turns_join_it():
    from chatphase.chat.ttft_prior import results_dir

    folder = results_dir()
    folder.mkdir(parents=True)
    (folder / "junk.json").write_text("{not json")
    (folder / "parallel.json").write_text(json.dumps({"kind": "parallel", "samples": []}))
    other = {"kind": "sweep", "model": {"path": "/models/other.gguf"}, "samples": [{"prompt_tokens": 9, "ttft_ms": 1}]}
    (folder / "other.json").write_text(json.dumps(other))
    samples = [
        {"prompt_tokens": n, "depth": 0, "warmup": False, "ttft_ms": 21.0 + 2.0 * n, "prefill_tokens_per_s": 500.0}
        for n in (8, 64, 256, 512)
    ]
    mine = {"kind": "sweep", "model": {"path": "/elsewhere/SmolLM2-135M-Instruct.Q4_1.gguf"}, "samples": samples}
    (folder / "smollm.json").write_text(json.dumps(mine))
    chat, _engine, calls = _chat(replies=["ok"])
    model = chat.ttft.model
    assert model is not None and model.source == "bench results smollm.json, 4 prefills"
    assert model.a_ms == pytest.approx(21.0) and model.b_ms_per_token == pytest.approx(2.0)
    chat.send("hello")
    first = finished(calls)[0]
    assert first.ttft_predicted_ms == pytest.approx(first.ttft_ms, rel=0.01)
    assert first.ttft_prediction_source == "bench results smollm.json, 4 prefills"
    assert chat.ttft.model.source == "this chat + bench results smollm.json, 5 prefills"
