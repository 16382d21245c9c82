"""Only float32 weights get a prefill bound in the benchmarks (:func:`chatphase.models.roofline.float32_peak_bounds`):
quantised weights run integer kernels that can beat a float32 matmul peak, so for them the bench's roofline,
its report, the lever grid and what-if show no prefill bound, prediction or share (a dash, JSON null, one line
saying why) and never call a prefill above the float32 figure a measurement problem; decode keeps its bound."""

from __future__ import annotations

import json

import pytest
from bench_support import CharTokenizer, ScriptedTokenEngine
from fake_engine import fake_model_info
from test_bench_results import make_cell

from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.core.report import summary_lines
from chatphase.bench.core.results import SweepResult
from chatphase.bench.core.roofline import build_roofline
from chatphase.bench.grid.levers import LeverGrid
from chatphase.bench.grid.result import GridResult
from chatphase.bench.grid.run import GridDone, GridRun
from chatphase.bench.sweep.loop import SweepPlan
from chatphase.bench.whatif import assumptions, device_rows, efficiency_from, find_device
from chatphase.cli import main
from chatphase.engine.config import EngineConfig
from chatphase.units import DASH

PEAKS = MachinePeaks(10e9, "read", 1e11, "matmul", threads=2)
NOTE = "prefill: no bound for Q4_0 weights — their integer or 16-bit kernels are not bounded by the float32 matmul peak"


def _roofline(weight_type: str) -> dict:
    # prefill measured at 1,330 tok/s: 2.66× the float32 figure 1e11 / (2 × 1e8) = 500 tok/s
    cell = make_cell("prompt", 96, 0, gen=8, ttft=[10.0], prefill=[1330.0], decode=[20.0])
    return build_roofline(PEAKS, weight_bytes=100_000_000, n_params=100_000_000, kv_bytes_per_token=1000,
                          cells=[cell], weight_type=weight_type)  # fmt: skip


def test_bench_roofline_has_no_prefill_bound_for_quantised_weights():
    q = _roofline("Q4_0")
    row = q["cells"][0]
    assert q["prefill_bound_tokens_per_s"] is None and row["prefill_bound_tokens_per_s"] is None
    assert row["prefill_pct_of_bound"] is None and row["prefill_above_bound"] is None
    assert q["prefill_best_pct_of_bound"] is None and q["prefill_verdict"] == NOTE
    assert "measurement" not in json.dumps(q) and "above the bound" not in json.dumps(q)
    assert row["decode_pct_of_bound"] is not None and q["decode_verdict"].startswith("decode: ")  # decode keeps it
    f32 = _roofline("F32")
    assert f32["prefill_bound_tokens_per_s"] == pytest.approx(500.0) and f32["cells"][0]["prefill_above_bound"]
    assert "measured above the bound (2.66×)" in f32["prefill_verdict"]


def test_the_report_says_why_instead_of_a_prefill_bound_and_reads_older_files():
    def lines(roofline: dict, quantization: str) -> list[str]:
        result = SweepResult(model={"name": "m", "quantization": quantization}, roofline=roofline)
        return summary_lines(SweepResult.from_dict(json.loads(result.to_json())))

    q = lines(_roofline("Q4_0"), "Q4_0")
    assert NOTE in q and not any("prefill bound" in x or "FLOP/s / (2 ×" in x for x in q)
    assert any(x.startswith("decode bound ") for x in q)
    f32 = "\n".join(lines(_roofline("F32"), "F32"))
    assert "prefill bound 500 tok/s = FLOP/s / (2 × 100 M params" in f32
    older = {k: v for k, v in _roofline("F32").items() if k != "weight_type"}  # saved before weight_type
    assert "prefill bound 500 tok/s" in "\n".join(lines(older, "Q4_0"))


def _grid(quantization: str) -> GridResult:
    plan = SweepPlan(prompt_lengths=(10,), depths=(0,), gen_tokens=3, reps=1, warmup=0)
    points, _ = LeverGrid({"n_ubatch": (64,)}).points()
    run = GridRun(
        points, {None: fake_model_info(quantization=quantization)}, EngineConfig(n_ctx=256, n_threads=2), plan,
        engine_factory=lambda i, c: ScriptedTokenEngine(), peaks={2: PEAKS}, builder=PromptBuilder(CharTokenizer()),
    )  # fmt: skip
    done = list(run)[-1]
    assert isinstance(done, GridDone)
    return done.result


def test_the_lever_grid_predicts_no_prefill_or_ttft_for_quantised_weights():
    q = _grid("Q4_1")
    for c in q.cells:
        assert c.prediction is not None and c.prediction.decode_tokens_per_s > 0
        assert c.prediction.prefill_tokens_per_s is None and c.prediction.ttft_ms is None
        assert c.ratios()["ttft_ms"] is None and c.ratios()["prefill_tokens_per_s"] is None
        row = c.row()
        assert row[3] == row[4] == row[6] == row[7] == DASH and row[9] != DASH
    text = q.render("table")
    assert "prefill: no bound for Q4_1 weights" in text and text.count("no bound for") == 1
    cell = json.loads(q.to_json())["grid"][0]
    assert cell["prediction"]["prefill_tokens_per_s"] is None and cell["prediction"]["ttft_ms"] is None
    assert cell["ratio"]["ttft_ms"] is None and cell["weight_type"] == "Q4_1"
    header, first = q.render("csv").splitlines()[:2]
    assert dict(zip(header.split(","), first.split(","), strict=True))["ttft_ms_pred"] == ""
    assert GridResult.from_dict(json.loads(q.to_json())).render("table") == text
    f32 = _grid("F32")
    assert all(c.prediction and c.prediction.ttft_ms and c.prediction.prefill_tokens_per_s for c in f32.cells)
    assert "no bound for" not in f32.render("table") and f32.cells[0].row()[3] != DASH


