"""explain.py: the plain-language line per phase carries this model's and this turn's numbers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from dashboard_support import INFO, TURNS, loaded_model, scripted_turn

from chatphase.explain import (
    CPU_REFERENCE_BANDWIDTH,
    explain_decode,
    explain_prefill,
    explain_thinking,
    explain_turn,
)
from chatphase.models.roofline import weight_bytes_per_token
from chatphase.units import fmt_bytes


def test_decode_tiny_model_on_cpu_is_overhead_bound():
    m = TURNS[2]  # 44.4 tok/s, 540 KV tokens x 23,040 B = 11.9 MiB; weights 98e6 B = 93.5 MiB
    line = explain_decode(loaded_model(), m)
    effective = m.decode_tokens_per_s * (98_000_000 + m.kv_cache_bytes)
    assert line.startswith("decode: per-token overhead bound")
    assert "re-reads 93.5 MiB of weights + 11.9 MiB of KV" in line
    assert f"{m.decode_tokens_per_s:.1f} tok/s moves only {fmt_bytes(effective)}/s" in line
    assert fmt_bytes(effective) == "4.6 GiB"
    assert "~47.7 GiB/s memory bandwidth" in line  # 51.2e9 B/s


def test_decode_counts_the_weight_bytes_the_roofline_does():
    """An untied token embedding is read one row a token: the line counts what the bench's roofline counts."""
    model = replace(loaded_model(), info=replace(INFO, embedding_bytes=10_000_000))
    assert weight_bytes_per_token(model.info) == 88_000_000
    assert "re-reads 83.9 MiB of weights" in explain_decode(model, TURNS[2])  # 98e6 - 10e6 B


def test_decode_fast_enough_is_bandwidth_bound_with_roofline():
    m = scripted_turn(100, 0, 200, 300, itl_ms=0.5)  # 2,000 tok/s x 105 MB = 210 GB/s > 25 % of 51.2 GB/s
    line = explain_decode(loaded_model(), m)
    per_token = 98_000_000 + 300 * 23_040
    assert line.startswith("decode: memory-bandwidth bound")
    assert "2000.0 tok/s" in line
    assert f"roofline ~{CPU_REFERENCE_BANDWIDTH / per_token:.0f} tok/s at 47.7 GiB/s" in line


def test_decode_uses_gpu_reference_when_all_layers_offloaded():
    m = scripted_turn(100, 0, 200, 300, itl_ms=0.5)
    assert "at 419.1 GiB/s" in explain_decode(loaded_model(gpu=True), m)  # 450e9 B/s
    assert "of ~838.2 GiB/s memory bandwidth" in explain_decode(loaded_model(), m, reference_bandwidth=900e9)


def test_decode_with_one_token_has_no_rate():
    m = scripted_turn(100, 0, 1, 101)
    assert explain_decode(loaded_model(), m) == "decode: 1 token — too few to measure a decode rate"


def test_prefill_compute_bound_line_with_cache_and_batch_speedup():
    m = TURNS[2]  # 71 new tokens at 320 tok/s, 409 of 480 cached, decode 44.4 tok/s
    line = explain_prefill(loaded_model(), m)
    assert line.startswith("prefill: compute bound")
    assert "2 × 135M params = 0.27 GFLOP" in line
    assert "71 tok at 320 tok/s" in line
    assert f"= {m.prefill_tokens_per_s * 2 * 134_515_008 / 1e9:.0f} GFLOP/s" in line
    assert f"{m.prefill_tokens_per_s / m.decode_tokens_per_s:.1f}× the decode rate" in line
    assert "409 of 480 prompt tokens reused from the KV cache" in line


def test_prefill_all_cached_and_tiny_prefill():
    all_cached = scripted_turn(300, 300, 10, 310)
    assert explain_prefill(loaded_model(), all_cached) == (
        "prefill: nothing to compute — all 300 prompt tokens were reused from the KV cache"
    )
    tiny = scripted_turn(305, 300, 10, 315)
    line = explain_prefill(loaded_model(), tiny)
    assert line.startswith("prefill: overhead bound — only 5 new tokens in")
    assert "300 of 305 prompt tokens reused" in line


def test_explain_turn_pairs_both_lines():
    prefill, decode = explain_turn(loaded_model(), TURNS[0])
    assert prefill.startswith("prefill:") and decode.startswith("decode:")


def test_thinking_says_what_it_cost_this_turn():
    m = scripted_turn(120, 0, 420, 540, thinking_tokens=312, itl_ms=13.2)  # the block ends at token 312
    line = explain_thinking(m)
    assert line == (
        f"thinking: 312 of 420 generated tokens (74%), {m.thinking_ms / 1000:.1f} s before the first answer token "
        f"(TTFA {m.ttfa_ms / 1000:.1f} s; TTFT {m.ttft_ms:.0f} ms)"
    )
    assert m.thinking_ms == pytest.approx(311 * 13.2, abs=0.01) and line.count("4.1 s") == 1
    assert explain_turn(loaded_model(), m)[2] == line


def test_thinking_cut_short_and_none_without_a_block():
    m = scripted_turn(120, 0, 300, 420, thinking_tokens=300, cut_short=True, stop_reason="length")
    assert explain_thinking(m) == (
        "thinking: 300 of 300 generated tokens (100%) in 6.0 s, cut short (stop: length) — the reply ended before an answer"
    )
    assert explain_thinking(TURNS[0]) is None and len(explain_turn(loaded_model(), TURNS[0])) == 2
