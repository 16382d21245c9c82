"""Least-squares lines through benchmark samples.

- TTFT against prompt length: ``ttft_ms = a + b × prompt_tokens`` — ``a`` (ms) is the fixed cost of a turn
  (tokenisation, first sample, per-call overhead), ``b`` (ms per token) the marginal prefill cost.
- Decode against context depth: ``decode_tokens_per_s = a + b × depth`` and, the physically linear form,
  ``tpot_ms = a + b × depth`` (each decode step reads the KV cache of every earlier token).

Ordinary least squares (``numpy.polyfit`` with degree 1) on every repetition, not on cell means, with the
coefficient of determination ``r² = 1 − SS_res / SS_tot`` (``None`` when all y are equal, where it is
undefined).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LinearFit:
    """``y = intercept + slope × x`` fitted to ``n`` points; units are those of y and y per unit of x."""

    intercept: float
    slope: float
    r2: float | None
    n: int

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
        return cls(float(data["intercept"]), float(data["slope"]), None if r2 is None else float(r2), int(data["n"]))


def linear_fit(x: Sequence[float], y: Sequence[float | None]) -> LinearFit | None:
    """Fit ``y = a + b x`` by least squares, skipping points whose y is ``None``.

    Returns ``None`` when fewer than two distinct x values remain (no line is determined).

    Raises:
        ValueError: when ``x`` and ``y`` differ in length.
    """
    import numpy as np  # here: the TUI imports this module, and NumPy at import costs it ~0.1 s

    if len(x) != len(y):
        raise ValueError(f"x and y differ in length ({len(x)} vs {len(y)})")
    pts = [(float(a), float(b)) for a, b in zip(x, y, strict=True) if b is not None]
    if len({p[0] for p in pts}) < 2:
        return None
    xs = np.array([p[0] for p in pts])
    ys = np.array([p[1] for p in pts])
    slope, intercept = np.polyfit(xs, ys, 1)
    residual = ys - (intercept + slope * xs)
    ss_tot = float(np.sum((ys - ys.mean()) ** 2))
    r2 = None if ss_tot == 0 else 1.0 - float(np.sum(residual**2)) / ss_tot
    return LinearFit(float(intercept), float(slope), r2, len(pts))


def sweep_fits(samples: Sequence) -> dict:
    """The JSON ``fits`` object from counted :class:`~chatphase.bench.core.results.Sample` records.

    ``ttft_ms_vs_prompt_tokens`` uses the ``"prompt"`` samples (intercept ms, slope ms per prompt token);
    ``decode_tokens_per_s_vs_depth`` and ``tpot_ms_vs_depth`` use the ``"depth"`` samples (intercept at
    depth 0; slope per token of depth). A fit that cannot be determined is ``None``.
    """
    prompt = [s for s in samples if s.kind == "prompt" and not s.warmup]
    depth = [s for s in samples if s.kind == "depth" and not s.warmup]

    def fit(points, xname, yname, y_unit, slope_unit):
        f = linear_fit([getattr(s, xname) for s in points], [getattr(s, yname) for s in points])
        return (
            None
            if f is None
            else {**f.to_dict(), "x": xname, "y": yname, "intercept_unit": y_unit, "slope_unit": slope_unit}
        )

    return {
        "ttft_ms_vs_prompt_tokens": fit(prompt, "prompt_tokens", "ttft_ms", "ms", "ms per prompt token"),
        "decode_tokens_per_s_vs_depth": fit(
            depth, "depth", "decode_tokens_per_s", "tokens/s", "tokens/s per token of depth"
        ),
        "tpot_ms_vs_depth": fit(depth, "depth", "tpot_ms", "ms", "ms per token of depth"),
    }
