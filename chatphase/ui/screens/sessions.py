"""Screens for saved sessions: the list (open, rename, delete, export) and the export dialog.

:class:`SessionsScreen` dismisses with the id of the session to open (Enter), or ``None`` (Esc).
Rename (``r``) edits the title in place; delete (``d``, pressed twice to confirm) removes the file —
except for the session being recorded, which cannot be deleted while it is open. :class:`ExportScreen`
writes one session as Markdown, JSON or CSV (:mod:`chatphase.sessions.export`) and dismisses with the path.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label, RadioButton, RadioSet, Static

from chatphase.engine.text import inert
from chatphase.errors import ChatPhaseError
from chatphase.sessions.catalog import delete_session, list_sessions, load_session, rename_session
from chatphase.sessions.export import FORMATS, default_export_path, write_export
from chatphase.sessions.store import Session, local_time
from chatphase.units import fmt_count

FORMAT_LABELS = {
    "md": "Markdown (transcript + metrics table)",
    "json": "JSON (everything)",
    "csv": "CSV (one row per turn, one column per metric)",
}


#: the sessions table's columns; Title and Model (indices 1, 2) give way when the table is narrow.
COLUMNS = ("ID", "Title", "Model", "Turns", "Last used")
_SHRINKABLE = (1, 2)
_MIN_SHRUNK = 6


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` cells with a trailing … when longer (cell widths as Rich counts them)."""
    from rich.cells import cell_len, set_cell_size

    return text if cell_len(text) <= width else set_cell_size(text, max(width - 1, 0)) + "…"


def fit_columns(total: int, rows: list[tuple[str, ...]], cell_padding: int = 1) -> list[int]:
    """Column widths (cells) for :data:`COLUMNS` so that the table fits ``total`` cells: each column as
    wide as its longest cell or label; when that is too wide, Title and Model give way (the wider one
    first, a cell at a time) down to :data:`_MIN_SHRUNK` cells, then a long Turns text ("3 (1 partial)")
    down to its label; ID and Last used never."""
    from rich.cells import cell_len

    widths = [max([cell_len(label)] + [cell_len(r[i]) for r in rows]) for i, label in enumerate(COLUMNS)]
    excess = sum(widths) + 2 * cell_padding * len(COLUMNS) - total
    while excess > 0:  # one cell at a time from the wider of Title and Model
        i = max(_SHRINKABLE, key=lambda k: widths[k])
        if widths[i] <= _MIN_SHRUNK:
            break
        widths[i] -= 1
        excess -= 1
    turns = COLUMNS.index("Turns")
    if excess > 0:
        widths[turns] -= min(excess, widths[turns] - len(COLUMNS[turns]))
    return widths


