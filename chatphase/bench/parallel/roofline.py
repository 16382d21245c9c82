"""The roofline of a parallel decode step: at which N it stops being bound by memory bandwidth and becomes
bound by arithmetic, from the peaks measured on this machine (:mod:`chatphase.bench.core.roofline`).

One step advances N sequences by one token each. It reads the weights once and each sequence's KV cache
(:func:`~chatphase.models.roofline.step_bytes`, at the mean decode context ``prompt + gen / 2``) and does
``2 × parameters × N`` FLOPs (:func:`~chatphase.models.roofline.step_flops`). With bandwidth ``B`` and
FLOP/s ``F`` (Williams, Waterman & Patterson's roofline):

- time bounds ``t_memory = bytes / B`` and ``t_arithmetic = FLOPs / F``; the step takes at least the
  larger, so the aggregate bound is ``N / max(t_memory, t_arithmetic)`` tokens/s;
- the step is bandwidth-bound while its arithmetic intensity ``FLOPs / bytes`` stays below the machine's
  balance ``F / B``; it crosses at ``N* = F·W / (2·P·B − F·k·c)`` (weights ``W`` bytes, ``P`` parameters,
  ``k`` KV bytes per token, ``c`` tokens of context), and never when the KV read grows as fast as the
  arithmetic (``2·P·B <= F·k·c``).

The arithmetic term is a float32 matmul peak's, so it bounds float32 weights only
(:func:`~chatphase.models.roofline.float32_weight_type`): for other weights the step is bounded by its bytes
alone, there is no crossover, and the verdicts say why (:func:`~chatphase.models.roofline.no_prefill_bound_text`).
"""

from __future__ import annotations

from collections.abc import Sequence

from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.roofline import bound_class
from chatphase.bench.parallel.records import ParallelCell
from chatphase.models.roofline import BoundShare, float32_weight_type, no_prefill_bound_text, step_bytes, step_flops


def crossover_n_seq(peaks: MachinePeaks, weight_bytes: int, n_params: int, kv_bytes_per_token: int, context: float):
    """The N at which the step's arithmetic intensity reaches the machine balance, or ``None`` (never)."""
    b, f = peaks.bandwidth_bytes_per_s, peaks.flops_per_s
    slope = 2.0 * n_params * b - f * kv_bytes_per_token * context
    return f * weight_bytes / slope if slope > 0 else None


def build_parallel_roofline(
    peaks: MachinePeaks,
    *,
    weight_bytes: int,
    n_params: int,
    kv_bytes_per_token: int,
    cells: Sequence[ParallelCell],
    weight_type: str | None,
) -> dict:
    """The JSON ``roofline`` object of a parallel sweep: peaks, machine balance, per-cell bounds and % of the
    bound, the crossover N per prompt length, and one plain-language line per cell (``parallel_verdicts``).
    ``weight_type`` (``ModelInfo.quantization``) not float32: no arithmetic term, no crossover (module doc)."""
    balance = peaks.flops_per_s / peaks.bandwidth_bytes_per_s
    arithmetic = float32_weight_type(weight_type)
    rows, lines, crossings = [], [], {}
    for c in cells:
        context = c.prompt_tokens + c.gen_tokens / 2
        nbytes = step_bytes(weight_bytes, kv_bytes_per_token, context, c.n_seq)
        flops = step_flops(n_params, c.n_seq)
        t_mem = nbytes / peaks.bandwidth_bytes_per_s
        t_flop = flops / peaks.flops_per_s if arithmetic else 0.0
        bound = c.n_seq / max(t_mem, t_flop)
        measured = c.aggregate_decode_tokens_per_s.mean
        row = {
            "prompt_tokens": c.prompt_tokens,
            "n_seq": c.n_seq,
            "step_bytes": nbytes,
            "step_flops": flops,
            "flops_per_byte": flops / nbytes,
            "bound_by": "arithmetic" if t_flop > t_mem else "memory bandwidth",
            "bound_step_ms": 1e3 * max(t_mem, t_flop),
            "aggregate_bound_tokens_per_s": bound,
            "pct_of_bound": None if measured is None else 100.0 * measured / bound,
        }
        rows.append(row)
        lines.append(parallel_verdict(row, balance, weight_bytes, kv_bytes_per_token * context, arithmetic))
        if arithmetic and c.prompt_tokens not in crossings:
            crossings[c.prompt_tokens] = crossover_n_seq(peaks, weight_bytes, n_params, kv_bytes_per_token, context)
    crossover = [{"prompt_tokens": length, "n_seq": n} for length, n in crossings.items()]
    return {
        **peaks.to_dict(),
        "weight_bytes": weight_bytes,
        "n_params": n_params,
        "kv_bytes_per_token": kv_bytes_per_token,
        "machine_balance_flops_per_byte": balance,
        "parallel_cells": rows,
        "parallel_crossover": crossover,
        "parallel_verdicts": [crossover_line(x["prompt_tokens"], x["n_seq"], peaks) for x in crossover]
        + ([] if arithmetic else [no_prefill_bound_text(weight_type, "the step's arithmetic") + ": bound by its bytes"])
        + lines,
        "weight_type": weight_type,
    }


