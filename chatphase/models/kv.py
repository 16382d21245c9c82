"""KV-cache size from GGUF metadata (``docs/metrics.md``).

Bytes per token = Σ over layers of ``n_head_kv × head_dim_k × bytes(type_k) + n_head_kv × head_dim_v × bytes(type_v)``,
where ``head_dim`` defaults to ``embedding_length / head_count`` unless ``{arch}.attention.key_length`` /
``value_length`` are given, and ``n_head_kv`` may be one number or one per layer. Element sizes follow ggml's
block layouts (``ggml.c`` type traits): f32 = 4, f16/bf16 = 2, q8_0 = 34/32, q5_1 = 24/32, q5_0 = 22/32,
q4_1 = 20/32, q4_0 = 18/32, iq4_nl = 18/32 bytes per element.

llama.cpp allocates the cache for the context size rounded up to a multiple of 256 cells and prints it as
``llama_kv_cache: size = … MiB`` at context creation; :func:`kv_capacity_bytes` reproduces that figure.
Example: SmolLM2-135M (30 layers, 3 KV heads, head dim 64, f16) = 23,040 bytes per token.

Not modelled: sliding-window layers with a smaller cache (Gemma 2/3) and recurrent-state models (Mamba,
RWKV), whose memory is not per token; :func:`kv_bytes_per_token` raises ``ValueError`` for the latter.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

#: bytes per element of each KV cache type llama.cpp accepts for ``type_k`` / ``type_v``.
KV_TYPE_BYTES: dict[str, Fraction] = {
    "f32": Fraction(4),
    "f16": Fraction(2),
    "bf16": Fraction(2),
    "q8_0": Fraction(34, 32),
    "q5_1": Fraction(24, 32),
    "q5_0": Fraction(22, 32),
    "q4_1": Fraction(20, 32),
    "q4_0": Fraction(18, 32),
    "iq4_nl": Fraction(18, 32),
}

#: llama.cpp rounds the number of KV cells up to a multiple of this.
KV_CELL_PAD = 256


@dataclass(frozen=True)
class AttentionShape:
    """The attention geometry the KV formula needs, as read from GGUF metadata.

    ``n_head_kv`` holds one entry per layer (a scalar in the file is repeated ``n_layer`` times); ``n_head``
    the query heads (attention's arithmetic, :func:`chatphase.models.roofline.attention_flops_per_context_token`;
    0 where unknown).
    """

    n_layer: int
    n_head_kv: tuple[int, ...]
    head_dim_k: int
    head_dim_v: int
    n_head: int = 0


def attention_shape(metadata: dict[str, Any], architecture: str) -> AttentionShape:
    """Read :class:`AttentionShape` from a GGUF key/value dict (``{arch}.block_count`` etc.).

    Raises:
        ValueError: when a required key is missing or the model has no attention KV cache.
    """
    a = architecture

    def get(key: str, default: object = None) -> Any:
        value = metadata.get(f"{a}.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata has no {a}.{key}")
        return value

    n_layer = int(get("block_count"))
    n_embd = int(get("embedding_length"))
    n_head_raw = get("attention.head_count")
    n_head = _first_nonzero(n_head_raw)
    n_head_kv_raw = metadata.get(f"{a}.attention.head_count_kv", n_head_raw)
    if isinstance(n_head_kv_raw, (list, tuple)):
        n_head_kv = tuple(int(x) for x in n_head_kv_raw)
        if len(n_head_kv) != n_layer:
            raise ValueError(f"{a}.attention.head_count_kv has {len(n_head_kv)} entries for {n_layer} layers")
    else:
        n_head_kv = (int(n_head_kv_raw),) * n_layer
    if not any(n_head_kv):
        raise ValueError(f"{a} has no attention KV heads (a recurrent model); its state is not per token")
    head_dim = n_embd // n_head
    head_dim_k = int(metadata.get(f"{a}.attention.key_length", head_dim))
    head_dim_v = int(metadata.get(f"{a}.attention.value_length", head_dim))
    return AttentionShape(n_layer, n_head_kv, head_dim_k, head_dim_v, n_head)


def _first_nonzero(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        value = next((v for v in value if v), 0)
    count = int(value)
    if count <= 0:
        raise ValueError("attention.head_count must be positive")
    return count


def kv_bytes_per_token(shape: AttentionShape, type_k: str = "f16", type_v: str = "f16") -> int:
    """KV-cache bytes one token occupies across all layers (an integer; see the module docstring).

    Raises:
        ValueError: for a cache type not in :data:`KV_TYPE_BYTES`.
    """
    bytes_k, bytes_v = _type_bytes(type_k), _type_bytes(type_v)
    total = sum(h * shape.head_dim_k * bytes_k + h * shape.head_dim_v * bytes_v for h in shape.n_head_kv)
    return int(total)  # block types give whole bytes per row for every real head size


def kv_cells(n_ctx: int) -> int:
    """KV cells llama.cpp allocates for ``n_ctx``: rounded up to a multiple of :data:`KV_CELL_PAD`."""
    if n_ctx <= 0:
        raise ValueError("n_ctx must be positive")
    return -(-n_ctx // KV_CELL_PAD) * KV_CELL_PAD


def kv_capacity_bytes(per_token_bytes: int, n_ctx: int) -> int:
    """Bytes allocated for the whole cache of a context of ``n_ctx`` tokens (padded as llama.cpp does)."""
    return per_token_bytes * kv_cells(n_ctx)


def _type_bytes(name: str) -> Fraction:
    try:
        return KV_TYPE_BYTES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown KV cache type {name!r}; choose one of {', '.join(KV_TYPE_BYTES)}") from None
