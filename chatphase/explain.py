"""One plain-language line per phase saying what bounds it, with this model's and this turn's numbers.

The reasoning is the roofline of ``docs/metrics.md``:

- decode: every new token re-reads all weights plus the KV cache written so far, so
  ``decode tokens/s <= memory bandwidth / (weight bytes + KV bytes)``. We report the effective bandwidth
  ``decode_tokens_per_s × (weight bytes + KV bytes)``. When that is below
  :data:`OVERHEAD_FRACTION` of a reference memory bandwidth, the bytes are not what limits the rate:
  per-token overhead (sampling, Python, thread wake-ups) dominates — the usual case for tiny models on CPU.
- prefill: every prompt token costs about ``2 × parameters`` FLOPs (one multiply-add per weight), and a
  batch of prompt tokens reads the weights once, so ``prefill tokens/s <= peak FLOP/s / (2 × parameters)``.
  We report the effective FLOP/s and how many times faster than decode the batch ran.
- thinking (reasoning models): the thinking block is decode whose tokens the user waits through before the
  answer; we report its share of the generated tokens and how long the first answer token waited for it.

The bytes and FLOPs are the roofline's (:mod:`chatphase.models.roofline`): weight bytes are what one token
reads (:func:`~chatphase.models.roofline.weight_bytes_per_token`), the KV bytes the cache after the turn.
Sizes use binary units (MiB, GiB) through :func:`chatphase.units.fmt_bytes`, as llama.cpp's log and the
rest of the app do.
"""

from __future__ import annotations

from chatphase.engine.events import LoadedModel
from chatphase.engine.metrics import TurnMetrics
from chatphase.models.roofline import decode_bound_tokens_per_s, step_bytes, step_flops, weight_bytes_per_token
from chatphase.units import fmt_bytes, fmt_count, fmt_params, fmt_seconds, fmt_stop_reason

#: reference DRAM bandwidth of a CPU, bytes/s: DDR4-3200 dual channel, 2 × 25.6 GB/s theoretical peak.
CPU_REFERENCE_BANDWIDTH = 51.2e9
#: reference memory bandwidth of a GPU, bytes/s: a mid-range discrete card (e.g. RTX 3060 Ti/4070: ~450–500 GB/s).
GPU_REFERENCE_BANDWIDTH = 450e9
#: below this fraction of the reference bandwidth, decode is called overhead bound rather than bandwidth bound.
OVERHEAD_FRACTION = 0.25
#: prefills of fewer new tokens than this are too short to be compute bound (fixed per-call costs dominate).
SMALL_PREFILL_TOKENS = 16


def _gpu_offloaded(model: LoadedModel) -> bool:
    """True when every layer runs on the GPU (partial offload is still bound by the CPU part)."""
    return bool(model.layers_offloaded and model.layers_total and model.layers_offloaded >= model.layers_total)


def explain_decode(model: LoadedModel, metrics: TurnMetrics, reference_bandwidth: float | None = None) -> str:
    """The decode line, e.g. ``decode: per-token overhead bound — each token re-reads 93.5 MiB of weights +
    11.9 MiB of KV, yet 44.4 tok/s moves only 4.6 GiB/s of ~47.7 GiB/s memory bandwidth: fixed work per
    token (sampling, Python, thread sync) dominates``.

    Args:
        model: the loaded model (weight bytes :func:`~chatphase.models.roofline.weight_bytes_per_token`, KV
            bytes per token; GPU offload decides the default reference bandwidth).
        metrics: the turn (``decode_tokens_per_s``; ``kv_cache_tokens`` and ``kv_cache_bytes`` after the turn).
        reference_bandwidth: bytes/s to compare against; default :data:`CPU_REFERENCE_BANDWIDTH`, or
            :data:`GPU_REFERENCE_BANDWIDTH` when all layers are offloaded.
    """
    tps = metrics.decode_tokens_per_s
    if tps is None or tps <= 0:
        return f"decode: {fmt_count(metrics.decode_tokens or 0, 'token')} — too few to measure a decode rate"
    weights = weight_bytes_per_token(model.info)
    kv = metrics.kv_cache_bytes
    per_kv, tokens = model.kv_bytes_per_token, metrics.kv_cache_tokens
    if weights is None or kv is None or per_kv is None or tokens is None:  # a remote server: neither is reported
        return f"decode: {tps:.1f} tok/s — weight and KV bytes not reported by the server, no roofline"
    per_token = step_bytes(weights, per_kv, tokens)  # = weights + kv
    ref = reference_bandwidth or (GPU_REFERENCE_BANDWIDTH if _gpu_offloaded(model) else CPU_REFERENCE_BANDWIDTH)
    effective = tps * per_token
    roofline_tps = decode_bound_tokens_per_s(ref, weights, per_kv, tokens)
    reads = f"each token re-reads {fmt_bytes(weights)} of weights + {fmt_bytes(kv)} of KV"
    if effective < OVERHEAD_FRACTION * ref:
        return (
            f"decode: per-token overhead bound — {reads}, yet {tps:.1f} tok/s moves only "
            f"{fmt_bytes(effective)}/s of ~{fmt_bytes(ref)}/s memory bandwidth: fixed work per token "
            f"(sampling, Python, thread sync) dominates"
        )
    return (
        f"decode: memory-bandwidth bound — {reads}: {tps:.1f} tok/s moves {fmt_bytes(effective)}/s "
        f"(roofline ~{roofline_tps:.0f} tok/s at {fmt_bytes(ref)}/s)"
    )


