"""The parallel sweep's table cells and progress line (the report helpers it renders with are
:mod:`chatphase.bench.core.report`'s)."""

from __future__ import annotations

from collections.abc import Sequence

from chatphase.bench.core.report import mean_sd
from chatphase.bench.parallel.records import ParallelCell, ParallelSample
from chatphase.units import DASH, fmt_mib, fmt_rate

_PARALLEL_METRICS = (
    ("step_ms", "step ms"),
    ("decode_tokens_per_s", "per-seq tok/s"),
    ("aggregate_decode_tokens_per_s", "aggregate tok/s"),
    ("prefill_tokens_per_s", "prefill tok/s"),
    ("ttft_ms", "TTFT ms"),
)


def parallel_rows(cells: Sequence[ParallelCell], fmt=mean_sd) -> list[list[str]]:
    """Table cells of parallel-decode cells, in :func:`parallel_headers` order."""
    return [
        [
            str(c.prompt_tokens),
            str(c.n_seq),
            str(c.reps),
            *(fmt(getattr(c, m)) for m, _ in _PARALLEL_METRICS),
            fmt_mib(c.kv_cache_bytes),
            fmt_mib(c.step_bytes),
            DASH if c.step_flops is None else f"{c.step_flops / 1e9:.2f}",
        ]
        for c in cells
    ]


def parallel_headers(what: str = "") -> list[str]:
    """Column headers of :func:`parallel_rows`."""
    labels = (f"{label} {what}".rstrip() for _, label in _PARALLEL_METRICS)
    return ["prompt tok", "N", "reps", *labels, "KV MiB", "step MiB", "step GFLOP"]


def parallel_progress(s: ParallelSample) -> tuple[str, str]:
    """One run's progress line as ``(label, figures)``: ``("N=4 prompt 64 warm-up", "aggregate 190.2 tok/s, per
    sequence 47.6 tok/s")``."""
    rep = "warm-up" if s.warmup else f"rep {s.rep + 1}"
    aggregate, per_seq = fmt_rate(s.aggregate_decode_tokens_per_s), fmt_rate(s.decode_tokens_per_s)
    return f"N={s.n_seq} prompt {s.prompt_tokens} {rep}", f"aggregate {aggregate}, per sequence {per_seq}"
