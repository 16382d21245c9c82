"""KV bytes per token from GGUF metadata (docs/metrics.md)."""

import pytest

from chatphase.models.kv import attention_shape, kv_bytes_per_token, kv_capacity_bytes, kv_cells

SMOLLM2 = {
    "llama.block_count": 30,
    "llama.embedding_length": 576,
    "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3,
}


def test_smollm2_f16_is_23040_bytes_per_token():
    assert kv_bytes_per_token(attention_shape(SMOLLM2, "llama")) == 23_040


def test_quantised_cache_types_use_block_sizes():
    shape = attention_shape(SMOLLM2, "llama")
    # q8_0: 34 bytes per 32 elements; 30 layers x 3 heads x 64 dims x 2 (K and V) = 11,520 elements
    assert kv_bytes_per_token(shape, "q8_0", "q8_0") == 11_520 * 34 // 32
    assert kv_bytes_per_token(shape, "q4_0", "f16") == 5_760 * 18 // 32 + 5_760 * 2


def test_per_layer_heads_and_explicit_head_dims():
    meta = {
        "gemma.block_count": 2,
        "gemma.embedding_length": 2048,
        "gemma.attention.head_count": 8,
        "gemma.attention.head_count_kv": [1, 4],
        "gemma.attention.key_length": 256,
        "gemma.attention.value_length": 128,
    }
    shape = attention_shape(meta, "gemma")
    assert kv_bytes_per_token(shape) == (1 + 4) * (256 + 128) * 2


def test_recurrent_model_has_no_per_token_cache():
    meta = {**SMOLLM2, "llama.attention.head_count_kv": 0}
    with pytest.raises(ValueError):
        attention_shape(meta, "llama")


def test_unknown_cache_type():
    with pytest.raises(ValueError, match="unknown KV cache type"):
        kv_bytes_per_token(attention_shape(SMOLLM2, "llama"), "q3_k")


def test_cells_padded_to_256():
    assert kv_cells(1000) == 1024 and kv_cells(4096) == 4096 and kv_cells(1) == 256
    assert kv_capacity_bytes(23_040, 2048) == 47_185_920  # llama.cpp prints 45.00 MiB
