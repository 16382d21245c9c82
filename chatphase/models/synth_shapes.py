"""The shapes of popular models, for synthetic GGUFs of the real size (:mod:`chatphase.models.synth`).

Each :class:`ModelShape` holds the hyper-parameters of a published model's text decoder (from its
``config.json`` on the Hugging Face Hub) and the parameter count its authors publish, which
``tests/models/test_synth.py`` checks :meth:`ModelShape.n_params` against (within 1 %). :func:`tensor_plan`
lists the GGUF tensors llama.cpp's loader expects for the architecture (``src/models/<arch>.cpp`` in
llama.cpp: ``load_arch_tensors``), each with the ggml type llama.cpp's own quantiser would give it
(:func:`tensor_type`, after ``llama_tensor_get_type`` in ``src/llama-quant.cpp``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: file types a synthetic model can be written in (``QUANT`` of ``chatphase models synth SHAPE:QUANT``).
QUANTS = ("Q4_0", "Q8_0", "Q4_K_M")


@dataclass(frozen=True)
class ModelShape:
    """A model's decoder geometry. ``n_ff`` is the feed-forward width, ``head_dim`` the K and V head size,
    ``tied`` whether the output matrix is the token embedding; ``published_params`` the count its
    authors give (``params_source`` says where), ``extra`` more GGUF metadata (``{arch}.`` prefixed)."""

    key: str
    name: str
    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    tied: bool
    n_ctx_train: int
    rope_freq_base: float
    rms_eps: float
    published_params: int
    params_source: str
    extra: dict[str, Any] = field(default_factory=dict)
    listed: bool = True

    @property
    def qk_norm(self) -> bool:
        """Whether each layer has per-head Q and K RMS norms (Qwen3, Qwen3 MoE, Gemma 3)."""
        return self.architecture in ("qwen3", "qwen3moe", "gemma3")

    @property
    def n_expert(self) -> int:
        """Experts per layer of a mixture-of-experts shape (``extra["expert_count"]``), 0 for a dense one."""
        return int(self.extra.get("expert_count", 0))

    def n_params(self) -> int:
        """Elements of all tensors of :func:`tensor_plan` (what :attr:`ModelInfo.n_params` counts)."""
        return sum(t.n_elements for t in tensor_plan(self, "Q8_0"))


_LLAMA3: dict[str, Any] = dict(
    architecture="llama", n_vocab=128256, n_ctx_train=131072, rope_freq_base=500000.0, rms_eps=1e-5
)
_QWEN3: dict[str, Any] = dict(
    architecture="qwen3", n_vocab=151936, n_ctx_train=40960, rope_freq_base=1000000.0, rms_eps=1e-6, head_dim=128
)
_QWEN3MOE: dict[str, Any] = dict(
    architecture="qwen3moe", n_vocab=151936, n_ctx_train=40960, rope_freq_base=1000000.0, rms_eps=1e-6, head_dim=128
)
_GEMMA3: dict[str, Any] = dict(
    architecture="gemma3",
    rope_freq_base=1000000.0,
    rms_eps=1e-6,
    head_dim=256,
    tied=True,
    extra={"attention.sliding_window": 512, "rope.freq_base_swa": 10000.0},
)
_QWEN3_CARD = "Qwen3 model card (huggingface.co/Qwen/{0}): 'Number of Parameters: {1}'"
_GEMMA3_REPORT = "Gemma 3 Technical Report (arXiv:2503.19786), Table 1: {0} embedding + {1} non-embedding (text only)"
_HF_COUNT = "safetensors parameter count of huggingface.co/{0}"

SHAPES: dict[str, ModelShape] = {
    s.key: s
    for s in (
        ModelShape(
            "llama-3.2-1b", "Llama-3.2-1B", n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192,
            tied=True, published_params=1_235_814_400, params_source=_HF_COUNT.format("meta-llama/Llama-3.2-1B"),
            **_LLAMA3,
        ),
        ModelShape(
            "llama-3.2-3b", "Llama-3.2-3B", n_layer=28, n_embd=3072, n_head=24, n_head_kv=8, head_dim=128, n_ff=8192,
            tied=True, published_params=3_212_749_824, params_source=_HF_COUNT.format("meta-llama/Llama-3.2-3B"),
            **_LLAMA3,
        ),
        ModelShape(
            "llama-3.1-8b", "Llama-3.1-8B", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336,
            tied=False, published_params=8_030_261_248, params_source=_HF_COUNT.format("meta-llama/Llama-3.1-8B"),
            **_LLAMA3,
        ),
        ModelShape(
            "qwen3-0.6b", "Qwen3-0.6B", n_layer=28, n_embd=1024, n_head=16, n_head_kv=8, n_ff=3072, tied=True,
            published_params=600_000_000, params_source=_QWEN3_CARD.format("Qwen3-0.6B", "0.6B"), **_QWEN3,
        ),
        ModelShape(
            "qwen3-4b", "Qwen3-4B", n_layer=36, n_embd=2560, n_head=32, n_head_kv=8, n_ff=9728, tied=True,
            published_params=4_000_000_000, params_source=_QWEN3_CARD.format("Qwen3-4B", "4.0B"), **_QWEN3,
        ),
        ModelShape(
            "qwen3-8b", "Qwen3-8B", n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, n_ff=12288, tied=False,
            published_params=8_200_000_000, params_source=_QWEN3_CARD.format("Qwen3-8B", "8.2B"), **_QWEN3,
        ),
        ModelShape(  # a mixture of experts: 128 experts of width 768 a layer, 8 used a token
            "qwen3-30b-a3b", "Qwen3-30B-A3B", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, n_ff=6144, tied=False,
            published_params=30_500_000_000, params_source=_QWEN3_CARD.format("Qwen3-30B-A3B", "30.5B"),
            extra={"expert_count": 128, "expert_used_count": 8, "expert_feed_forward_length": 768}, **_QWEN3MOE,
        ),
        ModelShape(
            "gemma-3-1b", "Gemma-3-1B", n_layer=26, n_embd=1152, n_head=4, n_head_kv=1, n_ff=6912, n_vocab=262144,
            n_ctx_train=32768, published_params=1_000_000_000, params_source=_GEMMA3_REPORT.format("302M", "698M"),
            **_GEMMA3,
        ),
        ModelShape(
            "gemma-3-4b", "Gemma-3-4B", n_layer=34, n_embd=2560, n_head=8, n_head_kv=4, n_ff=10240, n_vocab=262208,
            n_ctx_train=131072, published_params=3_884_000_000, params_source=_GEMMA3_REPORT.format("675M", "3,209M"),
            **_GEMMA3,
        ),
        ModelShape(
            "mistral-7b", "Mistral-7B-v0.3", architecture="llama", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8,
            head_dim=128, n_ff=14336, n_vocab=32768, tied=False, n_ctx_train=32768, rope_freq_base=1000000.0,
            rms_eps=1e-5, published_params=7_248_023_552,
            params_source=_HF_COUNT.format("mistralai/Mistral-7B-v0.3"),
        ),
        # tiny shapes of each architecture, for tests: every tensor row a multiple of 256 (Q4_K's block)
        *(
            ModelShape(
                f"tiny-{arch}", f"tiny-{arch}", architecture=arch, n_layer=2, n_embd=256, n_head=4, n_head_kv=2,
                head_dim=64, n_ff=512, n_vocab=2048, tied=arch != "llama", n_ctx_train=4096, rope_freq_base=10000.0,
                rms_eps=1e-6, published_params=0, params_source="(a test shape)",
                extra=_GEMMA3["extra"] if arch == "gemma3" else {}, listed=False,
            )
            for arch in ("llama", "qwen3", "gemma3")
        ),
        ModelShape(
            "tiny-qwen3moe", "tiny-qwen3moe", architecture="qwen3moe", n_layer=2, n_embd=256, n_head=4, n_head_kv=2,
            head_dim=64, n_ff=512, n_vocab=2048, tied=True, n_ctx_train=4096, rope_freq_base=10000.0, rms_eps=1e-6,
            published_params=0, params_source="(a test shape)", listed=False,
            extra={"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 256},
        ),
    )
}  # fmt: skip


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor to write: GGUF ``name``, ``shape`` in ggml order (``ne[0]`` = row length first), its ggml
    type name (``F32``, ``Q4_0``, ...), and ``role`` (``token_embd``, ``output``, ``attn_v``, ``ffn_down``,
    ``norm``, ``weight``)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: str
    role: str

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


#: ggml block size (elements) of each type a synthetic model uses.
BLOCK_ELEMENTS = {"F32": 1, "Q4_0": 32, "Q5_0": 32, "Q8_0": 32, "Q4_K": 256, "Q6_K": 256}
#: llama.cpp's fallback when a row is not a multiple of the type's block (``tensor_type_fallback``).
_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}


def _use_more_bits(i_layer: int, n_layer: int) -> bool:
    """llama.cpp's ``use_more_bits``: the layers Q4_K_M gives Q6_K for ``attn_v`` and ``ffn_down``."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def tensor_type(quant: str, role: str, row: int, i_layer: int, n_layer: int) -> str:
    """The ggml type llama.cpp's quantiser gives a tensor of ``role`` with rows of ``row`` elements in
    layer ``i_layer`` of ``n_layer``, for file type ``quant`` (one of :data:`QUANTS`).

    Raises:
        ValueError: an unknown ``quant``.
    """
    if quant not in QUANTS:
        raise ValueError(f"unknown quantisation {quant!r}: choose one of {', '.join(QUANTS)}")
    if role == "norm":
        return "F32"
    base = {"Q4_0": "Q4_0", "Q8_0": "Q8_0", "Q4_K_M": "Q4_K"}[quant]
    if role == "output":  # the output matrix (or the tied embedding) gets more bits
        ggml = "Q8_0" if base == "Q8_0" or row % BLOCK_ELEMENTS[base] else "Q6_K"
    elif quant == "Q4_K_M" and role in ("attn_v", "ffn_down") and _use_more_bits(i_layer, n_layer):
        ggml = "Q6_K"
    else:
        ggml = base
    if row % BLOCK_ELEMENTS[ggml]:
        ggml = _FALLBACK.get(ggml, ggml)
    return ggml


