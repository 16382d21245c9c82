"""Turn history: one row per finished turn, newest last, selectable (a Textual ``DataTable``).

Selecting or highlighting a row posts :class:`TurnHistoryTable.TurnChosen` with the turn id; the
dashboard answers by showing that turn's full metrics and timeline.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message
from textual.widgets import DataTable

from chatphase.engine.metrics import TurnMetrics
from chatphase.ui.format import fmt_int

#: (column key, header) in display order; two-line headers (name, unit) keep the table within 80 columns.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("turn", "#"),
    ("prompt_tokens", "prompt\ntok"),
    ("cached_tokens", "cached\ntok"),
    ("ttft_ms", "TTFT\nms"),
    ("prefill_tokens_per_s", "prefill\ntok/s"),
    ("decode_tokens", "decode\ntok"),
    ("decode_tokens_per_s", "decode\ntok/s"),
    ("itl_ms_p95", "ITL p95\nms"),
    ("kv_cache_tokens", "KV\ntok"),
    ("stop_reason", "stop"),
)

DASH = "–"


def _num(value: float | None, digits: int) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def format_row(turn_id: int, m: TurnMetrics) -> tuple[str, ...]:
    """The table cells of one turn, in :data:`COLUMNS` order (``–`` for an undefined metric)."""
    return (
        str(turn_id),
        fmt_int(m.prompt_tokens),
        fmt_int(m.cached_tokens),
        _num(m.ttft_ms, 1),
        _num(m.prefill_tokens_per_s, 0),
        fmt_int(m.decode_tokens),
        _num(m.decode_tokens_per_s, 1),
        _num(m.itl_ms_p95, 1),
        fmt_int(m.kv_cache_tokens),
        m.stop_reason,
    )


class TurnHistoryTable(DataTable):
    """Every turn of this chat with its headline metrics; row key = the turn id as a string."""

    @dataclass
    class TurnChosen(Message):
        """The user moved the cursor to (or selected) the row of ``turn_id``."""

        turn_id: int

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, header_height=2, **kwargs)

    def on_mount(self) -> None:
        for key, header in COLUMNS:
            self.add_column(header, key=key)

    def upsert_turn(self, turn_id: int, metrics: TurnMetrics) -> None:
        """Add the turn as the last row, or update its cells when the id is already shown (regenerate)."""
        cells = format_row(turn_id, metrics)
        key = str(turn_id)
        if key in self.rows:
            for (col, _), value in zip(COLUMNS, cells):
                self.update_cell(key, col, value)
            return
        self.add_row(*cells, key=key)
        self.move_cursor(row=self.row_count - 1, animate=False)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.TurnChosen(int(event.row_key.value)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.TurnChosen(int(event.row_key.value)))
