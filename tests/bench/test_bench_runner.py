"""The sweep: requests it sends, warm-ups, depth priming, aggregation, cancel, failures; one real sweep."""

from __future__ import annotations

import json

import pytest
from bench_support import CharTokenizer, ScriptedTokenEngine
from fake_engine import fake_model_info

from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.core.results import SweepResult
from chatphase.bench.sweep.loop import Sweep, SweepDone, SweepPlan, SweepProgress
from chatphase.bench.sweep.run import BenchStatus, RunDone, SweepRun
from chatphase.engine.config import EngineConfig
from chatphase.errors import EngineError, UsageError

PLAN = SweepPlan(prompt_lengths=(10, 50), depths=(0, 100), gen_tokens=5, reps=2, warmup=1, extend_tokens=4)


def run(plan=PLAN, engine=None):
    engine = engine or ScriptedTokenEngine()
    events = list(Sweep(engine, PromptBuilder(CharTokenizer()), plan))
    return engine, events


def test_requests_follow_the_method():
    engine, _ = run()
    reqs = engine.requests
    # prompt cells: 3 cold turns each of exactly L tokens; depth 0: 3 cold turns of 4 tokens;
    # depth 100: 3 × (prime 100 tokens with max_tokens=1, then 104 tokens reusing the cache)
    assert [len(r.prompt_token_ids) for r in reqs] == [10] * 3 + [50] * 3 + [4] * 3 + [100, 104] * 3
    assert all(r.ignore_eos and r.sampling.temperature == 0 for r in reqs)
    assert [r.reset_cache for r in reqs[9:]] == [True, False] * 3
    assert [r.sampling.max_tokens for r in reqs[9:]] == [1, 5] * 3
    assert all(r.reset_cache and r.sampling.max_tokens == 5 for r in reqs[:9])
    for prime, measured in zip(reqs[9::2], reqs[10::2], strict=False):
        assert measured.prompt_token_ids[:100] == prime.prompt_token_ids
    assert len({r.turn_id for r in reqs}) == len(reqs)


def test_progress_then_done_with_warmups_not_counted():
    _, events = run()
    progress = [e for e in events if isinstance(e, SweepProgress)]
    assert [p.done_runs for p in progress] == list(range(1, 13)) and progress[-1].total_runs == PLAN.total_runs == 12
    assert sum(p.sample.warmup for p in progress) == 4
    done = events[-1]
    assert isinstance(done, SweepDone) and not done.cancelled
    assert [(c.kind, c.prompt_tokens, c.depth, c.reps) for c in done.cells] == [
        ("prompt", 10, 0, 2),
        ("prompt", 50, 0, 2),
        ("depth", 4, 0, 2),
        ("depth", 104, 100, 2),
    ]


def test_cells_hold_the_engine_metrics_exactly():
    _, events = run()
    cells = {(c.kind, c.depth, c.prompt_tokens): c for c in events[-1].cells}
    c10 = cells[("prompt", 0, 10)]
    assert c10.ttft_ms.mean == pytest.approx(5 + 10 * 1.0) and c10.ttft_ms.sd == 0  # fixed 5 ms + 1 ms/token
    assert c10.prefill_tokens_per_s.mean == pytest.approx(1000.0)
    deep = cells[("depth", 100, 104)]
    assert deep.ttft_ms.mean == pytest.approx(5 + 4 * 1.0)  # only the 4 new tokens are evaluated
    assert deep.decode_tokens_per_s.mean < cells[("depth", 0, 4)].decode_tokens_per_s.mean
    # decode at depth 100: gaps 10 ms + 0.01 ms × cache length (105..108 tokens)
    gaps = [10 + 0.01 * n for n in (105, 106, 107, 108)]
    assert deep.tpot_ms.mean == pytest.approx(sum(gaps) / 4)
    assert deep.kv_cache_bytes == 100 * (104 + 4)
    samples = [e.sample for e in events if isinstance(e, SweepProgress) and e.sample.depth == 100]
    assert {s.cached_tokens for s in samples} == {100}


def test_cancel_gives_partial_results():
    engine = ScriptedTokenEngine()
    sweep = Sweep(engine, PromptBuilder(CharTokenizer()), PLAN)
    events = []
    for ev in sweep:
        events.append(ev)
        if isinstance(ev, SweepProgress) and ev.done_runs == 5:  # cell 10: 1 warm-up + 2; cell 50: 1 + 1
            sweep.cancel()
    done = events[-1]
    assert done.cancelled and engine.cancelled
    assert [(c.prompt_tokens, c.reps) for c in done.cells] == [(10, 2), (50, 1)]
    assert len(engine.requests) == 5


def test_a_turn_cancelled_inside_the_engine_ends_the_sweep():
    engine = ScriptedTokenEngine(cancel_after=2)
    events = list(Sweep(engine, PromptBuilder(CharTokenizer()), PLAN))
    assert len(engine.requests) == 3 and [c.reps for c in events[-1].cells] == [1]


def test_engine_failure_raises_engine_error():
    with pytest.raises(EngineError, match="scripted failure"):
        run(engine=ScriptedTokenEngine(fail_on_turn=2))


