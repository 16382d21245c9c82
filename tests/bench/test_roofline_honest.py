"""Honest roofline figures on faked peaks and measurements (no timing): a bound is never beaten (a measurement
above it is said in words, what-if never predicts above a device's bound), the read peak is the best of
several kernels and names the winner, the decode bound counts attention's work at depth, a lever that loses
says why, and the verdict does not flip between identical runs a few percent apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench_results import make_cell

from chatphase.bench.core import peaks as peaks_mod
from chatphase.bench.core.peaks import MachinePeaks, Repeated, measure_read
from chatphase.bench.core.results import SweepResult
from chatphase.bench.core.roofline import bound_class, build_roofline, verdict
from chatphase.bench.grid.levers import Prediction, bound_share, predict
from chatphase.bench.grid.result import GridCell, GridResult, grid_row, lever_lines
from chatphase.bench.parallel.roofline import parallel_verdict
from chatphase.bench.whatif import ModelFacts, efficiency_from, find_device, predict_decode
from chatphase.cli import main
from chatphase.commands.whatif import _ms
from chatphase.models.kv import AttentionShape, attention_shape
from chatphase.models.roofline import (
    attention_flops_per_context_token,
    decode_bound,
    decode_bound_tokens_per_s,
    share_of_bound,
)

#: Qwen3-0.6B's attention: 28 layers, 16 query heads, 8 KV heads, head size 128.
QWEN3_06B = AttentionShape(28, (8,) * 28, 128, 128, n_head=16)
PEAKS = MachinePeaks(10e9, "faked read", 1e11, "faked matmul", threads=2)


# --- the decode bound counts attention's work at depth ---------------------------------------------------


def test_attention_flops_by_hand_and_unknown_heads_count_nothing():
    # 2 × layers × heads × (head_dim_k + head_dim_v) = 4 × 28 × 16 × 128 per token of context
    assert attention_flops_per_context_token(QWEN3_06B) == 4 * 28 * 16 * 128 == 229_376
    assert attention_flops_per_context_token(AttentionShape(28, (8,) * 28, 128, 128)) == 0
    assert attention_flops_per_context_token(None) == 0
    meta = {"qwen3.block_count": 2, "qwen3.embedding_length": 64, "qwen3.attention.head_count": 4,
            "qwen3.attention.head_count_kv": 2}  # fmt: skip
    assert attention_shape(meta, "qwen3").n_head == 4


def test_decode_bound_is_the_weights_then_attentions_bytes_or_arithmetic_whichever_is_longer():
    # memory-bound attention: 1 GB of weights + 1000 B × 1000 tokens at 10 GB/s; 1e6 FLOPs at 1e11 FLOP/s
    b = decode_bound(10e9, 1_000_000_000, 1000, 1000, flops_per_s=1e11, attention_flops_per_context=1000)
    assert (b.weights_s, b.kv_read_s, b.attention_compute_s) == pytest.approx((0.1, 1e-4, 1e-5))
    assert b.step_s == pytest.approx(0.1001) and b.attention_bound_by == "memory bandwidth"
    # arithmetic-bound attention: 1e6 FLOPs per context token × 1000 tokens at 1e11 = 10 ms > 0.1 ms read
    b = decode_bound(10e9, 1_000_000_000, 1000, 1000, flops_per_s=1e11, attention_flops_per_context=1e6)
    assert b.step_s == pytest.approx(0.1 + 0.01) and b.attention_bound_by == "arithmetic"
    assert decode_bound_tokens_per_s(10e9, 1_000_000_000, 1000, 1000, 1e11, 1e6) == pytest.approx(1 / 0.11)
    # without FLOP/s it is the bandwidth roofline it always was
    assert decode_bound_tokens_per_s(10e9, 100_000_000, 1000, 1000) == pytest.approx(10e9 / 101_000_000)


def test_the_grid_prediction_counts_attention_at_depth():
    cell = make_cell("depth", 2052, 2048, gen=8, ttft=[10.0], prefill=[100.0], decode=[5.0])
    plain = predict(PEAKS, weight_bytes=300_000_000, n_params=600_000_000, kv_bytes_per_token=1000, cell=cell,
                    prefill_bounded=True)  # fmt: skip
    heavy = predict(PEAKS, weight_bytes=300_000_000, n_params=600_000_000, kv_bytes_per_token=1000, cell=cell,
                    attention_flops_per_context=1e6, prefill_bounded=True)  # fmt: skip
    context = 2052 + 4
    assert heavy.attention_flops == pytest.approx(1e6 * context)
    assert 1 / heavy.decode_tokens_per_s == pytest.approx(0.03 + 1e6 * context / 1e11)
    assert heavy.decode_tokens_per_s < plain.decode_tokens_per_s


# --- one function decides "above the bound" ---------------------------------------------------------------


def test_a_measurement_above_its_bound_is_said_in_words_never_as_a_percentage():
    above = share_of_bound(51.0, 48.0, "decode")
    assert above is not None and above.above and above.clamped == 1.0
    assert above.text() == "measured above the bound (1.06×): the peak read bandwidth measured here read low"
    within = share_of_bound(40.0, 50.0, "prefill")
    assert within is not None and not within.above and within.text() == "80% of the bound"
    assert share_of_bound(None, 3.0) is None and share_of_bound(3.0, 0.0) is None
    v = verdict("decode", 105.0)
    assert "measured above the bound (1.05×)" in v and "105%" not in v


def test_bench_roofline_flags_a_cell_above_its_bound():
    # bound 10e9 / (1e8 + 1000 × 100) ≈ 99.9 tok/s; measured 110
    cell = make_cell("prompt", 96, 0, gen=8, ttft=[10.0], prefill=[250.0], decode=[110.0])
    r = build_roofline(PEAKS, weight_bytes=100_000_000, n_params=100_000_000, kv_bytes_per_token=1000, cells=[cell],
                       weight_type="F32")  # fmt: skip
    assert r["cells"][0]["decode_above_bound"] and not r["cells"][0]["prefill_above_bound"]
    assert "measured above the bound (1.10×): the peak read bandwidth" in r["decode_verdict"]
    assert "110%" not in r["decode_verdict"]


def test_grid_rows_say_above_instead_of_a_ratio_over_one_and_footnote_why():
    cell = make_cell("depth", 4, 0, gen=8, ttft=[1.0], prefill=[100.0], decode=[110.0])
    pred = Prediction(decode_tokens_per_s=100.0, prefill_tokens_per_s=200.0, ttft_ms=2.0, step_bytes=1.0,
                      flops_per_token=1.0)  # fmt: skip
    row = grid_row("base", False, cell, pred, 1000)
    assert row[4] == "above" and row[10] == "above" and row[7] == "0.50"  # TTFT 1 ms < its 2 ms floor
    assert bound_share("ttft_ms", 1.0, 2.0).above and not bound_share("ttft_ms", 4.0, 2.0).above
    grid = GridResult(cells=[_grid_cell("base", {}, cell, pred)])
    foot = "\n".join(grid.footnotes())
    assert (
        "above: decode in 1 cell(s) (base depth 0): measured above the bound (1.10×): the peak read bandwidth" in foot
    )
    assert "above: TTFT in 1 cell(s) (base depth 0): measured above the bound (2.00×): the peak matmul FLOP/s" in foot
    assert json.loads(grid.to_json())["grid"][0]["above_bound"] == ["decode_tokens_per_s", "ttft_ms"]


def test_parallel_verdict_above_its_bound_is_in_words():
    row = {"n_seq": 4, "step_bytes": 2**20, "step_flops": 1e9, "flops_per_byte": 9.0, "bound_by": "arithmetic",
           "aggregate_bound_tokens_per_s": 100.0, "pct_of_bound": 120.0}  # fmt: skip
    line = parallel_verdict(row, 5.0, 2**20, 1000)
    assert "measured above the bound (1.20×): the peak matmul FLOP/s measured here read low" in line
    assert "120%" not in line


# --- the verdict does not flip between identical runs -----------------------------------------------------


def test_identical_runs_at_56_and_42_percent_get_the_same_verdict():
    """Seen: two identical runs read 56 % ("bound by memory bandwidth") and 42 % ("too small for the bound to
    bind") with one threshold at 50 %."""
    a, b = verdict("decode", 56.0), verdict("decode", 42.0)
    assert "near the boundary" in a and "near the boundary" in b
    assert "too small" not in a + b and "— bound by" not in a + b


@pytest.mark.parametrize("noise", [0.95, 1.05])
def test_a_few_percent_of_noise_never_turns_one_verdict_into_its_opposite(noise):
    for tenth in range(1, 1200):
        pct = tenth / 10
        pair = {bound_class(pct), bound_class(pct * noise)}
        assert pair != {"bound", "overhead"}, pct


def test_a_spread_that_crosses_the_band_reads_near_the_boundary():
    assert bound_class(70.0) == "bound" and bound_class(30.0) == "overhead"
    assert bound_class(55.0, 70.0) == "near" and bound_class(30.0, 45.0) == "near"
    assert "near the boundary" in verdict("decode", 70.0, (55.0, 72.0))
    assert "(repetitions 55–72%)" in verdict("decode", 70.0, (55.0, 72.0))


# --- the read peak is the best of several kernels ---------------------------------------------------------


def test_the_read_peak_is_the_best_kernel_and_names_it(monkeypatch):
    fake = {"sgemv": 38e9, "max": 36e9, "count_nonzero": 30e9, "sum": 33e9}
    seen: list[str] = []

    def timed(pool, work, nbytes, max_s):
        name = seen[len(seen) - 1]
        return Repeated((fake[name] * 0.9, fake[name]), True)

    real_kernel = peaks_mod._read_kernel

    def kernel(name, buf, sl):
        if not seen or seen[-1] != name:
            seen.append(name)
        return real_kernel(name, buf, sl)

    monkeypatch.setattr(peaks_mod, "_timed", timed)
    monkeypatch.setattr(peaks_mod, "_read_kernel", kernel)
    best, method, kernels = measure_read(2**20, threads=2, max_s=0.1)
    assert seen == list(fake) and kernels == fake and best.best == 38e9
    assert "sgemv won" in method and "sum 33.0" in method and "2 thread(s)" in method
    with pytest.raises(ValueError):
        measure_read(2**20, kernels=("triad",))


def test_measure_peaks_keeps_the_winner_and_every_kernel(monkeypatch):
    fake = {"sgemv": 38e9, "sum": 33e9}
    monkeypatch.setattr(peaks_mod, "measure_read", lambda *a: (Repeated((38e9,), True), "faked read", fake))
    monkeypatch.setattr(peaks_mod, "measure_bandwidth", lambda *a: (Repeated((30e9,), True), "faked copy"))
    monkeypatch.setattr(peaks_mod, "measure_matmul_flops", lambda *a: (Repeated((1e11,), True), "faked matmul"))
    p = peaks_mod.measure_peaks(threads=2, quiet_wait_s=0)
    assert p.bandwidth_bytes_per_s == 38e9 and p.bandwidth_kernel == "sgemv" and p.read_kernels == fake
    assert p.to_dict()["read_kernels"] == fake


def test_every_read_kernel_runs_on_a_small_buffer():
    """Each kernel once, in one thread and in two (what it reads, not how fast: no timing is judged)."""
    for threads in (1, 2):
        best, method, kernels = measure_read(2**20, threads=threads, max_s=0.01)
        assert set(kernels) == set(peaks_mod.READ_KERNELS) and all(v > 0 for v in kernels.values())
        assert best.best == max(kernels.values()) and " won — " in method


# --- a lever that loses says why --------------------------------------------------------------------------


def _grid_cell(point, levers, cell, prediction):
    return GridCell(point, levers, "m", True, cell, prediction, 1000, 10_000, None, 100)


def _pred(decode):
    return Prediction(decode, 1000.0, 1.0, 1.0, 1.0)


def _kv_grid(q8_rate_deep):
    f16, q8 = {"type_k": "f16", "type_v": "f16"}, {"type_k": "q8_0", "type_v": "q8_0"}
    cells = []
    for point, levers, shallow, deep, pred_deep in (
        ("ctk=f16 ctv=f16", f16, 50.0, 40.0, 30.0),
        ("ctk=q8_0 ctv=q8_0", q8, 50.0, q8_rate_deep, 36.6),  # predicted 1.22× of f16
    ):
        cells.append(_grid_cell(point, levers, make_cell("depth", 4, 0, gen=8, decode=[shallow]), _pred(60.0)))
        cells.append(_grid_cell(point, levers, make_cell("depth", 2052, 2048, gen=8, decode=[deep]), _pred(pred_deep)))
    return cells


def test_a_quantised_kv_cache_that_loses_says_why():
    cells = _kv_grid(31.2)  # 0.78× of f16 at depth 2048
    lines = lever_lines(cells)
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith(
        "lever lost: ctk=q8_0 ctv=q8_0 decodes at 0.78× of ctk=f16 ctv=f16 at depth 2048, where the roofline "
        "predicted 1.22×"
    )
    assert "on a CPU, attention dequantises the q8_0 cache" in line and "costs more than the bytes it saves" in line
    # the step's growth over depth 0: f16 1/40 − 1/50 = 5 ms; q8_0 1/31.2 − 1/50 ≈ 12.05 ms
    assert "grew 5.00 ms over its shallowest depth with ctk=f16 ctv=f16, 12.05 ms with ctk=q8_0" in line
    assert line in GridResult(cells=cells).footnotes()


def test_a_lever_that_wins_or_was_not_predicted_to_win_says_nothing():
    assert lever_lines(_kv_grid(41.0)) == []  # measured faster: no loss
    cells = _kv_grid(31.2)
    cells[3] = _grid_cell(cells[3].point, cells[3].levers, cells[3].cell, _pred(30.0))  # no gain predicted
    assert lever_lines(cells) == []


def test_another_lever_that_loses_gets_the_general_reason():
    base = _grid_cell("t=1", {"n_threads": 1}, make_cell("depth", 4, 0, decode=[50.0]), _pred(40.0))
    two = _grid_cell("t=2", {"n_threads": 2}, make_cell("depth", 4, 0, decode=[45.0]), _pred(80.0))
    (line,) = lever_lines([base, two])
    assert "t=2 decodes at 0.90× of t=1" in line and "this lever's cost lies elsewhere" in line


def test_the_bench_says_what_attention_costs_at_depth():
    # weights 300 MB at 10 GB/s = 30 ms; KV 1000 B/token; depth 2048 measured 20 ms slower than depth 0
    shallow = make_cell("depth", 4, 0, gen=8, ttft=[5.0], prefill=[100.0], decode=[25.0])
    deep = make_cell("depth", 2052, 2048, gen=8, ttft=[5.0], prefill=[100.0], decode=[1 / 0.06])
    r = build_roofline(PEAKS, weight_bytes=300_000_000, n_params=600_000_000, kv_bytes_per_token=1000,
                       cells=[shallow, deep], attention_flops_per_context=229_376, weight_type="F32")  # fmt: skip
    line = r["attention_line"]
    assert line.startswith("attention at depth 2048: the step grew 20.00 ms over depth 0 (33% of a 60.0 ms step)")
    assert "attention costs" in line and "on a CPU its arithmetic" in line
    cells = r["cells"]
    assert cells[1]["decode_bound_terms_ms"]["attention_compute"] == pytest.approx(1e3 * 229_376 * 2056 / 1e11)


# --- what-if never predicts above a device's bound --------------------------------------------------------

MODEL = ModelFacts("m", weight_bytes=1_000_000_000, n_params=1_000_000_000, kv_bytes_per_token=100_000)


def _above_bound_result():
    """This machine measured decode at 1.10× and prefill at 3.08× of its bounds (its peaks read low)."""
    bw, flops = 20e9, 1e11
    decode_bound_rate = bw / (1e9 + 12 * 100_000)  # depth 0 decodes at 4 + 8 = 12 tokens of context
    cells = [
        make_cell("prompt", 256, 0, gen=16, ttft=[1000.0], prefill=[3.08 * flops / 2e9], decode=[9.0]),
        make_cell("depth", 4, 0, gen=16, ttft=[20.0], prefill=[200.0], decode=[1.10 * decode_bound_rate]),
    ]
    roofline = {"bandwidth_bytes_per_s": bw, "flops_per_s": flops, "weight_bytes": MODEL.weight_bytes,
                "n_params": MODEL.n_params, "kv_bytes_per_token": MODEL.kv_bytes_per_token}  # fmt: skip
    return SweepResult(
        model={"name": "m", "quantization": "F32"}, results=cells, roofline=roofline, system={"cpu": "X"}
    )


def test_efficiency_above_the_bound_is_clamped_and_flagged():
    eff, model, _ = efficiency_from(_above_bound_result())
    assert eff.decode == 1.0 and eff.prefill == 1.0
    assert eff.decode_measured == pytest.approx(1.10) and eff.prefill_measured == pytest.approx(3.08)
    assert eff.decode_above_bound and eff.prefill_above_bound
    rtx = find_device("rtx-4090")
    # never above the device's own bound (1,008 GB/s over 1 GB of weights)
    assert predict_decode(rtx.bandwidth_bytes_per_s, 1.10, model, 0) == pytest.approx(1008e9 / 1e9)


def test_whatif_prints_no_percentage_above_100_and_no_zero_ttft(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(_above_bound_result().to_json())
    assert main(["whatif", "--from", str(path), "--device", "h100,rtx-4090", "--prompt-lengths", "16,512"]) == 0
    out = capsys.readouterr().out
    assert "110%" not in out and "308%" not in out and " 0 ms" not in out
    assert "this machine's decode measured above the bound (1.10×): the peak read bandwidth" in out
    assert "this machine's prefill measured above the bound (3.08×): the peak matmul FLOP/s" in out
    assert "100% of its read bandwidth in decode" in out and "100% of its matmul FLOP/s in prefill" in out
    assert "calibration: measured above its bound, efficiency clamped to 100%" in out
    h100 = next(line for line in out.splitlines() if line.startswith("NVIDIA H100"))
    # 16 tokens × 2 GFLOP at 989 TFLOP/s = 0.032 ms; 1008 GB/s over 1 GB of weights, never 1.10 ×
    assert "0.032 ms" in h100 and "3,350.0" in h100


def test_ttft_is_never_rounded_to_zero():
    assert [_ms(x) for x in (0.0004, 0.032, 1.2, 12.4, 2500.0)] == ["< 0.01 ms", "0.032 ms", "1.2 ms", "12 ms",
                                                                     "2.5 s"]  # fmt: skip


# --- llama-bench runs the way chatphase does (weight repacking where chatphase repacks) -------------------


@pytest.fixture
def levers_script():
    from benchmarks import levers

    return levers


@pytest.mark.parametrize(("kind", "safe", "expect"), [("other", False, "1"), ("amx", True, "1"), ("amx", False, "0")])
def test_llama_bench_repacks_where_chatphase_does(monkeypatch, fake_cpu, levers_script, kind, safe, expect):
    fake_cpu(kind, probe_safe=safe)
    ran = []

    class Done:
        stdout = json.dumps([{"n_depth": 0, "avg_ts": 51.0}])

    from benchmarks import harness

    monkeypatch.setattr(harness.subprocess, "run", lambda argv, **kw: ran.append(argv) or Done())
    got = levers_script.bench_tg("llama-bench", Path("m.gguf"), 16, 64, 2)
    argv = ran[0]
    assert got == {0: 51.0} and argv[argv.index("--repack") + 1] == expect
    assert levers_script.vs_bound(51.0, 48.0).startswith("measured above the bound (1.06×)")
    assert levers_script.vs_bound(40.0, 50.0) == "0.80"
