"""A lever grid run end to end (``chatphase bench`` with a comma list in a lever, :mod:`chatphase.bench.grid.levers`).

Steps: validate the plan; resolve each point's model; check that all points' engines fit in memory at
once (weights are memory-mapped, so points of one file share them; each has its own KV cache); measure
the peaks at each thread count the points use (before any engine loads); load one in-process engine per
point; then run the cells **interleaved**: in each round (warm-ups first, then ``reps`` counted rounds)
every point runs every cell once, so a change in the machine's load falls on all points alike. Results:
per point, the cells (:class:`~chatphase.bench.core.results.CellResult`) with the roofline's prediction and
the measured / predicted ratio (:class:`~chatphase.bench.grid.result.GridResult`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from chatphase.bench.core.contract import Done, validate_plan
from chatphase.bench.core.events import BenchNotice, BenchStatus, load_engine, system_facts
from chatphase.bench.core.experiment import plan_from_dict
from chatphase.bench.core.job import ExperimentJob
from chatphase.bench.core.peaks import QUIET_WAIT_S, MachinePeaks, measure_peaks
from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder
from chatphase.bench.grid.levers import GridPoint, LeverGrid, predict
from chatphase.bench.grid.result import GridCell, GridResult
from chatphase.bench.sweep.loop import Sweep, SweepPlan, SweepProgress, aggregate
from chatphase.engine.base import Engine
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import LoadedModel
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import ModelInfo, read_model_info
from chatphase.models.kv import kv_bytes_per_token, kv_capacity_bytes
from chatphase.models.resolve import resolve_model
from chatphase.models.roofline import (
    attention_flops_per_context_token,
    float32_peak_bounds,
    prefill_params,
    weight_bytes_per_token,
)

#: share of the available memory the grid's engines may take together.
MEMORY_SHARE = 0.85


@dataclass(frozen=True)
class GridProgress(SweepProgress):
    """A :class:`SweepProgress` that names the point (its :meth:`GridPoint.label`) the sample belongs to."""

    point: str = ""


@dataclass(frozen=True)
class GridDone(Done):
    """The grid is over; ``result`` holds every point's cells (``result.cancelled`` when stopped early)."""

    result: GridResult


