"""Least-squares lines through measured turns (a bench sweep's samples, the history's turns).

- TTFT against prompt length: ``ttft_ms = a + b × prompt_tokens`` — ``a`` (ms) is the fixed cost of a turn
  (tokenisation, first sample, per-call overhead), ``b`` (ms per token) the marginal prefill cost.
- Decode against context depth: ``decode_tokens_per_s = a + b × depth`` and, the physically linear form,
  ``tpot_ms = a + b × depth`` (each decode step reads the KV cache of every earlier token).

Ordinary least squares on every repetition, not on cell means, in closed form over the points' sums
(:class:`Moments`: ``b = Sxy / Sxx``, ``a = ȳ − b x̄`` with ``Sxx = Σx² − (Σx)²/n``, ``Sxy = Σxy − ΣxΣy/n``; what
``numpy.polyfit`` of degree 1 solves), with the coefficient of determination ``r² = 1 − SS_res / SS_tot``
(``None`` when all y are equal, where it is undefined): C-level sums over lists, without NumPy's import (a tenth
of a second of ``chatphase stats``, which fits 100,000 turns). :func:`cost_fit` is the line of a cost, whose
fixed part cannot be negative: least squares under ``a ≥ 0``, which is the line through the origin when the free
line's intercept comes out negative.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import compress
from operator import mul


@dataclass(frozen=True)
class LinearFit:
    """``y = intercept + slope × x`` fitted to ``n`` points; units are those of y and y per unit of x.
    ``through_origin``: the intercept was held at 0 (:func:`cost_fit`), not fitted."""

    intercept: float
    slope: float
    r2: float | None
    n: int
    through_origin: bool = False

    def predict(self, x: float) -> float:
        """The fitted y at ``x``."""
        return self.intercept + self.slope * x

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> LinearFit | None:
        """Inverse of :meth:`to_dict` (``None`` stays ``None``)."""
        if not data:
            return None
        r2 = data.get("r2")
        return cls(
            float(data["intercept"]),
            float(data["slope"]),
            None if r2 is None else float(r2),
            int(data["n"]),
            bool(data.get("through_origin", False)),
        )


@dataclass(frozen=True)
class Moments:
    """The sums a least-squares line needs over ``n`` points (x, y): ``Σx, Σy, Σx², Σxy, Σy²``, the smallest and
    largest y, and ``distinct_x``, how many different x there are."""

    n: int = 0
    sum_x: float = 0.0
    sum_y: float = 0.0
    sum_xx: float = 0.0
    sum_xy: float = 0.0
    sum_yy: float = 0.0
    y_min: float = math.inf
    y_max: float = -math.inf
    distinct_x: int = 0

    @classmethod
    def of(cls, x: Sequence[float], y: Sequence[float | None]) -> Moments:
        """The moments of the points whose y is defined.

        Raises:
            ValueError: when ``x`` and ``y`` differ in length.
        """
        if len(x) != len(y):
            raise ValueError(f"x and y differ in length ({len(x)} vs {len(y)})")
        defined = [b is not None for b in y]
        return cls.of_points(list(compress(x, defined)), list(compress(y, defined)))  # type: ignore[arg-type]

    @classmethod
    def of_points(cls, xs: list[float], ys: list[float]) -> Moments:
        """The moments of the points ``(xs[i], ys[i])``, every one defined (numbers, ``int`` or ``float``)."""
        if not xs:
            return cls()
        return cls(
            len(xs),
            math.fsum(xs),
            math.fsum(ys),
            math.fsum(map(mul, xs, xs)),
            math.fsum(map(mul, xs, ys)),
            math.fsum(map(mul, ys, ys)),
            float(min(ys)),
            float(max(ys)),
            len(set(xs)),
        )


def linear_fit(x: Sequence[float], y: Sequence[float | None], min_x: int = 2) -> LinearFit | None:
    """Fit ``y = a + b x`` by least squares, skipping points whose y is ``None``.

    Returns ``None`` when fewer than ``min_x`` distinct x values remain (two determine a line, and so fit it
    exactly whatever the law; a third is the first that can show the points are not on one).

    Raises:
        ValueError: when ``x`` and ``y`` differ in length.
    """
    return line_of(Moments.of(x, y), min_x)


def cost_fit(x: Sequence[float], y: Sequence[float | None], min_x: int = 3) -> LinearFit | None:
    """The least-squares line ``y = a + b x`` of a cost, under ``a ≥ 0`` (a fixed cost is never negative):
    :func:`cost_line_of` the points.

    Raises:
        ValueError: when ``x`` and ``y`` differ in length.
    """
    return cost_line_of(Moments.of(x, y), min_x)


def line_of(m: Moments, min_x: int = 2) -> LinearFit | None:
    """The least-squares line of the points ``m`` sums up; ``None`` below ``min_x`` (at least 2) distinct x."""
    if m.distinct_x < max(2, min_x):
        return None
    sxx = m.sum_xx - m.sum_x * m.sum_x / m.n
    sxy = m.sum_xy - m.sum_x * m.sum_y / m.n
    if sxx <= 0:  # distinct x values whose spread rounds away
        return None
    slope = sxy / sxx
    intercept = (m.sum_y - slope * m.sum_x) / m.n
    return LinearFit(intercept, slope, _r2(m, m.sum_yy - intercept * m.sum_y - slope * m.sum_xy), m.n)


def cost_line_of(m: Moments, min_x: int = 3) -> LinearFit | None:
    """The least-squares line of a cost under ``a ≥ 0``: the free line (:func:`line_of`) when its intercept is
    ≥ 0; else the least-squares line through the origin (``b = Σxy / Σx²``, ``through_origin``), which is the
    constrained optimum then (the squared error is convex in ``(a, b)``, so its minimum over ``a ≥ 0`` lies on
    ``a = 0``). Its r² is ``1 − SS_res / SS_tot`` as for the free line, so the two compare (it can fall below 0
    where no line through 0 follows the points). ``None`` below ``min_x`` distinct x values."""
    free = line_of(m, min_x)
    if free is None or free.intercept >= 0:
        return free
    slope = m.sum_xy / m.sum_xx
    return LinearFit(0.0, slope, _r2(m, m.sum_yy - slope * m.sum_xy), m.n, through_origin=True)


def _r2(m: Moments, ss_res: float) -> float | None:
    """``1 − SS_res / SS_tot`` (``SS_res = Σ(y − a − bx)²``, which the least-squares line's normal equations
    reduce to ``Σy² − aΣy − bΣxy``); ``None`` when all y are equal."""
    if m.y_min == m.y_max:
        return None
    ss_tot = m.sum_yy - m.sum_y * m.sum_y / m.n
    return 1.0 - max(ss_res, 0.0) / ss_tot
