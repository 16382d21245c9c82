"""How close each phase comes to its physical bound, with peaks measured on this machine.

The bounds are the roofline of :mod:`chatphase.models.roofline` (decode: bandwidth / bytes a token reads;
prefill: FLOP/s / FLOPs a token costs). Peaks are measured on this machine, with no other chatphase engine
running, repeated until stable, at the engine's thread count (:mod:`chatphase.bench.peaks`); the decode
bound uses the *read* bandwidth (decode reads the weights), the copy figure is kept beside it for comparison
with STREAM.

A small model on a CPU is limited by per-token overhead (graph setup, sampling, Python), not by DRAM: when
the measured rate stays below :data:`BINDING_PCT` % of its bound, the verdict says so plainly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatphase.bench.peaks import MachinePeaks
from chatphase.bench.results import CellResult
from chatphase.models.roofline import decode_bound_tokens_per_s, prefill_bound_tokens_per_s

#: below this percentage of its bound a phase is reported as not bound by it (overhead dominates).
BINDING_PCT = 50.0


def cell_context_tokens(cell: CellResult) -> float:
    """The average context a cell decodes at: ``prompt_tokens + gen_tokens / 2`` tokens."""
    return cell.prompt_tokens + cell.gen_tokens / 2


def verdict(phase: str, pct: float | None, weight_bytes: int) -> str:
    """One plain sentence on whether ``phase`` ("decode"/"prefill") is bound at ``pct`` % of its bound."""
    if pct is None:
        return f"{phase}: not measured"
    if pct > 100:
        return (
            f"{phase}: {pct:.0f}% of the bound — above it: the {weight_bytes / 2**20:.0f} MiB of weights are "
            "served partly from CPU caches (or the peak test under-measured this machine)"
        )
    if pct < BINDING_PCT:
        why = (
            "per-token overhead (graph setup, sampling, Python) dominates, not memory bandwidth"
            if phase == "decode"
            else "per-batch overhead and the work outside the weight matmuls (attention, norms, dequantisation) "
            "dominate, not matmul FLOP/s"
        )
        return f"{phase}: {pct:.0f}% of the bound — the model is too small for the bound to bind: {why}"
    return f"{phase}: {pct:.0f}% of the bound — bound by " + ("memory bandwidth" if phase == "decode" else "arithmetic")


def build_roofline(
    peaks: MachinePeaks, *, weight_bytes: int, n_params: int, kv_bytes_per_token: int, cells: Sequence[CellResult]
) -> dict:
    """The JSON ``roofline`` object: peaks, per-cell bounds and % of bound, and two verdicts.

    A cell decodes at :func:`cell_context_tokens`. The verdicts use the
    fastest measured cell of each phase (the one closest to its bound).
    """
    rows: list[dict[str, Any]] = []
    for c in cells:
        context = cell_context_tokens(c)
        d_bound = decode_bound_tokens_per_s(peaks.bandwidth_bytes_per_s, weight_bytes, kv_bytes_per_token, context)
        p_bound = prefill_bound_tokens_per_s(peaks.flops_per_s, n_params)
        d_mean, p_mean = c.decode_tokens_per_s.mean, c.prefill_tokens_per_s.mean
        rows.append(
            {
                "kind": c.kind,
                "prompt_tokens": c.prompt_tokens,
                "depth": c.depth,
                "decode_bound_tokens_per_s": d_bound,
                "decode_pct_of_bound": None if d_mean is None else 100.0 * d_mean / d_bound,
                "prefill_bound_tokens_per_s": p_bound,
                "prefill_pct_of_bound": None if p_mean is None else 100.0 * p_mean / p_bound,
            }
        )
    best_decode = max((r["decode_pct_of_bound"] for r in rows if r["decode_pct_of_bound"] is not None), default=None)
    best_prefill = max((r["prefill_pct_of_bound"] for r in rows if r["prefill_pct_of_bound"] is not None), default=None)
    decode_verdict = verdict("decode", best_decode, weight_bytes)
    prefill_verdict = verdict("prefill", best_prefill, weight_bytes)
    if peaks.engines_beside:  # say it where the verdict is read: these percentages run high
        decode_verdict += f" ({peaks.conditions})"
        prefill_verdict += f" ({peaks.conditions})"
    return {
        **peaks.to_dict(),
        "conditions": peaks.conditions,
        "weight_bytes": weight_bytes,
        "n_params": n_params,
        "kv_bytes_per_token": kv_bytes_per_token,
        "decode_bound_tokens_per_s_at_empty_context": decode_bound_tokens_per_s(
            peaks.bandwidth_bytes_per_s, weight_bytes, kv_bytes_per_token, 0
        ),
        "prefill_bound_tokens_per_s": prefill_bound_tokens_per_s(peaks.flops_per_s, n_params),
        "cells": rows,
        "decode_best_pct_of_bound": best_decode,
        "prefill_best_pct_of_bound": best_prefill,
        "decode_verdict": decode_verdict,
        "prefill_verdict": prefill_verdict,
    }
