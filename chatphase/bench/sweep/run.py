"""The prompt-length and depth sweep as one run, an iterator of events: the non-UI API behind ``chatphase bench``
and the Experiments screen (which runs it in a child process, :mod:`chatphase.bench.core.job`).

Steps: validate the plan against ``n_ctx`` (before any work), measure the machine's peaks (roofline; before
loading, after other chatphase engines stopped: :func:`chatphase.bench.core.run.acquire_peaks`), load the model
into an in-process :class:`~chatphase.engine.local.llama.LlamaEngine` and its vocabulary into a tokenizer, run
the :class:`~chatphase.bench.sweep.loop.Sweep`, then assemble a :class:`~chatphase.bench.core.results.SweepResult`
with fits and roofline.
"""

from __future__ import annotations

from collections.abc import Iterator

from chatphase.bench.core.contract import validate_plan
from chatphase.bench.core.events import BenchEvent, BenchNotice, BenchStatus, RunDone, load_engine, system_facts
from chatphase.bench.core.fits import sweep_fits
from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder
from chatphase.bench.core.results import SweepResult
from chatphase.bench.core.roofline import build_roofline
from chatphase.bench.core.run import ModelRun, gpu_note, model_record, roofline_inputs, settings_record
from chatphase.bench.sweep.loop import Sweep, SweepDone, SweepPlan
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import LoadedModel
from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.roofline import attention_flops_per_context_token, prefill_params

__all__ = ["BenchEvent", "BenchNotice", "BenchStatus", "RunDone", "SweepRun", "make_run", "system_facts"]


def make_run(
    info: ModelInfo, config: EngineConfig, plan: SweepPlan, roofline: bool, log_path: str | None, **options
) -> SweepRun:
    """The child's run of a sweep job (:func:`~chatphase.bench.experiments.job_for`)."""
    return SweepRun(info, config, plan, roofline=roofline, log_path=log_path, **options)


def placement_run(info: ModelInfo, config: EngineConfig, plan: SweepPlan, peaks: MachinePeaks | None) -> SweepRun:
    """One placement's sweep for the offload sweep (:class:`~chatphase.bench.offload.run.OffloadRun`): these
    peaks (measured once for all placements), no roofline without them."""
    return SweepRun(info, config, plan, roofline=peaks is not None, peaks=peaks)


class SweepRun(ModelRun):
    """A whole prompt-length and depth sweep; iterate to run it (blocking), :meth:`cancel` from any thread.
    Arguments as :class:`~chatphase.bench.core.run.ModelRun`'s, ``plan`` a :class:`SweepPlan`.

    Raises (while iterating):
        UsageError: the plan does not fit ``config.n_ctx`` (auto: the least it chooses) (raised before any work).
        EngineError: the model fails to load or a turn fails.
    """

    plan: SweepPlan
    _running: tuple[LoadedModel, SweepPlan, MachinePeaks | None] | None = None

    def __iter__(self) -> Iterator[BenchEvent]:
        plan = validate_plan(self.plan, self.config.n_ctx_before_load)
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
        yield RunDone(self._result(loaded, plan, done, peaks))

    def partial(self) -> SweepResult | None:
        """The runs measured so far as a cancelled :class:`SweepResult`, while the sweep may still be running in
        another thread; ``None`` before the model was loaded."""
        sweep, running = self._sweep, self._running
        if not isinstance(sweep, Sweep) or running is None:
            return None
        loaded, plan, peaks = running
        return self._result(loaded, plan, sweep.partial(), peaks)

    def _result(self, loaded: LoadedModel, plan: SweepPlan, done: SweepDone, peaks: MachinePeaks | None) -> SweepResult:
        counted = [s for s in done.samples if not s.warmup]
        roofline = {}
        inputs = roofline_inputs(self.info, loaded, peaks)
        if inputs is not None and peaks is not None and done.cells:
            weights, n_params, kv_per_token = inputs
            roofline = build_roofline(
                peaks,
                weight_bytes=weights,
                n_params=n_params,
                kv_bytes_per_token=kv_per_token,
                cells=done.cells,
                attention_flops_per_context=attention_flops_per_context_token(self.info.attention),
                prefill_params=prefill_params(self.info),
                weight_type=self.info.quantization,
            )
            if note := gpu_note(loaded):  # the peaks are the CPU's: they do not bound a GPU
                note += ", so the percentages are not meaningful"
                roofline.update(
                    decode_verdict=f"decode: {note}", prefill_verdict=f"prefill: {note}", attention_line=None
                )
        return SweepResult(
            model=model_record(self.info),
            settings=settings_record(loaded, plan.to_dict(), done.notes),
            system=system_facts(loaded),
            results=list(done.cells),
            fits=sweep_fits(counted),
            roofline=roofline,
            samples=list(done.samples),
            cancelled=done.cancelled,
        )
