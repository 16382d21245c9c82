"""The parallel-decode sweep as one benchmark run (``chatphase bench --parallel``, the Experiments screen).

:class:`ParallelRun` runs a :class:`~chatphase.bench.parallel.sweep.ParallelPlan`. Steps: build the engine, validate the plan (locally against ``n_ctx``: N sequences of
prompt + generation must fit; nothing has run yet), measure the machine's peaks (local only: they do
not bound a server), load, run the :class:`~chatphase.bench.parallel.sweep.ParallelSweep` and assemble the
:class:`~chatphase.bench.parallel.result.ParallelResult` (its cells and the per-N roofline).

Locally the engine is a :class:`~chatphase.engine.local.batched.BatchedEngine` with ``n_seq_max`` = the largest
N. An engine without ``run_batch`` is a server's: after connecting, the plan is cut to the server's slots
(said in a :class:`~chatphase.bench.core.events.BenchNotice`) and one more engine is loaded per concurrent
stream (:mod:`chatphase.bench.parallel.remote`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from chatphase.bench.core.contract import validate_plan
from chatphase.bench.core.events import BenchEvent, BenchNotice, BenchStatus, RunDone, load_engine, system_facts
from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder
from chatphase.bench.core.run import ModelRun, gpu_note, model_record, roofline_inputs, settings_record
from chatphase.bench.parallel.remote import RemoteStreams, fit_plan_to_server
from chatphase.bench.parallel.result import ParallelResult
from chatphase.bench.parallel.roofline import build_parallel_roofline
from chatphase.bench.parallel.sweep import LocalBatches, ModelFacts, ParallelDone, ParallelPlan, ParallelSweep
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import LoadedModel
from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.roofline import weight_bytes_per_token


def make_run(
    info: ModelInfo, config: EngineConfig, plan: ParallelPlan, roofline: bool, log_path: str | None, **options
) -> ParallelRun:
    """The child's run of a parallel job (:func:`~chatphase.bench.experiments.job_for`)."""
    return ParallelRun(info, config, plan, roofline=roofline, log_path=log_path, **options)


class ParallelRun(ModelRun):
    """The parallel-decode sweep; iterate to run it (blocking), :meth:`cancel` from any thread. Arguments as
    :class:`~chatphase.bench.core.run.ModelRun`'s, ``plan`` a :class:`ParallelPlan`; an engine without
    ``run_batch`` (a remote server's) is built once per concurrent stream.

    Raises (while iterating):
        UsageError: the plan does not fit (before any work; for a server, after connecting).
        EngineError: the model fails to load or a run fails.
    """

    plan: ParallelPlan

    def __iter__(self) -> Iterator[BenchEvent]:
        return run_parallel(self, self.plan)


def run_parallel(bench, plan: ParallelPlan) -> Iterator[BenchEvent]:
    """Run ``plan`` for ``bench`` (a :class:`ParallelRun`); yields its events.

    Raises:
        UsageError: the plan does not fit (before any work; for a server, after connecting).
        EngineError: the model fails to load or a run fails.
    """
    config = replace(bench.config, n_seq_max=max(plan.n_seqs) if plan.n_seqs else 1)
    engine = bench.make_engine(config, batched=True)
    engines = [engine]
    local = hasattr(engine, "run_batch")
    try:
        plan = validate_plan(plan, config.n_ctx_before_load, config.n_batch) if local else validate_plan(plan, None)
        peaks = (yield from bench.peaks()) if local else None
        yield BenchStatus(f"loading {bench.info.name}")
        bench.attach(engine=engine)
        loaded = load_engine(engine)
        notes: tuple[str, ...] = ()
        runner: LocalBatches | RemoteStreams
        if local:
            runner = LocalBatches(engine)
        else:
            plan, notes = fit_plan_to_server(plan, loaded)
            for note in notes:
                yield BenchNotice(note)
            if max(plan.n_seqs) > 1:
                yield BenchStatus(f"opening {max(plan.n_seqs)} streams")
            for _ in range(max(plan.n_seqs) - 1):
                engines.append(bench.make_engine(config, batched=True))
                load_engine(engines[-1])
            runner = RemoteStreams(engines)
        builder = bench.builder or PromptBuilder(EngineTokenizer(engine))
        info = loaded.info
        facts = ModelFacts(weight_bytes_per_token(info), info.n_params, loaded.kv_bytes_per_token)
        sweep = ParallelSweep(runner, builder, plan, facts, notes)
        bench.attach(sweep=sweep)
        done: ParallelDone | None = None
        for event in sweep:
            if isinstance(event, ParallelDone):
                done = event
            else:
                yield event
    finally:
        for e in engines:
            e.close()
    assert done is not None
    yield RunDone(parallel_result(loaded, plan, done, peaks))


def parallel_result(
    loaded: LoadedModel, plan: ParallelPlan, done: ParallelDone, peaks: MachinePeaks | None
) -> ParallelResult:
    """The :class:`ParallelResult` of a parallel sweep (its cells, samples and roofline)."""
    info = loaded.info
    roofline: dict = {}
    inputs = roofline_inputs(info, loaded, peaks)
    if inputs is not None and peaks is not None and done.cells:
        weights, n_params, per_token = inputs
        roofline = build_parallel_roofline(
            peaks, weight_bytes=weights, n_params=n_params, kv_bytes_per_token=per_token, cells=done.cells,
            weight_type=info.quantization,
        )  # fmt: skip
        if note := gpu_note(loaded):  # the peaks are the CPU's: they do not bound a GPU
            roofline["parallel_verdicts"] = [f"{note}, so the bounds and percentages are not meaningful"]
    return ParallelResult(
        model=model_record(info),
        settings=settings_record(loaded, plan.to_dict(), done.notes),
        system=system_facts(loaded),
        roofline=roofline,
        cancelled=done.cancelled,
        parallel=list(done.cells),
        parallel_samples=list(done.samples),
    )
