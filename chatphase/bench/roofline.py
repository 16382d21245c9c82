"""How close each phase comes to its physical bound, with peaks measured on this machine.

Bounds (the roofline model, Williams, Waterman & Patterson 2009, applied to LLM inference as in
``docs/metrics.md``):

- decode: every generated token reads all weights and the KV cache of the context once, so
  ``decode_bound_tokens_per_s = bandwidth_bytes_per_s / (weight_bytes + kv_bytes_per_token × context_tokens)``;
- prefill: a forward pass costs about ``2 × n_params`` FLOPs per token (one multiply-add per weight), so
  ``prefill_bound_tokens_per_s = flops_per_s / (2 × n_params)``.

Peaks are measured, not looked up:

- memory bandwidth: a STREAM-style *Copy* (McCalpin's STREAM benchmark) with ``numpy.copyto`` on two
  float64 arrays much larger than the CPU caches, split over the engine's thread count; bytes counted
  as read + written (2 × array bytes per pass); the best of several passes.
- FLOP/s: a float32 ``numpy.matmul`` of two n × n matrices (NumPy's BLAS, 2n³ FLOPs); best of several.
  BLAS picks its own thread count (usually every core), which can exceed the engine's ``n_threads``.

``weight_bytes`` is the GGUF file size (tensor data plus a small header: an upper estimate). A small
model on a CPU is limited by per-token overhead (graph setup, sampling, Python), not by DRAM: when the
measured rate stays below :data:`BINDING_PCT` % of its bound, the verdict says so plainly.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from chatphase.bench.results import CellResult

#: below this percentage of its bound a phase is reported as not bound by it (overhead dominates).
BINDING_PCT = 50.0


@dataclass(frozen=True)
class MachinePeaks:
    """Measured peaks: bytes per second and FLOP per second, each with the method that measured it."""

    bandwidth_bytes_per_s: float
    bandwidth_method: str
    flops_per_s: float
    flops_method: str

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


def measure_bandwidth(array_bytes: int = 128 * 2**20, threads: int = 1, passes: int = 5) -> tuple[float, str]:
    """STREAM-style Copy bandwidth in bytes per second, and a description of the method.

    Args:
        array_bytes: size of each of the two arrays (bytes; far above the last-level cache).
        threads: threads copying disjoint slices at once (``numpy.copyto`` releases the GIL).
        passes: timed passes; the best one counts (STREAM reports the best of its trials).

    Raises:
        ValueError: when an argument is not positive.
    """
    import numpy as np  # here: the TUI imports this module, and NumPy at import costs it ~0.1 s

    if array_bytes <= 0 or threads < 1 or passes < 1:
        raise ValueError("array_bytes, threads and passes must be positive")
    n = max(threads, array_bytes // 8)
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    bounds = np.linspace(0, n, threads + 1, dtype=np.int64)
    slices = [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds)]

    def copy(sl: slice) -> None:
        np.copyto(dst[sl], src[sl])

    best = float("inf")
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(copy, slices))  # touch every page once before timing
        for _ in range(passes):
            t0 = time.perf_counter()
            list(pool.map(copy, slices))
            best = min(best, time.perf_counter() - t0)
    moved = 2 * n * 8
    method = (
        f"STREAM-style Copy: numpy.copyto of 2 × {n * 8 / 2**20:.0f} MiB float64 arrays on {threads} "
        f"thread(s), read + write bytes counted, best of {passes}"
    )
    return moved / best, method


def measure_matmul_flops(n: int = 1024, passes: int = 5) -> tuple[float, str]:
    """float32 matrix-multiply FLOP/s (``2 n³`` FLOPs per product, NumPy's BLAS), best of ``passes``.

    Raises:
        ValueError: when an argument is not positive.
    """
    import numpy as np  # here: the TUI imports this module, and NumPy at import costs it ~0.1 s

    if n < 1 or passes < 1:
        raise ValueError("n and passes must be positive")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up (thread pool start, page faults)
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return (
        2.0 * n**3 / best,
        f"numpy.matmul float32 {n}×{n} (2n³ FLOPs, NumPy's BLAS on its own thread count), best of {passes}",
    )


def measure_peaks(threads: int = 1) -> MachinePeaks:
    """Measure both peaks (about a second on a laptop)."""
    bw, bw_method = measure_bandwidth(threads=threads)
    flops, flops_method = measure_matmul_flops()
    return MachinePeaks(bw, bw_method, flops, flops_method)


def decode_bound_tokens_per_s(
    bandwidth_bytes_per_s: float, weight_bytes: int, kv_bytes_per_token: int, context_tokens: float
) -> float:
    """Memory-bandwidth bound on decode tokens/s at ``context_tokens`` tokens of context (see module doc)."""
    return bandwidth_bytes_per_s / (weight_bytes + kv_bytes_per_token * context_tokens)


def prefill_bound_tokens_per_s(flops_per_s: float, n_params: int) -> float:
    """Compute bound on prefill tokens/s: ``flops_per_s / (2 × n_params)``."""
    return flops_per_s / (2.0 * n_params)


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

    A cell decodes at an average context of ``prompt_tokens + gen_tokens / 2`` tokens. The verdicts use the
    fastest measured cell of each phase (the one closest to its bound).
    """
    rows = []
    for c in cells:
        context = c.prompt_tokens + c.gen_tokens / 2
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
    return {
        **peaks.to_dict(),
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
        "decode_verdict": verdict("decode", best_decode, weight_bytes),
        "prefill_verdict": verdict("prefill", best_prefill, weight_bytes),
    }
