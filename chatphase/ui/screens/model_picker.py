"""Model picker: a modal list of the models ``chatphase models`` finds; returns the chosen ``ModelInfo``.

Rows come from :func:`chatphase.models.resolve.list_models` (bundled default, models directory, Hugging Face
cache), read in a thread worker so the screen opens at once. Each row shows architecture, parameters,
quantisation, file size, training context, KV bytes per token and the memory estimate at the app's
n_ctx, n_ubatch and KV cache types (:mod:`chatphase.models.memory`). Files that fail validation are
listed with their reason and cannot be chosen (a notice says why); a model that would be refused for
memory cannot be chosen either.
The highlighted model's fit — llama.cpp's own memory plan of loading it with the app's engine settings
(``n_gpu_layers`` as set, auto by default: the layers that fit and each device's total) — is made in a child
process (:func:`chatphase.engine.memory_plan.plan_in_child`, about a second) from a thread worker once the cursor
rests on a row, kept per file, and shown under the table; the list's column stays the quick estimate.
Enter picks, Esc cancels (``None``). No llama.cpp here: only GGUF headers are read. A long model spec is
shortened with "…" so that every other column (Source last) fits the box; the line under the table
gives the highlighted model's whole name and path.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label
from textual.worker import get_current_worker

from chatphase.chat.controller import ChatController
from chatphase.chat.settings_apply import naming_model
from chatphase.engine.memory_plan import FitResult
from chatphase.engine.text import inert
from chatphase.errors import ChatPhaseError
from chatphase.models.gguf_meta import SYNTHETIC_LABEL, ModelInfo
from chatphase.models.memory import MemoryVerdict, assess, estimate
from chatphase.models.resolve import ModelEntry, list_models
from chatphase.units import fmt_bytes, fmt_count

COLUMNS = ("", "Model", "Arch", "Params", "Quant", "Size", "Ctx", "KV/tok", "Memory", "Source")
#: seconds the cursor rests on a row before its memory plan is asked for (rows passed over start no child).
PLAN_DELAY_S = 0.3
#: the Model column is never cut below this many characters (a narrower box scrolls sideways instead).
MIN_MODEL_CHARS = 8


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters with a trailing "…" when longer."""
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


