"""One benchmark run end to end, as an iterator of events: the non-UI API behind ``chatphase bench``
and the Experiments screen (which runs it in a child process, :mod:`chatphase.bench.job`).

Steps: validate the plan against ``n_ctx`` (before any work), measure the machine's peaks (roofline;
before loading, after other chatphase engines stopped: :mod:`chatphase.bench.peaks`), load the model into an in-process :class:`~chatphase.engine.llama.LlamaEngine` and its vocabulary into a
tokenizer, run the :class:`~chatphase.bench.runner.Sweep`, then assemble a
:class:`~chatphase.bench.results.BenchResult` with fits and roofline.
"""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from chatphase import __version__
from chatphase.bench.fits import sweep_fits
from chatphase.bench.peaks import QUIET_WAIT_S, MachinePeaks, measure_peaks
from chatphase.bench.prompts import EngineTokenizer, PromptBuilder
from chatphase.bench.results import BenchResult
from chatphase.bench.roofline import build_roofline
from chatphase.bench.runner import Sweep, SweepDone, SweepPlan, SweepProgress
from chatphase.engine.base import Engine
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, LoadedModel, ModelLoaded
from chatphase.errors import EngineError
from chatphase.models.gguf_meta import ModelInfo


@dataclass(frozen=True)
class BenchStatus:
    """A step started (``"measuring memory bandwidth"``, ``"loading model"``, ...)."""

    text: str


@dataclass(frozen=True)
class BenchDone:
    """The run is over; ``result`` holds everything measured (``result.cancelled`` when stopped early)."""

    result: BenchResult


BenchEvent = BenchStatus | SweepProgress | BenchDone


def system_facts(loaded: LoadedModel | None = None) -> dict:
    """The JSON ``system`` object: OS, Python, CPU, cores, memory, library versions, llama.cpp's system info."""
    import llama_cpp
    import numpy
    import psutil

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cpus": psutil.cpu_count(logical=True),
        "memory_bytes": psutil.virtual_memory().total,
        "chatphase": __version__,
        "llama_cpp_python": llama_cpp.__version__,
        "numpy": numpy.__version__,
        "llama_system_info": loaded.system_info if loaded else "",
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class BenchRun:
    """A whole benchmark; iterate to run it (blocking), :meth:`cancel` from any thread.

    Args:
        info: the validated model; config: the engine settings; plan: what to measure.
        engine_factory: builds the engine (default: in-process ``LlamaEngine``) — tests pass a fake.
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
        plan: SweepPlan,
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

    def cancel(self) -> None:
        """Stop as soon as possible; the run still ends with a (partial) :class:`BenchDone`."""
        self._cancel.set()
        if self._sweep is not None:
            self._sweep.cancel()
        elif self._engine is not None:
            self._engine.cancel()

    def __iter__(self) -> Iterator[BenchEvent]:
        plan = self.plan.validate(self.config.n_ctx)
        engine_settings = self.config.resolved()
        peaks: MachinePeaks | None = self._peaks if self._roofline else None
        if peaks is None and self._roofline and not self._cancel.is_set():  # before our engine loads
            from chatphase.system.engine_registry import running_engines

            if others := running_engines(exclude=(os.getpid(),)):
                pids = ", ".join(map(str, others))
                yield BenchStatus(f"waiting up to {self._quiet_wait_s:g} s for chatphase engine pid {pids} to stop")
            yield BenchStatus("measuring memory bandwidth and matmul FLOP/s")
            peaks = measure_peaks(
                threads=engine_settings["n_threads"],
                threads_batch=engine_settings["n_threads_batch"],
                quiet_wait_s=self._quiet_wait_s,
            )
        yield BenchStatus(f"loading {self.info.name}")
        engine = self._engine = self._make_engine()
        try:
            loaded = _load(engine)
            builder = self._builder or PromptBuilder(EngineTokenizer(engine))
            sweep = self._sweep = Sweep(engine, builder, plan)
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

    def _make_engine(self) -> Engine:
        if self._factory is not None:
            return self._factory(self.info, self.config)
        from chatphase.engine.llama import LlamaEngine

        return LlamaEngine(self.info, self.config, log_path=self._log_path)

    def _result(self, loaded: LoadedModel, plan: SweepPlan, done: SweepDone, peaks: MachinePeaks | None) -> BenchResult:
        counted = [s for s in done.samples if not s.warmup]
        kv_per_token = loaded.kv_bytes_per_token
        roofline = {}
        if peaks is not None and done.cells:
            roofline = build_roofline(
                peaks,
                weight_bytes=self.info.size_bytes,
                n_params=self.info.n_params,
                kv_bytes_per_token=kv_per_token,
                cells=done.cells,
            )
            if loaded.layers_offloaded:  # the peaks are the CPU's: they do not bound a GPU
                note = (
                    f"{loaded.layers_offloaded} layers run on the GPU: these CPU peaks do not bound them, "
                    "so the percentages are not meaningful"
                )
                roofline.update(decode_verdict=f"decode: {note}", prefill_verdict=f"prefill: {note}")
        model = {k: v for k, v in self.info.to_dict().items() if k != "attention"}
        return BenchResult(
            model=model,
            settings={
                "engine": loaded.settings,
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


def _load(engine: Engine) -> LoadedModel:
    for event in engine.load():
        if isinstance(event, EngineFailed):
            raise EngineError(event.message)
        if isinstance(event, ModelLoaded):
            return event.model
    raise EngineError("the engine finished loading without reporting the model")
