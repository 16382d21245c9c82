"""The Experiments screen: prompt-length and depth sweeps from the TUI, plotted as they run.

Pick prompt lengths, depths, reps and generated tokens; Run (Ctrl+R) starts the same benchmark as
``chatphase bench`` in a child process (:class:`chatphase.bench.job.BenchJob`, driven from a thread
worker — this module never imports llama.cpp). A progress bar counts the runs, both plots fill in with
every measured repetition, and Esc cancels (partial results are kept). When the run ends the table
shows mean ± sd per cell and the status line the fit and the roofline verdicts. Save (Ctrl+S) writes
JSON or CSV by the file name; Load (Ctrl+O) reads an earlier result and overlays it on the plots, to
compare two models or two settings. Esc with nothing running closes the screen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Input, Label, ProgressBar, Static

from chatphase.bench.api import BenchDone, BenchStatus
from chatphase.bench.job import BenchFailed, BenchJob
from chatphase.bench.report import mean_sd
from chatphase.bench.results import BenchResult, load_result, save_result
from chatphase.bench.runner import SweepPlan, SweepProgress
from chatphase.config import Settings
from chatphase.engine.config import EngineConfig
from chatphase.errors import ChatPhaseError, UsageError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.ui.experiments_plot import BenchPlot

JobFactory = Callable[[ModelInfo, EngineConfig, SweepPlan], BenchJob]


def parse_tokens(text: str, what: str) -> tuple[int, ...]:
    """``"64, 256,1024"`` -> ``(64, 256, 1024)``; empty -> ``()``.

    Raises:
        UsageError: naming the field, for anything but comma-separated whole numbers.
    """
    parts = [p.strip() for p in text.replace(" ", ",").split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"{what}: expected comma-separated token counts like 64,256,1024") from None


def parse_count(text: str, what: str) -> int:
    """A whole number from an input field.

    Raises:
        UsageError: naming the field.
    """
    try:
        return int(text.strip())
    except ValueError:
        raise UsageError(f"{what}: expected a whole number (got {text.strip()!r})") from None


class ExperimentsScreen(Screen[None]):
    """Sweeps with live plots, save/load and overlays (see the module docstring).

    Args:
        model_info: the model to measure (the chat's current model).
        settings: engine settings (n_ctx, threads, ...) as the chat uses them.
        job_factory: builds the job (tests pass a scripted one); default :class:`BenchJob`.
    """

    CSS_PATH = Path(__file__).with_name("experiments.tcss")  # absolute: subclasses elsewhere work
    BINDINGS = [
        Binding("ctrl+r", "run", "Run", id="experiments.run", tooltip="Run the sweep"),
        Binding(
            "escape",
            "cancel_or_close",
            "Cancel/Close",
            id="experiments.cancel",
            tooltip="Cancel the running sweep (partial results are kept); close when idle",
        ),
        Binding("ctrl+s", "save", "Save", id="experiments.save", tooltip="Save the last result (.json or .csv)"),
        Binding("ctrl+o", "load", "Load", id="experiments.load", tooltip="Load a saved result and overlay it"),
    ]

    def __init__(self, model_info: ModelInfo, settings: Settings, job_factory: JobFactory | None = None) -> None:
        super().__init__()
        self.model_info = model_info
        self.settings = settings
        self.job_factory: JobFactory = job_factory or (lambda info, s, plan: BenchJob(info, s, plan))
        self.job: BenchJob | None = None
        self.result: BenchResult | None = None
        self.overlays: list[BenchResult] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="exp-box"):
            yield Label(f"Experiments — {self.model_info.name}  ·  n_ctx {self.settings.n_ctx}", classes="panel-title")
            with Horizontal(id="exp-form"):
                yield self._field("Prompt lengths", "exp-lengths", "64,256,1024")
                yield self._field("Depths", "exp-depths", "0,1024")
                yield self._field("Reps", "exp-reps", "3")
                yield self._field("Gen tokens", "exp-gen", "32")
                yield Button("Run", id="exp-run", variant="primary")
                yield Button("Cancel", id="exp-cancel", disabled=True)
            with Horizontal(id="exp-progress-row"):
                yield ProgressBar(id="exp-progress", show_eta=False)
                yield Static("Set the sweep and press Run (Ctrl+R).", id="exp-status")
            with Horizontal(id="exp-plots"):
                yield BenchPlot("ttft", id="exp-plot-ttft")
                yield BenchPlot("decode", id="exp-plot-decode")
            yield DataTable(id="exp-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="exp-summary")
            with Horizontal(id="exp-files"):
                yield Input(placeholder="file.json or file.csv", id="exp-path", value=self._default_path())
                yield Button("Save", id="exp-save")
                yield Button("Load + overlay", id="exp-load")
                yield Button("Clear overlays", id="exp-clear")
        yield Footer()

    @staticmethod
    def _field(label: str, id_: str, value: str) -> Vertical:
        return Vertical(Label(label), Input(value=value, id=id_), classes="exp-field")

    def _default_path(self) -> str:
        stem = "".join(ch if ch.isalnum() else "-" for ch in self.model_info.name.lower()).strip("-")
        return f"bench-{stem}.json"

    def on_mount(self) -> None:
        table = self.query_one("#exp-table", DataTable)
        table.add_columns("kind", "prompt tok", "depth", "reps", "TTFT ms", "prefill tok/s", "decode tok/s", "KV MiB")
        self.query_one("#exp-lengths", Input).focus()

    # -- actions -----------------------------------------------------------------------------------
    def on_button_pressed(self, event: Button.Pressed) -> None:
        handlers = {
            "exp-run": self.action_run,
            "exp-cancel": self.action_cancel,
            "exp-save": self.action_save,
            "exp-load": self.action_load,
            "exp-clear": self.action_clear_overlays,
        }
        handler = handlers.get(event.button.id or "")
        if handler:
            handler()

    def plan_from_form(self) -> SweepPlan:
        """The :class:`SweepPlan` the form describes (validated against n_ctx).

        Raises:
            UsageError: for a malformed field or a plan that does not fit.
        """

        def value(id_: str) -> str:
            return self.query_one(f"#{id_}", Input).value

        plan = SweepPlan(
            prompt_lengths=parse_tokens(value("exp-lengths"), "Prompt lengths"),
            depths=parse_tokens(value("exp-depths"), "Depths"),
            reps=parse_count(value("exp-reps"), "Reps"),
            gen_tokens=parse_count(value("exp-gen"), "Gen tokens"),
            warmup=1,
        )
        return plan.validate(self.settings.n_ctx)

    def action_run(self) -> None:
        """Validate the form and start the sweep (a notice instead when the form is wrong)."""
        if self.job is not None:
            self.notify("A sweep is already running (Esc cancels it).", severity="warning")
            return
        try:
            plan = self.plan_from_form()
            self.job = self.job_factory(self.model_info, self.settings.engine_config(), plan)
        except ChatPhaseError as exc:
            self._status(str(exc), "-error")
            self.notify(str(exc), severity="error")
            return
        bar = self.query_one("#exp-progress", ProgressBar)
        bar.update(total=plan.total_runs, progress=0)
        for plot in self.query(BenchPlot):
            plot.start_live(self.model_info.name)
        self._set_running(True)
        self._status(f"Starting: {plan.total_runs} runs ({plan.warmup} warm-up + {plan.reps} reps per cell)…")
        self._run_job(self.job)

    def action_cancel(self) -> None:
        """Cancel the running sweep; it ends with the repetitions measured so far."""
        if self.job is not None:
            self.job.cancel()
            self._status("Cancelling…", "-warning")

    def action_cancel_or_close(self) -> None:
        """Esc: cancel a running sweep, else close the screen."""
        if self.job is not None:
            self.action_cancel()
        else:
            self.dismiss(None)

    def action_save(self) -> None:
        """Save the last result to the path field (.json or .csv)."""
        if self.result is None:
            self.notify("Nothing to save yet: run a sweep first.", severity="warning")
            return
        path = Path(self.query_one("#exp-path", Input).value.strip()).expanduser()
        try:
            save_result(self.result, path)
        except ChatPhaseError as exc:
            self.notify(str(exc), severity="error")
            return
        self.notify(f"Saved {path}")

    def action_load(self) -> None:
        """Load the result at the path field and overlay it on the plots."""
        path = Path(self.query_one("#exp-path", Input).value.strip()).expanduser()
        try:
            loaded = load_result(path)
        except ChatPhaseError as exc:
            self.notify(str(exc), severity="error")
            return
        if not loaded.label:
            loaded.label = f"{loaded.display_label()} ({path.name})"
        self.overlays.append(loaded)
        self._show_results()
        self.notify(f"Loaded {path.name}: {len(loaded.results)} cells overlaid")

    def action_clear_overlays(self) -> None:
        """Remove the loaded overlays (the current result stays)."""
        self.overlays.clear()
        self._show_results()

    # -- the worker and its events -----------------------------------------------------------------
    @work(thread=True, exclusive=True, group="experiments")
    def _run_job(self, job: BenchJob) -> None:
        try:
            for event in job.events():
                self.app.call_from_thread(self.handle_event, event)
        except Exception:  # the details go to the debug log; the screen says it in words
            logging.getLogger(__name__).debug("experiments job", exc_info=True)
            self.app.call_from_thread(self.handle_event, BenchFailed("the benchmark stopped on an internal error"))

    def handle_event(self, event) -> None:
        """Apply one job event to the screen (called on the UI thread; ignored once the screen is closed)."""
        if not self.is_attached:
            return
        if isinstance(event, BenchStatus):
            self._status(event.text[:1].upper() + event.text[1:] + "…")
        elif isinstance(event, SweepProgress):
            self.query_one("#exp-progress", ProgressBar).update(progress=event.done_runs)
            s = event.sample
            what = f"prompt {s.prompt_tokens}" if s.kind == "prompt" else f"depth {s.depth}"
            ttft = "–" if s.ttft_ms is None else f"{s.ttft_ms:.1f} ms"
            rate = "–" if s.decode_tokens_per_s is None else f"{s.decode_tokens_per_s:.1f} tok/s"
            self._status(
                f"[{event.done_runs}/{event.total_runs}] {what} {'warm-up' if s.warmup else f'rep {s.rep + 1}'}: "
                f"TTFT {ttft}, decode {rate}"
            )
            for plot in self.query(BenchPlot):
                plot.add_sample(s)
        elif isinstance(event, BenchDone):
            self.job = None
            self._set_running(False)
            self.result = event.result
            self._fill_table(event.result)
            self._show_results()
            self.query_one("#exp-summary", Static).update(self._summary(event.result))
            self._status(
                "Cancelled: partial results." if event.result.cancelled else "Done.",
                "-warning" if event.result.cancelled else "",
            )
        elif isinstance(event, BenchFailed):
            self.job = None
            self._set_running(False)
            for plot in self.query(BenchPlot):
                plot.end_live()
            self._status(event.message, "-error")
            self.notify(event.message, severity="error")

    # -- helpers -----------------------------------------------------------------------------------
    def _show_results(self) -> None:
        shown = ([self.result] if self.result else []) + self.overlays
        for plot in self.query(BenchPlot):
            plot.end_live()
            plot.set_results(shown)

    def _fill_table(self, result: BenchResult) -> None:
        table = self.query_one("#exp-table", DataTable)
        table.clear()
        for c in result.results:
            table.add_row(
                c.kind,
                str(c.prompt_tokens),
                str(c.depth),
                str(c.reps),
                mean_sd(c.ttft_ms),
                mean_sd(c.prefill_tokens_per_s),
                mean_sd(c.decode_tokens_per_s),
                f"{c.kv_cache_bytes / 2**20:.1f}",
            )

    @staticmethod
    def _summary(result: BenchResult) -> str:
        lines = []
        fit = result.fits.get("ttft_ms_vs_prompt_tokens") if result.fits else None
        if fit:
            r2 = "–" if fit["r2"] is None else f"{fit['r2']:.3f}"
            lines.append(f"TTFT ≈ {fit['intercept']:.1f} ms + {fit['slope']:.3f} ms × prompt tokens (r² {r2})")
        if result.roofline:
            lines.append(f"{result.roofline['decode_verdict']}")
            lines.append(f"{result.roofline['prefill_verdict']}")
        return "\n".join(lines)

    def _set_running(self, running: bool) -> None:
        self.query_one("#exp-run", Button).disabled = running
        self.query_one("#exp-cancel", Button).disabled = not running

    def _status(self, text: str, kind: str = "") -> None:
        status = self.query_one("#exp-status", Static)
        status.set_classes(kind)
        status.update(text)

    def on_unmount(self) -> None:
        if self.job is not None:
            self.job.cancel()
