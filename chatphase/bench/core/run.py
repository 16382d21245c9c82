"""What a one-model experiment run shares (the sweep, parallel and offload runs): the machine's peaks measured
before the model loads, the engine it measures through, cancelling, and the facts every result records.

:class:`ModelRun` is the base of :class:`~chatphase.bench.sweep.run.SweepRun` and
:class:`~chatphase.bench.parallel.run.ParallelRun`; :func:`acquire_peaks` is the peaks step alone (the offload
sweep measures them once for all its placements).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Generator
from typing import Any

from chatphase.bench.core.events import BenchEvent, BenchStatus, RunDone
from chatphase.bench.core.peaks import QUIET_WAIT_S, MachinePeaks, measure_peaks
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.core.results import SweepResult
from chatphase.engine.base import Engine
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import LoadedModel
from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.roofline import weight_bytes_per_token


def acquire_peaks(
    config: EngineConfig, quiet_wait_s: float = QUIET_WAIT_S
) -> Generator[BenchEvent, None, MachinePeaks]:
    """Measure the machine's peaks at ``config``'s thread counts once other chatphase engines have stopped,
    saying so in :class:`BenchStatus` events (a generator: ``peaks = yield from acquire_peaks(config)``)."""
    from chatphase.system.engine_registry import busy_engines_now

    if others := busy_engines_now(exclude=(os.getpid(),)):  # an idle one is not waited for
        pids = ", ".join(map(str, others))
        yield BenchStatus(f"waiting up to {quiet_wait_s:g} s for busy chatphase engine pid {pids}")
    yield BenchStatus("measuring memory bandwidth and matmul FLOP/s")
    resolved = config.resolved()
    return measure_peaks(
        threads=resolved["n_threads"], threads_batch=resolved["n_threads_batch"], quiet_wait_s=quiet_wait_s
    )


def model_record(info: ModelInfo) -> dict:
    """A result's ``model`` object: the model's facts without its attention shape."""
    return {k: v for k, v in info.to_dict().items() if k != "attention"}


def settings_record(loaded: LoadedModel, plan_dict: dict, notes) -> dict:
    """A result's ``settings`` object: the engine settings as loaded, the plan, the load's and the run's notes."""
    return {"engine": loaded.settings.to_dict(), "plan": plan_dict, "notes": [*loaded.notes, *notes]}


def roofline_inputs(info: ModelInfo, loaded: LoadedModel, peaks: MachinePeaks | None) -> tuple[int, int, int] | None:
    """``(weight bytes per token, n_params, KV bytes per token)`` when peaks were measured and all three are
    known (else ``None``: no roofline)."""
    weights, n_params, per_token = weight_bytes_per_token(info), info.n_params, loaded.kv_bytes_per_token
    if peaks is None or weights is None or n_params is None or per_token is None:
        return None
    return weights, n_params, per_token


def gpu_note(loaded: LoadedModel) -> str | None:
    """Why CPU peaks bound nothing when layers run on a GPU (``None`` when none does)."""
    if not loaded.layers_offloaded:
        return None
    return f"{loaded.layers_offloaded} layers run on the GPU: these CPU peaks do not bound them"


class ModelRun:
    """The shared part of a one-model run; subclasses iterate.

    Args:
        info: the validated model; config: the engine settings; plan: what to measure.
        engine_factory: builds the engine (default: in-process ``LlamaEngine``, or ``BatchedEngine`` when
            asked for) — tests pass a fake.
        roofline: measure the machine's peaks and add the roofline (about a second).
        builder: the prompt builder (default: one on the loaded engine's own vocabulary).
        log_path: llama.cpp's log file for the default engine (default: the engine log).
        peaks: use these machine peaks instead of measuring them (tests; comparing on one reference).
        quiet_wait_s: how long to wait for other chatphase engines to stop before measuring the peaks.
    """

    def __init__(
        self,
        info: ModelInfo,
        config: EngineConfig,
        plan,
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
        self._sweep: Any = None
        self._engine: Engine | None = None

    def cancel(self) -> None:
        """Stop as soon as possible; the run still ends with a (partial) result."""
        self._cancel.set()
        if self._sweep is not None:
            self._sweep.cancel()
        elif self._engine is not None:
            self._engine.cancel()

    def peaks(self) -> Generator[BenchEvent, None, MachinePeaks | None]:
        """The machine's peaks unless given or off (:func:`acquire_peaks`), before this run's engine loads
        (a generator: ``peaks = yield from run.peaks()``)."""
        peaks: MachinePeaks | None = self._peaks if self._roofline else None
        if peaks is None and self._roofline and not self._cancel.is_set():
            peaks = yield from acquire_peaks(self.config, self._quiet_wait_s)
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

    def partial(self) -> SweepResult | None:
        """The runs measured so far, while the run may still go on in another thread; ``None`` where a run has
        no partial result before its cancelled last event."""
        return None

    def partial_done(self) -> RunDone | None:
        """:meth:`partial` as the run's last event (``None``: nothing to give yet)."""
        result = self.partial()
        return RunDone(result) if result is not None else None

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
