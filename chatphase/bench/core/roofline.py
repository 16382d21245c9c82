"""How close each phase comes to its physical bound, with peaks measured on this machine.

The bounds are the roofline of :mod:`chatphase.models.roofline` (decode: the weights' bytes, then
attention's bytes or arithmetic at the cell's context; prefill: FLOP/s / FLOPs a token costs). Peaks are
measured on this machine, with no other chatphase engine running, repeated until stable, at the engine's
thread count (:mod:`chatphase.bench.core.peaks`); the decode bound uses the *read* bandwidth (the best of
several read kernels), the copy figure is kept beside it for comparison with STREAM. A measurement above
its bound is said in words (:func:`chatphase.models.roofline.share_of_bound`), never as a percentage above 100.

A small model on a CPU is limited by per-token overhead (graph setup, sampling, Python), not by DRAM. The
verdict says which with a band, not one threshold (:func:`bound_class`): at or above
:data:`BOUND_PCT` % of the bound the phase is bound by it, below :data:`OVERHEAD_PCT` % overhead dominates,
and between them — or when the repetitions' spread crosses the band — it is *near the boundary*, so two
identical runs a few percent apart never get opposite verdicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.results import CellResult
from chatphase.models.roofline import (
    PEAK_OF_PHASE,
    BoundShare,
    decode_bound,
    decode_bound_tokens_per_s,
    float32_weight_type,
    no_prefill_bound_text,
    prefill_bound_tokens_per_s,
)

#: at or above this percentage of its bound (its slowest repetition too) a phase is reported as bound by it.
BOUND_PCT = 60.0
#: below this percentage (its fastest repetition too) a phase is reported as not bound by it (overhead dominates).
OVERHEAD_PCT = 40.0

BoundClass = Literal["bound", "near", "overhead"]


def bound_class(pct_low: float, pct_high: float | None = None) -> BoundClass:
    """``"bound"``, ``"near"`` (the boundary) or ``"overhead"`` for a phase measured between ``pct_low`` and
    ``pct_high`` % of its bound (its repetitions' slowest and fastest; one figure: ``pct_high`` omitted)."""
    high = pct_low if pct_high is None else pct_high
    if min(pct_low, high) >= BOUND_PCT:
        return "bound"
    if max(pct_low, high) < OVERHEAD_PCT:
        return "overhead"
    return "near"


def cell_context_tokens(cell: CellResult) -> float:
    """The average context a cell decodes at: ``prompt_tokens + gen_tokens / 2`` tokens."""
    return cell.prompt_tokens + cell.gen_tokens / 2


def verdict(phase: str, pct: float | None, pct_range: tuple[float, float] | None = None) -> str:
    """One plain sentence on whether ``phase`` ("decode"/"prefill") is bound at ``pct`` % of its bound
    (``pct_range``: its repetitions' slowest and fastest, in %), by :func:`bound_class`; a measurement
    above its bound says so (:class:`~chatphase.models.roofline.BoundShare`)."""
    if pct is None:
        return f"{phase}: not measured"
    share = BoundShare(pct / 100, PEAK_OF_PHASE[phase])
    if share.above:
        return f"{phase}: {share.text()} — a bound is never beaten: measure the peaks again with nothing else running"
    what = "memory bandwidth" if phase == "decode" else "arithmetic"
    overhead = (
        "per-token overhead (graph setup, sampling, Python)"
        if phase == "decode"
        else "per-batch overhead and the work outside the weight matmuls (attention, norms, dequantisation)"
    )
    low, high = pct_range if pct_range is not None else (pct, pct)
    spread = f" (repetitions {low:.0f}–{high:.0f}%)" if high - low >= 1 else ""
    kind = bound_class(min(pct, low), max(pct, high))
    if kind == "overhead":
        return (
            f"{phase}: {share.text()}{spread} — the model is too small for the bound to bind: {overhead} "
            f"dominates, not {'memory bandwidth' if phase == 'decode' else 'matmul FLOP/s'}"
        )
    if kind == "near":
        return (
            f"{phase}: {share.text()}{spread} — near the boundary ({OVERHEAD_PCT:.0f}–{BOUND_PCT:.0f}% of the "
            f"bound): partly bound by {what}, partly by {overhead}"
        )
    return f"{phase}: {share.text()}{spread} — bound by {what}"


def _pct_range(stats, bound: float) -> tuple[float, float] | None:
    if stats.min is None or stats.max is None:
        return None
    return 100.0 * stats.min / bound, 100.0 * stats.max / bound


def attention_line(
    peaks: MachinePeaks,
    *,
    weight_bytes: int,
    kv_bytes_per_token: int,
    attention_flops_per_context: float,
    shallow: CellResult,
    deep: CellResult,
) -> str | None:
    """Attention's measured cost at depth, against the roofline's: the step's growth from ``shallow`` to
    ``deep`` (``1 / decode rate``, each cell's mean) beside the growth of the bound's attention term
    (its KV bytes at the read bandwidth or its FLOPs at the matmul peak, the larger). ``None`` when a rate
    is missing or the deep cell is not deeper."""
    slow, fast = deep.decode_tokens_per_s.mean, shallow.decode_tokens_per_s.mean
    c_deep, c_shallow = cell_context_tokens(deep), cell_context_tokens(shallow)
    if not slow or not fast or c_deep <= c_shallow:
        return None

    def bound(c: float):
        return decode_bound(
            peaks.bandwidth_bytes_per_s, weight_bytes, kv_bytes_per_token, c, peaks.flops_per_s,
            attention_flops_per_context,
        )  # fmt: skip

    measured_ms = 1e3 * (1 / slow - 1 / fast)
    allowed_ms = 1e3 * (bound(c_deep).attention_s - bound(c_shallow).attention_s)
    share = measured_ms / (1e3 / slow)
    head = (
        f"attention at depth {deep.depth}: the step grew {measured_ms:.2f} ms over depth {shallow.depth} "
        f"({share:.0%} of a {1e3 / slow:.1f} ms step); the roofline allows {allowed_ms:.2f} ms for it "
        f"(bound by {bound(c_deep).attention_bound_by})"
    )
    if allowed_ms > 0 and measured_ms > 1.5 * allowed_ms:
        return (
            f"{head} — attention costs {measured_ms / allowed_ms:.1f}× its bound: on a CPU its arithmetic "
            "(and a quantised cache's dequantisation) runs far below the matmul peak, more than its bytes cost"
        )
    return head


def build_roofline(
    peaks: MachinePeaks,
    *,
    weight_bytes: int,
    n_params: int,
    kv_bytes_per_token: int,
    cells: Sequence[CellResult],
    attention_flops_per_context: float = 0.0,
    prefill_params: int | None = None,
    weight_type: str | None,
) -> dict:
    """The JSON ``roofline`` object: peaks, per-cell bounds and % of bound, two verdicts and, with depth
    cells at two depths, attention's measured cost (``attention_line``).

    A cell decodes at :func:`cell_context_tokens`. The verdicts use the fastest measured cell of each phase
    (the one closest to its bound) and its repetitions' spread. ``weight_type`` is the model's
    (``ModelInfo.quantization``): for weights other than float32 (:func:`~chatphase.models.roofline.float32_weight_type`)
    the prefill bound, its percentages and ``prefill_above_bound`` are ``None`` and the prefill verdict says why
    (:func:`~chatphase.models.roofline.no_prefill_bound_text`); the decode bound holds for any weight type.
    """
    rows: list[dict[str, Any]] = []
    spreads: dict[tuple[str, int], tuple[float, float] | None] = {}
    p_params = prefill_params or n_params  # the parameters a prompt token multiplies, where the shape is known
    p_bound = prefill_bound_tokens_per_s(peaks.flops_per_s, p_params) if float32_weight_type(weight_type) else None
    for i, c in enumerate(cells):
        b = decode_bound(
            peaks.bandwidth_bytes_per_s, weight_bytes, kv_bytes_per_token, cell_context_tokens(c),
            peaks.flops_per_s, attention_flops_per_context,
        )  # fmt: skip
        d_bound = b.tokens_per_s
        d_mean, p_mean = c.decode_tokens_per_s.mean, c.prefill_tokens_per_s.mean
        spreads["decode", i] = _pct_range(c.decode_tokens_per_s, d_bound)
        spreads["prefill", i] = None if p_bound is None else _pct_range(c.prefill_tokens_per_s, p_bound)
        rows.append(
            {
                "kind": c.kind,
                "prompt_tokens": c.prompt_tokens,
                "depth": c.depth,
                "decode_bound_tokens_per_s": d_bound,
                "decode_bound_terms_ms": {
                    "weights": 1e3 * b.weights_s,
                    "kv_read": 1e3 * b.kv_read_s,
                    "attention_compute": 1e3 * b.attention_compute_s,
                },
                "decode_pct_of_bound": None if d_mean is None else 100.0 * d_mean / d_bound,
                "decode_above_bound": d_mean is not None and d_mean > d_bound,
                "prefill_bound_tokens_per_s": p_bound,
                "prefill_pct_of_bound": None if p_mean is None or p_bound is None else 100.0 * p_mean / p_bound,
                "prefill_above_bound": None if p_bound is None else p_mean is not None and p_mean > p_bound,
            }
        )

    def best(phase: str) -> tuple[float | None, tuple[float, float] | None]:
        key = f"{phase}_pct_of_bound"
        measured = [(r[key], i) for i, r in enumerate(rows) if r[key] is not None]
        if not measured:
            return None, None
        pct, i = max(measured)
        return pct, spreads[phase, i]

    decode_verdict = verdict("decode", *best("decode"))
    prefill_verdict = (
        verdict("prefill", *best("prefill")) if p_bound is not None else no_prefill_bound_text(weight_type)
    )
    if peaks.engines_beside:  # say it where the verdict is read: these percentages run high
        decode_verdict += f" ({peaks.conditions})"
        prefill_verdict += f" ({peaks.conditions})" if p_bound is not None else ""
    depth_cells = sorted((c for c in cells if c.kind == "depth"), key=lambda c: c.depth)
    attention = None
    if len(depth_cells) >= 2:
        attention = attention_line(
            peaks, weight_bytes=weight_bytes, kv_bytes_per_token=kv_bytes_per_token,
            attention_flops_per_context=attention_flops_per_context, shallow=depth_cells[0], deep=depth_cells[-1],
        )  # fmt: skip
    return {
        **peaks.to_dict(),
        "conditions": peaks.conditions,
        "weight_bytes": weight_bytes,
        "n_params": n_params,
        "prefill_params": p_params,
        "kv_bytes_per_token": kv_bytes_per_token,
        "attention_flops_per_context_token": attention_flops_per_context,
        "decode_bound_tokens_per_s_at_empty_context": decode_bound_tokens_per_s(
            peaks.bandwidth_bytes_per_s, weight_bytes, kv_bytes_per_token, 0
        ),
        "prefill_bound_tokens_per_s": p_bound,
        "cells": rows,
        "decode_best_pct_of_bound": best("decode")[0],
        "prefill_best_pct_of_bound": best("prefill")[0],
        "decode_verdict": decode_verdict,
        "prefill_verdict": prefill_verdict,
        "attention_line": attention,
        "weight_type": weight_type,
    }
