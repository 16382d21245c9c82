"""The Experiments screen: the registered experiments (:mod:`chatphase.bench.experiments`) from the TUI, plotted as
they run.

One tab per experiment that has one (its record's ``tab``): **Prompt length & depth**, **Parallel**, **Levers**
(:mod:`chatphase.ui.experiments.levers`: one lever's values as an interleaved lever grid), **Speculative**
(:mod:`chatphase.ui.experiments.spec`) and **Interference** (:mod:`chatphase.ui.experiments.interference`: live
swim lanes); an experiment with no tab of its own gets the plain one (:class:`~chatphase.ui.experiments.panes.ExperimentPane`:
its form and its rows). Each tab's form is made from its plan's knobs (:mod:`chatphase.ui.experiments.form`), the
same as ``chatphase bench``'s flags. Run (Ctrl+R) starts the active tab's experiment, the same run as
``chatphase bench``, in a child process (:class:`chatphase.bench.core.job.ExperimentJob`, built by each tab from
the registry, driven from a thread worker — this module never imports llama.cpp). A progress bar counts the runs,
the tab's plots fill in with every measured repetition, the table shows the cells measured so far, and Esc cancels
(partial results are kept; the status line says when nothing was measured yet, the warm-ups not counting). When the
run ends the summary adds the fit and the roofline verdicts. Each tab has its own status line.
Save (Ctrl+S) writes the active tab's result as JSON or CSV by the file name (relative to the current
directory; the notice names the whole path). Each tab has its own file name and progress bar (the field and
the bar show the active tab's), and Save never replaces a file at once: it asks, and a second Save replaces
it. Load (Ctrl+O) reads an earlier result and overlays it on every plot it has cells for, to compare two models or
two settings (only the experiments whose record says ``overlays`` show Load and the overlay buttons).
Esc with nothing running closes the screen. Run refuses, with a notice, while the chat's reply streams
(each would skew the other's figures); the app opens one such screen at most, so one sweep runs at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Input, Label, ProgressBar, Static, TabbedContent

from chatphase.bench.core.contract import Done, Progress
from chatphase.bench.core.events import BenchNotice, BenchStatus
from chatphase.bench.core.job import BenchFailed, ExperimentJob
from chatphase.bench.core.results import save_result
from chatphase.bench.experiments import EXPERIMENTS, load_bench_result
from chatphase.engine.config import EngineConfig
from chatphase.engine.text import inert
from chatphase.errors import ChatPhaseError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.settings.schema import Settings
from chatphase.ui.experiments.compare import ComparePane
from chatphase.ui.experiments.interference import InterferencePane
from chatphase.ui.experiments.levers import LeversPane
from chatphase.ui.experiments.panes import ExperimentPane, ParallelPane, SweepPane
from chatphase.ui.experiments.spec import SpecPane

#: the tabs of their own, by experiment; another registered experiment with a tab gets :class:`ExperimentPane`.
PANES: dict[str, Callable[[ModelInfo, Settings], ExperimentPane]] = {
    "sweep": lambda info, settings: SweepPane(),
    "parallel": lambda info, settings: ParallelPane(),
    "grid": LeversPane,
    "spec": lambda info, settings: SpecPane(),
    "interference": lambda info, settings: InterferencePane(),
    "compare": lambda info, settings: ComparePane(),
}


def pane_for(kind: str, info: ModelInfo, settings: Settings) -> ExperimentPane:
    """The tab of the experiment ``kind``."""
    make = PANES.get(kind)
    return make(info, settings) if make is not None else ExperimentPane(kind)


#: a tab's status line before its first run.
IDLE_STATUS = "Set the sweep and press Run (Ctrl+R)."

#: (model, engine settings, the active tab's plan) -> a job; tests pass a scripted one.
JobFactory = Callable[[ModelInfo, EngineConfig, object], ExperimentJob]


class ExperimentsScreen(Screen[None]):
    """Sweeps with live plots, save/load and overlays (see the module docstring).

    Args:
        model_info: the model to measure (the chat's current model).
        settings: engine settings (n_ctx, threads, ...) as the chat uses them.
        job_factory: builds the job for any tab (tests pass a scripted one); default the tab's
            :meth:`~chatphase.ui.experiments.panes.ExperimentPane.make_job`.
        is_busy: whether the chat's reply is running (the app's controller; a sweep beside it would skew
            both, so Run refuses with a notice meanwhile); default never.
    """

    CSS_PATH = Path(__file__).with_name("experiments.tcss")  # absolute: subclasses elsewhere work
    BINDINGS = [
        Binding("ctrl+r", "run", "Run", id="experiments.run", tooltip="Run the active tab's sweep"),
        Binding(
            "escape",
            "cancel_or_close",
            "Cancel/Close",
            id="experiments.cancel",
            tooltip="Cancel the running sweep (partial results are kept); close when idle",
        ),
        Binding("ctrl+s", "save", "Save", id="experiments.save", tooltip="Save the tab's last result (.json or .csv)"),
        Binding("ctrl+o", "load", "Load", id="experiments.load", tooltip="Load a saved result and overlay it"),
    ]

    def __init__(
        self,
        model_info: ModelInfo,
        settings: Settings,
        job_factory: JobFactory | None = None,
        is_busy: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__()
        self.is_busy = is_busy
        self.model_info = model_info
        self.settings = settings
        self.job_factory: JobFactory | None = job_factory
        self.job: ExperimentJob | None = None
        self.job_pane: ExperimentPane | None = None
        self.job_plan = None
        self.results: dict[str, object] = {}  # tab kind -> its last result
        self.overlays: list = []  # results loaded from files (of the experiments that overlay)
        self.progress: list[Progress] = []  # the running experiment's counted runs, for the table's live rows
        #: each tab's status line (text, class): a tab never shows the other's
        self.statuses: dict[str, tuple[str, str]] = {}
        #: each tab's file name and progress bar ``(total, done)``: the path field and the bar show the active
        #: tab's, so that one tab's Save never takes a name typed on another (a saved sweep was replaced so)
        self.paths: dict[str, str] = {}
        self.bars: dict[str, tuple[int, int]] = {}
        self._path_kind = "sweep"  # the tab whose name the path field holds
        self._overwrite: tuple[str, Path] | None = None  # (tab, file) that Save asked about: again replaces it

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="exp-box"):
            yield Label(
                inert(f"Experiments — {self.model_info.name}  ·  n_ctx {self.settings.engine.n_ctx or 'auto'}"),
                classes="panel-title",
                markup=False,
            )
            with TabbedContent(id="exp-tabs"):
                for kind, experiment in EXPERIMENTS.items():
                    if experiment.tab:
                        yield pane_for(kind, self.model_info, self.settings)
            with Horizontal(id="exp-progress-row"):
                yield Button("Run", id="exp-run", variant="primary", compact=True)
                yield Button("Cancel", id="exp-cancel", disabled=True, compact=True)
                # a set total: an indeterminate bar animates (and repaints) the whole time the screen is idle
                yield ProgressBar(total=1, id="exp-progress", show_eta=False, classes="-idle")
                yield Static(IDLE_STATUS, id="exp-status", markup=False)
            yield DataTable(id="exp-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="exp-summary", classes="-empty", markup=False)
            with Horizontal(id="exp-files"):
                yield Input(placeholder="file.json or file.csv", id="exp-path", value=self._default_path("sweep"))
                yield Button("Save", id="exp-save")
                yield Button("Load + overlay", id="exp-load")
                yield Button("Clear overlays", id="exp-clear")
        yield Footer()

    def _default_path(self, kind: str) -> str:
        stem = "".join(ch if ch.isalnum() else "-" for ch in self.model_info.name.lower()).strip("-")
        return f"bench-{'' if kind == 'sweep' else kind + '-'}{stem}.json"

    def on_mount(self) -> None:
        self.paths = {p.kind: self._default_path(p.kind) for p in self.query(ExperimentPane)}
        self._fill_table()
        self.query_one("#exp-tabs").query(Input).first().focus()

    @property
    def pane(self) -> ExperimentPane:
        """The active tab's pane."""
        return self.query_one(f"#{self.query_one(TabbedContent).active}", ExperimentPane)

    @property
    def result(self):
        """The active tab's last result (``None`` before its first run)."""
        return self.results.get(self.pane.kind)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Load is a key only on the tabs that draw overlays (the Levers and Speculative tabs draw none)."""
        if action != "load":
            return True
        try:
            return self.pane.overlays
        except NoMatches:  # not composed yet, or closing
            return True

    def _show_overlay_buttons(self) -> None:
        for id_ in ("#exp-load", "#exp-clear"):
            self.query_one(id_, Button).display = self.pane.overlays
        self.refresh_bindings()

    @on(TabbedContent.TabActivated)
    def _tab_changed(self, event: TabbedContent.TabActivated) -> None:
        path, kind = self.query_one("#exp-path", Input), self.pane.kind
        self.paths[self._path_kind] = path.value
        path.value, self._path_kind = self.paths.get(kind, self._default_path(kind)), kind
        self._overwrite = None
        self._show_bar(self.pane)
        self._fill_table()
        self._show_overlay_buttons()
        self._status(*self.statuses.get(self.pane.kind, (IDLE_STATUS, "")))

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

    def action_run(self) -> None:
        """Validate the active form and start its sweep (a notice instead when the form is wrong)."""
        if self.job is not None:
            self.notify("A sweep is already running (Esc cancels it).", severity="warning")
            return
        if self.is_busy():  # Ctrl+C stops the reply from any screen (Esc here closes this one)
            self.notify("Not running the sweep: wait for the reply or stop it (press Ctrl+C).", severity="warning")
            return
        pane = self.pane
        try:
            plan = pane.plan(self.settings)
            self.job = (self.job_factory or pane.make_job)(self.model_info, self.settings.engine, plan)
        except ChatPhaseError as exc:
            self._status(str(exc), "-error")
            self.notify(str(exc), severity="error")
            return
        self.job_pane, self.job_plan, self.progress = pane, plan, []
        self._set_bar(pane, plan.total_runs, 0)
        pane.start_live(self.model_info.name)
        self._set_running(True)
        self._status(
            f"Starting: {plan.total_runs} runs ({getattr(plan, 'warmup', 0)} warm-up + {getattr(plan, 'reps', 1)} reps "
            "per cell)…"
        )
        self._run_job(self.job)

    def action_cancel(self) -> None:
        """Cancel the running sweep; it ends with the repetitions measured so far."""
        if self.job is not None:
            self.job.cancel()
            self._status("Cancelling…", "-warning", self.job_pane)

    def action_cancel_or_close(self) -> None:
        """Esc: cancel a running sweep, else close the screen."""
        if self.job is not None:
            self.action_cancel()
        else:
            self.dismiss(None)

    def action_save(self) -> None:
        """Save the active tab's last result to the path field (.json or .csv). A file that exists is not
        replaced at once: the notice asks, and Save again (same tab, same name) replaces it."""
        if self.result is None:
            self.notify("Nothing to save yet: run this tab's sweep first.", severity="warning")
            return
        path = Path(self.query_one("#exp-path", Input).value.strip()).expanduser()
        asked, self._overwrite = self._overwrite, None
        if path.exists() and asked != (self.pane.kind, path.resolve()):
            self._overwrite = (self.pane.kind, path.resolve())
            self.notify(
                f"{path.resolve()} exists: press Ctrl+S again to replace it, or change the name.",
                title="Save",
                severity="warning",
                timeout=10,
            )
            return
        try:
            save_result(self.result, path)
        except ChatPhaseError as exc:
            self.notify(str(exc), severity="error")
            return
        self.notify(f"Saved {path.resolve()}")

    @on(Input.Changed, "#exp-path")
    def _path_changed(self) -> None:
        self._overwrite = None  # a question about another name

    def action_load(self) -> None:
        """Load the result at the path field and overlay it on the plots it has cells for."""
        if not self.pane.overlays:
            self.notify("Overlays are drawn on the Prompt length & depth and Parallel tabs.", severity="warning")
            return
        path = Path(self.query_one("#exp-path", Input).value.strip()).expanduser()
        try:
            loaded = load_bench_result(path)
        except ChatPhaseError as exc:
            self.notify(str(exc), severity="error")
            return
        if not loaded.label:
            loaded.label = f"{loaded.display_label()} ({path.name})"
        self.overlays.append(loaded)
        self._show_results()
        cells = EXPERIMENTS[loaded.kind].rows(loaded)
        self.notify(f"Loaded {path.name}: {len(cells)} cells overlaid")

    def action_clear_overlays(self) -> None:
        """Remove the loaded overlays (the current results stay)."""
        self.overlays.clear()
        self._show_results()

    # -- the worker and its events -----------------------------------------------------------------
    @work(thread=True, exclusive=True, group="experiments")
    def _run_job(self, job: ExperimentJob) -> None:
        try:
            for event in job.events():
                self.app.call_from_thread(self.handle_event, event)
        except Exception:  # the details go to the debug log; the screen says it in words
            logging.getLogger(__name__).debug("experiments job", exc_info=True)
            self.app.call_from_thread(self.handle_event, BenchFailed("the benchmark stopped on an internal error"))

    def handle_event(self, event) -> None:
        """Apply one job event to the screen (called on the UI thread; ignored once the screen is closed)."""
        if not self.is_attached or self.job_pane is None:
            return
        pane = self.job_pane
        if isinstance(event, BenchStatus):
            self._status(event.text[:1].upper() + event.text[1:] + "…", pane=pane)
        elif isinstance(event, BenchNotice):
            self.notify(event.text, severity="warning", timeout=10)
        elif isinstance(event, Progress):  # any experiment's
            self._set_bar(pane, event.total_runs, event.done_runs)
            label, figures = event.line()
            self._status(f"[{event.done_runs}/{event.total_runs}] {label}: {figures}", pane=pane)
            pane.add_progress(event)
            if event.counted:
                self.progress.append(event)
                self._fill_table()
        elif isinstance(event, Done):  # any experiment's last event
            self.job = None
            self._set_running(False)
            self.results[pane.kind] = event.result
            self._show_results()
            self._fill_table()
            self._status(*self._ending(pane, event.result), pane)
        elif isinstance(event, BenchFailed):
            self.job = None
            self._set_running(False)
            pane.end_live()
            self._status(event.message, "-error", pane)
            self.notify(event.message, severity="error")
        elif (text := pane.take_event(event, self.job_plan)) is not None:  # the experiment's own (swim lanes)
            total, done = self.bars.get(pane.kind, (0, 0))
            self._status(f"[{done}/{total}] {text}", pane=pane)

    # -- helpers -----------------------------------------------------------------------------------
    @staticmethod
    def _ending(pane: ExperimentPane, result) -> tuple[str, str]:
        """The status line and its class for a run that ended with ``result``: a cancelled one says whether
        anything was measured (warm-ups are not)."""
        if not result.cancelled:
            return "Done.", ""
        if not pane.rows(result):
            return "Cancelled: nothing was measured yet.", "-warning"
        return "Cancelled: partial results.", "-warning"

    def _show_results(self) -> None:
        for pane in self.query(ExperimentPane):
            pane.show_results(self.results.get(pane.kind), self.overlays)

    def _fill_table(self) -> None:
        """The active tab's columns and rows: the cells measured so far while its sweep runs, else its last
        result's; its summary under the table."""
        pane, result = self.pane, self.result
        table = self.query_one("#exp-table", DataTable)
        table.clear(columns=True)
        running = self.job is not None and pane is self.job_pane
        if running:
            rows = pane.live_rows(self.progress, self.job_plan)
        else:
            rows = pane.rows(result) if result is not None else []
        table.add_columns(*pane.COLUMNS)  # after the rows: a plain tab's columns are its rows' keys
        for row in rows:  # a lever's values name models; a loaded file's cells are its text: plain, inert
            table.add_row(*(Text(inert(c)) if isinstance(c, str) else c for c in row))
        summary = inert(pane.summary(result)) if result and not running else ""
        box = self.query_one("#exp-summary", Static)
        box.update(summary)
        box.set_class(not summary, "-empty")

    def _set_bar(self, pane: ExperimentPane, total: int, done: int) -> None:
        """``pane``'s progress: ``done`` of ``total`` runs (shown when that tab is)."""
        self.bars[pane.kind] = (total, done)
        if pane is self.pane:
            self._show_bar(pane)

    def _show_bar(self, pane: ExperimentPane) -> None:
        """The bar shows ``pane``'s progress, hidden for a tab that has not run."""
        bar = self.query_one("#exp-progress", ProgressBar)
        total, done = self.bars.get(pane.kind, (1, 0))
        bar.set_class(pane.kind not in self.bars, "-idle")
        bar.update(total=total, progress=done)

    def _set_running(self, running: bool) -> None:
        self.query_one("#exp-run", Button).disabled = running
        self.query_one("#exp-cancel", Button).disabled = not running

    def _status(self, text: str, kind: str = "", pane: ExperimentPane | None = None) -> None:
        """Set ``pane``'s status line (default: the active tab's); shown when that tab is."""
        pane = pane or self.pane
        self.statuses[pane.kind] = (text, kind)
        if pane is self.pane:
            status = self.query_one("#exp-status", Static)
            status.set_classes(kind)
            status.update(inert(text))  # errors and notices may quote a model or a file

    def on_unmount(self) -> None:
        if self.job is not None:
            self.job.cancel()