def explain_prefill(model: LoadedModel, metrics: TurnMetrics) -> str:
    """The prefill line, e.g. ``prefill: compute bound — each prompt token costs 2 × 135M params = 0.27
    GFLOP; 512 tok at 300 tok/s = 81 GFLOP/s, 6.2× the decode rate (a batch reads the weights once)``.

    Uses ``model.info.n_params``; ``metrics.prefill_tokens``, ``prefill_ms``, ``prefill_tokens_per_s``,
    ``cached_tokens``, ``prompt_tokens`` and ``decode_tokens_per_s``.
    """
    if metrics.prefill_tokens is None or metrics.prefill_ms is None:
        return "prefill: not reported by the server — the client's TTFT includes it with network and queueing"
    cached = metrics.cached_tokens
    cached_note = f"; {cached} of {metrics.prompt_tokens} prompt tokens reused from the KV cache" if cached else ""
    if metrics.prefill_tokens == 0:
        return f"prefill: nothing to compute — all {metrics.prompt_tokens} prompt tokens were reused from the KV cache"
    tps = metrics.prefill_tokens_per_s
    if tps is None or metrics.prefill_tokens < SMALL_PREFILL_TOKENS:
        return (
            f"prefill: overhead bound — only {fmt_count(metrics.prefill_tokens, 'new token')} in "
            f"{metrics.prefill_ms:.1f} ms, too few to fill a batch{cached_note}"
        )
    if not model.info.n_params:
        return f"prefill: {metrics.prefill_tokens} tok at {tps:.0f} tok/s (parameter count not reported){cached_note}"
    flops_per_token = step_flops(model.info.n_params)
    effective = tps * flops_per_token
    speedup = ""
    if metrics.decode_tokens_per_s:
        speedup = f", {tps / metrics.decode_tokens_per_s:.1f}× the decode rate (a batch reads the weights once)"
    return (
        f"prefill: compute bound — each prompt token costs 2 × {fmt_params(model.info.n_params)} params = "
        f"{flops_per_token / 1e9:.2g} GFLOP; {metrics.prefill_tokens} tok at {tps:.0f} tok/s = "
        f"{effective / 1e9:.0f} GFLOP/s{speedup}{cached_note}"
    )


def _duration(ms: float | None) -> str:
    if ms is None or ms >= 1000:
        return fmt_seconds(None if ms is None else ms / 1000)
    return f"{ms:.0f} ms"


def explain_thinking(metrics: TurnMetrics) -> str | None:
    """The thinking line of a reasoning model's turn (``None`` for a turn without a thinking block), e.g.
    ``thinking: 312 of 420 generated tokens (74%), 4.1 s before the first answer token (TTFA 4.2 s; TTFT
    41 ms)``; a reply that ended inside the block says it was cut short and by what."""
    if not metrics.thought:
        return None
    thinking, generated = metrics.thinking_tokens, metrics.decode_tokens or 0
    if thinking is None:  # a remote server that does not count thinking
        tokens = "a thinking block (the server did not count its tokens)"
    else:
        share = f" ({100 * thinking / generated:.0f}%)" if generated else ""
        tokens = f"{thinking:,} of {generated:,} generated tokens{share}"
    spent = _duration(metrics.thinking_ms)
    if metrics.thinking_cut_short:
        stop = fmt_stop_reason(metrics.stop_reason)
        return f"thinking: {tokens} in {spent}, cut short (stop: {stop}) — the reply ended before an answer"
    return (
        f"thinking: {tokens}, {spent} before the first answer token "
        f"(TTFA {_duration(metrics.ttfa_ms)}; TTFT {_duration(metrics.ttft_ms)})"
    )


def explain_turn(model: LoadedModel, metrics: TurnMetrics) -> tuple[str, ...]:
    """``(prefill line, decode line)`` for one turn, and the thinking line when it had a thinking block."""
    thinking = explain_thinking(metrics)
    lines = (explain_prefill(model, metrics), explain_decode(model, metrics))
    return lines if thinking is None else (*lines, thinking)