class GridRun:
    """Run ``points`` (from :meth:`LeverGrid.points`) on ``plan``; iterate to run it, :meth:`cancel` from any
    thread. ``infos`` maps each point's model spec to its validated :class:`ModelInfo` (``None`` key: the
    default model); ``config`` the base engine settings each point overrides; ``engine_factory``,
    ``builder`` and ``peaks`` (by thread count) replace the real ones in tests.

    Raises (while iterating):
        UsageError: the plan does not fit, or the engines would not fit in memory together.
        EngineError: a model fails to load or a turn fails.
    """

    def __init__(
        self,
        points: list[GridPoint],
        infos: dict[str | None, ModelInfo],
        config: EngineConfig,
        plan: SweepPlan,
        notes: list[str] | None = None,
        engine_factory: Callable[[ModelInfo, EngineConfig], Engine] | None = None,
        roofline: bool = True,
        peaks: dict[int, MachinePeaks] | None = None,
        log_path: str | None = None,
        quiet_wait_s: float = QUIET_WAIT_S,
        builder: PromptBuilder | None = None,
        levers: dict[str, tuple] | None = None,
    ) -> None:
        self.points, self.infos, self.config, self.plan = points, infos, config, plan
        self.levers = dict(levers or {})  # saved with the plan, so that the grid can run again
        self._builder = builder
        self._notes = list(notes or [])
        self._factory = engine_factory
        self._roofline = roofline
        self._peaks = peaks
        self._log_path = log_path
        self._quiet_wait_s = quiet_wait_s
        self._cancel = threading.Event()
        self._sweeps: list[Sweep] = []
        self._measured: tuple | None = None  # what partial() reads: (plan, configs, peaks, notes, samples, loaded)

    def cancel(self) -> None:
        """Stop as soon as possible; the run still ends with a (partial) :class:`GridDone`."""
        self._cancel.set()
        for sweep in self._sweeps:
            sweep.cancel()

    def partial_done(self) -> GridDone | None:
        """:meth:`partial` (the name every run's partial result has)."""
        return self.partial()

    def partial(self) -> GridDone | None:
        """The runs measured so far as a cancelled result, while the grid may still run in another thread;
        ``None`` before any engine loaded."""
        if self._measured is None:
            return None
        plan, configs, peaks, notes, samples, loaded = self._measured
        if not loaded:
            return None
        got = [list(s) for s in samples]
        return GridDone(self._result(plan, configs, dict(peaks), list(notes), got, list(loaded), cancelled=True))

    def config_of(self, point: GridPoint) -> EngineConfig:
        """The engine settings of ``point``: the base config with its levers.

        Raises:
            UsageError: a lever value the engine settings refuse.
        """
        return replace(self.config, **point.engine_overrides()).validate()

    def info_of(self, point: GridPoint) -> ModelInfo:
        return self.infos[point.values.get("model")]

    def check_memory(self) -> None:
        """Refuse a grid whose engines do not fit in the available memory together.

        Raises:
            UsageError: with the estimate and what is available.
        """
        import psutil

        weights = {i.path: i.size_bytes or 0 for i in self.infos.values()}  # files: their size is known
        kv = 0
        for point in self.points:
            info, cfg = self.info_of(point), self.config_of(point)
            if info.attention is not None:
                kv += kv_capacity_bytes(
                    kv_bytes_per_token(info.attention, cfg.type_k, cfg.type_v), cfg.n_ctx_before_load
                )
        need, available = sum(weights.values()) + kv, psutil.virtual_memory().available
        if need > MEMORY_SHARE * available:
            raise UsageError(
                f"the grid's {len(self.points)} engines need about {need / 2**30:.1f} GiB at once "
                f"({sum(weights.values()) / 2**30:.1f} GiB weights + {kv / 2**30:.1f} GiB KV caches), "
                f"{available / 2**30:.1f} GiB is available: give fewer values or a smaller --n-ctx"
            )

    def __iter__(self) -> Iterator:
        plan = validate_plan(self.plan, self.config.n_ctx_before_load)
        configs = [self.config_of(p) for p in self.points]
        self.check_memory()
        peaks: dict[int, MachinePeaks] = dict(self._peaks or {})
        if self._roofline and self._peaks is None:
            for threads in sorted({c.resolved()["n_threads"] for c in configs}):
                if self._cancel.is_set():
                    break
                yield BenchStatus(f"measuring memory bandwidth and matmul FLOP/s on {threads} thread(s)")
                peaks[threads] = measure_peaks(threads=threads, threads_batch=threads, quiet_wait_s=self._quiet_wait_s)
        engines: list[Engine] = []
        loaded: list[LoadedModel] = []
        notes = list(self._notes)
        samples: list[list] = [[] for _ in self.points]
        self._measured = (plan, configs, peaks, notes, samples, loaded)
        try:
            builders: dict[str, PromptBuilder] = {}
            for point, cfg in zip(self.points, configs, strict=True):
                if self._cancel.is_set():
                    break
                yield BenchStatus(f"loading {point.label()}")
                engine = self._make_engine(self.info_of(point), cfg)
                engines.append(engine)
                loaded.append(load_engine(engine))
                path = self.info_of(point).path
                builders.setdefault(path, self._builder or PromptBuilder(EngineTokenizer(engine)))
                self._sweeps.append(Sweep(engine, builders[path], plan))
                if self._cancel.is_set():
                    self._sweeps[-1].cancel()
            cells = plan.cells()
            total = len(self.points) * len(cells) * (plan.warmup + plan.reps)
            done, rounds = 0, plan.warmup + plan.reps
            for i in range(rounds):
                for k, (point, sweep) in enumerate(zip(self.points, self._sweeps, strict=False)):
                    if not self._cancel.is_set():
                        warm = " (warm-up)" if i < plan.warmup else ""
                        yield BenchStatus(f"round {i + 1}/{rounds}{warm}: {point.label()}")
                    for kind, prompt_tokens, depth in cells:
                        if self._cancel.is_set():
                            break
                        sample = sweep.measure_once(kind, prompt_tokens, depth, i, notes)
                        if sample is None:
                            break
                        samples[k].append(sample)
                        done += 1
                        yield GridProgress(done, total, sample, point.label())
        finally:
            for engine in engines:
                engine.close()
        yield GridDone(self._result(plan, configs, peaks, notes, samples, loaded, self._cancel.is_set()))

    def _result(self, plan: SweepPlan, configs, peaks, notes, samples, loaded, cancelled: bool) -> GridResult:
        """The grid's result from each point's samples (warm-ups left out) and its loaded engine's facts."""
        result = GridResult(
            peaks=peaks,
            plan={
                **plan.to_dict(),
                **({"levers": {k: list(v) for k, v in self.levers.items()}} if self.levers else {}),
            },
            notes=list(dict.fromkeys(notes)),
            system=system_facts(loaded[0] if loaded else None),
            cancelled=cancelled,
        )
        for point, cfg, got, lm in zip(self.points, configs, samples, loaded, strict=False):
            info, ls = self.info_of(point), lm.settings
            p = peaks.get(cfg.resolved()["n_threads"])
            weights = weight_bytes_per_token(info)
            for cell in aggregate([s for s in got if not s.warmup], plan.gen_tokens):
                prediction = None
                n_params, per_token = info.n_params, lm.kv_bytes_per_token
                if (  # CPU peaks do not bound a GPU
                    p is not None and not lm.layers_offloaded
                    and n_params is not None and per_token is not None and weights is not None
                ):  # fmt: skip
                    prediction = predict(
                        p, weight_bytes=weights, n_params=n_params, kv_bytes_per_token=per_token, cell=cell,
                        attention_flops_per_context=attention_flops_per_context_token(info.attention),
                        prefill_params=prefill_params(info), prefill_bounded=float32_peak_bounds(info),
                    )  # fmt: skip
                result.cells.append(
                    GridCell(
                        point=point.label(),
                        levers={**point.values, "flash_attn": ls.flash_attn, "type_k": ls.type_k, "type_v": ls.type_v},
                        model=info.name,
                        synthetic=info.synthetic,
                        cell=cell,
                        prediction=prediction,
                        kv_bytes_per_token=lm.kv_bytes_per_token,
                        kv_capacity_bytes=lm.kv_capacity_bytes,
                        llama_kv_cache_bytes=lm.llama_kv_cache_bytes,
                        weight_bytes_per_token=weights,
                        weight_type=info.quantization,
                    )
                )
        return result

    def _make_engine(self, info: ModelInfo, config: EngineConfig) -> Engine:
        if self._factory is not None:
            return self._factory(info, config)
        from chatphase.engine.local.llama import LlamaEngine

        return LlamaEngine(info, config, log_path=self._log_path)