@pytest.mark.parametrize(
    "plan,match",
    [
        (SweepPlan(reps=0), "--reps must be at least 1"),
        (SweepPlan(warmup=-1), "--warmup"),
        (SweepPlan(gen_tokens=0), "--gen"),
        (SweepPlan(prompt_lengths=(), depths=()), "nothing to measure"),
        (SweepPlan(prompt_lengths=(512,)), "must be below n_ctx 512"),
        (SweepPlan(prompt_lengths=(500,), gen_tokens=32), "exceed n_ctx 512"),
        (SweepPlan(prompt_lengths=(0,)), "at least 1 token"),
        (SweepPlan(prompt_lengths=(8,), depths=(480,), gen_tokens=32), "depth 480"),
        (SweepPlan(prompt_lengths=(8,), depths=(-1,)), "0 or more"),
    ],
)
def test_plan_validation(plan, match):
    with pytest.raises(UsageError, match=match):
        plan.validate(512)


def test_bench_run_with_a_fake_engine_builds_the_result():
    plan = SweepPlan(prompt_lengths=(10, 20, 40), depths=(0, 50), gen_tokens=3, reps=2, warmup=0)
    engine = ScriptedTokenEngine()
    run_ = SweepRun(
        fake_model_info(),
        EngineConfig(n_ctx=256),
        plan,
        engine_factory=lambda i, s: engine,
        roofline=False,
        builder=PromptBuilder(CharTokenizer()),
    )
    events = list(run_)
    assert isinstance(events[0], BenchStatus) and isinstance(events[-1], RunDone)
    res = events[-1].result
    assert engine.closed
    fit = res.fits["ttft_ms_vs_prompt_tokens"]
    assert fit["intercept"] == pytest.approx(5) and fit["slope"] == pytest.approx(1) and fit["r2"] == pytest.approx(1)
    assert res.fits["decode_tokens_per_s_vs_depth"]["slope"] < 0
    assert res.settings["plan"]["reps"] == 2 and res.settings["engine"]["n_ctx"] == 4096
    assert SweepResult.from_dict(json.loads(res.to_json())) == res


@pytest.mark.parametrize(
    "offloaded,quantization,expect,prefill",
    [
        (0, "F32", "too small for the bound to bind", "too small for the bound to bind"),
        (0, "Q4_1", "too small for the bound to bind", "prefill: no bound for Q4_1 weights"),  # not float32
        (31, "Q4_1", "GPU", "GPU"),
    ],
)
def test_bench_run_roofline_verdicts(offloaded, quantization, expect, prefill):
    from chatphase.bench.core.peaks import MachinePeaks

    plan = SweepPlan(prompt_lengths=(10, 20), depths=(0,), gen_tokens=3, reps=1, warmup=0)
    engine = ScriptedTokenEngine(layers_offloaded=offloaded)
    res = list(
        SweepRun(
            fake_model_info(quantization=quantization),
            EngineConfig(n_ctx=256),
            plan,
            engine_factory=lambda i, s: engine,
            builder=PromptBuilder(CharTokenizer()),
            peaks=MachinePeaks(1e12, "bw", 1e15, "mm"),
        )
    )[-1].result
    assert expect in res.roofline["decode_verdict"] and prefill in res.roofline["prefill_verdict"]
    assert (res.roofline["prefill_bound_tokens_per_s"] is None) == (quantization != "F32")
    assert res.roofline["bandwidth_method"] == "bw" and len(res.roofline["cells"]) == 3


def test_bench_run_validates_before_any_work():
    engine = ScriptedTokenEngine()
    run_ = SweepRun(
        fake_model_info(),
        EngineConfig(n_ctx=64),
        SweepPlan(prompt_lengths=(64,)),
        engine_factory=lambda i, s: engine,
        builder=PromptBuilder(CharTokenizer()),
    )
    with pytest.raises(UsageError):
        next(iter(run_))
    assert engine.requests == []


def test_real_sweep_ttft_grows_with_the_prompt(default_model_info):
    """A small real sweep on the bundled model: 32 and 256 tokens, 2 reps, and a depth run reusing the cache."""
    plan = SweepPlan(prompt_lengths=(32, 256), depths=(128,), gen_tokens=4, reps=2, warmup=0)
    events = list(SweepRun(default_model_info, EngineConfig(n_ctx=512, n_threads=1), plan, roofline=False))
    res = events[-1].result
    cells = {(c.kind, c.prompt_tokens): c for c in res.results}
    short, long_ = cells[("prompt", 32)], cells[("prompt", 256)]
    assert short.reps == long_.reps == 2
    assert long_.ttft_ms.mean > short.ttft_ms.mean
    assert long_.kv_cache_bytes > short.kv_cache_bytes > 0
    deep = [s for s in res.samples if s.kind == "depth"]
    assert deep and all(s.cached_tokens == 128 and s.prefill_tokens == 4 for s in deep)
    assert all(s.decode_tokens == 4 and s.stop_reason == "length" for s in res.samples)