class SessionsScreen(ModalScreen[str | None]):
    """The saved sessions, newest first. ``current_id`` is the session being recorded (marked, and
    protected from deletion)."""

    CSS_PATH = "sessions.tcss"
    BINDINGS = [
        Binding("escape", "close", "Close", id="sessions.close"),
        Binding("r", "rename", "Rename", id="sessions.rename"),
        Binding("d", "delete", "Delete", id="sessions.delete"),
        Binding("e", "export", "Export", id="sessions.export"),
    ]

    def __init__(self, current_id: str | None = None) -> None:
        super().__init__()
        self.current_id = current_id
        self._armed_delete: str | None = None
        self._rows: list | None = None  # the summaries last read from disk (a resize only refits them)

    def compose(self) -> ComposeResult:
        with Vertical(id="sessions-box", classes="modal-box"):
            yield Label(
                "Sessions  ·  Enter open  ·  r rename  ·  d delete  ·  e export  ·  Esc close", classes="panel-title"
            )
            yield DataTable(id="sessions-table", cursor_type="row", zebra_stripes=True)
            yield Input(id="sessions-rename", placeholder="new title, Enter to save, Esc to cancel")
            yield Static("", id="sessions-status", markup=False)  # titles, errors

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        self.query_one("#sessions-rename", Input).display = False
        self.refresh_table()
        table.focus()

    def on_resize(self) -> None:
        # the columns are fitted to the table's width; the list is not read from disk again
        self.refresh_table(keep=self.selected_id, reload=False)

    def refresh_table(self, keep: str | None = None, reload: bool = True) -> None:
        """Reload the list from disk (``reload``; else the list last read), cursor kept on ``keep`` when
        given, the columns fitted to the table's width: ID, Turns and Last used whole, Title and Model cut
        with … to share the rest."""
        table = self.query_one(DataTable)
        if reload or self._rows is None:
            self._rows = list_sessions()
        rows = self._rows
        cells: list[tuple[str, ...]] = []
        for s in rows:
            turns = f"{s.turns}" + (f" ({s.partial_turns} partial)" if s.partial_turns else "")
            mark = "● " if s.id == self.current_id else ""
            cells.append((mark + s.id, inert(s.title), inert(s.model), turns, local_time(s.last_used)))
        scrollbar = table.styles.scrollbar_size_vertical if len(rows) + 1 > table.size.height else 0
        width = table.size.width - scrollbar
        widths = fit_columns(width, cells, cell_padding=table.cell_padding)
        table.clear(columns=True)
        for label, w in zip(COLUMNS, widths, strict=True):
            table.add_column(label, width=w)
        for s, row in zip(rows, cells, strict=True):
            table.add_row(*(Text(clip(text, w)) for text, w in zip(row, widths, strict=True)), key=s.id)  # not markup
        if keep and keep in {s.id for s in rows}:
            table.move_cursor(row=table.get_row_index(keep))
        self._status("No saved sessions yet." if not rows else f"{len(rows)} sessions (● = this chat)")

    def _status(self, text: str, kind: str = "") -> None:
        status = self.query_one("#sessions-status", Static)
        status.set_classes(kind)
        status.update(inert(text))

    @property
    def selected_id(self) -> str | None:
        """The id under the cursor, or ``None`` when the list is empty."""
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(event.row_key.value)

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self._armed_delete = None

    def action_rename(self) -> None:
        sid = self.selected_id
        if sid is None:
            return
        box = self.query_one("#sessions-rename", Input)
        box.value = inert(load_session(sid).title)
        box.display = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        sid = self.selected_id
        event.input.display = False
        self.query_one(DataTable).focus()
        if sid is None:
            return
        try:
            s = rename_session(sid, event.value)
        except ChatPhaseError as exc:
            self._status(str(exc), "-error")
            return
        self.refresh_table(keep=sid)
        self._status(f"Renamed {sid}: {s.title}")

    def action_delete(self) -> None:
        sid = self.selected_id
        if sid is None:
            return
        if sid == self.current_id:
            self._status("This is the open chat's session: start a new chat (Ctrl+N) before deleting it.", "-error")
            return
        if self._armed_delete != sid:
            self._armed_delete = sid
            self._status(f"Press d again to delete {sid} for good.", "-warning")
            return
        self._armed_delete = None
        try:
            s = delete_session(sid)
        except ChatPhaseError as exc:
            self._status(str(exc), "-error")
            return
        self.refresh_table()
        self._status(f"Deleted {sid}: {s.title}")

    def action_export(self) -> None:
        sid = self.selected_id
        if sid is not None:
            self.app.push_screen(
                ExportScreen(load_session(sid)), lambda path: self._status(f"Exported to {path}") if path else None
            )

    def action_close(self) -> None:
        box = self.query_one("#sessions-rename", Input)
        if box.display:  # Esc first cancels a rename
            box.display = False
            self.query_one(DataTable).focus()
            return
        self.dismiss(None)


class ExportScreen(ModalScreen[Path | None]):
    """Export ``session``: pick a format, edit the path (default ``./chatphase-<id>.<fmt>``), Enter."""

    CSS_PATH = "sessions.tcss"
    BINDINGS = [Binding("escape", "close", "Close", id="export.close")]

    def __init__(self, session: Session, directory: Path | None = None) -> None:
        super().__init__()
        self.session = session
        self.directory = directory
        self.fmt = "md"

    def compose(self) -> ComposeResult:
        with Vertical(id="export-box", classes="modal-box"):
            yield Label(
                inert(f"Export {self.session.title or self.session.id} ({fmt_count(len(self.session.turns), 'turn')})"),
                classes="panel-title",
                markup=False,
            )
            yield Static("Format: arrows, Enter  ·  Tab: the path, Enter exports  ·  Esc cancel", id="export-hint")
            with RadioSet(id="export-format"):
                for fmt in FORMATS:
                    yield RadioButton(FORMAT_LABELS[fmt], value=fmt == self.fmt, name=fmt)
            yield Input(str(default_export_path(self.session, self.fmt, self.directory)), id="export-path")
            yield Static("", id="export-status", markup=False)  # errors naming paths
            with Horizontal(id="export-buttons"):
                yield Button("Export", variant="primary", id="export-go")
                yield Button("Cancel", id="export-cancel")

    def on_mount(self) -> None:
        self.query_one("#export-format", RadioSet).focus()  # the hint's order: the format first

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        old_default = str(default_export_path(self.session, self.fmt, self.directory))
        self.fmt = event.pressed.name or "md"
        path = self.query_one("#export-path", Input)
        if path.value == old_default:  # follow the format unless the user typed a path
            path.value = str(default_export_path(self.session, self.fmt, self.directory))

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self.export()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "export-go":
            self.export()
        else:
            self.dismiss(None)

    def export(self) -> None:
        """Write the file; on success notify and dismiss with its path, else show the error here."""
        text = self.query_one("#export-path", Input).value.strip()
        if not text:
            self.query_one("#export-status", Static).update("Give a file path.")
            return
        try:
            path = write_export(self.session, self.fmt, Path(text).expanduser())
        except ChatPhaseError as exc:
            self.query_one("#export-status", Static).update(inert(str(exc)))
            return
        self.app.notify(f"Exported {self.session.id} as {self.fmt} to {path}", title="Session: Export")
        self.dismiss(path)

    def action_close(self) -> None:
        self.dismiss(None)
