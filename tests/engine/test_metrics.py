"""Exact metric math with scripted timestamps (docs/metrics.md)."""

import pytest

from chatphase.engine.metrics import TurnMetrics, compute_turn_metrics, itl_stats_ms

MS = 1_000_000


def scripted(**overrides):
    args = dict(
        t_submit_ns=1_000 * MS,
        t_prefill_start_ns=1_002 * MS,
        t_prefill_end_ns=1_102 * MS,  # 100 ms of prefill
        token_times_ns=[1_105 * MS, 1_115 * MS, 1_125 * MS, 1_145 * MS, 1_155 * MS],
        prompt_tokens=250,
        cached_tokens=50,
        kv_cache_tokens=254,
        kv_bytes_per_token=23_040,
        kv_capacity_bytes=23_040 * 4096,
        stop_reason="stop",
    )
    args.update(overrides)
    return compute_turn_metrics(**args)


def test_formulas_on_scripted_timestamps():
    m = scripted()
    assert m.prefill_tokens == 200
    assert m.prefill_ms == 100.0
    assert m.prefill_tokens_per_s == pytest.approx(2000.0)  # 200 tokens / 0.1 s
    assert m.ttft_ms == 105.0  # t_first - t_submit
    assert m.tokenize_ms == 2.0
    assert m.decode_tokens == 5
    assert m.decode_ms == 50.0  # t_last - t_first
    assert m.decode_tokens_per_s == pytest.approx(80.0)  # (5 - 1) / 0.05 s, the TPOT definition
    assert m.tpot_ms == pytest.approx(12.5)
    # gaps 10, 10, 20, 10 -> p50 10, p95 by linear interpolation = 10 + 0.85 * 10 = 18.5, max 20
    assert m.itl_ms_p50 == pytest.approx(10.0)
    assert m.itl_ms_p95 == pytest.approx(18.5)
    assert m.itl_ms_max == pytest.approx(20.0)
    assert m.kv_cache_bytes == 254 * 23_040
    assert m.prefill_tokens + m.cached_tokens == m.prompt_tokens


def test_single_token_has_no_decode_rate():
    m = scripted(token_times_ns=[1_105 * MS])
    assert m.ttft_ms == 105.0
    assert m.decode_tokens == 1 and m.decode_ms == 0.0
    assert m.decode_tokens_per_s is None and m.tpot_ms is None
    assert itl_stats_ms([5]) == (None, None, None)


def test_no_tokens_cancelled_in_prefill():
    m = scripted(token_times_ns=[], stop_reason="cancelled")
    assert m.ttft_ms is None and m.decode_tokens == 0 and m.stop_reason == "cancelled"


def test_fully_cached_prompt_has_no_prefill_rate():
    m = scripted(cached_tokens=250, t_prefill_end_ns=1_002 * MS)
    assert m.prefill_tokens == 0 and m.prefill_tokens_per_s is None


@pytest.mark.parametrize(
    "bad",
    [
        dict(cached_tokens=300),
        dict(t_prefill_start_ns=999 * MS),
        dict(t_prefill_end_ns=1_001 * MS),
        dict(token_times_ns=[3 * MS, 2 * MS]),
        dict(stop_reason="eos"),
    ],
)
def test_inconsistent_inputs_raise(bad):
    with pytest.raises(ValueError):
        scripted(**bad)


def test_round_trip_dict():
    m = scripted()
    assert TurnMetrics.from_dict({**m.to_dict(), "future_field": 1}) == m


def test_a_prefill_cancelled_between_chunks_counts_only_evaluated_tokens():
    m = scripted(token_times_ns=[], stop_reason="cancelled", evaluated_tokens=50)
    assert m.prefill_tokens == 50 and m.prefill_tokens_per_s == pytest.approx(500.0)  # 50 / 0.1 s
    with pytest.raises(ValueError):
        scripted(evaluated_tokens=201)


def test_thinking_is_a_phase_inside_decode():
    # submit at 0; tokens every 10 ms from 100 ms: 4 of thinking (the block closes at 132 ms), then 3 of answer
    times = [(100 + 10 * i) * MS for i in range(7)]
    m = compute_turn_metrics(
        t_submit_ns=0,
        t_prefill_start_ns=MS,
        t_prefill_end_ns=90 * MS,
        token_times_ns=times,
        prompt_tokens=10,
        cached_tokens=0,
        kv_cache_tokens=17,
        kv_bytes_per_token=1,
        kv_capacity_bytes=256,
        stop_reason="stop",
        thinking_tokens=4,
        t_thinking_end_ns=132 * MS,
    )
    assert (m.ttft_ms, m.thinking_tokens, m.thinking_ms, m.answer_tokens) == (100.0, 4, 32.0, 3)
    assert m.ttfa_ms == 140.0 and m.answer_tokens_per_s == pytest.approx(100.0)  # 2 gaps in 20 ms
    assert m.decode_tokens_per_s == pytest.approx(100.0) and not m.thinking_cut_short  # thinking is decode


def test_thinking_cut_short_and_no_thinking():
    times = [(100 + 10 * i) * MS for i in range(5)]
    base = dict(
        t_submit_ns=0,
        t_prefill_start_ns=MS,
        t_prefill_end_ns=90 * MS,
        token_times_ns=times,
        prompt_tokens=10,
        cached_tokens=0,
        kv_cache_tokens=15,
        kv_bytes_per_token=1,
        kv_capacity_bytes=256,
        stop_reason="length",
    )
    cut = compute_turn_metrics(**base, thinking_tokens=5)
    assert (cut.thinking_cut_short, cut.thinking_ms, cut.answer_tokens, cut.ttfa_ms) == (True, 40.0, 0, None)
    plain = compute_turn_metrics(**base)
    assert (plain.thinking_tokens, plain.answer_tokens, plain.ttfa_ms, plain.thinking_cut_short) == (
        None,
        None,
        None,
        False,
    )
    with pytest.raises(ValueError):
        compute_turn_metrics(**base, thinking_tokens=6, t_thinking_end_ns=200 * MS)


def test_itl_percentiles_match_numpys_linear_method():
    """The standard library computes them (no NumPy in the UI), by NumPy's definition."""
    import random

    import numpy as np

    from chatphase.engine.metrics import itl_stats_ms

    rng = random.Random(14)
    for n in (2, 3, 4, 21, 200):
        times = [0]
        for _ in range(n - 1):
            times.append(times[-1] + rng.randrange(1, 300_000_000))
        gaps = np.diff(np.asarray(times)) / 1e6
        p50, p95, pmax = itl_stats_ms(times)
        assert (p50, p95) == pytest.approx(tuple(np.percentile(gaps, [50, 95])), rel=1e-12)
        assert pmax == gaps.max()


def test_from_dict_is_the_constructor_over_the_known_fields():
    """The fast path (the instance's dict built at once) gives what ``TurnMetrics(**known)`` gives: defaults for
    the fields a dict lacks, unknown keys ignored, and a missing required field still a TypeError."""
    full = scripted().to_dict()
    assert TurnMetrics.from_dict(full) == TurnMetrics(**full)
    assert TurnMetrics.from_dict({**full, "a_newer_field": 1}) == TurnMetrics(**full)
    minimal = {k: full[k] for k in list(full)[:17]}
    m = TurnMetrics.from_dict(minimal)
    assert m == TurnMetrics(**minimal) and hash(m) == hash(TurnMetrics(**minimal))
    with pytest.raises(AttributeError):
        m.ttft_ms = 1.0  # still frozen
    with pytest.raises(TypeError):
        TurnMetrics.from_dict({k: v for k, v in full.items() if k != "ttft_ms"})
