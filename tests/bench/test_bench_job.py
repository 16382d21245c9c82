"""The benchmark in a child process (what the Experiments screen runs): events, cancel, bad plans."""

from __future__ import annotations

import pytest

from chatphase.bench.core.job import BenchFailed
from chatphase.bench.experiments import job_for
from chatphase.bench.parallel.records import ParallelSample
from chatphase.bench.parallel.sweep import ParallelPlan
from chatphase.bench.sweep.loop import SweepPlan, SweepProgress
from chatphase.bench.sweep.run import BenchStatus, RunDone
from chatphase.engine.config import EngineConfig
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import ModelInfo


def test_job_runs_in_a_child_and_returns_the_result(default_model_info, tmp_path):
    plan = SweepPlan(prompt_lengths=(16, 48), depths=(), gen_tokens=3, reps=1, warmup=0)
    job = job_for(
        default_model_info,
        EngineConfig(n_ctx=128, n_threads=1),
        plan,
        roofline=False,
        log_path=str(tmp_path / "engine.log"),
    )
    events = list(job.events())
    assert isinstance(events[0], BenchStatus)
    assert [e.done_runs for e in events if isinstance(e, SweepProgress)] == [1, 2]
    done = events[-1]
    assert isinstance(done, RunDone) and not done.result.cancelled
    assert [c.prompt_tokens for c in done.result.results] == [16, 48]
    assert (tmp_path / "engine.log").exists()  # llama.cpp's output went to the log, not the terminal


def test_parallel_sweep_runs_in_a_child(default_model_info, tmp_path):
    plan = ParallelPlan(n_seqs=(1, 3), prompt_lengths=(16,), gen_tokens=3, reps=1, warmup=0)
    job = job_for(
        default_model_info, EngineConfig(n_ctx=256, n_threads=1), plan, roofline=False, log_path=str(tmp_path / "e.log")
    )
    events = list(job.events())
    samples = [e.sample for e in events if isinstance(e, SweepProgress)]
    assert [s.n_seq for s in samples] == [1, 3] and all(isinstance(s, ParallelSample) for s in samples)
    done = events[-1]
    assert isinstance(done, RunDone) and [c.n_seq for c in done.result.parallel] == [1, 3]
    assert done.result.parallel[1].kv_cache_bytes == 3 * (16 + 3) * default_model_info.kv_bytes_per_token
    with pytest.raises(UsageError, match="n_ctx 256 holds 13 such"):
        job_for(
            default_model_info, EngineConfig(n_ctx=256), ParallelPlan(n_seqs=(16,), prompt_lengths=(16,), gen_tokens=3)
        )


def test_cancel_ends_with_partial_results(default_model_info, tmp_path):
    plan = SweepPlan(prompt_lengths=(16, 32, 48, 64), depths=(), gen_tokens=3, reps=3, warmup=0)
    job = job_for(
        default_model_info, EngineConfig(n_ctx=128, n_threads=1), plan, roofline=False, log_path=str(tmp_path / "e.log")
    )
    events = []
    for ev in job.events():
        events.append(ev)
        if isinstance(ev, SweepProgress):
            job.cancel()
    done = events[-1]
    assert isinstance(done, RunDone) and done.result.cancelled
    assert sum(c.reps for c in done.result.results) < 12


def test_bad_plan_is_refused_before_starting(default_model_info):
    with pytest.raises(UsageError, match="below n_ctx"):
        job_for(default_model_info, EngineConfig(n_ctx=64), SweepPlan(prompt_lengths=(64,)))


def test_unloadable_model_reports_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    info = ModelInfo(
        path=str(bad),
        name="bad",
        architecture="llama",
        n_params=1,
        size_bytes=68,
        n_layer=1,
        quantization="F16",
        n_ctx_train=128,
        kv_bytes_per_token=None,
        has_chat_template=False,
    )
    job = job_for(
        info,
        EngineConfig(n_ctx=64),
        SweepPlan(prompt_lengths=(8,), depths=()),
        roofline=False,
        log_path=str(tmp_path / "e.log"),
    )
    last = list(job.events())[-1]
    assert isinstance(last, BenchFailed) and "\n" not in last.message


def test_a_child_that_dies_is_reported_not_hung(default_model_info, tmp_path):
    import os
    import signal

    plan = SweepPlan(prompt_lengths=(16, 32, 48, 64), depths=(), gen_tokens=3, reps=3, warmup=0)
    job = job_for(
        default_model_info, EngineConfig(n_ctx=128, n_threads=1), plan, roofline=False, log_path=str(tmp_path / "e.log")
    )
    events = []
    for ev in job.events():
        events.append(ev)
        if len(events) == 1:
            os.kill(job.pid, signal.SIGKILL)
    assert isinstance(events[-1], BenchFailed) and "died" in events[-1].message
