"""The Experiments screen's sweeps, one tab each: the form that describes a plan, its plots, and how its
results read in the table and the summary.

- :class:`SweepPane` — prompt lengths and context depths (TTFT and decode tok/s plots).
- :class:`ParallelPane` — N sequences decoded together (aggregate and per-sequence tok/s against N).
- the lever grid's tab is in :mod:`chatphase.ui.experiments.levers`.

The screen (:mod:`chatphase.ui.experiments.screen`) runs whichever tab is active and talks to each through
:class:`ExperimentPane`'s methods: :meth:`~ExperimentPane.plan`, :meth:`~ExperimentPane.make_job`, the live
calls, :meth:`~ExperimentPane.rows` (of a result), :meth:`~ExperimentPane.live_rows` (of the progress events
a running sweep sent so far), :meth:`~ExperimentPane.summary` and :meth:`~ExperimentPane.show_results`.
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, TabPane

from chatphase.bench.core.parallel_results import ParallelSample
from chatphase.bench.core.report import fit_lines, parallel_headers, parallel_rows, sweep_headers, sweep_rows
from chatphase.bench.core.results import Sample, SweepResult
from chatphase.bench.core.runner import SweepPlan, SweepProgress, aggregate
from chatphase.bench.experiments import EXPERIMENTS, job_for
from chatphase.bench.parallel.result import ParallelResult
from chatphase.bench.parallel.sweep import ModelFacts, ParallelPlan, aggregate_parallel
from chatphase.engine.config import EngineConfig
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.settings.schema import Settings
from chatphase.ui.experiments.plot import BenchPlot, ParallelPlot
from chatphase.units import parse_counts


def parse_list(text: str, what: str) -> tuple[int, ...]:
    """An input field's :func:`chatphase.units.parse_counts`.

    Raises:
        UsageError: naming the field, for anything but comma-separated whole numbers.
    """
    try:
        return parse_counts(text)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None


def parse_count(text: str, what: str) -> int:
    """A whole number from an input field.

    Raises:
        UsageError: naming the field.
    """
    try:
        return int(text.strip())
    except ValueError:
        raise UsageError(f"{what}: expected a whole number (got {text.strip()!r})") from None


def form_field(label: str, id_: str, value: str) -> Vertical:
    return Vertical(Label(label), Input(value=value, id=id_), classes="exp-field")


class ExperimentPane(TabPane):
    """What the screen asks of a tab. ``kind`` names its result (and its default file name); ``experiment``
    its kind in the registry (:data:`~chatphase.bench.experiments.EXPERIMENTS`), which says whether results
    loaded from files are drawn on its plots (:attr:`overlays`). Defaults are those of a one-model sweep
    (:func:`~chatphase.bench.experiments.job_for`, plots that take samples)."""

    kind = ""
    experiment = "sweep"
    COLUMNS: tuple[str, ...] = ()

    def plan(self, settings: Settings):
        """The plan the form describes.

        Raises:
            UsageError: for a malformed field or a plan that does not fit.
        """
        raise NotImplementedError

    @property
    def overlays(self) -> bool:
        """Whether results loaded from files are drawn on this tab's plots (the registry's word)."""
        return EXPERIMENTS[self.experiment].overlays

    def _value(self, id_: str) -> str:
        """The text of the form's input ``id_``."""
        return self.query_one(f"#{id_}", Input).value

    def make_job(self, info: ModelInfo, config: EngineConfig, plan):
        """The job that runs ``plan`` (in a child process)."""
        return job_for(info, config, plan)

    def plots(self):
        raise NotImplementedError

    # the table and the status line: each pane's own, for its own result and progress events
    def rows(self, result: Any) -> list[list[str]]:
        raise NotImplementedError

    def live_rows(self, progress: list[Any], plan: Any) -> list[list[str]]:
        raise NotImplementedError

    def summary(self, result: Any) -> str:
        raise NotImplementedError

    def progress_text(self, event: Any) -> str:
        raise NotImplementedError

    def start_live(self, label: str) -> None:
        for plot in self.plots():
            plot.start_live(label)

    def add_progress(self, event: SweepProgress) -> None:
        """One measured run (warm-ups too): onto the live plots."""
        for plot in self.plots():
            plot.add_sample(event.sample)

    def end_live(self) -> None:
        for plot in self.plots():
            plot.end_live()

    def show_results(self, current, overlays: list[SweepResult | ParallelResult]) -> None:
        """Draw ``current`` (this tab's last result, or ``None``) and the loaded overlays."""
        for plot in self.plots():
            plot.end_live()
            plot.set_results(([current] if current else []) + overlays)


