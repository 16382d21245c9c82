"""How close each phase comes to its physical bound, with peaks measured on this machine.

Bounds (the roofline model, Williams, Waterman & Patterson 2009, applied to LLM inference as in
``docs/metrics.md``):

- decode: every generated token reads all weights and the KV cache of the context once, so
  ``decode_bound_tokens_per_s = bandwidth_bytes_per_s / (weight_bytes + kv_bytes_per_token × context_tokens)``;
- prefill: a forward pass costs about ``2 × n_params`` FLOPs per token (one multiply-add per weight), so
  ``prefill_bound_tokens_per_s = flops_per_s / (2 × n_params)``.

Peaks are measured on this machine, with no other chatphase engine running, repeated until stable,
at the engine's thread count (:mod:`chatphase.bench.peaks`); the decode bound uses the *read* bandwidth
(decode reads the weights), the copy figure is kept beside it for comparison with STREAM.

``weight_bytes`` is what one token reads of the weights (:func:`weight_bytes_per_token`): the GGUF file size
(tensor data plus a small header: an upper estimate) less a separate token-embedding matrix, of which a
token reads one row (a tied one is the output matrix, read whole). A small
model on a CPU is limited by per-token overhead (graph setup, sampling, Python), not by DRAM: when the
measured rate stays below :data:`BINDING_PCT` % of its bound, the verdict says so plainly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatphase.bench.peaks import MachinePeaks
from chatphase.bench.results import CellResult
from chatphase.models.gguf_meta import ModelInfo

#: below this percentage of its bound a phase is reported as not bound by it (overhead dominates).
BINDING_PCT = 50.0


def weight_bytes_per_token(info: ModelInfo) -> int:
    """Bytes of weights one token reads: ``info.size_bytes`` less ``info.embedding_bytes`` (an untied token
    embedding, looked up one row at a time).

    Raises:
        ValueError: a served model whose server did not report its size.
    """
    if info.size_bytes is None:
        raise ValueError(f"the size of {info.name} is not known")
    return info.size_bytes - info.embedding_bytes


def cell_context_tokens(cell: CellResult) -> float:
    """The average context a cell decodes at: ``prompt_tokens + gen_tokens / 2`` tokens."""
    return cell.prompt_tokens + cell.gen_tokens / 2


def step_bytes(weight_bytes: int, kv_bytes_per_token: int, context_tokens: float, n_seq: int = 1) -> float:
    """Bytes one decode step reads: the weights once, plus each of ``n_seq`` sequences' KV cache of
    ``context_tokens`` tokens (``weight_bytes + n_seq × kv_bytes_per_token × context_tokens``)."""
    return weight_bytes + n_seq * kv_bytes_per_token * context_tokens


def step_flops(n_params: int, n_tokens: int = 1) -> float:
    """FLOPs of a forward pass over ``n_tokens`` tokens: ``2 × n_params × n_tokens`` (one multiply-add per
    weight and token; attention's own arithmetic is left out, small beside it at these contexts)."""
    return 2.0 * n_params * n_tokens


def decode_bound_tokens_per_s(
    bandwidth_bytes_per_s: float, weight_bytes: int, kv_bytes_per_token: int, context_tokens: float
) -> float:
    """Memory-bandwidth bound on decode tokens/s at ``context_tokens`` tokens of context (see module doc)."""
    return bandwidth_bytes_per_s / step_bytes(weight_bytes, kv_bytes_per_token, context_tokens)


def prefill_bound_tokens_per_s(flops_per_s: float, n_params: int) -> float:
    """Compute bound on prefill tokens/s: ``flops_per_s / (2 × n_params)``."""
    return flops_per_s / step_flops(n_params)


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
