"""The token record's cuts (:mod:`chatphase.engine.tokens`) and the overflow's left-out tokens
(:func:`chatphase.engine.local.overflow_turn.left_out`), on made-up ids."""

from __future__ import annotations

import pickle

import pytest

from chatphase.engine.local.overflow_turn import left_out
from chatphase.engine.metrics import compute_turn_metrics
from chatphase.engine.tokens import TurnTokens


def test_spans_cover_the_prompt_in_order_and_each_position_has_one_source():
    t = TurnTokens(range(10), restored=3, cached=5, prefilled=4)
    assert t.spans() == [(0, 3, "restored"), (3, 5, "cached"), (5, 9, "prefilled"), (9, 10, "unevaluated")]
    assert [t.source(i) for i in (0, 2, 3, 4, 5, 8, 9)] == [
        "restored", "restored", "cached", "cached", "prefilled", "prefilled", "unevaluated"
    ]  # fmt: skip
    with pytest.raises(IndexError):
        t.source(10)
    assert TurnTokens([7, 8], 0, 0, 2).spans() == [(0, 2, "prefilled")]


@pytest.mark.parametrize(("restored", "cached", "prefilled"), [(3, 2, 0), (0, 5, 6), (-1, 0, 0)])
def test_spans_out_of_order_are_refused(restored, cached, prefilled):
    with pytest.raises(ValueError, match="spans out of order"):
        TurnTokens(range(10), restored, cached, prefilled)


def test_gaps_and_counts_come_from_the_same_times_the_metrics_do():
    t_submit, times = 1_000_000_000, [1_100_000_000, 1_110_000_000, 1_150_000_000]
    t = TurnTokens([1, 2, 3], 0, 1, 2, reply_ids=[4, 5, 6], reply_t_ns=[x - t_submit for x in times])
    m = compute_turn_metrics(
        t_submit_ns=t_submit,
        t_prefill_start_ns=t_submit,
        t_prefill_end_ns=times[0],
        token_times_ns=times,
        prompt_tokens=3,
        cached_tokens=1,
        kv_cache_tokens=5,
        kv_bytes_per_token=1,
        kv_capacity_bytes=100,
        stop_reason="stop",
    )
    assert t.view_counts() == TurnTokens.metric_counts(m)
    assert t.t_ms(0) == m.ttft_ms == 100.0 and t.itl_ms(0) is None
    assert [t.itl_ms(1), t.itl_ms(2)] == [10.0, 40.0] and max(10.0, 40.0) == m.itl_ms_max
    with pytest.raises(ValueError, match="one time per reply token"):
        TurnTokens([1], 0, 0, 1, reply_ids=[1, 2], reply_t_ns=[1])


def test_a_record_crosses_a_pipe_whole():
    t = TurnTokens([1, 2], 0, 1, 1, [9], "shifted", [3], [5], [0], ((0, 2, 1),))
    back = pickle.loads(pickle.dumps(t))
    assert back == t and back.counts()["shifted"] == 1 and back.spec_accepted == 1


def test_the_left_out_tokens_follow_the_prefix_the_fitted_prompt_kept():
    system, old, new = [1, 2], [10, 11, 12], [20, 21]
    assert left_out(system + old + new, system + new, 3) == old
    assert left_out(old + new, new, 3) == old  # no system prompt
    # the fitted prompt agrees past the cut by chance (its first kept token equals the first dropped one)
    assert left_out([1, 2, 10, 11, 10, 21], [1, 2, 10, 21], 2) == [10, 11]
    assert len(left_out([5, 6], [5, 6], 1)) == 1  # the count holds even where nothing lines up
    # a chat template's shape: each message starts with the same header token (1) and ends with 2
    start, end, system, user, assistant = 1, 2, [1, 90, 2], 91, 92
    old = [start, user, 10, end, start, assistant, 11, end]
    newest = [start, user, 12, end, start, assistant]
    opens = {start}.__contains__
    assert left_out(system + old + newest, system + newest, len(old), opens) == old  # whole messages, header first
    assert left_out(system + old + newest, system + newest, len(old)) == [end, *old[:-1]]  # no header known: earliest


def test_the_thinking_block_is_the_reply_s_first_tokens():
    t = TurnTokens((1,), 0, 0, 1, reply_ids=(1, 2, 3), reply_t_ns=(1, 2, 3), thinking_tokens=2)
    assert [t.thinking(i) for i in range(3)] == [True, True, False]
    with pytest.raises(ValueError, match="thinking"):
        TurnTokens((1,), 0, 0, 1, reply_ids=(1,), reply_t_ns=(1,), thinking_tokens=2)
