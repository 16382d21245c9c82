"""One benchmark run end to end, as an iterator of events: the non-UI API behind ``chatphase bench``
and the Experiments screen (which runs it in a child process, :mod:`chatphase.bench.core.job`).

Steps: validate the plan against ``n_ctx`` (before any work), measure the machine's peaks (roofline;
before loading, after other chatphase engines stopped: :mod:`chatphase.bench.core.peaks`), load the model into an in-process :class:`~chatphase.engine.local.llama.LlamaEngine` and its vocabulary into a
tokenizer, run the :class:`~chatphase.bench.core.runner.Sweep`, then assemble a
:class:`~chatphase.bench.core.results.BenchResult` with fits and roofline. A
:class:`~chatphase.bench.parallel.sweep.ParallelPlan` runs the parallel-decode sweep instead
(:mod:`chatphase.bench.parallel.run`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Generator, Iterator

from chatphase.bench.core.events import BenchDone, BenchEvent, BenchNotice, BenchStatus, load_engine, system_facts
from chatphase.bench.core.fits import sweep_fits
from chatphase.bench.core.peaks import QUIET_WAIT_S, MachinePeaks, measure_peaks
from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder
from chatphase.bench.core.results import BenchResult
from chatphase.bench.core.roofline import build_roofline
from chatphase.bench.core.runner import Sweep, SweepDone, SweepPlan
from chatphase.bench.parallel.sweep import ParallelPlan
from chatphase.engine.base import Engine
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import LoadedModel
from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.roofline import attention_flops_per_context_token, weight_bytes_per_token

__all__ = ["BenchDone", "BenchEvent", "BenchNotice", "BenchRun", "BenchStatus", "system_facts"]


class BenchRun:
    """A whole benchmark; iterate to run it (blocking), :meth:`cancel` from any thread.

    Args:
        info: the validated model; config: the engine settings; plan: what to measure (a
            :class:`SweepPlan`, or a :class:`~chatphase.bench.parallel.sweep.ParallelPlan` for the parallel sweep).
        engine_factory: builds the engine (default: in-process ``LlamaEngine``, or ``BatchedEngine`` for a
            parallel plan) — tests pass a fake. For a parallel plan an engine without ``run_batch`` (a
            remote server's) is built once per concurrent stream.
        roofline: measure the machine's peaks and add the roofline (about a second).
        builder: the prompt builder (default: one on the loaded engine's own vocabulary).
        log_path: llama.cpp's log file for the default engine (default: the engine log).
        peaks: use these machine peaks instead of measuring them (tests; comparing on one reference).
        quiet_wait_s: how long to wait for other chatphase engines to stop before measuring the peaks.

    Raises (while iterating):
        UsageError: the plan does not fit ``config.n_ctx`` (raised before any work).
        EngineError: the model fails to load or a turn fails.
    """

    def __init__(
        self,
        info: ModelInfo,
        config: EngineConfig,
        plan: SweepPlan | ParallelPlan,
        engine_factory: Callable[[ModelInfo, EngineConfig], Engine] | None = None,
        roofline: bool = True,
        builder: PromptBuilder | None = None,
        log_path: str | None = None,
        peaks: MachinePeaks | None = None,
        quiet_wait_s: float = QUIET_WAIT_S,
    ) -> None:
        self.info, self.config, self.plan = info, config, plan
        self._quiet_wait_s = quiet_wait_s
        self._peaks = peaks
        self._log_path = log_path
        self._builder = builder
        self._factory = engine_factory
        self._roofline = roofline
        self._cancel = threading.Event()
        self._sweep: Sweep | None = None
        self._engine: Engine | None = None
        self._running: tuple[LoadedModel, SweepPlan, MachinePeaks | None] | None = None

    def cancel(self) -> None:
        """Stop as soon as possible; the run still ends with a (partial) :class:`BenchDone`."""
        self._cancel.set()
        if self._sweep is not None:
            self._sweep.cancel()
        elif self._engine is not None:
            self._engine.cancel()

    def __iter__(self) -> Iterator[BenchEvent]:
        if isinstance(self.plan, ParallelPlan):
            from chatphase.bench.parallel.run import run_parallel

            yield from run_parallel(self, self.plan)
            return
        plan = self.plan.validate(self.config.n_ctx)
        peaks = yield from self.peaks()
        yield BenchStatus(f"loading {self.info.name}")
        engine = self._engine = self.make_engine()
        try:
            loaded = load_engine(engine)
            builder = self._builder or PromptBuilder(EngineTokenizer(engine))
            sweep = self._sweep = Sweep(engine, builder, plan)
            self._running = loaded, plan, peaks
            if self._cancel.is_set():
                sweep.cancel()
            done: SweepDone | None = None
            for event in sweep:
                if isinstance(event, SweepDone):
                    done = event
                else:
                    yield event
        finally:
            engine.close()
        assert done is not None
        yield BenchDone(self._result(loaded, plan, done, peaks))

    def partial(self) -> BenchResult | None:
        """The runs measured so far as a cancelled :class:`BenchResult`, while the sweep may still be running in
        another thread; ``None`` before the model was loaded (or for a parallel plan)."""
        sweep, running = self._sweep, self._running
        if not isinstance(sweep, Sweep) or running is None:
            return None
        loaded, plan, peaks = running
        return self._result(loaded, plan, sweep.partial(), peaks)

    def peaks(self) -> Generator[BenchEvent, None, MachinePeaks | None]:
        """Measure the machine's peaks unless given or off, before this run's engine loads and once other
        chatphase engines have stopped (a generator: ``peaks = yield from run.peaks()``)."""
        peaks: MachinePeaks | None = self._peaks if self._roofline else None
        if peaks is None and self._roofline and not self._cancel.is_set():
            from chatphase.system.engine_registry import busy_engines_now

            if others := busy_engines_now(exclude=(os.getpid(),)):  # an idle one is not waited for
                pids = ", ".join(map(str, others))
                yield BenchStatus(f"waiting up to {self._quiet_wait_s:g} s for busy chatphase engine pid {pids}")
            yield BenchStatus("measuring memory bandwidth and matmul FLOP/s")
            resolved = self.config.resolved()
            peaks = measure_peaks(
                threads=resolved["n_threads"],
                threads_batch=resolved["n_threads_batch"],
                quiet_wait_s=self._quiet_wait_s,
            )
        return peaks

    def make_engine(self, config: EngineConfig | None = None, batched: bool = False) -> Engine:
        """A new engine from the factory, else an in-process ``LlamaEngine`` (``BatchedEngine`` when ``batched``)."""
        config = config or self.config
        if self._factory is not None:
            return self._factory(self.info, config)
        if batched:
            from chatphase.engine.local.batched import BatchedEngine

            return BatchedEngine(self.info, config, log_path=self._log_path)
        from chatphase.engine.local.llama import LlamaEngine

        return LlamaEngine(self.info, config, log_path=self._log_path)

    @property
    def builder(self) -> PromptBuilder | None:
        """The prompt builder given at construction (``None``: build one on the loaded engine)."""
        return self._builder

    def attach(self, sweep=None, engine=None) -> None:
        """Send :meth:`cancel` to this sweep (else engine) from now on; cancel it at once if asked already."""
        self._sweep = sweep or self._sweep
        self._engine = engine or self._engine
        target = sweep or engine
        if target is not None and self._cancel.is_set():
            target.cancel()

    def _result(self, loaded: LoadedModel, plan: SweepPlan, done: SweepDone, peaks: MachinePeaks | None) -> BenchResult:
        counted = [s for s in done.samples if not s.warmup]
        kv_per_token, n_params, weights = (
            loaded.kv_bytes_per_token,
            self.info.n_params,
            weight_bytes_per_token(self.info),
        )
        roofline = {}
        if (
            peaks is not None
            and done.cells
            and kv_per_token is not None
            and n_params is not None
            and weights is not None
        ):
            roofline = build_roofline(
                peaks,
                weight_bytes=weights,
                n_params=n_params,
                kv_bytes_per_token=kv_per_token,
                cells=done.cells,
                attention_flops_per_context=attention_flops_per_context_token(self.info.attention),
            )
            if loaded.layers_offloaded:  # the peaks are the CPU's: they do not bound a GPU
                note = (
                    f"{loaded.layers_offloaded} layers run on the GPU: these CPU peaks do not bound them, "
                    "so the percentages are not meaningful"
                )
                roofline.update(
                    decode_verdict=f"decode: {note}", prefill_verdict=f"prefill: {note}", attention_line=None
                )
        model = {k: v for k, v in self.info.to_dict().items() if k != "attention"}
        return BenchResult(
            model=model,
            settings={
                "engine": loaded.settings.to_dict(),
                "plan": plan.to_dict(),
                "notes": list(loaded.notes) + list(done.notes),
            },
            system=system_facts(loaded),
            results=list(done.cells),
            fits=sweep_fits(counted),
            roofline=roofline,
            samples=list(done.samples),
            cancelled=done.cancelled,
        )
