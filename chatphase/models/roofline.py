"""The roofline's bytes and FLOPs of one model: what a token reads and computes, and the bounds they set.

The roofline model (Williams, Waterman & Patterson 2009) as applied to LLM inference in ``docs/metrics.md``:

- decode: every generated token reads the weights and the KV cache of its context once, so
  ``decode tokens/s <= bandwidth / (weight_bytes + kv_bytes_per_token × context_tokens)``;
- prefill: a forward pass costs about ``2 × n_params`` FLOPs per token (one multiply-add per weight), so
  ``prefill tokens/s <= FLOP/s / (2 × n_params)``.

``weight_bytes`` is what one token reads of the weights (:func:`weight_bytes_per_token`). Used by the
bench's roofline (:mod:`chatphase.bench.roofline`) and the per-turn explanation (:mod:`chatphase.explain`).
"""

from __future__ import annotations

from chatphase.models.gguf_meta import ModelInfo


def weight_bytes_per_token(info: ModelInfo) -> int | None:
    """Bytes of weights one token reads: ``info.size_bytes`` (the GGUF file: tensor data plus a small header,
    an upper estimate) less ``info.embedding_bytes`` (an untied token embedding, looked up one row at a time; a
    tied one is the output matrix, read whole). ``None`` when the size is unknown (a remote server's model)."""
    return None if info.size_bytes is None else info.size_bytes - info.embedding_bytes


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
