"""The roofline's bytes and FLOPs of one model: what a token reads and computes, and the bounds they set.

The roofline model (Williams, Waterman & Patterson 2009) as applied to LLM inference in ``docs/metrics.md``:

- decode: every generated token reads the weights once, then attention reads the KV cache of its context
  and does its arithmetic on it. llama.cpp runs a graph's ops one after another (a barrier between ops on
  a CPU), so the step's time is bounded by the sum of each op's own roofline (as LLM-Viewer does, Yuan et
  al. 2024, "LLM Inference Unveiled: Survey and Roofline Model Insights", arXiv:2402.16363):
  ``t ≥ weight_bytes / B + max(kv_bytes_per_token × c / B, attention_flops_per_context_token × c / F)``
  (:func:`decode_bound`). The weight matmuls' own arithmetic is left out of their term: decode multiplies
  quantised weights with integer dot products that a float32 matmul peak does not bound.
- prefill: a forward pass costs about ``2 × n_params`` FLOPs per token (one multiply-add per weight), so
  ``prefill tokens/s <= FLOP/s / (2 × n_params)``.

``weight_bytes`` is what one token reads of the weights (:func:`weight_bytes_per_token`). A measured rate
is judged against a bound by :func:`share_of_bound` (one place decides what "above the bound" means).
Used by the bench's roofline (:mod:`chatphase.bench.core.roofline`), the lever grid, what-if and the per-turn
explanation (:mod:`chatphase.explain`).
"""

from __future__ import annotations

from dataclasses import dataclass

from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.kv import AttentionShape


def weight_bytes_per_token(info: ModelInfo) -> int | None:
    """Bytes of weights one token reads: ``info.size_bytes`` (the GGUF file: tensor data plus a small header,
    an upper estimate) less ``info.embedding_bytes`` (an untied token embedding, looked up one row at a time; a
    tied one is the output matrix, read whole). ``None`` when the size is unknown (a remote server's model)."""
    return None if info.size_bytes is None else info.size_bytes - info.embedding_bytes


def attention_flops_per_context_token(shape: AttentionShape | None) -> int:
    """FLOPs one decoded token's attention costs per token of context: ``Σ layers 2 × n_head × (head_dim_k +
    head_dim_v)`` — the logits ``q·k`` and the weighted sum of ``v``, one multiply-add per element and query
    head (Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", Appendix F: attention
    logits and reduce, ``2 × context × key_size × heads`` each). With equal head sizes that is
    ``4 × n_layers × n_head × head_dim``. 0 when the shape or its query heads are unknown."""
    if shape is None or not shape.n_head:
        return 0
    return 2 * shape.n_layer * shape.n_head * (shape.head_dim_k + shape.head_dim_v)


def step_bytes(weight_bytes: int, kv_bytes_per_token: int, context_tokens: float, n_seq: int = 1) -> float:
    """Bytes one decode step reads: the weights once, plus each of ``n_seq`` sequences' KV cache of
    ``context_tokens`` tokens (``weight_bytes + n_seq × kv_bytes_per_token × context_tokens``)."""
    return weight_bytes + n_seq * kv_bytes_per_token * context_tokens


def step_flops(n_params: int, n_tokens: int = 1) -> float:
    """FLOPs of the weight matmuls over ``n_tokens`` tokens: ``2 × n_params × n_tokens`` (one multiply-add
    per weight and token; attention's own is :func:`attention_flops_per_context_token`)."""
    return 2.0 * n_params * n_tokens


@dataclass(frozen=True)
class DecodeBound:
    """The least time of one decode step, by term (seconds): ``weights_s`` (weight bytes / bandwidth),
    ``kv_read_s`` (the KV cache's bytes / bandwidth) and ``attention_compute_s`` (attention's FLOPs / peak
    FLOP/s; 0 where unknown). Attention is one op that both reads the cache and computes, so it takes the
    larger of its two; the weights' op comes before it (see the module doc)."""

    weights_s: float
    kv_read_s: float
    attention_compute_s: float

    @property
    def attention_s(self) -> float:
        return max(self.kv_read_s, self.attention_compute_s)

    @property
    def step_s(self) -> float:
        return self.weights_s + self.attention_s

    @property
    def tokens_per_s(self) -> float:
        return 1.0 / self.step_s

    @property
    def attention_bound_by(self) -> str:
        """``"arithmetic"`` when attention's FLOPs take longer than its bytes, else ``"memory bandwidth"``."""
        return "arithmetic" if self.attention_compute_s > self.kv_read_s else "memory bandwidth"


def decode_bound(
    bandwidth_bytes_per_s: float,
    weight_bytes: int,
    kv_bytes_per_token: int,
    context_tokens: float,
    flops_per_s: float | None = None,
    attention_flops_per_context: float = 0.0,
) -> DecodeBound:
    """The decode step's least time at ``context_tokens`` tokens of context (module doc): the weights'
    bytes, then attention's bytes or arithmetic, whichever takes longer (``flops_per_s`` ``None`` or
    ``attention_flops_per_context`` 0: bytes only, the plain bandwidth roofline)."""
    compute = 0.0
    if flops_per_s and attention_flops_per_context:
        compute = attention_flops_per_context * context_tokens / flops_per_s
    return DecodeBound(
        weights_s=weight_bytes / bandwidth_bytes_per_s,
        kv_read_s=kv_bytes_per_token * context_tokens / bandwidth_bytes_per_s,
        attention_compute_s=compute,
    )


