"""Least-squares lines through measured turns (a bench sweep's samples, the history's turns).

- TTFT against prompt length: ``ttft_ms = a + b × prompt_tokens`` — ``a`` (ms) is the fixed cost of a turn
  (tokenisation, first sample, per-call overhead), ``b`` (ms per token) the marginal prefill cost.
- Decode against context depth: ``decode_tokens_per_s = a + b × depth`` and, the physically linear form,
  ``tpot_ms = a + b × depth`` (each decode step reads the KV cache of every earlier token).

Ordinary least squares (``numpy.polyfit`` with degree 1) on every repetition, not on cell means, with the
coefficient of determination ``r² = 1 − SS_res / SS_tot`` (``None`` when all y are equal, where it is
undefined). :func:`cost_fit` is the line of a cost, whose fixed part cannot be negative: least squares under
``a ≥ 0``, which is the line through the origin when the free line's intercept comes out negative.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass


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


def _points(x: Sequence[float], y: Sequence[float | None]) -> list[tuple[float, float]]:
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length ({len(x)} vs {len(y)})")
    return [(float(a), float(b)) for a, b in zip(x, y, strict=True) if b is not None]


def linear_fit(x: Sequence[float], y: Sequence[float | None], min_x: int = 2) -> LinearFit | None:
    """Fit ``y = a + b x`` by least squares, skipping points whose y is ``None``.

    Returns ``None`` when fewer than ``min_x`` distinct x values remain (two determine a line, and so fit it
    exactly whatever the law; a third is the first that can show the points are not on one).

    Raises:
        ValueError: when ``x`` and ``y`` differ in length.
    """
    import numpy as np  # here: the TUI imports this module, and NumPy at import costs it ~0.1 s

    pts = _points(x, y)
    if len({p[0] for p in pts}) < max(2, min_x):
        return None
    xs = np.array([p[0] for p in pts])
    ys = np.array([p[1] for p in pts])
    slope, intercept = np.polyfit(xs, ys, 1)
    return LinearFit(float(intercept), float(slope), _r2(xs, ys, float(intercept), float(slope)), len(pts))


def cost_fit(x: Sequence[float], y: Sequence[float | None], min_x: int = 3) -> LinearFit | None:
    """The least-squares line ``y = a + b x`` of a cost, under ``a ≥ 0`` (a fixed cost is never negative).

    The free line (:func:`linear_fit`) when its intercept is ≥ 0; else the least-squares line through the origin
    (``b = Σxy / Σx²``, ``through_origin``), which is the constrained optimum then (the squared error is convex in
    ``(a, b)``, so its minimum over ``a ≥ 0`` lies on ``a = 0``). Its r² is ``1 − SS_res / SS_tot`` as for the
    free line, so the two compare (it can fall below 0 where no line through 0 follows the points).
    ``None`` when fewer than ``min_x`` distinct x values remain.

    Raises:
        ValueError: when ``x`` and ``y`` differ in length.
    """
    import numpy as np

    free = linear_fit(x, y, min_x)
    if free is None or free.intercept >= 0:
        return free
    pts = _points(x, y)
    xs = np.array([p[0] for p in pts])
    ys = np.array([p[1] for p in pts])
    slope = float(np.dot(xs, ys) / np.dot(xs, xs))
    return LinearFit(0.0, slope, _r2(xs, ys, 0.0, slope), len(pts), through_origin=True)


def _r2(xs, ys, intercept: float, slope: float) -> float | None:
    """``1 − SS_res / SS_tot`` of the line over the points; ``None`` when all y are equal."""
    import numpy as np

    residual = ys - (intercept + slope * xs)
    ss_tot = float(np.sum((ys - ys.mean()) ** 2))
    return None if ss_tot == 0 else 1.0 - float(np.sum(residual**2)) / ss_tot
