"""The interference experiment as one run (``chatphase bench --interference``, the Experiments screen's tab).

Steps: validate the plan against the context (nothing has run yet), measure the machine's peaks, load an
:class:`~chatphase.engine.local.interference.InterferenceEngine` with ``n_seq_max`` = N + 1 and a unified KV cache
(``kv_unified``: a per-sequence cache would split every mixed batch per sequence), then run every policy, the policies
interleaved within each repetition, and assemble the :class:`~chatphase.bench.interference.result.InterferenceResult`.

Events: :class:`~chatphase.bench.core.events.BenchStatus`, a :class:`LaneUpdate` at most every
:data:`LANE_UPDATE_S` seconds while a run goes (its steps since the last one: the live swim lanes, never one message
per token), an :class:`InterferenceProgress` per run, then one :class:`~chatphase.bench.core.events.RunDone`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from chatphase.bench.core.contract import validate_plan
from chatphase.bench.core.events import BenchStatus, RunDone, load_engine, system_facts
from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder
from chatphase.bench.core.run import ModelRun, gpu_note, model_record, roofline_inputs, settings_record
from chatphase.bench.interference.analysis import InterferenceSample, analyse, policy_rows
from chatphase.bench.interference.plan import InterferencePlan, policy_name
from chatphase.bench.interference.remote import (
    SERVER_POLICY,
    RemoteInterference,
    fit_to_server,
    server_batching,
    stream_cap,
)
from chatphase.bench.interference.result import InterferenceResult
from chatphase.bench.interference.roofline import build_interference_roofline
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import LoadedModel
from chatphase.engine.interference import InterferenceOutcome, InterferenceRequest, StepRecord
from chatphase.errors import EngineError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.units import DASH

#: the least time between two :class:`LaneUpdate` s of one run (seconds).
LANE_UPDATE_S = 0.25


@dataclass(frozen=True)
class LaneUpdate:
    """Steps of the run going on since the last update: ``policy`` (``None`` = whole), ``rep`` (counted from 0,
    warm-ups first), ``n_running``, ``t_start_ns`` (the run's start: lane times are drawn from it), ``arrival_ns``
    (0 before the newcomer arrived) and ``steps``. ``first`` marks a run's first update (the lanes start afresh)."""

    policy: int | None
    rep: int
    n_running: int
    t_start_ns: int
    steps: tuple[StepRecord, ...]
    first: bool = False


@dataclass(frozen=True)
class InterferenceProgress:
    """One run of one policy ended: the ``done_runs``-th of ``total_runs``."""

    done_runs: int
    total_runs: int
    sample: InterferenceSample

    @property
    def counted(self) -> bool:
        """Not a warm-up."""
        return not self.sample.warmup

    def line(self) -> tuple[str, str]:
        """``(label, figures)`` for the CLI's progress and the tab's status line."""
        s = self.sample
        p50, p99, top = s.itl_ms
        rep = f"warm-up {s.rep + 1}" if s.warmup else f"rep {s.rep + 1}"
        ttft = DASH if s.newcomer_ttft_ms is None else f"{s.newcomer_ttft_ms:.0f} ms"
        itl = DASH if top is None else f"{p50:.1f}/{p99:.1f}/{top:.1f} ms"
        return f"{policy_name(s.chunk)} {rep}", f"ITL p50/p99/max {itl}, newcomer TTFT {ttft}"


def make_run(
    info: ModelInfo, config: EngineConfig, plan: InterferencePlan, roofline: bool, log_path: str | None, **options
) -> InterferenceRun:
    """The child's run of an interference job (:class:`~chatphase.bench.core.job.ExperimentJob`)."""
    return InterferenceRun(info, config, plan, roofline=roofline, log_path=log_path, **options)


class InterferenceRun(ModelRun):
    """The interference experiment; iterate to run it (blocking), :meth:`cancel` from any thread. Arguments as
    :class:`~chatphase.bench.core.run.ModelRun`'s, ``plan`` an :class:`InterferencePlan`.

    Raises (while iterating):
        UsageError: the plan does not fit (before any work). EngineError: the model fails to load or a step fails.
    """

    plan: InterferencePlan

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._samples: list[InterferenceSample] = []
        self._record: tuple[LoadedModel, MachinePeaks | None] | None = None
        self._server: dict | None = None  # over --server: what it says of its batching

    def engine_config(self) -> EngineConfig:
        """The run's engine settings: N + 1 sequences, one unified KV cache."""
        return replace(self.config, n_seq_max=self.plan.n_running + 1, kv_unified=True)

    def _make(self, config: EngineConfig):
        if self._factory is not None:
            return self._factory(self.info, config)
        from chatphase.engine.local.interference import InterferenceEngine

        return InterferenceEngine(self.info, config, log_path=self._log_path)

    def partial_done(self) -> RunDone | None:
        """The runs measured so far as a cancelled result, while the run may go on in another thread; ``None`` before
        the model loaded."""
        if self._record is None:
            return None
        loaded, peaks = self._record
        samples = list(self._samples)
        return RunDone(interference_result(loaded, self.plan, samples, peaks, cancelled=True, server=self._server))

    def __iter__(self) -> Iterator[object]:
        config = self.engine_config()
        engine = self._make(config)
        local = hasattr(engine, "iter_interference")  # else a server's engine (``--server``)
        plan = (
            validate_plan(self.plan, config.n_ctx_before_load, config.n_batch)
            if local
            else validate_plan(self.plan, None)
        )
        engines = [engine]
        try:
            peaks = (yield from self.peaks()) if local else None
            yield BenchStatus(f"loading {self.info.name}")
            self.attach(engine=engine)
            loaded = load_engine(engine)
            self._record = (loaded, peaks)
            builder = self.builder or PromptBuilder(EngineTokenizer(engine))
            prompts = tuple(builder.tokens(plan.running_prompt_tokens, variant=j) for j in range(plan.n_running))
            newcomer = builder.tokens(plan.newcomer_tokens, variant=plan.n_running)
            if local:
                runs = self._local_runs(engine, plan, prompts, newcomer)
            else:
                fit_to_server(plan.n_running, plan.newcomer_tokens, plan.gen_tokens, loaded)
                yield BenchStatus(f"opening {plan.n_running + 1} streams")
                for _ in range(plan.n_running):
                    engines.append(self._make(config))
                    load_engine(engines[-1])
                self._server = server_batching(loaded.settings.server, loaded)
                runs = self._remote_runs(engines, plan, prompts, newcomer, loaded)
            yield from runs
        finally:
            for e in engines:
                e.close()
        yield RunDone(interference_result(loaded, plan, self._samples, peaks, self._cancel.is_set(), self._server))

    def _local_runs(self, engine, plan: InterferencePlan, prompts, newcomer) -> Iterator[object]:
        """Every policy, interleaved within each repetition, on the local engine."""
        for i in range(plan.warmup + plan.reps):
            for chunk in plan.policies():
                if self._cancel.is_set():
                    return
                request = InterferenceRequest(prompts, newcomer, chunk, plan.gen_tokens, plan.gen_tokens)
                outcome = yield from _follow(engine, request, i, plan.n_running)
                if not (yield from self._count(outcome, i, plan)):
                    return

    def _remote_runs(self, engines, plan: InterferencePlan, prompts, newcomer, loaded) -> Iterator[object]:
        """The server's own policy, once per repetition (:mod:`chatphase.bench.interference.remote`)."""
        runner = RemoteInterference(engines)
        self.attach(sweep=runner)
        cap = stream_cap(loaded.settings.n_ctx, plan.running_prompt_tokens)
        for i in range(plan.warmup + plan.reps):
            if self._cancel.is_set():
                return
            outcome = runner.run(prompts, newcomer, plan.gen_tokens, plan.gen_tokens, cap)
            prompt_ms = (runner.server_timings or {}).get("prompt_ms")
            if not (yield from self._count(outcome, i, plan, prompt_ms)):
                return

    def _count(self, outcome: InterferenceOutcome, i: int, plan: InterferencePlan, server_prompt_ms=None):
        """Keep ``outcome``'s sample and yield its progress (a generator returning ``False`` when the run ends).

        Raises:
            EngineError: the run failed.
        """
        if outcome.stop_reason == "error":
            raise EngineError(f"engine failed during the interference run: {outcome.error}")
        if outcome.stop_reason == "cancelled":
            self._cancel.set()
            return False
        warm = i < plan.warmup
        sample = analyse(outcome, rep=i if warm else i - plan.warmup, warmup=warm)
        if server_prompt_ms is not None:
            sample = replace(sample, server_prompt_ms=float(server_prompt_ms))
        self._samples.append(sample)
        total = plan.total_runs if outcome.chunk != SERVER_POLICY else plan.reps + plan.warmup
        yield InterferenceProgress(len(self._samples), total, sample)
        return True


def _follow(engine, request: InterferenceRequest, rep: int, n_running: int):
    """Drive one run of ``engine``, yielding a :class:`LaneUpdate` at most every :data:`LANE_UPDATE_S`; returns its
    outcome (a generator: ``outcome = yield from _follow(...)``)."""
    pending: list[StepRecord] = []
    last, first, t_start = time.monotonic(), True, 0
    for event in engine.iter_interference(request):
        if isinstance(event, InterferenceOutcome):
            if pending or first:
                yield LaneUpdate(request.chunk, rep, n_running, t_start or event.t_start_ns, tuple(pending), first)
            return event
        t_start = t_start or event.t_start_ns  # the lanes' origin: the run's first step
        pending.append(event)
        now = time.monotonic()
        if now - last >= LANE_UPDATE_S:
            yield LaneUpdate(request.chunk, rep, n_running, t_start, tuple(pending), first)
            pending, last, first = [], now, False
    raise EngineError("the engine ended an interference run without its outcome")


def interference_result(
    loaded: LoadedModel,
    plan: InterferencePlan,
    samples: list[InterferenceSample],
    peaks: MachinePeaks | None,
    cancelled: bool = False,
    server: dict | None = None,
) -> InterferenceResult:
    """The :class:`InterferenceResult` of the samples so far, with the mixed step's roofline when peaks were
    measured."""
    info = loaded.info
    roofline: dict = {}
    inputs = roofline_inputs(info, loaded, peaks)
    rows = policy_rows(samples)
    if inputs is not None and peaks is not None and rows:
        weights, n_params, per_token = inputs
        roofline = build_interference_roofline(
            peaks, weight_bytes=weights, n_params=n_params, kv_bytes_per_token=per_token, n_running=plan.n_running,
            context_tokens=plan.running_prompt_tokens + plan.gen_tokens, rows=rows,
            newcomer_tokens=plan.newcomer_tokens, weight_type=info.quantization,
        )  # fmt: skip
        if note := gpu_note(loaded):
            roofline["interference_lines"] = [f"{note}, so the bounds are not meaningful"]
    notes = (
        []
        if server
        else [
            "KV cache unified (kv_unified): with a cache per sequence llama.cpp splits a mixed batch so that one prompt "
            "token rides with the decode tokens per physical batch",
            f"a step above n_ubatch {loaded.settings.n_ubatch} tokens runs as several physical batches (sub-batches), "
            "each reading the weights again",
        ]
    )
    if server:
        notes.append(server_line(server))
    settings = settings_record(loaded, plan.to_dict(), notes)
    if server:
        settings["server_batching"] = server
    return InterferenceResult(
        model=model_record(info),
        settings=settings,
        system=system_facts(loaded),
        roofline=roofline,
        cancelled=cancelled,
        samples=list(samples),
    )


def server_line(server: dict) -> str:
    """What the server said of its batching, and what it did not, in one sentence."""
    slots = server.get("total_slots")
    said = [f"{slots} slots" if slots is not None else "slots: not reported"]
    if server.get("n_ctx_per_slot"):
        said.append(f"{server['n_ctx_per_slot']:,} tokens of context per slot")
    listed = server.get("slots")
    said.append(f"/slots lists {listed}" if listed is not None else "/slots: not served")
    return (
        f"the server ({server.get('server_kind') or 'server'}) reports {', '.join(said)}; it does not expose "
        f"{', '.join(server.get('not_exposed', []))} — its chunk is its n_batch (llama-server's -b) less the running "
        "streams' tokens"
    )
