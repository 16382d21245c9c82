"""The budget line (chatphase.chat.budget) and the turn's one TTFT prediction, with scripted timings: points made by
a known law (:func:`tests.timing.test_timing_ttft.law`), and the fake engine's scripted clock (``FakeTiming``: a
fixed cost, a cost per token, the attention's per token × context, a restore's)."""

from __future__ import annotations

import json

import pytest
from test_ttft_trust import _chat, finished, words

from chatphase.chat.budget import Budget, budget_of, duration_range, ttft_text
from chatphase.engine.events import PromptCount
from chatphase.timing.ttft_model import fit
from chatphase.timing.ttft_prediction import TtftBound, TtftPredictor, predict
from tests.timing.test_timing_ttft import law, restored


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