@dataclass(frozen=True)
class GridPlan:
    """A lever grid: ``points`` and ``notes`` (:meth:`LeverGrid.points` of ``levers``, the values given per lever),
    each point's model spec to its validated model (``infos``; empty: resolved by :func:`make_run`), and ``sweep``,
    the cells every point runs."""

    points: list[GridPoint]
    infos: dict[str | None, ModelInfo]
    sweep: SweepPlan
    notes: list[str] = field(default_factory=list)
    levers: dict[str, tuple] = field(default_factory=dict)

    @classmethod
    def of(
        cls, levers: dict[str, tuple], sweep: SweepPlan, infos: dict[str | None, ModelInfo] | None = None
    ) -> GridPlan:
        """The grid of ``levers`` on ``sweep``.

        Raises:
            UsageError: too many points, or none valid (:meth:`LeverGrid.points`).
        """
        points, notes = LeverGrid(levers).points()
        return cls(points, dict(infos or {}), sweep, notes, dict(levers))

    @property
    def total_runs(self) -> int:
        return len(self.points) * self.sweep.total_runs

    @property
    def reps(self) -> int:
        return self.sweep.reps

    @property
    def synthetic(self) -> dict[str, bool]:
        """Which points (by label) run a synthetic model (as far as :attr:`infos` knows)."""
        infos = self.infos
        return {p.label(): bool((m := infos.get(p.values.get("model"))) and m.synthetic) for p in self.points}

    @property
    def warmup(self) -> int:
        return self.sweep.warmup

    def validate(self, n_ctx: int | None, n_batch: int | None = None) -> GridPlan:
        """``self`` with its cells checked (:meth:`SweepPlan.validate`). Raises UsageError."""
        return replace(self, sweep=validate_plan(self.sweep, n_ctx, n_batch))

    def to_dict(self) -> dict:
        levers = {"levers": {k: list(v) for k, v in self.levers.items()}} if self.levers else {}
        return {"points": [p.label() for p in self.points], **self.sweep.to_dict(), **levers}

    @classmethod
    def from_dict(cls, data: dict) -> GridPlan:
        """A saved grid's plan (its ``levers`` and the sweep's cells); the models are resolved when it runs.

        Raises:
            UsageError: a plan saved without its levers (before they were saved), or one that makes no grid.
        """
        if not isinstance(data.get("levers"), dict):
            raise UsageError("this lever grid was saved without its levers: run it again with the lever flags")
        levers = {k: tuple(v) for k, v in data["levers"].items()}
        return cls.of(levers, plan_from_dict(SweepPlan, data))


def make_run(
    info: ModelInfo, config: EngineConfig, plan: GridPlan, roofline: bool, log_path: str | None, **options
) -> GridRun:
    """The run of a :class:`GridPlan` (the child's, and the CLI's); models of ``plan.levers`` not in ``plan.infos``
    are resolved here (``None``: ``info``)."""
    infos = dict(plan.infos)
    for spec in plan.levers.get("model", (None,)):
        if spec not in infos:
            infos[spec] = info if spec is None else read_model_info(resolve_model(spec))
    return GridRun(plan.points, infos, config, plan.sweep, notes=plan.notes, roofline=roofline, log_path=log_path,
                   levers=plan.levers, **options)  # fmt: skip


def GridJob(
    points: list[GridPoint],
    infos: dict[str | None, ModelInfo],
    config: EngineConfig,
    plan: SweepPlan,
    notes: list[str] | None = None,
    roofline: bool = True,
    log_path: str | None = None,
) -> ExperimentJob:
    """A lever grid (:class:`GridRun`) in a child process: its events are ``BenchStatus``, ``BenchNotice``,
    ``GridProgress``, then ``GridDone`` or ``BenchFailed``.

    Raises:
        UsageError: when the plan does not fit ``config.n_ctx`` (auto: the least it chooses).
    """
    grid = GridPlan(points, infos, plan, list(notes or []))
    return ExperimentJob(infos[points[0].values.get("model")], config, grid, make_run, roofline, log_path)


__all__ = [
    "BenchNotice",
    "BenchStatus",
    "GridDone",
    "GridJob",
    "GridPlan",
    "GridProgress",
    "GridResult",
    "GridRun",
    "make_run",
]