def tensor_plan(shape: ModelShape, quant: str) -> list[PlannedTensor]:
    """Every tensor of ``shape``'s GGUF in file order, typed for ``quant`` (:func:`tensor_type`).

    Raises:
        ValueError: an unknown ``quant``.
    """
    e, ff, nl = shape.n_embd, shape.n_ff, shape.n_layer
    q_out, kv_out = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    out: list[PlannedTensor] = []

    def add(name: str, dims: tuple[int, ...], role: str, i_layer: int = 0) -> None:
        out.append(PlannedTensor(name, dims, tensor_type(quant, role, dims[0], i_layer, nl), role))

    add("token_embd.weight", (e, shape.n_vocab), "output" if shape.tied else "token_embd")
    for i in range(nl):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", (e,), "norm")
        add(b + "attn_q.weight", (e, q_out), "weight", i)
        add(b + "attn_k.weight", (e, kv_out), "weight", i)
        add(b + "attn_v.weight", (e, kv_out), "attn_v", i)
        add(b + "attn_output.weight", (q_out, e), "weight", i)
        if shape.qk_norm:
            add(b + "attn_q_norm.weight", (shape.head_dim,), "norm")
            add(b + "attn_k_norm.weight", (shape.head_dim,), "norm")
        if shape.architecture == "gemma3":
            add(b + "post_attention_norm.weight", (e,), "norm")
            add(b + "post_ffw_norm.weight", (e,), "norm")
        add(b + "ffn_norm.weight", (e,), "norm")
        if shape.n_expert:  # llama.cpp's qwen3moe: a router (kept in F32 by its quantiser) and stacked experts
            n_x, ff_x = shape.n_expert, int(shape.extra["expert_feed_forward_length"])
            add(b + "ffn_gate_inp.weight", (e, n_x), "norm")
            add(b + "ffn_gate_exps.weight", (e, ff_x, n_x), "weight", i)
            add(b + "ffn_up_exps.weight", (e, ff_x, n_x), "weight", i)
            add(b + "ffn_down_exps.weight", (ff_x, e, n_x), "ffn_down", i)
            continue
        add(b + "ffn_gate.weight", (e, ff), "weight", i)
        add(b + "ffn_up.weight", (e, ff), "weight", i)
        add(b + "ffn_down.weight", (ff, e), "ffn_down", i)
    add("output_norm.weight", (e,), "norm")
    if not shape.tied:
        add("output.weight", (e, shape.n_vocab), "output")
    return out


def parse_spec(spec: str) -> tuple[ModelShape, str]:
    """``SHAPE[:QUANT]`` (case-insensitive; QUANT defaults to Q4_0) as ``(shape, quant)``.

    Raises:
        ValueError: an unknown shape or quantisation (the message lists the choices).
    """
    key, _, quant = spec.strip().partition(":")
    shape = SHAPES.get(key.lower())
    if shape is None:
        names = ", ".join(k for k, s in SHAPES.items() if s.listed)
        raise ValueError(f"unknown model shape {key!r}: choose one of {names}")
    quant = (quant or "Q4_0").upper()
    if quant not in QUANTS:
        raise ValueError(f"unknown quantisation {quant!r}: choose one of {', '.join(QUANTS)}")
    return shape, quant
