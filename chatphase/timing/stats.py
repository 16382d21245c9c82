"""Summary statistics of benchmark repetitions: mean ± sample standard deviation, median, min, max.

The same summary llama-bench prints (mean ± sd over repetitions, ``docs/metrics.md``), computed with the
standard library's :mod:`statistics`: ``sd`` is the *sample* standard deviation (divisor ``n - 1``,
``statistics.stdev``), undefined (``None``) for a single value; ``median`` averages the two middle
values for an even count. :func:`t95` is Student's t quantile that the TTFT prediction's range is drawn with
(:mod:`chatphase.timing.ttft_prediction`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

T = TypeVar("T")
K = TypeVar("K")

#: Student's t, one-sided 95 %, by degrees of freedom (the largest tabulated ≤ the dof is used: conservative).
_T95 = (
    (1, 6.314), (2, 2.920), (3, 2.353), (4, 2.132), (5, 2.015), (6, 1.943), (7, 1.895), (8, 1.860), (9, 1.833),
    (10, 1.812), (12, 1.782), (15, 1.753), (20, 1.725), (30, 1.697), (60, 1.671), (120, 1.658),
)  # fmt: skip
_Z95 = 1.645


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


#: the keys of a :class:`Stats` in JSON and, suffixed to a metric's name, its CSV columns.
STAT_KEYS: tuple[str, ...] = ("mean", "sd", "median", "min", "max", "n")


def group_cells(samples: Iterable[T], key: Callable[[T], K]) -> dict[K, list[T]]:
    """``samples`` grouped by ``key`` (a cell's coordinates), the cells in first-seen order."""
    groups: dict[K, list[T]] = {}
    for s in samples:
        groups.setdefault(key(s), []).append(s)
    return groups


def summarize_metrics(group: Sequence[object], metrics: Sequence[str]) -> dict[str, Stats]:
    """Each metric's :func:`summarize` over a cell's samples; a metric holding several values per sample (the
    TTFT of each of N sequences) pools them."""
    out = {}
    for m in metrics:
        values: list[float | None] = []
        for s in group:
            v = getattr(s, m)
            values.extend(v if isinstance(v, (tuple, list)) else (v,))
        out[m] = summarize(values)
    return out


def stat_columns(metrics: Sequence[str]) -> tuple[str, ...]:
    """The CSV columns of the metrics' statistics: ``ttft_ms_mean``, ``ttft_ms_sd``, ..."""
    return tuple(f"{m}_{k}" for m in metrics for k in STAT_KEYS)


def stats_row(cell: object, metrics: Sequence[str]) -> dict:
    """A cell's statistics as CSV cells under :func:`stat_columns` (undefined values empty)."""
    return {f"{m}_{k}": "" if v is None else v for m in metrics for k, v in getattr(cell, m).to_dict().items()}


def stats_of_row(row: dict, metrics: Sequence[str]) -> dict[str, dict]:
    """Inverse of :func:`stats_row`: each metric's ``{"mean", ...}`` object (values as the CSV's strings)."""
    return {m: {k: row.get(f"{m}_{k}") for k in STAT_KEYS} for m in metrics}


def t95(dof: int) -> float:
    """Student's t one-sided 95 % quantile at ``dof`` degrees of freedom (the table's row at or under ``dof``:
    conservative between rows; the normal's 1.645 from 1,000 on); infinite under 1."""
    if dof < 1:
        return math.inf
    if dof >= 1000:
        return _Z95
    return next(t for d, t in reversed(_T95) if dof >= d)