class ModelPickerScreen(ModalScreen[ModelInfo | None]):
    """Pick a model. ``lister`` returns the entries (default :func:`list_models` over ``models_dir``);
    ``current_path`` marks the loaded model; ``n_ctx``, ``n_ubatch`` (the physical batch llama.cpp runs)
    and the KV cache types ``type_k``/``type_v`` size the memory column, as the user's settings would load
    each model; ``planner(path)`` makes the highlighted model's memory plan (``None``: no plan shown; it runs in a
    thread and may raise :class:`~chatphase.errors.ChatPhaseError`). Dismisses with the chosen
    :class:`~chatphase.models.gguf_meta.ModelInfo`, or ``None`` on Esc."""

    CSS_PATH = "model_picker.tcss"
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="picker.cancel")]

    def __init__(
        self,
        n_ctx: int = 4096,
        current_path: str | None = None,
        models_dir: str | None = None,
        lister: Callable[[], list[ModelEntry]] | None = None,
        n_ubatch: int = 256,
        type_k: str = "f16",
        type_v: str = "f16",
        planner: Callable[[str], FitResult] | None = None,
    ) -> None:
        super().__init__()
        self.n_ctx = n_ctx
        self.memory_settings = (n_ctx, n_ubatch, type_k, type_v)  # estimate()'s arguments after the model
        self.current_path = current_path
        self.lister = lister or (lambda: list_models(models_dir))
        self.entries: list[ModelEntry] = []
        self.rows: list[tuple] = []  # each entry's cells, the Model column whole
        self.verdicts: dict[str, MemoryVerdict] = {}
        self.planner = planner
        self.plans: dict[str, Text] = {}  # each file's plan line, once made
        self.highlighted: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box", classes="modal-box"):
            yield Label("Model: Switch  ·  Enter load  ·  Esc cancel", classes="panel-title")
            yield Label("Reading model headers…", id="picker-status")
            yield DataTable(id="picker-table", cursor_type="row", zebra_stripes=True)
            yield Label("", id="picker-detail")
            yield Label("", id="picker-plan")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*COLUMNS)
        self.load_entries()

    @work(thread=True, exclusive=True, group="model-picker")
    def load_entries(self) -> None:
        """Read the model list off the UI thread, then fill the table."""
        try:
            entries = self.lister()
            error = None
        except Exception as exc:  # a broken models directory must not kill the picker
            entries, error = [], f"cannot list models: {exc}"
        self.app.call_from_thread(self.fill, entries, error)

    def fill(self, entries: list[ModelEntry], error: str | None = None) -> None:
        """Show ``entries`` (usable first, in listing order; broken ones after)."""
        self.entries = sorted(entries, key=lambda e: e.info is None)
        self.rows = [self._cells(e) for e in self.entries]
        cursor = 0
        for i, e in enumerate(self.entries):
            if e.info is not None and self.current_path and e.path == self.current_path:
                cursor = i
        usable = sum(e.info is not None for e in self.entries)
        n_ctx, n_ubatch, type_k, type_v = self.memory_settings
        kv = type_k if type_k == type_v else f"{type_k}/{type_v}"
        status = error or f"{fmt_count(usable, 'usable model')} · memory at n_ctx {n_ctx}, n_ubatch {n_ubatch}, KV {kv}"
        self.query_one("#picker-status", Label).update(Text(inert(status)))
        self._draw(cursor)
        self.query_one(DataTable).focus()

    def on_resize(self) -> None:
        if self.rows:
            self._draw(self.query_one(DataTable).cursor_row)

    def _draw(self, cursor: int) -> None:
        """The rows, the Model column shortened so that the table fits the box's width."""
        table = self.query_one(DataTable)
        width = table.size.width or self.app.size.width
        others = sum(max(len(h), *(len(str(r[c])) for r in self.rows), 0) for c, h in enumerate(COLUMNS) if c != 1)
        model = max(MIN_MODEL_CHARS, width - others - 2 * table.cell_padding * len(COLUMNS) - 1)
        table.clear()
        for i, (mark, label, *rest) in enumerate(self.rows):
            short = (
                Text(shorten(label.plain, model), style=label.style)
                if isinstance(label, Text)
                else Text(shorten(label, model))  # a file name: not markup
            )
            table.add_row(mark, short, *(Text(c) if isinstance(c, str) else c for c in rest), key=str(i))
        if self.rows:
            table.move_cursor(row=cursor)

    def _cells(self, e: ModelEntry) -> tuple:
        mark = "●" if e.info is not None and e.path == self.current_path else ("*" if e.is_default else "")
        spec = inert(e.spec or "default")  # a file name or a path: it may hold anything
        label: str | Text = spec
        if e.info is not None and e.info.synthetic:  # random weights: say so where the model is chosen
            label = Text.assemble(spec, (f" ({SYNTHETIC_LABEL})", "yellow"))
        if e.info is None:
            return (
                mark,
                Text(spec, style="dim"),
                Text("unusable", style="red"),
                "",
                "",
                "",
                "",
                "",
                "",
                inert(e.source),
            )
        i: ModelInfo = e.info
        need = estimate(i, *self.memory_settings)
        verdict = assess(need)
        self.verdicts[e.path] = verdict
        style = {"ok": "", "warn": "yellow", "refuse": "red"}[verdict.level]
        memory = Text(fmt_bytes(need.total_bytes), style=style)
        return (mark, label, *map(inert, e.figures()), memory, inert(e.source))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """Show the highlighted file's path, or why it cannot be used."""
        if event.row_key is None or event.row_key.value is None:
            return
        e = self.entries[int(event.row_key.value)]
        detail = (
            Text(inert(e.error or "unusable"), style="red")
            if e.info is None
            else Text(
                inert(
                    f"{e.info.name} · {e.path}"
                    + (f" · {self.verdicts[e.path].message}" if e.path in self.verdicts else "")
                )
            )
        )
        self.query_one("#picker-detail", Label).update(detail)
        self.highlighted = e.path if e.info is not None else None
        self._show_plan()
        if self.highlighted is not None and self.planner is not None and e.path not in self.plans:
            self.plan_entry(e.path)

    @work(thread=True, exclusive=True, group="model-plan")
    def plan_entry(self, path: str) -> None:
        """``planner(path)`` off the UI thread, once the cursor has rested on the row (:data:`PLAN_DELAY_S`)."""
        assert self.planner is not None
        worker = get_current_worker()
        if worker.cancelled_event.wait(PLAN_DELAY_S):  # the cursor moved on: another row's worker replaced this
            return
        try:
            fit = self.planner(path)
            line = Text(inert(fit.summary()), style="red" if fit.refusal else "")
        except ChatPhaseError as exc:
            line = Text(inert(f"no memory plan: {exc}"), style="red")
        if not worker.is_cancelled:  # the picker is still open
            self.app.call_from_thread(self._planned, path, line)

    def _planned(self, path: str, line: Text) -> None:
        self.plans[path] = line
        if not self.is_attached:
            return
        self._show_plan()

    def _show_plan(self) -> None:
        """The highlighted model's plan line, ``memory plan: projecting…`` while it is made, blank without one."""
        path = self.highlighted
        if self.planner is None or path is None:
            line = Text("")
        else:
            line = self.plans.get(path) or Text("memory plan: projecting…", style="dim")
        self.query_one("#picker-plan", Label).update(line)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is None:
            return
        entry = self.entries[int(event.row_key.value)]
        if entry.info is None:
            self.notify(entry.error or "this file cannot be used", title="Model unusable", severity="error")
            return
        verdict = self.verdicts.get(entry.path)
        if verdict is not None and verdict.level == "refuse":
            self.notify(verdict.message, title="Model will not fit", severity="error")
            return
        if verdict is not None and verdict.level == "warn":
            self.notify(verdict.message, title="Memory", severity="warning")
        self.dismiss(entry.info)

    def action_cancel(self) -> None:
        self.dismiss(None)