def crossover_line(prompt_tokens: int, n_seq: float | None, peaks: MachinePeaks) -> str:
    """Where the step turns from bandwidth-bound to arithmetic-bound, in one sentence."""
    balance = (
        f"machine balance {peaks.flops_per_s / peaks.bandwidth_bytes_per_s:.1f} FLOP/byte = "
        f"{peaks.flops_per_s / 1e9:.1f} GFLOP/s ÷ {peaks.bandwidth_bytes_per_s / 1e9:.1f} GB/s"
    )
    if n_seq is None:
        return (
            f"prompt {prompt_tokens}: the step stays bound by memory bandwidth at every N — each sequence's KV "
            f"read grows as fast as its arithmetic ({balance})"
        )
    if n_seq <= 1:
        return f"prompt {prompt_tokens}: the step is bound by arithmetic already at N = 1 on this machine ({balance})"
    return (
        f"prompt {prompt_tokens}: the step turns from bound by memory bandwidth to bound by arithmetic at "
        f"N ≈ {n_seq:.1f} on this machine ({balance})"
    )


def parallel_verdict(
    row: dict, balance: float, weight_bytes: int, kv_bytes_per_seq: float, arithmetic: bool = True
) -> str:
    """One plain sentence on cell ``row`` of :func:`build_parallel_roofline` (``arithmetic`` false: the
    weights are not float32, the balance bounds nothing and is left out)."""
    n = row["n_seq"]
    side = "above" if row["flops_per_byte"] > balance else "below"
    against = f", {side} the balance {balance:.1f}" if arithmetic else ""
    head = (
        f"N={n}: a step reads {row['step_bytes'] / 2**20:.1f} MiB (weights once + {n} × "
        f"{kv_bytes_per_seq / 2**20:.2f} MiB KV) and does {row['step_flops'] / 1e9:.2f} GFLOP — "
        f"{row['flops_per_byte']:.1f} FLOP/byte{against}: bound by {row['bound_by']}, at most "
        f"{row['aggregate_bound_tokens_per_s']:,.0f} tok/s"
    )
    pct = row["pct_of_bound"]
    if pct is None:
        return f"{head}; not measured"
    measured = pct * row["aggregate_bound_tokens_per_s"] / 100
    share = BoundShare(pct / 100, "read bandwidth" if row["bound_by"] == "memory bandwidth" else "matmul FLOP/s")
    if share.above:
        return f"{head}; measured {measured:,.0f} tok/s, {share.text()}"
    tail = f"; measured {measured:,.0f} tok/s, {pct:.0f}% of it"
    kind = bound_class(pct)
    if kind == "overhead":
        return f"{head}{tail} — per-step overhead (graph setup, thread barriers, sampling) dominates, not the bound"
    if kind == "near":
        return f"{head}{tail} — near the boundary: per-step overhead counts as much as the bound"
    return f"{head}{tail}"
