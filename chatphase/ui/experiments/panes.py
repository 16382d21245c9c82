"""The Experiments screen's tabs, one per registered experiment that has one: the form that describes a plan (made
from the plan's knobs, :mod:`chatphase.ui.experiments.form`), its plots, and how its results read in the table and
the summary.

- :class:`ExperimentPane` — any experiment's tab: its form, and its rows in the table (no plots).
- :class:`SweepPane` — prompt lengths and context depths (TTFT and decode tok/s plots).
- :class:`ParallelPane` — N sequences decoded together (aggregate and per-sequence tok/s against N).
- the lever grid's, decode modes' and interference tabs are in :mod:`~chatphase.ui.experiments.levers`,
  :mod:`~chatphase.ui.experiments.spec` and :mod:`~chatphase.ui.experiments.interference`.

The screen (:mod:`chatphase.ui.experiments.screen`) runs whichever tab is active and talks to each through
:class:`ExperimentPane`'s methods: :meth:`~ExperimentPane.plan`, :meth:`~ExperimentPane.make_job`, the live
calls, :meth:`~ExperimentPane.rows` (of a result), :meth:`~ExperimentPane.live_rows` (of the progress events
a running sweep sent so far), :meth:`~ExperimentPane.summary` and :meth:`~ExperimentPane.show_results`.
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Input, TabPane

from chatphase.bench.core.contract import Progress
from chatphase.bench.core.experiment import Experiment
from chatphase.bench.core.report import fit_lines, sweep_headers, sweep_rows
from chatphase.bench.core.results import Sample, SweepResult
from chatphase.bench.experiments import EXPERIMENTS, job_for
from chatphase.bench.parallel.report import parallel_headers, parallel_rows
from chatphase.bench.parallel.result import ParallelResult
from chatphase.bench.parallel.sweep import ModelFacts, ParallelPlan, ParallelProgress, aggregate_parallel
from chatphase.bench.sweep.loop import SweepPlan, SweepProgress, aggregate
from chatphase.engine.config import EngineConfig
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.settings.schema import Settings
from chatphase.ui.experiments.form import PlanForm
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


class ExperimentPane(TabPane):
    """What the screen asks of a tab: the registered experiment of its ``kind``
    (:data:`~chatphase.bench.experiments.EXPERIMENTS`, which says whether results loaded from files are drawn on its
    plots: :attr:`overlays`), its form (:class:`~chatphase.ui.experiments.form.PlanForm`, made from the plan's
    knobs), its job (:func:`~chatphase.bench.experiments.job_for`), and how its results and progress read. The
    defaults are a tab with no plots whose table shows the experiment's rows (a registered experiment with no tab
    of its own gets this one)."""

    kind = ""
    TITLE = ""

    def __init__(self, kind: str | None = None, **kwargs) -> None:
        self.kind = kind or self.kind
        super().__init__(self.TITLE or self.experiment.title.capitalize(), id=f"exp-tab-{self.kind}", **kwargs)

    @property
    def experiment(self) -> Experiment:
        return EXPERIMENTS[self.kind]

    @property
    def COLUMNS(self) -> tuple[str, ...]:  # the panes' own are class constants
        return self._columns

    _columns: tuple[str, ...] = ()

    def compose(self) -> ComposeResult:
        yield self.form()

    def form(self) -> PlanForm:
        """The plan's form (a tab may pass its own defaults)."""
        return PlanForm(self.experiment)

    def plan(self, settings: Settings):
        """The plan the form describes, validated against ``settings``' n_ctx and n_batch.

        Raises:
            UsageError: for a malformed field or a plan that does not fit.
        """
        values = self.query_one(PlanForm).values()
        return self.experiment.make_plan(values).validate(settings.engine.n_ctx_before_load, settings.engine.n_batch)

    @property
    def overlays(self) -> bool:
        """Whether results loaded from files are drawn on this tab's plots (the registry's word)."""
        return self.experiment.overlays

    def _value(self, id_: str) -> str:
        """The text of the form's input ``id_``."""
        return self.query_one(f"#{id_}", Input).value

    def make_job(self, info: ModelInfo, config: EngineConfig, plan):
        """The job that runs ``plan`` (in a child process)."""
        return job_for(info, config, plan)

    def plots(self):
        return []

    # the table and the status line: each pane's own, for its own result and progress events
    def rows(self, result: Any) -> list[list[str]]:
        """The result's rows (the experiment's :attr:`~chatphase.bench.core.experiment.Experiment.rows`)."""
        rows = self.experiment.rows(result)
        self._columns = tuple(rows[0]) if rows else self._columns
        return [["" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in r.values()] for r in rows]

    def live_rows(self, progress: list[Any], plan: Any) -> list[list[str]]:
        """The runs so far, one line each."""
        self._columns = self._columns or ("run", "figures")
        return [list(e.line()) for e in progress]

    def summary(self, result: Any) -> str:
        return ""

    def start_live(self, label: str) -> None:
        for plot in self.plots():
            plot.start_live(label)

    def add_progress(self, event: Progress) -> None:
        """One measured run (warm-ups too): its sample onto the live plots."""
        for plot in self.plots():
            plot.add_sample(getattr(event, "sample", None))

    def take_event(self, event: object, plan: Any) -> str | None:
        """An event of this experiment's own (not status, notice, progress or its end); the status line's new text,
        or ``None``."""
        return None

    def end_live(self) -> None:
        for plot in self.plots():
            plot.end_live()

    def show_results(self, current, overlays: list) -> None:
        """Draw ``current`` (this tab's last result, or ``None``) and the loaded overlays."""
        for plot in self.plots():
            plot.end_live()
            plot.set_results(([current] if current else []) + overlays)


class SweepPane(ExperimentPane):
    """Prompt lengths × depths: TTFT against prompt tokens and decode tok/s against depth."""

    kind = "sweep"
    TITLE = "Prompt length & depth"
    COLUMNS = tuple(sweep_headers())

    def compose(self) -> ComposeResult:
        yield self.form()
        with Horizontal(id="exp-plots", classes="exp-plots"):
            yield BenchPlot("ttft", id="exp-plot-ttft")
            yield BenchPlot("decode", id="exp-plot-decode")

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
    TITLE = "Parallel"
    COLUMNS = tuple(parallel_headers()[i] for i in _PARALLEL_KEEP)

    def compose(self) -> ComposeResult:
        yield self.form()
        with Horizontal(id="exp-pplots", classes="exp-plots"):
            yield ParallelPlot(id="exp-plot-parallel")

    def plots(self):
        return self.query(ParallelPlot)

    @staticmethod
    def rows(result: ParallelResult) -> list[list[str]]:
        return _parallel_table(result.parallel)

    @staticmethod
    def live_rows(progress: list[ParallelProgress], plan: ParallelPlan) -> list[list[str]]:
        """Rows of the cells measured so far (``plan`` unused: a sample knows its cell; the step's bytes
        and FLOPs, which need the model's facts, are not in the table)."""
        samples = [e.sample for e in progress if isinstance(e, ParallelProgress)]
        return _parallel_table(aggregate_parallel(samples, ModelFacts(None, None, None)))

    @staticmethod
    def summary(result: ParallelResult) -> str:
        return "\n".join((result.roofline or {}).get("parallel_verdicts", []))