def test_an_older_grid_file_without_a_weight_type_still_loads():
    data = json.loads(_grid("F32").to_json())
    for c in data["grid"]:
        del c["weight_type"]
    loaded = GridResult.from_dict(data)
    assert loaded.cells[0].weight_type is None and loaded.cells[0].prediction.ttft_ms > 0


def _bench(quantization: str) -> SweepResult:
    # prefill 1,330 tok/s against the float32 figure 1e11 / (2 × 1e9) = 50 tok/s: 26.6×
    cells = [
        make_cell("prompt", 256, 0, gen=16, ttft=[200.0], prefill=[1330.0], decode=[9.0]),
        make_cell("depth", 4, 0, gen=16, ttft=[20.0], prefill=[200.0], decode=[8.0]),
    ]
    roofline = {"bandwidth_bytes_per_s": 20e9, "flops_per_s": 1e11, "weight_bytes": 1_000_000_000,
                "n_params": 1_000_000_000, "kv_bytes_per_token": 100_000}  # fmt: skip
    model = {"name": "m", "quantization": quantization}
    return SweepResult(model=model, results=cells, roofline=roofline, system={"cpu": "X"})


def test_whatif_scales_a_quantised_prefill_without_calling_it_a_bound():
    eff, model, _ = efficiency_from(_bench("Q4_0"))
    assert not eff.prefill_bound and eff.prefill_measured is None and not eff.prefill_above_bound
    assert eff.prefill == pytest.approx(26.6)  # not clamped to 1.0: it is no share of a bound
    h100 = find_device("h100")
    ttft = device_rows([h100], eff, model, [1000], [0])[0]["ttft_ms"][1000]
    # this machine's prefill (1,330 tok/s) scaled by the FLOP/s ratio 989e12 / 1e11
    assert ttft == pytest.approx(1000 * 1000 / (1330 * 989e12 / 1e11))
    notes = "\n".join(assumptions(eff, model))
    assert NOTE in notes and "neither a bound nor a measurement" in notes
    assert "measurement problem" not in notes and "2660%" not in notes and "upper bounds on speed (TTFT" not in notes
    f32, _, _ = efficiency_from(_bench("F32"))
    assert f32.prefill_bound and f32.prefill == 1.0 and f32.prefill_above_bound  # a bound: clamped, flagged


def test_whatif_command_on_a_quantised_result(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(_bench("Q4_0").to_json())
    assert main(["whatif", "--from", str(path), "--device", "h100", "--prompt-lengths", "256"]) == 0
    out = capsys.readouterr().out
    assert NOTE in out and "clamped" not in out and "measurement problem" not in out
    assert main(["whatif", "--from", str(path), "--device", "h100", "--json"]) == 0
    eff = json.loads(capsys.readouterr().out)["efficiency"]
    assert eff["prefill_bound"] is False and eff["prefill_measured"] is None and eff["weight_type"] == "Q4_0"


def test_a_parallel_step_of_quantised_weights_is_bounded_by_its_bytes_alone():
    from test_bench_parallel import P, W, _cell

    from chatphase.bench.parallel.roofline import build_parallel_roofline

    peaks = MachinePeaks(20e9, "read", 100e9, "matmul")  # balance 5 FLOP/byte: N = 4 is past the crossover
    cells = [_cell(1, 100.0), _cell(4, 390.0)]
    q = build_parallel_roofline(peaks, weight_bytes=W, n_params=P, kv_bytes_per_token=100, cells=cells,
                                weight_type="Q4_1")  # fmt: skip
    assert q["parallel_crossover"] == [] and [r["bound_by"] for r in q["parallel_cells"]] == ["memory bandwidth"] * 2
    four = q["parallel_cells"][1]
    assert four["aggregate_bound_tokens_per_s"] == pytest.approx(4 / ((W + 4 * 100 * 14) / 20e9))  # N / t_memory
    verdicts = "\n".join(q["parallel_verdicts"])
    assert "the step's arithmetic: no bound for Q4_1 weights" in verdicts
    assert "above the bound" not in verdicts and "balance" not in verdicts
    f32 = build_parallel_roofline(peaks, weight_bytes=W, n_params=P, kv_bytes_per_token=100, cells=cells,
                                  weight_type="F32")  # fmt: skip
    assert f32["parallel_cells"][1]["bound_by"] == "arithmetic" and "above the bound" in f32["parallel_verdicts"][-1]


def test_a_mixed_step_of_quantised_weights_has_no_arithmetic_crossover():
    from test_bench_interference import ScriptedEngine
    from test_bench_interference import _run as run_interference

    from chatphase.bench.interference.plan import InterferencePlan

    plan = InterferencePlan(n_running=2, newcomer_tokens=128, chunks=(16, 64), gen_tokens=3, reps=1, warmup=0)
    q = run_interference(plan, ScriptedEngine(info=fake_model_info(quantization="Q4_1")))[0][-1].result.roofline
    assert q["crossover_prompt_tokens"] is None
    assert all(c["bound_by"] == "memory bandwidth" for c in q["interference_cells"])
    assert q["interference_lines"][0].startswith("mixed step: arithmetic: no bound for Q4_1 weights")
    f32 = run_interference(plan, ScriptedEngine(info=fake_model_info(quantization="F32")))[0][-1].result.roofline
    assert f32["crossover_prompt_tokens"] > 0 and "arithmetic" in [c["bound_by"] for c in f32["interference_cells"]]
