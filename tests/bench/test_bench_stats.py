"""The sweep's fits, the roofline's formulas and the peak measurements against hand-computed values."""

from __future__ import annotations

import pytest
from test_bench_results import make_cell

from chatphase.bench.core.fits import sweep_fits
from chatphase.bench.core.peaks import MachinePeaks, measure_bandwidth, measure_matmul_flops
from chatphase.bench.core.results import Sample
from chatphase.bench.core.roofline import BOUND_PCT, build_roofline, verdict
from chatphase.models.roofline import decode_bound_tokens_per_s, prefill_bound_tokens_per_s


def _sample(kind, prompt_tokens, depth, ttft, dtps, tpot, warm=False):
    return Sample(
        kind, prompt_tokens, depth, 0, warm, ttft, 100.0, dtps, tpot, prompt_tokens - depth, depth, 8, 0, "length"
    )


def test_sweep_fits_use_the_right_samples():
    samples = [
        _sample("prompt", 100, 0, 25.0, 50, 20),
        _sample("prompt", 200, 0, 45.0, 50, 20),
        _sample("prompt", 300, 0, 999.0, 50, 20, warm=True),  # warm-up: ignored
        _sample("depth", 4, 0, 6.0, 50.0, 20.0),
        _sample("depth", 1004, 1000, 7.0, 40.0, 25.0),
    ]
    fits = sweep_fits(samples)
    t = fits["ttft_ms_vs_prompt_tokens"]
    assert t["intercept"] == pytest.approx(5) and t["slope"] == pytest.approx(0.2) and t["n"] == 2
    d = fits["decode_tokens_per_s_vs_depth"]
    assert d["intercept"] == pytest.approx(50) and d["slope"] == pytest.approx(-0.01)
    assert fits["tpot_ms_vs_depth"]["slope"] == pytest.approx(0.005)
    assert sweep_fits([])["ttft_ms_vs_prompt_tokens"] is None


def test_roofline_bounds_by_hand():
    # 10 GB/s over (100 MB weights + 1000 B × 1000 tokens) = 1e10 / 1.01e8
    assert decode_bound_tokens_per_s(10e9, 100_000_000, 1000, 1000) == pytest.approx(99.00990099)
    assert prefill_bound_tokens_per_s(1e11, 100_000_000) == pytest.approx(500)


def test_build_roofline_percentages_and_verdicts():
    peaks = MachinePeaks(10e9, "copy", 1e11, "matmul")
    cell = make_cell("prompt", 96, 0, gen=8, ttft=[10.0], prefill=[250.0], decode=[20.0])
    r = build_roofline(
        peaks, weight_bytes=100_000_000, n_params=100_000_000, kv_bytes_per_token=1000, cells=[cell], weight_type="F32"
    )
    row = r["cells"][0]
    # context during decode = 96 + 8/2 = 100 tokens -> bound 1e10 / (1e8 + 1e5)
    assert row["decode_bound_tokens_per_s"] == pytest.approx(1e10 / 100_100_000)
    assert row["decode_pct_of_bound"] == pytest.approx(100 * 20.0 / (1e10 / 100_100_000))
    assert row["prefill_pct_of_bound"] == pytest.approx(50.0)
    assert "too small for the bound to bind" in r["decode_verdict"]  # 20 % < OVERHEAD_PCT
    assert "near the boundary" in r["prefill_verdict"]  # exactly 50 %: between OVERHEAD_PCT and BOUND_PCT
    assert r["bandwidth_method"] == "copy"


def test_the_prefill_bound_counts_the_parameters_a_prompt_token_multiplies(default_model_info):
    """The token embedding is a row lookup and the output matrix runs for the last token only: SmolLM2-135M's
    tied 49,152 × 576 matrix is 28 M of its 135 M parameters, so 2 × n_params put its prefill bound 27 % low."""
    from dataclasses import replace

    from chatphase.models.roofline import prefill_params

    info = default_model_info
    matrix = info.n_vocab * info.n_embd
    assert info.embedding_bytes == 0 and prefill_params(info) == info.n_params - matrix  # tied: one matrix
    assert prefill_params(replace(info, embedding_bytes=1)) == info.n_params - 2 * matrix  # untied: two
    assert prefill_params(replace(info, n_vocab=None)) is None
    peaks = MachinePeaks(10e9, "copy", 1e11, "matmul")
    cell = make_cell("prompt", 96, 0, gen=8, ttft=[10.0], prefill=[250.0], decode=[20.0])
    both = dict(
        weight_bytes=100_000_000, n_params=100_000_000, kv_bytes_per_token=1000, cells=[cell], weight_type="F32"
    )
    r = build_roofline(peaks, **both, prefill_params=80_000_000)
    assert r["prefill_bound_tokens_per_s"] == pytest.approx(1e11 / 1.6e8) and r["prefill_params"] == 80_000_000
    assert build_roofline(peaks, **both)["prefill_params"] == 100_000_000  # the shape unknown: n_params


def test_verdict_wording():
    assert "measured above the bound (1.30×): the peak read bandwidth measured here read low" in verdict(
        "decode", 130.0
    )
    assert "130%" not in verdict("decode", 130.0)
    assert "bound by memory bandwidth" in verdict("decode", BOUND_PCT + 1)
    assert "not measured" in verdict("prefill", None)


def test_peak_measurements_return_positive_rates_and_name_their_method():
    for kind in ("read", "copy"):
        passes, method = measure_bandwidth(kind, array_bytes=4 * 2**20, threads=2, max_s=0.2)
        assert passes.best > 0 and "2 thread" in method and "passes, spread" in method
        assert len(passes.rates) >= 5 and passes.spread()["min"] <= passes.spread()["median"] <= passes.best
    assert "STREAM-style Copy" in measure_bandwidth("copy", array_bytes=2**20, max_s=0.1)[1]
    flops, fmethod = measure_matmul_flops(n=64, threads=1, max_s=0.2)
    assert flops.best > 0 and "matmul" in fmethod and "BLAS on 1 thread" in fmethod
    with pytest.raises(ValueError):
        measure_bandwidth(threads=0)
    with pytest.raises(ValueError):
        measure_bandwidth("triad")
