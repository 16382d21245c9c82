"""Summary statistics (chatphase.timing.stats) and least-squares lines (chatphase.timing.fits) against
hand-computed values."""

from __future__ import annotations

import math

import pytest

from chatphase.timing.fits import LinearFit, cost_fit, linear_fit
from chatphase.timing.stats import EMPTY, Stats, summarize, t95


def test_summary_of_a_known_sample():
    s = summarize([2, 4, 4, 4, 5, 5, 7, 9])
    assert s.mean == 5
    assert s.sd == pytest.approx(math.sqrt(32 / 7))  # sample sd: divisor n - 1
    assert (s.median, s.min, s.max, s.n) == (4.5, 2, 9, 8)


def test_summary_skips_undefined_and_handles_one_value():
    s = summarize([None, 3.0, None])
    assert (s.mean, s.sd, s.median, s.min, s.max, s.n) == (3.0, None, 3.0, 3.0, 3.0, 1)
    assert summarize([None]) == EMPTY
    assert summarize([]) == EMPTY


def test_stats_dict_round_trip():
    s = summarize([1.5, 2.5, 10.0])
    assert Stats.from_dict(s.to_dict()) == s
    assert Stats.from_dict({"mean": "", "n": ""}) == EMPTY


def test_perfect_line():
    f = linear_fit([0, 1, 2, 3], [1, 3, 5, 7])
    assert f.intercept == pytest.approx(1) and f.slope == pytest.approx(2)
    assert f.r2 == pytest.approx(1) and f.n == 4
    assert f.predict(10) == pytest.approx(21)


def test_imperfect_line_hand_computed():
    # x̄ = 2, ȳ = 5/3, Sxy = 1, Sxx = 2 -> b = 1/2, a = 2/3; SS_res = 1/6, SS_tot = 2/3 -> r² = 3/4
    f = linear_fit([1, 2, 3], [1, 2, 2])
    assert f.slope == pytest.approx(0.5)
    assert f.intercept == pytest.approx(2 / 3)
    assert f.r2 == pytest.approx(0.75)


def test_fit_edge_cases():
    assert linear_fit([5, 5], [1, 2]) is None  # one distinct x: no line
    assert linear_fit([1, 2, 3], [None, 4, None]) is None
    flat = linear_fit([1, 2, 3], [4, 4, 4])
    assert flat.slope == pytest.approx(0) and flat.r2 is None  # r² undefined when y is constant
    assert linear_fit([1, 2, 3], [2, None, 6]).slope == pytest.approx(2)
    with pytest.raises(ValueError):
        linear_fit([1, 2], [1])
    assert LinearFit.from_dict(LinearFit(1.0, 2.0, None, 3).to_dict()) == LinearFit(1.0, 2.0, None, 3)
    assert LinearFit.from_dict(LinearFit(0.0, 2.0, 0.5, 3, True).to_dict()).through_origin
    assert linear_fit([1, 2], [1, 3], min_x=3) is None and linear_fit([1, 2, 2], [1, 3, 4], min_x=3) is None


def test_a_cost_line_has_no_negative_fixed_cost():
    """A convex cost (y = x² / 1000) gives the free line a negative intercept: no turn pays less than nothing, so
    the line is the least-squares one with a ≥ 0, through the origin: b = Σxy / Σx², r² against the mean."""
    x, y = [100, 200, 400], [10, 40, 160]
    assert linear_fit(x, y).intercept < 0
    f = cost_fit(x, y)
    assert f.through_origin and f.intercept == 0 and f.n == 3
    assert f.slope == pytest.approx(73_000 / 210_000)
    ss_res = sum((b - f.slope * a) ** 2 for a, b in zip(x, y, strict=True))
    assert f.r2 == pytest.approx(1 - ss_res / sum((b - 70) ** 2 for b in y))
    assert cost_fit([1, 2, 3], [5, 6, 8]) == linear_fit([1, 2, 3], [5, 6, 8])  # a ≥ 0: the free line
    assert cost_fit([30, 50], [313.2, 1347.2]) is None  # two sizes: any law is a line through them


def test_students_t_is_the_tables_row_at_or_under_the_degrees_of_freedom():
    assert t95(0) == math.inf and t95(1) == 6.314 and t95(11) == 1.812 and t95(999) == 1.658 and t95(1000) == 1.645
