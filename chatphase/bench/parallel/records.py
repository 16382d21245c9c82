"""Records of the parallel-decode sweep and their file forms (JSON and CSV), beside :mod:`~chatphase.bench.core.results`.

- :class:`ParallelSample` — one measured repetition of N sequences (``n_seq``) decoded together.
- :class:`ParallelCell` — the summary of one (prompt_tokens, n_seq) cell's repetitions.

Names as llama-batched-bench's: ``prompt_tokens`` is its PP (tokens per sequence), ``gen_tokens`` its TG
(decode steps), ``n_seq`` its B; ``prefill_tokens_per_s`` its S_PP and ``aggregate_decode_tokens_per_s`` its
S_TG. ``decode_tokens_per_s`` is per sequence (S_TG / B) and ``step_ms`` one step's time (every sequence
advances one token). ``step_bytes`` / ``step_flops``: what one step needs (the roofline,
:mod:`chatphase.bench.parallel.roofline`). In CSV a parallel cell is a row of kind ``"parallel"``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from chatphase.timing.stats import Stats, stat_columns, stats_of_row, stats_row

#: per-cell metrics summarised as :class:`Stats`.
PARALLEL_STAT_METRICS: tuple[str, ...] = (
    "step_ms",
    "decode_tokens_per_s",
    "aggregate_decode_tokens_per_s",
    "prefill_tokens_per_s",
    "ttft_ms",
    "itl_ms_p50",
    "itl_ms_p95",
)
_KEYS = ("prompt_tokens", "n_seq", "gen_tokens", "reps")
_EXTRA = ("kv_cache_bytes", "step_bytes", "step_flops")
PARALLEL_CSV_COLUMNS: tuple[str, ...] = (
    "kind",
    *_KEYS,
    *stat_columns(PARALLEL_STAT_METRICS),
    *_EXTRA,
)


@dataclass(frozen=True)
class ParallelSample:
    """One repetition: ``n_seq`` sequences of ``prompt_tokens`` prompt tokens each, ``gen_tokens`` steps.

    ``ttft_ms`` holds one value per sequence (local) or stream (remote); ``decode_tokens`` counts the
    tokens all sequences wrote (``None`` when a server does not report it); a ``None`` rate is undefined.
    """

    prompt_tokens: int
    n_seq: int
    gen_tokens: int
    rep: int
    warmup: bool
    step_ms: float | None
    decode_tokens_per_s: float | None
    aggregate_decode_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    ttft_ms: tuple[float, ...]
    itl_ms_p50: float | None
    itl_ms_p95: float | None
    decode_tokens: int | None
    kv_cache_bytes: int | None
    stop_reason: str

    def to_dict(self) -> dict:
        """JSON-ready dict (``kind`` = ``"parallel"`` first)."""
        return {"kind": "parallel", **asdict(self), "ttft_ms": list(self.ttft_ms)}

    @classmethod
    def from_dict(cls, data: dict) -> ParallelSample:
        """Inverse of :meth:`to_dict` (unknown keys ignored)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["ttft_ms"] = tuple(float(x) for x in values.get("ttft_ms") or ())
        return cls(**values)


@dataclass(frozen=True)
class ParallelCell:
    """Summary of one cell's measured repetitions (warm-up runs excluded); ``None`` = unknown."""

    prompt_tokens: int
    n_seq: int
    gen_tokens: int
    reps: int
    step_ms: Stats
    decode_tokens_per_s: Stats
    aggregate_decode_tokens_per_s: Stats
    prefill_tokens_per_s: Stats
    ttft_ms: Stats
    itl_ms_p50: Stats
    itl_ms_p95: Stats
    kv_cache_bytes: int | None
    step_bytes: int | None
    step_flops: float | None

    def to_dict(self) -> dict:
        """The JSON ``parallel`` entry: stats as ``{"mean","sd","median","min","max","n"}`` objects."""
        out: dict = {"kind": "parallel", **{k: getattr(self, k) for k in _KEYS}}
        for m in PARALLEL_STAT_METRICS:
            out[m] = getattr(self, m).to_dict()
        out.update({k: getattr(self, k) for k in _EXTRA})
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ParallelCell:
        """Inverse of :meth:`to_dict`.

        Raises:
            KeyError / ValueError / TypeError: on a malformed entry (callers make a one-line message).
        """
        values: dict[str, Any] = {k: int(data[k]) for k in _KEYS}
        values.update({m: Stats.from_dict(data.get(m)) for m in PARALLEL_STAT_METRICS})
        return cls(
            **values,
            kv_cache_bytes=_opt(int, data.get("kv_cache_bytes")),
            step_bytes=_opt(int, data.get("step_bytes")),
            step_flops=_opt(float, data.get("step_flops")),
        )

    def csv_row(self) -> dict:
        """One CSV row keyed by :data:`PARALLEL_CSV_COLUMNS` (unknown values are empty cells)."""
        row: dict = {
            "kind": "parallel",
            **{k: getattr(self, k) for k in _KEYS},
            **stats_row(self, PARALLEL_STAT_METRICS),
        }
        row.update({k: "" if getattr(self, k) is None else getattr(self, k) for k in _EXTRA})
        return row

    @classmethod
    def from_csv_row(cls, row: dict) -> ParallelCell:
        """Inverse of :meth:`csv_row` (values arrive as strings)."""
        data: dict = {**{k: row[k] for k in _KEYS}, **stats_of_row(row, PARALLEL_STAT_METRICS)}
        data.update({k: row.get(k) for k in _EXTRA})
        return cls.from_dict(data)


def _opt(kind, value):
    return None if value is None or value == "" else kind(float(value)) if kind is int else kind(value)
