"""Summary statistics of benchmark repetitions: mean ± sample standard deviation, median, min, max.

The same summary llama-bench prints (mean ± sd over repetitions, ``docs/metrics.md``), computed with the
standard library's :mod:`statistics`: ``sd`` is the *sample* standard deviation (divisor ``n - 1``,
``statistics.stdev``), undefined (``None``) for a single value; ``median`` averages the two middle
values for an even count.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Stats:
    """Summary of ``n`` values in the unit of the metric it describes (``None`` = undefined)."""

    mean: float | None
    sd: float | None
    median: float | None
    min: float | None
    max: float | None
    n: int = 0

    def to_dict(self) -> dict:
        """``{"mean", "sd", "median", "min", "max", "n"}``, JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> Stats:
        """Inverse of :meth:`to_dict`; missing keys read as ``None`` (``n`` as 0)."""
        data = data or {}
        mean, sd, median, lo, hi = (_opt_float(data.get(k)) for k in ("mean", "sd", "median", "min", "max"))
        return cls(mean, sd, median, lo, hi, n=int(data.get("n") or 0))


EMPTY = Stats(None, None, None, None, None, 0)


def summarize(values: Iterable[float | None]) -> Stats:
    """Summarise the defined values (``None`` entries, e.g. a decode rate of a 1-token reply, are skipped).

    Returns :data:`EMPTY` when no value is defined; ``sd`` is ``None`` for a single value.
    """
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return EMPTY
    sd = statistics.stdev(xs) if len(xs) >= 2 else None
    return Stats(statistics.fmean(xs), sd, statistics.median(xs), min(xs), max(xs), len(xs))


def _opt_float(value) -> float | None:
    if value is None or value == "":
        return None
    return float(value)