def pick_model(app: App, chat: ChatController, switch: Callable[[ModelInfo], None]) -> None:
    """Open :class:`ModelPickerScreen` at ``chat``'s n_ctx, its model highlighted; a usable choice goes to
    ``switch`` (a fresh engine; the conversation is kept). A file whose chat template cannot render is
    refused here, before the running engine is let go."""
    from chatphase.engine.memory_plan import plan_in_child
    from chatphase.engine.prompting.chat_format import format_before_load

    def chosen(info: ModelInfo | None) -> None:
        if info is None:
            return
        if info.path == chat.model_info.path:
            app.notify(f"{info.name} is already loaded", title="Model")
            return
        try:
            format_before_load(info, chat.settings.engine.chat_template)
        except ChatPhaseError as exc:
            app.notify(str(exc), title="Model unusable", severity="error")
            return
        chat.settings = naming_model(chat.settings, info)  # F9 shows the model that is loaded
        switch(info)

    settings, engine = chat.settings, chat.settings.engine
    app.push_screen(
        ModelPickerScreen(
            n_ctx=engine.n_ctx_before_load,
            current_path=chat.model_info.path,
            models_dir=settings.models_dir,
            n_ubatch=engine.n_ubatch_used,
            type_k=engine.type_k,
            type_v=engine.type_v,
            planner=lambda path: plan_in_child(path, engine.to_dict()),
        ),
        chosen,
    )
