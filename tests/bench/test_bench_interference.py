"""``chatphase bench --interference``: the accounting with scripted step times, the plan and the CLI's bad inputs,
the run with a scripted engine, and a tiny real run on the default model (marker ``model``)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from bench_support import CharTokenizer, ScriptedBatchEngine
from fake_engine import fake_model_info

from chatphase.bench.core.events import RunDone
from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.experiments import EXPERIMENTS, load_result
from chatphase.bench.interference.analysis import analyse, percentiles_ms, policy_rows, stall
from chatphase.bench.interference.plan import InterferencePlan
from chatphase.bench.interference.result import CSV_COLUMNS, InterferenceResult
from chatphase.bench.interference.run import InterferenceProgress, InterferenceRun, LaneUpdate
from chatphase.cli import main
from chatphase.engine.config import EngineConfig
from chatphase.engine.interference import InterferenceOutcome, InterferenceRequest, StepRecord
from chatphase.errors import UsageError
from chatphase.models.roofline import weight_bytes_per_token

MS = 1_000_000  # ns


def scripted(chunk: int | None, prompt_step_ms: int, n_prompt_steps: int, *, n: int = 2, decode_ms: int = 10,
             before: int = 3, after: int = 2) -> InterferenceOutcome:  # fmt: skip
    """An outcome with scripted step times: ``before`` decode steps of ``decode_ms``, the newcomer's prompt in
    ``n_prompt_steps`` steps of ``prompt_step_ms`` (the running streams decode in them unless ``chunk`` is None), then
    ``after`` steps of all. The prefill of the running prompts ends at 100 ms (their first tokens)."""
    t = 100 * MS
    lanes: list[list[int]] = [[t] for _ in range(n)] + [[]]
    steps = []

    def step(ms, decoded, decode_tokens, prompt_tokens):
        nonlocal t
        start, t = t, t + ms * MS
        for j in decoded:
            lanes[j].append(t)
        steps.append(StepRecord(len(steps), start, t, tuple(decoded), decode_tokens, prompt_tokens))

    for _ in range(before):
        step(decode_ms, range(n), n, 0)
    arrival = t
    for k in range(n_prompt_steps):
        last = k == n_prompt_steps - 1
        running = [] if chunk is None else list(range(n))
        step(prompt_step_ms, [*running, n] if last else running, len(running), chunk or 64)
    for _ in range(after):
        step(decode_ms, range(n + 1), n + 1, 0)
    return InterferenceOutcome(n, 128, chunk, 0, arrival, tuple(tuple(x) for x in lanes), tuple(steps), "length")


def test_whole_prompt_first_stalls_every_stream_for_the_whole_prefill():
    s = analyse(scripted(None, prompt_step_ms=200, n_prompt_steps=2))
    # arrival at 130 ms; the prefill runs 130-530; the streams' next token comes with the step after it, at 540
    assert s.baseline_gaps_ms == (10.0,) * 6
    assert s.window_gaps_ms == (410.0, 410.0)  # the gap from 130 to 540, in each stream
    assert s.newcomer_ttft_ms == 400.0
    assert stall(s.baseline_gaps_ms, s.window_gaps_ms) == (400.0, 41.0)
    # every token after the arrival: 2 steps × 3 lanes, plus the newcomer's first; over 130 -> 550 ms
    assert s.aggregate_decode_tokens_per_s == pytest.approx(7 / 0.420)
    assert s.prompt_steps == 2 and s.prompt_step_ms == 200.0
    assert s.timeline is not None and s.timeline.arrival_ms == 130.0 and len(s.timeline.blocks) == 2


def test_chunked_mixed_steps_shorten_the_stall_and_delay_the_first_token():
    s = analyse(scripted(16, prompt_step_ms=40, n_prompt_steps=8))
    assert s.window_gaps_ms == (40.0,) * 16  # each mixed step is a gap of each stream; the next step's not
    assert s.newcomer_ttft_ms == 320.0
    assert stall(s.baseline_gaps_ms, s.window_gaps_ms) == (30.0, 4.0)
    assert s.itl_ms == (40.0, 40.0, 40.0)


def test_percentiles_keep_every_gap_not_a_mean():
    gaps = [10.0] * 99 + [500.0]
    p50, p99, top = percentiles_ms(gaps)
    assert p50 == 10.0 and top == 500.0
    assert p99 == pytest.approx(10.0 + 0.01 * 490.0)  # linear between the 99th and 100th ranks
    assert percentiles_ms([]) == (None, None, None)


def test_policy_rows_pool_the_counted_runs_gaps():
    a = analyse(scripted(16, 40, 8), rep=0)
    b = analyse(scripted(16, 60, 8), rep=1)
    warm = analyse(scripted(16, 900, 8), warmup=True)
    (row,) = policy_rows([warm, a, b])
    assert row.runs == 2 and row.itl_ms_max == 60.0 and row.stall_ms == 50.0
    assert row.newcomer_ttft_ms.mean == pytest.approx((320 + 480) / 2)


def test_result_round_trips_through_the_registry(tmp_path):
    samples = [analyse(scripted(None, 200, 2)), analyse(scripted(16, 40, 8))]
    result = InterferenceResult(model={"name": "m"}, settings={"plan": InterferencePlan().to_dict()}, samples=samples)
    path = tmp_path / "r.json"
    path.write_text(result.to_json())
    back = load_result(path)
    assert isinstance(back, InterferenceResult) and back.samples == samples
    assert json.loads(path.read_text())["kind"] == "interference" and EXPERIMENTS["interference"].plot is not None
    assert back.to_csv().splitlines()[0].split(",") == list(CSV_COLUMNS)
    table = back.render("table")
    assert "whole" in table and "chunk 16" in table and "trade-off" in table


@pytest.mark.parametrize(
    "plan,n_ctx,n_batch,match",
    [
        (InterferencePlan(n_running=0), 4096, 256, "N must be 1"),
        (InterferencePlan(chunks=(0,)), 4096, 256, "--chunks: a chunk is 1 token"),
        (InterferencePlan(newcomer_tokens=1), 4096, 256, "2 tokens or more"),
        (InterferencePlan(n_running=4, chunks=(253,)), 4096, 256, "= 257, over n_batch 256"),
        (InterferencePlan(newcomer_tokens=4000), 4096, 256, "raise --n-ctx"),
        (InterferencePlan(n_running=8, chunks=()), 4096, 8, "decodes 9 tokens, over n_batch 8"),
    ],
)
def test_plans_that_do_not_fit_are_refused_in_one_line(plan, n_ctx, n_batch, match):
    with pytest.raises(UsageError, match=match):
        plan.validate(n_ctx, n_batch)


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--interference", "0"], "N must be 1"),
        (["--interference", "4", "--chunks", "300"], "over n_batch 256"),
        (["--interference", "2", "--parallel", "2"], "--parallel does not apply to --interference"),
        (["--interference", "2", "--prompt-lengths", "64,128"], "one --prompt-lengths value"),
        (["--interference", "2", "--format", "yaml"], "unknown --format 'yaml'"),
        (["--interference", "2", "--plot", "x.pdf"], ".svg or .png"),
        (["--interference", "2", "--server", "http://127.0.0.1:9", "--chunks", "8"], "--chunks does not apply over"),
        (["--interference", "2", "--threads", "1,2"], "a lever grid"),
        (["--parallel", "2", "--chunks", "8"], "--chunks applies to --interference"),
    ],
)
def test_cli_bad_inputs_exit_2_with_one_line(capsys, argv, match):
    assert main(["bench", "--model", "/nonexistent/model.gguf", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1 and "Traceback" not in err


class ScriptedEngine(ScriptedBatchEngine):
    """An interference engine whose runs are :func:`scripted` outcomes (whole: 2 steps of 200 ms, chunked: 8 of 40)."""

    def iter_interference(self, request: InterferenceRequest):
        self.requests.append(request)
        outcome = scripted(request.chunk, 200 if request.chunk is None else 40, 2 if request.chunk is None else 8)
        if self.cancelled:
            outcome = replace(outcome, stop_reason="cancelled")
        yield from outcome.steps
        yield outcome


PEAKS = MachinePeaks(20e9, "scripted copy", 1000e9, "scripted matmul")  # machine balance 50 FLOP/byte


def _run(plan, engine, cancel_at=None):
    configs = []

    def factory(info, config):
        configs.append(config)
        return engine

    run = InterferenceRun(engine.info, EngineConfig(n_ctx=4096), plan, engine_factory=factory, peaks=PEAKS,
                          builder=PromptBuilder(CharTokenizer()))  # fmt: skip
    events = []
    for event in run:
        events.append(event)
        if cancel_at is not None and isinstance(event, InterferenceProgress) and event.done_runs == cancel_at:
            run.cancel()
    return events, configs


def test_the_run_interleaves_the_policies_and_ends_with_the_roofline():
    plan = InterferencePlan(n_running=2, newcomer_tokens=128, chunks=(16, 64), gen_tokens=3, reps=2, warmup=1)
    engine = ScriptedEngine(info=fake_model_info(quantization="F32"))  # float32 weights: an arithmetic bound
    events, configs = _run(plan, engine)
    assert configs[0].n_seq_max == 3 and configs[0].kv_unified  # one context, a unified KV cache
    assert [r.chunk for r in engine.requests] == [None, 64, 16] * 3
    assert len({r.newcomer for r in engine.requests}) == 1 and len(set(engine.requests[0].prompts)) == 2
    progress = [e for e in events if isinstance(e, InterferenceProgress)]
    assert [p.done_runs for p in progress] == list(range(1, 10)) and progress[0].sample.warmup
    lanes = [e for e in events if isinstance(e, LaneUpdate)]
    assert len(lanes) == 9 and all(u.first for u in lanes)  # scripted runs are instant: one update per run
    assert sum(len(u.steps) for u in lanes[:1]) == 3 + 2 + 2  # before, the whole prompt's 2 pieces, after
    result = events[-1].result
    assert isinstance(events[-1], RunDone) and not result.cancelled
    assert [r.runs for r in result.rows()] == [2, 2, 2]
    roof = result.roofline
    # C* = F × bytes / (B × 2 × params) − N: the weights + 2 streams × 100 B × (64 prompt + 3 steps) of KV
    weights = weight_bytes_per_token(fake_model_info())
    assert roof["crossover_prompt_tokens"] == pytest.approx(50 * (weights + 2 * 100 * 67) / (2 * 134_515_008) - 2)
    assert [c["bound_by"] for c in roof["interference_cells"]] == ["arithmetic", "arithmetic", "memory bandwidth"]
    assert any(line.startswith("mixed step:") for line in roof["interference_lines"])


def test_cancel_keeps_the_runs_measured_so_far():
    plan = InterferencePlan(n_running=2, newcomer_tokens=128, chunks=(16,), gen_tokens=3, reps=3, warmup=0)
    events, _ = _run(plan, ScriptedEngine(), cancel_at=2)
    result = events[-1].result
    assert result.cancelled and len(result.samples) == 2


def test_a_plot_draws_the_trade_off_and_the_swim_lanes(tmp_path):
    pytest.importorskip("matplotlib")
    from chatphase.bench.interference.plot import write_interference_plot

    plan = InterferencePlan(n_running=2, newcomer_tokens=128, chunks=(16, 64), gen_tokens=3, reps=1, warmup=0)
    result = _run(plan, ScriptedEngine())[0][-1].result
    path = write_interference_plot([result], tmp_path / "i.svg")
    svg = path.read_text()
    assert "Swim lanes: whole" in svg and "Swim lanes: chunk 16" in svg and "newcomer TTFT" in svg


@pytest.mark.model
def test_real_run_on_the_default_model(default_model_info, tmp_path):
    plan = InterferencePlan(n_running=2, newcomer_tokens=40, chunks=(8,), gen_tokens=2, reps=1, warmup=0,
                            running_prompt_tokens=8)  # fmt: skip
    config = EngineConfig(n_ctx=256, n_batch=32, n_ubatch=16, n_threads=1)
    run = InterferenceRun(default_model_info, config, plan, roofline=False, log_path=str(tmp_path / "engine.log"))
    events = list(run)
    result = events[-1].result
    assert not result.cancelled and result.settings["engine"]["kv_unified"] is True
    whole, chunked = result.samples
    assert whole.chunk is None and chunked.chunk == 8
    assert whole.prompt_steps == 2 and chunked.prompt_steps == 5  # 40 tokens: 32 + 8; 5 chunks of 8
    assert chunked.sub_batches == 1 and whole.sub_batches == 2  # 2 + 8 tokens fit n_ubatch 16; 32 do not
    assert len(whole.window_gaps_ms) == 2 and len(chunked.window_gaps_ms) == 2 * 5
    for s in (whole, chunked):
        assert s.timeline is not None and [len(x) for x in s.timeline.lanes] == [1 + 2 + 5 * (s.chunk == 8) + 2] * 2 + [
            3
        ]
        assert s.newcomer_ttft_ms is not None and s.newcomer_ttft_ms > 0
