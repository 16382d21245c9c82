"""chatphase.timing.forecast: when the conversation will fill n_ctx, from the KV size after each turn."""

from __future__ import annotations

import pytest

from chatphase.timing.forecast import KvForecast, forecast_kv


def test_no_turns_yet():
    assert forecast_kv([], 2048) == KvForecast(0, 2048, 0.0, None, None)


def test_average_growth_and_turns_left():
    f = forecast_kv([200, 410, 540], 2048)
    assert f.used_tokens == 540
    assert f.growth_tokens_per_turn == pytest.approx(180.0)
    assert f.turns_left == 8  # (2048 - 540) / 180 = 8.4
    assert f.used_fraction == pytest.approx(540 / 2048)


def test_shrinking_turn_counts_as_net_change():
    assert forecast_kv([400, 300], 1000).growth_tokens_per_turn == pytest.approx(150.0)


def test_full_context():
    f = forecast_kv([1500, 2100], 2048)
    assert f.turns_left == 0 and f.used_fraction == 1.0


def test_empty_cache_is_not_growing():
    assert forecast_kv([0, 0], 512).turns_left is None


@pytest.mark.parametrize("series, n_ctx", [([10], 0), ([-1], 100)])
def test_bad_input(series, n_ctx):
    with pytest.raises(ValueError):
        forecast_kv(series, n_ctx)


def test_a_resumed_chats_cold_prefill_is_growth_of_its_earlier_turns():
    """A resumed chat of 2 turns: its first turn prefills them again, so the cache holds 3 of the
    conversation's turns after it, and the growth per turn is 1,143 / 3, not 1,143 (issue 32)."""
    f = forecast_kv([1143], 4096, turns_held=3)
    assert f.growth_tokens_per_turn == pytest.approx(381.0)
    assert f.turns_left == 7  # (4096 - 1143) / 381 = 7.75
    assert forecast_kv([1143], 4096).turns_left == 2  # one turn of this engine: the cold prefill is its growth
