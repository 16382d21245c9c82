"""The parallel-decode sweep with scripted clocks: step accounting, the plan's checks, the sweep through
``ParallelRun``, the per-N roofline, and the result's JSON/CSV/table/plot forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_support import MS, CharTokenizer, ScriptedBatchEngine
from fake_engine import fake_model_info

from chatphase.bench.core.contract import SCHEMA_VERSION
from chatphase.bench.core.events import RunDone
from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.core.report import render
from chatphase.bench.core.results import save_result
from chatphase.bench.experiments import load_bench_result, load_result, read_csv
from chatphase.bench.parallel.plot import write_parallel_plot
from chatphase.bench.parallel.records import ParallelCell
from chatphase.bench.parallel.result import ParallelResult
from chatphase.bench.parallel.roofline import build_parallel_roofline, crossover_n_seq
from chatphase.bench.parallel.run import ParallelRun
from chatphase.bench.parallel.sweep import ModelFacts, ParallelPlan, aggregate_parallel, batch_sample
from chatphase.bench.sweep.loop import SweepProgress
from chatphase.engine.batching import BatchOutcome
from chatphase.engine.config import EngineConfig
from chatphase.errors import EngineError, UsageError
from chatphase.timing.stats import summarize

PEAKS = MachinePeaks(20e9, "scripted copy", 100e9, "scripted matmul")  # machine balance 5 FLOP/byte
W, P, K = 98_000_000, 134_515_008, 100  # fake_model_info's weights and parameters; scripted KV bytes per token


def _outcome(**changes) -> BatchOutcome:
    """4 sequences × 10 prompt tokens: prefill 0–20 ms, decode from 21 ms, 3 steps of 10, 12 and 14 ms."""
    values = dict(
        n_seq=4,
        prompt_tokens=40,
        t_prefill_start_ns=0,
        t_prefill_end_ns=20 * MS,
        first_token_ns=(5 * MS, 5 * MS, 20 * MS, 20 * MS),
        t_decode_start_ns=21 * MS,
        step_end_ns=(31 * MS, 43 * MS, 57 * MS),
        decode_batch_tokens=(4, 4, 4),
        tokens=((1, 2, 3, 4),) * 4,
        texts=("abcd",) * 4,
        kv_cache_tokens=52,
        kv_cache_bytes=5200,
        stop_reason="length",
    )
    values.update(changes)
    return BatchOutcome(**values)


def test_step_accounting_is_llama_batched_bench_s_pp_and_s_tg():
    s = batch_sample(_outcome(), prompt_tokens=10, gen_tokens=3, rep=1)
    assert s.step_ms == pytest.approx(12.0)  # 36 ms of decode / 3 steps
    assert s.decode_tokens_per_s == pytest.approx(3 / 0.036)  # per sequence: steps / decode time
    assert s.aggregate_decode_tokens_per_s == pytest.approx(4 * 3 / 0.036)  # S_TG = N × TG / t_TG
    assert s.prefill_tokens_per_s == pytest.approx(40 / 0.020)  # S_PP = N × PP / t_PP
    assert s.ttft_ms == (5.0, 5.0, 20.0, 20.0)
    assert s.itl_ms_p50 == pytest.approx(12.0) and s.itl_ms_p95 == pytest.approx(13.8)  # gaps 10, 12, 14
    assert (s.decode_tokens, s.kv_cache_bytes, s.rep, s.n_seq) == (16, 5200, 1, 4)


def test_step_accounting_with_no_step_is_undefined_not_zero():
    s = batch_sample(_outcome(step_end_ns=(), decode_batch_tokens=(), stop_reason="cancelled"), 10, 3)
    assert s.step_ms is s.decode_tokens_per_s is s.aggregate_decode_tokens_per_s is None


def test_cells_summarise_reps_and_carry_step_bytes_and_flops():
    samples = [batch_sample(_outcome(step_end_ns=(31 * MS, 41 * MS, 51 * MS + d * MS)), 10, 3, rep=d) for d in (0, 6)]
    (cell,) = aggregate_parallel(samples, ModelFacts(W, P, K))
    assert (cell.prompt_tokens, cell.n_seq, cell.reps) == (10, 4, 2)
    assert cell.step_ms == summarize([10.0, 12.0]) and cell.ttft_ms.n == 8  # every sequence of every rep
    assert cell.step_bytes == W + 4 * K * (10 + 3 / 2)  # weights once + N × the KV read at the mean context
    assert cell.step_flops == 2 * P * 4
    (unknown,) = aggregate_parallel(samples, ModelFacts(W, None, None))
    assert unknown.step_bytes is None and unknown.step_flops is None


@pytest.mark.parametrize(
    "plan, n_ctx, match",
    [
        (ParallelPlan(n_seqs=(0,)), 4096, "N must be 1 to 256"),
        (ParallelPlan(n_seqs=(1, 257)), 4096, "N must be 1 to 256"),
        (ParallelPlan(n_seqs=()), 4096, "nothing to measure"),
        (ParallelPlan(prompt_lengths=()), 4096, "needs a prompt length"),
        (ParallelPlan(reps=0), 4096, "--reps"),
        (ParallelPlan(gen_tokens=0), 4096, "--gen"),
        (ParallelPlan(n_seqs=(1, 16), prompt_lengths=(128,), gen_tokens=32), 2048, "n_ctx 2,048 holds 12 such"),
        (ParallelPlan(n_seqs=(2,), prompt_lengths=(5000,)), 4096, "not even one fits n_ctx 4,096"),
    ],
)
def test_bad_plans_are_refused_saying_what_fits(plan, n_ctx, match):
    with pytest.raises(UsageError, match=match):
        plan.validate(n_ctx)


def test_a_step_of_n_tokens_must_fit_n_batch():
    with pytest.raises(UsageError, match="over n_batch 4 \\(raise --n-batch to 8\\)"):
        ParallelPlan(n_seqs=(1, 8), prompt_lengths=(16,)).validate(4096, n_batch=4)


def test_plan_that_just_fits_and_a_server_plan_skip_the_context_check():
    assert ParallelPlan(n_seqs=(16,), prompt_lengths=(96,), gen_tokens=32).validate(2048).total_runs == 4
    assert ParallelPlan(n_seqs=(64,), prompt_lengths=(4000,)).validate(None)


def _run(plan, engine, peaks=PEAKS, cancel_at=None):
    configs = []

    def factory(info, config):
        configs.append(config)
        return engine

    run = ParallelRun(
        fake_model_info(),
        EngineConfig(n_ctx=4096),
        plan,
        engine_factory=factory,
        peaks=peaks,
        builder=PromptBuilder(CharTokenizer()),
    )
    events = []
    for event in run:
        events.append(event)
        if cancel_at is not None and len(events) == cancel_at:
            run.cancel()
    return events, configs


def test_sweep_through_bench_run_measures_every_cell_with_distinct_prompts():
    engine = ScriptedBatchEngine()
    plan = ParallelPlan(n_seqs=(1, 2, 4), prompt_lengths=(10,), gen_tokens=8, reps=2, warmup=1)
    events, configs = _run(plan, engine)
    progress = [e for e in events if isinstance(e, SweepProgress)]
    assert [p.done_runs for p in progress] == list(range(1, 10)) and progress[0].total_runs == 9
    assert [p.sample.warmup for p in progress[:3]] == [True, False, False]
    assert configs[0].n_seq_max == 4 and engine.closed  # one context for the largest N
    for req in engine.requests:
        assert (
            req.gen_steps == 8 and all(len(p) == 10 for p in req.prompts) and len(set(req.prompts)) == len(req.prompts)
        )
    result = events[-1].result
    assert isinstance(events[-1], RunDone) and not result.cancelled and isinstance(result, ParallelResult)
    assert [(c.n_seq, c.reps) for c in result.parallel] == [(1, 2), (2, 2), (4, 2)]
    for c in result.parallel:  # step = 10 + 1 × N ms; prefill 0.5 ms per token
        assert c.step_ms.mean == pytest.approx(10 + c.n_seq)
        assert c.aggregate_decode_tokens_per_s.mean == pytest.approx(1000 * c.n_seq / (10 + c.n_seq))
        assert c.decode_tokens_per_s.mean == pytest.approx(1000 / (10 + c.n_seq))
        assert c.prefill_tokens_per_s.mean == pytest.approx(2000)
        assert c.kv_cache_bytes == c.n_seq * (10 + 8) * K
    # Q4_1 weights: a line saying the step's arithmetic has no bound (no crossover), then one per N
    assert len(result.roofline["parallel_verdicts"]) == 1 + 3
    assert result.settings["plan"]["sweep"] == "parallel" and len(result.parallel_samples) == 9


def test_cancel_mid_sweep_keeps_partial_cells_and_failures_raise():
    plan = ParallelPlan(n_seqs=(1, 2, 4), prompt_lengths=(10,), gen_tokens=4, reps=2, warmup=0)
    events, _ = _run(plan, ScriptedBatchEngine(), cancel_at=4)  # loading, then 3 runs: N=2 has one rep
    result = events[-1].result
    assert result.cancelled and [(c.n_seq, c.reps) for c in result.parallel] == [(1, 2), (2, 1)]
    with pytest.raises(EngineError, match="scripted failure"):
        _run(plan, ScriptedBatchEngine(fail_on_run=2))


def _cell(n: int, aggregate: float, length: int = 10, gen: int = 8) -> ParallelCell:
    s = summarize([aggregate])
    return ParallelCell(length, n, gen, 1, s, s, s, s, s, s, s, None, None, None)


def test_roofline_per_n_turns_from_bandwidth_to_arithmetic_at_the_crossover():
    cells = [_cell(1, 100.0), _cell(2, 150.0), _cell(4, 390.0)]
    r = build_parallel_roofline(PEAKS, weight_bytes=W, n_params=P, kv_bytes_per_token=K, cells=cells, weight_type="F32")
    n_star = crossover_n_seq(PEAKS, W, P, K, 10 + 8 / 2)
    assert 2 * P * n_star / (W + n_star * K * 14) == pytest.approx(5.0)  # intensity meets the balance there
    assert r["machine_balance_flops_per_byte"] == pytest.approx(5.0)
    assert [row["bound_by"] for row in r["parallel_cells"]] == ["memory bandwidth", "arithmetic", "arithmetic"]
    one, four = r["parallel_cells"][0], r["parallel_cells"][2]
    assert one["aggregate_bound_tokens_per_s"] == pytest.approx(20e9 / (W + K * 14))  # N / t_memory
    assert four["aggregate_bound_tokens_per_s"] == pytest.approx(100e9 / (2 * P))  # N / t_arithmetic
    assert four["pct_of_bound"] == pytest.approx(100 * 390 / (100e9 / (2 * P)))
    lines = r["parallel_verdicts"]
    assert f"at N ≈ {n_star:.1f} on this machine" in lines[0] and "5.0 FLOP/byte" in lines[0]
    assert lines[1].startswith("N=1: a step reads") and "bound by memory bandwidth" in lines[1]
    assert "near the boundary: per-step overhead" in lines[1]  # 100 tok/s is 49 % of its bound: in the 40-60 % band
    assert "bound by arithmetic" in lines[3] and "above the bound" in lines[3]  # 390 > 372 tok/s


def test_roofline_when_the_kv_read_keeps_the_step_bandwidth_bound():
    r = build_parallel_roofline(
        PEAKS, weight_bytes=W, n_params=P, kv_bytes_per_token=10**6, cells=[_cell(8, 10.0, 4000)], weight_type="F32"
    )
    assert r["parallel_crossover"] == [{"prompt_tokens": 4000, "n_seq": None}]
    assert "stays bound by memory bandwidth at every N" in r["parallel_verdicts"][0]


def _result() -> ParallelResult:
    plan = ParallelPlan(n_seqs=(1, 2), prompt_lengths=(10,), gen_tokens=4, reps=2, warmup=0)
    return _run(plan, ScriptedBatchEngine())[0][-1].result


def test_json_and_csv_round_trip_and_load_for_overlays(tmp_path):
    result = _result()
    for name in ("r.json", "r.csv"):
        loaded = load_result(save_result(result, tmp_path / name))
        assert loaded.parallel == result.parallel and isinstance(loaded, ParallelResult)
    assert load_result(tmp_path / "r.json").parallel_samples == result.parallel_samples
    text = (tmp_path / "r.csv").read_text().splitlines()
    assert text[0].startswith("kind,prompt_tokens,n_seq,gen_tokens,reps,step_ms_mean") and text[1].startswith(
        "parallel,10,1,4,2,"
    )


def test_csv_with_both_kinds_of_cells(tmp_path):
    """A result holds one kind of cells: the sweep's CSV its prompt/depth cells, the parallel sweep's its parallel
    cells; an older CSV holding both kinds' rows reads into both lists, and loading it is refused in one line."""
    from test_bench_results import make_result

    sweep, par = make_result(), _result()
    cells, parallel = read_csv(sweep.to_csv())
    assert cells == sweep.results and parallel == []
    cells, parallel = read_csv(par.to_csv())
    assert cells == [] and parallel == par.parallel
    mixed = tmp_path / "mixed.csv"  # the columns of both, as a result holding both kinds wrote them
    head, *rows = sweep.to_csv().splitlines()
    par_head, *par_rows = par.to_csv().splitlines()
    columns = head.split(",") + [c for c in par_head.split(",") if c not in head.split(",")]
    blank = {c: "" for c in columns}
    lines = [",".join(columns)]
    for names, values in [(head, r) for r in rows] + [(par_head, r) for r in par_rows]:
        lines.append(",".join({**blank, **dict(zip(names.split(","), values.split(","), strict=True))}.values()))
    mixed.write_text("\n".join(lines) + "\n")
    cells, parallel = read_csv(mixed.read_text())
    assert cells == sweep.results and parallel == par.parallel
    with pytest.raises(UsageError, match=r"mixed\.csv holds both sweep and parallel cells"):
        load_result(mixed)


