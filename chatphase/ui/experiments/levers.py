"""The Experiments screen's Levers tab: one lever's values run as a lever grid (:mod:`chatphase.bench.grid.levers`).

Pick a lever — the model (a list of the models chatphase finds, synthetic ones labelled), the KV cache
type of K or V, flash attention, n_ubatch or the thread count — and its values (a comma list, as for
``chatphase bench --cache-type-k f16,q8_0``), plus the cells every point runs (prompt lengths, depths,
reps, generated tokens). Run measures each cell of every point interleaved, round by round
(:class:`~chatphase.bench.grid.run.GridRun` in a child process, :func:`~chatphase.bench.experiments.job_for`).
The table shows each cell's measured TTFT / prefill / decode beside the roofline's prediction and their
ratio (:func:`~chatphase.bench.grid.result.grid_row`); the plots show decode tok/s against the bytes one
decode step reads, with the bandwidth bound (peak read bandwidth / bytes) as a line per thread count,
and TTFT against prompt tokens, one line per point (per n_ubatch when that is the lever).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, Select, SelectionList

from chatphase.bench.core.job import ExperimentJob
from chatphase.bench.core.roofline import cell_context_tokens
from chatphase.bench.experiments import job_for
from chatphase.bench.grid.levers import check_values, parse_lever
from chatphase.bench.grid.result import GRID_HEADERS, GridCell, GridResult, grid_row
from chatphase.bench.grid.run import GridPlan, GridProgress
from chatphase.bench.sweep.loop import SweepPlan, aggregate
from chatphase.engine.config import EngineConfig
from chatphase.engine.text import inert
from chatphase.errors import ChatPhaseError, UsageError
from chatphase.models.gguf_meta import SYNTHETIC_LABEL, ModelInfo
from chatphase.models.roofline import step_bytes
from chatphase.settings.schema import Settings
from chatphase.ui.experiments.form import PlanForm, form_field
from chatphase.ui.experiments.panes import ExperimentPane
from chatphase.ui.experiments.plot import COLORS, SeriesPlot

#: (label, lever) in the picker, and each lever's values when it is picked (models: a list of files).
LEVER_OPTIONS = [
    ("K cache type", "type_k"),  # short: the form fits 80 columns with every label whole
    ("V cache type", "type_v"),
    ("Flash attention", "flash_attn"),
    ("n_ubatch", "n_ubatch"),
    ("Threads", "n_threads"),
    ("Model", "model"),
]
DEFAULT_VALUES = {"type_k": "f16,q8_0,q4_0", "type_v": "f16,q8_0", "flash_attn": "on,off",
                  "n_ubatch": "64,256,512", "n_threads": "1,2"}  # fmt: skip
#: the cells every point runs, smaller than the command line's sweep (a grid runs them once per point).
FORM_DEFAULTS = {"prompt_lengths": (64, 256), "depths": (0, 512), "reps": 2, "gen_tokens": 16}
FORM_WIDTHS = {"prompt_lengths": "exp-w14", "depths": "exp-w9", "reps": "exp-w6", "gen_tokens": "exp-w10"}


PlotKind = Literal["decode", "ttft"]


class LeverPlot(SeriesPlot):
    """A lever grid's plot, one series per point: ``decode`` (tok/s against MB read per decode step, with the
    bandwidth bound per thread count) or ``ttft`` (TTFT ms against prompt tokens). While the grid runs, the
    TTFT plot shows each measured repetition; bytes per step are known once the engines have reported their
    KV cache, so the decode plot fills in when the run ends."""

    TITLES: ClassVar[dict[str, tuple[str, str, str]]] = {
        "decode": ("Decode: tok/s vs MB read per token", "MB read per decode step", "tok/s"),
        "ttft": ("Prefill: TTFT vs prompt tokens", "prompt tokens", "TTFT ms"),
    }

    def __init__(self, kind: PlotKind, **kwargs) -> None:
        super().__init__(**kwargs)
        self.kind: PlotKind = kind
        self.grid: GridResult | None = None

    def set_grid(self, grid: GridResult | None) -> None:
        self.grid = grid
        self.replot()

    def live_point(self, sample) -> tuple[float, float] | None:
        if self.kind == "ttft" and not sample.warmup and sample.kind == "prompt" and sample.ttft_ms is not None:
            return float(sample.prompt_tokens), sample.ttft_ms
        return None

    def series(self) -> list[tuple[str, list[tuple[float, float]]]]:
        """``(point label, sorted (x, y) points)`` of the finished grid, points in run order."""
        by_point: dict[str, list[tuple[float, float]]] = {}
        for c in self.grid.cells if self.grid else []:
            xy = self._xy(c)
            if xy is not None:
                by_point.setdefault(c.point, []).append(xy)
        return [(p, sorted(pts)) for p, pts in by_point.items()]

    def _xy(self, c: GridCell) -> tuple[float, float] | None:
        cell = c.cell
        weights, per_token = c.weight_bytes_per_token, c.kv_bytes_per_token
        if (
            self.kind == "decode"
            and cell.decode_tokens_per_s.mean is not None
            and weights is not None
            and per_token is not None
        ):
            read = step_bytes(weights, per_token, cell_context_tokens(cell))
            return read / 1e6, cell.decode_tokens_per_s.mean
        if self.kind == "ttft" and cell.kind == "prompt" and cell.ttft_ms.mean is not None:
            return float(cell.prompt_tokens), cell.ttft_ms.mean
        return None

    def series_count(self) -> int:
        return len(self.series()) + (1 if self.live else 0)

    def replot(self) -> None:
        """Rebuild the plotext figure and schedule a repaint."""
        plt = self.begin_figure(*self.TITLES[self.kind])
        series = self.series()
        xs_all = [x for _, pts in series for x, _ in pts]
        if self.kind == "decode" and self.grid and xs_all:  # first, so that the points are drawn over it
            self._bandwidth_lines(min(xs_all), max(xs_all))
        for i, (point, pts) in enumerate(series):
            xs, ys = (list(v) for v in zip(*pts, strict=True))
            # decode: one point per cell (a point's cells differ in bytes, not along a line)
            draw = plt.scatter if self.kind == "decode" else plt.plot
            draw(xs, ys, marker="dot", color=COLORS[i % len(COLORS)], label=inert(point))  # model names
            self.y_top = max(self.y_top, *ys)
            self.legend_lines += 1
        self.draw_live()
        self.refresh()

    def _bandwidth_lines(self, lo: float, hi: float) -> None:
        """The decode bound ``bandwidth / bytes`` across the measured range, one line per thread count."""
        lo, hi = lo * 0.95, hi * 1.05
        xs = [lo + (hi - lo) * k / 24 for k in range(25)]
        self.plt.xlim(lo, hi)
        for t, peaks in sorted(self.grid.peaks.items() if self.grid is not None else ()):
            bw_mb = peaks.bandwidth_bytes_per_s / 1e6
            ys = [bw_mb / x for x in xs]
            self.plt.plot(xs, ys, marker="braille", color="gray", label=f"bound {bw_mb / 1e3:.1f} GB/s ({t}t)")
            self.y_top = max(self.y_top, ys[0])
            self.legend_lines += 1


class LeversPane(ExperimentPane):
    """One lever's values as a lever grid (see the module docstring)."""

    kind = "grid"
    TITLE = "Levers"
    COLUMNS = tuple(GRID_HEADERS)

    def __init__(self, model_info: ModelInfo, settings: Settings) -> None:
        super().__init__()
        self.model_info, self.settings = model_info, settings

    def compose(self) -> ComposeResult:
        lever = Vertical(
            Label("Lever"),
            Select(LEVER_OPTIONS, value="type_k", allow_blank=False, compact=True, id="exp-lever"),
            classes="exp-field exp-lever-field",
        )
        values = form_field("Values", "exp-lvalues", DEFAULT_VALUES["type_k"]).add_class("exp-lvalues-field")
        # a smaller grid than the command line's default, and widths for the labels (experiments.tcss), so that the
        # values field takes the rest
        yield PlanForm(self.experiment, FORM_DEFAULTS, FORM_WIDTHS, before=(lever, values))
        yield SelectionList[str](id="exp-lmodels")
        with Horizontal(id="exp-lplots", classes="exp-plots"):
            yield LeverPlot("decode", id="exp-plot-lbytes")
            yield LeverPlot("ttft", id="exp-plot-lttft")

    def on_mount(self) -> None:
        self.query_one("#exp-lmodels").display = False
        self._find_models()

    @work(thread=True, exclusive=True, group="levers-models")
    def _find_models(self) -> None:
        """List the models chatphase finds (a header read each) without holding up the screen."""
        from chatphase.models.resolve import list_models

        try:
            entries = [e for e in list_models(self.settings.models_dir, include_broken=False) if e.info]
        except (ChatPhaseError, OSError):
            entries = []
        self.app.call_from_thread(self._fill_models, entries)

    def _fill_models(self, entries) -> None:
        if not self.is_attached:  # the screen closed while the list was read
            return
        models = self.query_one("#exp-lmodels", SelectionList)
        models.clear_options()
        for e in entries:
            label = e.info.name + (f"  ({SYNTHETIC_LABEL})" if e.info.synthetic else "") + f"  {e.path}"
            models.add_option((Text(inert(label)), e.path, e.path == self.model_info.path))  # a file name: not markup

    @on(Select.Changed, "#exp-lever")
    def _lever_changed(self, event: Select.Changed) -> None:
        values, model = self.query_one("#exp-lvalues", Input), event.value == "model"
        values.value = DEFAULT_VALUES.get(str(event.value), "")
        values.placeholder = "the list below" if model else "comma list"
        values.disabled = model
        self.query_one("#exp-lmodels").display = event.value == "model"

    def plan(self, settings: Settings) -> GridPlan:
        """The grid the form describes (models validated, cells against ``settings.engine.n_ctx``).

        Raises:
            UsageError: for a malformed field, a value the lever does not take, no model picked, too many
                points, or cells that do not fit.
        """
        from chatphase.models.gguf_meta import read_model_info

        lever = str(self.query_one("#exp-lever", Select).value)
        if lever == "model":
            items = tuple(self.query_one("#exp-lmodels", SelectionList).selected)
            if not items:
                raise UsageError("Models: pick at least one in the list")
            infos = {path: read_model_info(path) for path in items}
        else:
            items = check_values(lever, parse_lever(lever, self._value("exp-lvalues")))
            infos = {None: self.model_info}
        levers = {lever: items}
        if lever in ("type_k", "type_v"):  # so that a V type the settings' flash attention refuses is left out
            levers["flash_attn"] = (settings.engine.flash_attn,)
        sweep = SweepPlan(**self.query_one(PlanForm).values())
        return GridPlan.of(levers, sweep, infos).validate(settings.engine.n_ctx_before_load)

    def make_job(self, info: ModelInfo, config: EngineConfig, plan: GridPlan) -> ExperimentJob:
        return job_for(plan.infos[plan.points[0].values.get("model")], config, plan)

    def plots(self):
        return self.query(LeverPlot)

    def show_results(self, current: GridResult | None, overlays) -> None:
        for plot in self.plots():
            plot.end_live()
            plot.set_grid(current)

    @staticmethod
    def rows(result: GridResult) -> list[list[str]]:
        return [c.row() for c in result.cells]

    @staticmethod
    def live_rows(progress: list[GridProgress], plan: GridPlan) -> list[list[str]]:
        """Rows of the cells measured so far, per point in run order (predictions come with the result)."""
        by_point: dict[str, list] = {}
        for e in progress:
            by_point.setdefault(e.point, []).append(e.sample)
        return [
            grid_row(point, plan.synthetic.get(point, False), cell, None, None)
            for point, samples in by_point.items()
            for cell in aggregate(samples, plan.sweep.gen_tokens)
        ]

    @staticmethod
    def summary(result: GridResult) -> str:
        return "\n".join(result.footnotes())


__all__ = ["LeverPlot", "LeversPane"]