class SweepPane(ExperimentPane):
    """Prompt lengths × depths: TTFT against prompt tokens and decode tok/s against depth."""

    kind = "sweep"
    COLUMNS = tuple(sweep_headers())

    def __init__(self) -> None:
        super().__init__("Prompt length & depth", id="exp-tab-sweep")

    def compose(self) -> ComposeResult:
        with Horizontal(id="exp-form", classes="exp-form"):
            yield form_field("Prompt lengths", "exp-lengths", "64,256,1024")
            yield form_field("Depths", "exp-depths", "0,1024")
            yield form_field("Reps", "exp-reps", "3")
            yield form_field("Gen tokens", "exp-gen", "32")
        with Horizontal(id="exp-plots", classes="exp-plots"):
            yield BenchPlot("ttft", id="exp-plot-ttft")
            yield BenchPlot("decode", id="exp-plot-decode")

    def plan(self, settings: Settings) -> SweepPlan:
        """The plan the form describes, validated against ``settings.engine.n_ctx``.

        Raises:
            UsageError: for a malformed field or a plan that does not fit.
        """
        return SweepPlan(
            prompt_lengths=parse_list(self._value("exp-lengths"), "Prompt lengths"),
            depths=parse_list(self._value("exp-depths"), "Depths"),
            reps=parse_count(self._value("exp-reps"), "Reps"),
            gen_tokens=parse_count(self._value("exp-gen"), "Gen tokens"),
            warmup=1,
        ).validate(settings.engine.n_ctx)

    def plots(self):
        return self.query(BenchPlot)

    @staticmethod
    def rows(result: SweepResult) -> list[list[str]]:
        return sweep_rows(result.results)

    @staticmethod
    def live_rows(progress: list[SweepProgress], plan: SweepPlan) -> list[list[str]]:
        """Rows of the cells measured so far (counted samples of the running sweep of ``plan``)."""
        return sweep_rows(aggregate([e.sample for e in progress if isinstance(e.sample, Sample)], plan.gen_tokens))

    @staticmethod
    def summary(result: SweepResult) -> str:
        lines = fit_lines(result)
        if result.roofline and "decode_verdict" in result.roofline:
            lines.append(result.roofline["decode_verdict"])
            lines.append(result.roofline["prefill_verdict"])
            if result.roofline.get("attention_line"):
                lines.append(result.roofline["attention_line"])
        return "\n".join(lines)


#: the parallel table leaves out a step's MiB and GFLOP: the summary's line per N says both, and with them
#: the table would not fit 120 columns.
_PARALLEL_LEFT_OUT = ("step MiB", "step GFLOP")
_PARALLEL_KEEP = tuple(i for i, h in enumerate(parallel_headers()) if h not in _PARALLEL_LEFT_OUT)


def _parallel_table(cells) -> list[list[str]]:
    return [[row[i] for i in _PARALLEL_KEEP] for row in parallel_rows(cells)]


class ParallelPane(ExperimentPane):
    """N sequences decoded together: aggregate and per-sequence decode tok/s against N."""

    kind = "parallel"
    experiment = "parallel"
    COLUMNS = tuple(parallel_headers()[i] for i in _PARALLEL_KEEP)

    def __init__(self) -> None:
        super().__init__("Parallel", id="exp-tab-parallel")

    def compose(self) -> ComposeResult:
        with Horizontal(id="exp-pform", classes="exp-form"):
            yield form_field("Sequences (N)", "exp-nseqs", "1,2,4,8")
            yield form_field("Prompt tokens", "exp-plength", "128")
            yield form_field("Reps", "exp-preps", "3")
            yield form_field("Gen steps", "exp-pgen", "32")
        with Horizontal(id="exp-pplots", classes="exp-plots"):
            yield ParallelPlot(id="exp-plot-parallel")

    def plan(self, settings: Settings) -> ParallelPlan:
        """The plan the form describes, validated against ``settings`` (N sequences of prompt + steps must fit
        n_ctx; a step of N tokens n_batch).

        Raises:
            UsageError: for a malformed field or a plan that does not fit.
        """
        return ParallelPlan(
            n_seqs=parse_list(self._value("exp-nseqs"), "Sequences"),
            prompt_lengths=parse_list(self._value("exp-plength"), "Prompt tokens"),
            reps=parse_count(self._value("exp-preps"), "Reps"),
            gen_tokens=parse_count(self._value("exp-pgen"), "Gen steps"),
            warmup=1,
        ).validate(settings.engine.n_ctx, settings.engine.n_batch)

    def plots(self):
        return self.query(ParallelPlot)

    @staticmethod
    def rows(result: ParallelResult) -> list[list[str]]:
        return _parallel_table(result.parallel)

    @staticmethod
    def live_rows(progress: list[SweepProgress], plan: ParallelPlan) -> list[list[str]]:
        """Rows of the cells measured so far (``plan`` unused: a sample knows its cell; the step's bytes
        and FLOPs, which need the model's facts, are not in the table)."""
        samples = [e.sample for e in progress if isinstance(e.sample, ParallelSample)]
        return _parallel_table(aggregate_parallel(samples, ModelFacts(None, None, None)))

    @staticmethod
    def summary(result: ParallelResult) -> str:
        return "\n".join((result.roofline or {}).get("parallel_verdicts", []))