def test_a_parallel_file_from_before_it_had_its_own_result_loads_as_one():
    """``tests/bench/data/bench_parallel_before_kind.json`` was written by chatphase at f0d4e74 (a sweep's
    ``SweepResult`` holding parallel cells, no ``kind``, no ``version``), ``….table.txt`` and ``….md`` are that
    chatphase's table and Markdown of it: it loads as the parallel sweep's result, overlays, renders the same
    text, and saves again with its kind and version."""
    data = Path(__file__).parent / "data"
    path = data / "bench_parallel_before_kind.json"
    old = json.loads(path.read_text())
    assert "kind" not in old and old["results"] == [] and len(old["parallel"]) == 2
    loaded = load_bench_result(path)
    assert isinstance(loaded, ParallelResult) and [c.n_seq for c in loaded.parallel] == [1, 2]
    assert [c.to_dict() for c in loaded.parallel] == old["parallel"] and len(loaded.parallel_samples) == 4
    assert loaded.display_label() == "tiny-parallel-fixture"
    assert render(loaded, "table") == (data / "bench_parallel_before_kind.table.txt").read_text(encoding="utf-8")
    assert render(loaded, "md") == (data / "bench_parallel_before_kind.md").read_text(encoding="utf-8")
    again = json.loads(loaded.to_json())
    assert (again["kind"], again["version"]) == ("parallel", SCHEMA_VERSION) and again["parallel"] == old["parallel"]


def test_table_markdown_and_plot(tmp_path):
    result = _result()
    table = render(result, "table")
    assert "aggregate tok/s mean ± sd" in table and "step GFLOP" in table and "S_TG" in table
    assert "gen 4 steps" in table and "N=2: a step reads" in table
    md = render(result, "md")
    assert md.startswith("### chatphase bench") and "| prompt tok | N |" in md
    assert write_parallel_plot([result, result], tmp_path / "p.svg").stat().st_size > 1000