def decode_bound_tokens_per_s(
    bandwidth_bytes_per_s: float,
    weight_bytes: int,
    kv_bytes_per_token: int,
    context_tokens: float,
    flops_per_s: float | None = None,
    attention_flops_per_context: float = 0.0,
) -> float:
    """Bound on decode tokens/s at ``context_tokens`` tokens of context: ``1 /`` :func:`decode_bound`'s step."""
    return decode_bound(
        bandwidth_bytes_per_s,
        weight_bytes,
        kv_bytes_per_token,
        context_tokens,
        flops_per_s,
        attention_flops_per_context,
    ).tokens_per_s


def prefill_bound_tokens_per_s(flops_per_s: float, n_params: int) -> float:
    """Compute bound on prefill tokens/s: ``flops_per_s / (2 × n_params)``, ``n_params`` the parameters a prompt
    token multiplies (:func:`prefill_params` where the model's shape is known)."""
    return flops_per_s / step_flops(n_params)


def prefill_params(info: ModelInfo) -> int | None:
    """The parameters each prompt token of a prefill multiplies: ``n_params`` less the embedding matrices (the
    token embedding is a row lookup, and the output matrix runs for the last token only, as llama.cpp computes
    logits for it alone; tied embeddings are one matrix). ``None`` when the parameter count or the embedding's
    shape is unknown. SmolLM2-135M: 106 M of 135 M."""
    if not info.n_params or not info.n_vocab or not info.n_embd:
        return None
    per_token = info.n_params - info.n_vocab * info.n_embd * (2 if info.embedding_bytes else 1)
    return per_token if per_token > 0 else None


def prefill_flops(info: ModelInfo, n_tokens: int) -> float | None:
    """The weight matmuls' FLOPs of a prefill of ``n_tokens`` tokens, counted low (a lower bound's numerator):
    ``2 × prefill_params × n_tokens`` (:func:`prefill_params`) plus the output matrix once. Attention's own FLOPs
    are left out (they run in the KV cache's type, which a weights' peak does not bound). ``None`` when the
    parameter count or the embedding's shape is unknown."""
    per_token = prefill_params(info)
    if per_token is None or not info.n_vocab or not info.n_embd:
        return None
    return step_flops(per_token, n_tokens) + step_flops(info.n_vocab * info.n_embd)


#: the weight types whose matmuls run in float32 arithmetic on a CPU, the kernel a float32 matmul peak measures
#: (:func:`chatphase.bench.core.peaks.measure_matmul_flops`). Quantised weights run integer dot products
#: (int8 with VNNI or AMX) and 16-bit ones may run BF16/FP16 instructions, both faster than float32: prefill
#: has been measured above a float32 peak's bound, which then bounds nothing.
FLOAT32_WEIGHT_TYPES = frozenset({"ALL_F32", "F32"})


def float32_peak_bounds(info: ModelInfo) -> bool:
    """Whether a float32 matmul peak bounds ``info``'s prefill: its weights are float32."""
    return float32_weight_type(info.quantization)


def float32_weight_type(quantization: str | None) -> bool:
    """:func:`float32_peak_bounds` for a weight type by name (``ModelInfo.quantization``, as a saved result
    records it); ``None`` (not recorded) is not float32."""
    return quantization in FLOAT32_WEIGHT_TYPES


def no_prefill_bound_text(quantization: str | None, what: str = "prefill") -> str:
    """The one line said where a bound on the weight matmuls' arithmetic (``what``: prefill, or a batched
    step's arithmetic) is left out (:func:`float32_weight_type` false)."""
    return (
        f"{what}: no bound for {quantization or 'unknown'} weights — their integer or 16-bit kernels are not "
        "bounded by the float32 matmul peak"
    )


#: what each phase's bound is made of, as :func:`share_of_bound` names it when a measurement beats it.
PEAK_OF_PHASE = {"decode": "read bandwidth", "prefill": "matmul FLOP/s"}


@dataclass(frozen=True)
class BoundShare:
    """A measured rate against its bound: ``fraction`` = measured / bound. A bound is never beaten, so a
    fraction above 1.0 is a measurement problem: the peak ``peak`` (e.g. ``"read bandwidth"``) was measured
    below what the machine reaches; :attr:`above` says so and :meth:`text` says it in words instead of a
    percentage above 100."""

    fraction: float
    peak: str

    @property
    def above(self) -> bool:
        return self.fraction > 1.0

    @property
    def clamped(self) -> float:
        """The fraction, at most 1.0 (what may be carried over to another machine)."""
        return min(self.fraction, 1.0)

    def text(self) -> str:
        """``"87% of the bound"``, or ``"measured above the bound (1.05×): the peak read bandwidth measured
        here read low"``."""
        if self.above:
            return f"measured above the bound ({self.fraction:.2f}×): the peak {self.peak} measured here read low"
        return f"{100 * self.fraction:.0f}% of the bound"


def share_of_bound(measured: float | None, bound: float | None, phase: str = "decode") -> BoundShare | None:
    """``measured`` rate against ``bound`` (same unit; rates, so higher is faster) for ``phase`` (a key of
    :data:`PEAK_OF_PHASE`, or the peak's own name); ``None`` when either is missing or the bound is 0."""
    if measured is None or not bound:
        return None
    return BoundShare(measured / bound, PEAK_OF_PHASE.get(phase, phase))
