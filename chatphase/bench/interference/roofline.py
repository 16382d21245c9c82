"""The roofline's account of a mixed step: N decode tokens and C prompt tokens in one ``llama_decode``.

A step reads the weights once per physical batch (``sub_batches``, 1 while the step fits ``n_ubatch``) and each
running stream's KV cache (:func:`~chatphase.models.roofline.step_bytes` at the streams' context), and does
``(N + C) × 2 × parameters`` FLOPs (:func:`~chatphase.models.roofline.step_flops`). With the measured bandwidth ``B``
and matmul FLOP/s ``F`` its least time is ``max(bytes / B, FLOPs / F)`` (Williams, Waterman & Patterson's roofline).
While ``FLOPs / F`` is the smaller, the C prompt tokens ride almost free on the bytes the decode tokens read anyway;
past ``C* = F × bytes / (2 × parameters × B) − N`` the step is bound by arithmetic and every prompt token lengthens
every running stream's gap — the trade-off chunked prefill sets with C.

``F`` is a float32 matmul peak, so the arithmetic term bounds float32 weights only
(:func:`~chatphase.models.roofline.float32_weight_type`): for other weights a step is bounded by its bytes alone,
there is no ``C*`` (``None``), and a line says why (:func:`~chatphase.models.roofline.no_prefill_bound_text`).
"""

from __future__ import annotations

from collections.abc import Sequence

from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.interference.analysis import PolicyRow
from chatphase.bench.interference.plan import policy_name
from chatphase.models.roofline import float32_weight_type, no_prefill_bound_text, step_bytes, step_flops


def crossover_chunk(
    peaks: MachinePeaks, weight_bytes: int, n_params: int, step_kv_bytes: float, n_running: int
) -> float:
    """Prompt tokens a step holds when its arithmetic takes as long as its bytes (one physical batch): ``C*``
    (module docstring); 0 or less: bound by arithmetic with decode tokens alone."""
    nbytes = weight_bytes + step_kv_bytes
    return peaks.flops_per_s * nbytes / (peaks.bandwidth_bytes_per_s * step_flops(n_params)) - n_running


def build_interference_roofline(
    peaks: MachinePeaks,
    *,
    weight_bytes: int,
    n_params: int,
    kv_bytes_per_token: int,
    n_running: int,
    context_tokens: float,
    rows: Sequence[PolicyRow],
    newcomer_tokens: int,
    weight_type: str | None,
) -> dict:
    """The JSON ``roofline`` object: peaks, the crossover ``C*`` and, per policy, the prompt step's bytes, FLOPs, bound
    and measured share, with one plain line each (``interference_lines``). ``context_tokens``: the running streams'
    context while the newcomer arrives; ``weight_type`` (``ModelInfo.quantization``) not float32: no arithmetic
    term (module doc)."""
    b, f = peaks.bandwidth_bytes_per_s, peaks.flops_per_s
    kv = step_bytes(0, kv_bytes_per_token, context_tokens, n_running)
    cross = crossover_chunk(peaks, weight_bytes, n_params, kv, n_running)
    cells, lines = [], []
    balance = f / b
    arithmetic = float32_weight_type(weight_type)
    if not arithmetic:
        lines.append(
            f"mixed step: {no_prefill_bound_text(weight_type, 'arithmetic')}: each step is bound by its bytes, "
            "and no C marks where arithmetic takes over"
        )
    elif cross <= 0:
        lines.append(
            f"mixed step: bound by arithmetic already with {n_running} decode tokens alone on this machine "
            f"(balance {balance:.1f} FLOP/byte)"
        )
    else:
        lines.append(
            f"mixed step: {n_running} decode tokens + C prompt tokens read the weights once "
            f"({weight_bytes / 2**20:.0f} MiB + {kv / 2**20:.1f} MiB KV) and do (N + C) × 2 × "
            f"{n_params / 1e6:.0f} M FLOPs: bound by memory bandwidth up to C ≈ {cross:.0f}, by arithmetic above "
            f"(balance {balance:.1f} FLOP/byte = {f / 1e9:.1f} GFLOP/s ÷ {b / 1e9:.1f} GB/s)"
        )
    for row in rows:
        if row.prompt_steps == 0:
            continue
        decode = 0 if row.chunk is None else n_running
        chunk = row.chunk if row.chunk is not None else -(-newcomer_tokens // row.prompt_steps)
        nbytes = row.sub_batches * weight_bytes + (kv if decode else 0)
        flops = step_flops(n_params, decode + chunk)
        t_mem, t_flop = nbytes / b, flops / f if arithmetic else 0.0
        bound_ms = 1e3 * max(t_mem, t_flop)
        by = "arithmetic" if t_flop > t_mem else "memory bandwidth"
        measured = row.prompt_step_ms
        cell = {
            "chunk": row.chunk,
            "decode_tokens": decode,
            "prompt_tokens": chunk,
            "sub_batches": row.sub_batches,
            "step_bytes": nbytes,
            "step_flops": flops,
            "bound_by": by,
            "bound_step_ms": bound_ms,
            "measured_step_ms": measured,
            "pct_of_bound": None if not measured else 100.0 * bound_ms / measured,
        }
        cells.append(cell)
        head = (
            f"{policy_name(row.chunk)}: a prompt step of {decode} decode + {chunk} prompt tokens"
            f"{f' in {row.sub_batches} sub-batches' if row.sub_batches > 1 else ''} reads {nbytes / 2**20:.0f} MiB, "
            f"does {flops / 1e9:.1f} GFLOP: bound by {by}, ≥ {bound_ms:.1f} ms"
        )
        lines.append(head + (f"; measured {measured:.1f} ms ({cell['pct_of_bound']:.0f}% of the bound's speed)"
                             if measured else ""))  # fmt: skip
    return {
        **peaks.to_dict(),
        "conditions": peaks.conditions,
        "weight_bytes": weight_bytes,
        "n_params": n_params,
        "kv_bytes_per_token": kv_bytes_per_token,
        "machine_balance_flops_per_byte": balance,
        "crossover_prompt_tokens": cross if arithmetic and cross > 0 else None,
        "interference_cells": cells,
        "interference_lines": lines,
        "weight_type": weight_type,
    }
