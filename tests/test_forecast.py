"""forecast.py: when the conversation will fill n_ctx, from the KV size after each turn."""

from __future__ import annotations

import pytest

from chatphase.forecast import KvForecast, forecast_kv


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
