"""Turn history: one row per finished turn, newest last, selectable (a Textual ``DataTable``).

Selecting or highlighting a row posts :class:`TurnHistoryTable.TurnChosen` with the turn number; the
dashboard answers by showing that turn's full metrics and timeline.

The table lives in the side panel (54 cells wide next to the chat, about 50 below it at 80×24), so its
ten figures per turn are stacked two to a cell: each column holds two figures of one unit, top over
bottom, and its three-line header names them (top, bottom, unit). Numbers are right-aligned. The table
takes 45 cells with four-digit figures (48 with a ``cancelled`` stop), so it does not scroll sideways there.

Once a turn of the chat had a thinking block (a reasoning model), the table uses :data:`THINKING_COLUMNS`:
the bottom figure of the token column is the turn's thinking tokens instead of the KV tokens after it
(those are close to prompt + decode tokens, and shown in the turn's detail and the KV gauge), so the
table keeps its width. A new chat goes back to :data:`COLUMNS`. A turn decoded speculatively shows, under
its stop reason, its tokens per target step and its speed-up against its own plain steps (``2.7×1.6``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from chatphase.engine.metrics import TurnMetrics
from chatphase.units import DASH, fmt_int

#: (column key, header) in display order. A stacked column's header is "top figure\nbottom figure\nunit".
COLUMNS: tuple[tuple[str, str], ...] = (
    ("turn", "#"),
    ("prompt_cached_tokens", "prompt\ncached\ntok"),
    ("ttft_itl_p95_ms", "TTFT\nITL p95\nms"),
    ("prefill_decode_tokens_per_s", "prefill\ndecode\ntok/s"),
    ("decode_kv_tokens", "decode\nKV\ntok"),
    ("stop_reason", "stop"),
)
#: the columns once a turn had thinking: decode tokens over thinking tokens in place of decode over KV.
THINKING_COLUMNS: tuple[tuple[str, str], ...] = tuple(
    ("decode_thinking_tokens", "decode\nthink\ntok") if key == "decode_kv_tokens" else (key, header)
    for key, header in COLUMNS
)
#: the header's height in lines (top figure, bottom figure, unit).
HEADER_HEIGHT = 3
#: a row's height in lines (two figures per cell).
ROW_HEIGHT = 2
#: columns drawn left-aligned (the rest are numbers, right-aligned).
TEXT_COLUMNS = frozenset({"stop_reason"})


def _num(value: float | None, digits: int) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def format_row(number: int, m: TurnMetrics, thinking: bool = False) -> tuple[str, ...]:
    """The table cells of one turn, in :data:`COLUMNS` order (:data:`THINKING_COLUMNS` with ``thinking``;
    ``–`` for an undefined metric); a stacked cell is ``"top\\nbottom"``. Cached tokens
    restored from the prefix store follow the cached count as ``⤓N``."""
    below_decode = m.thinking_tokens if thinking else m.kv_cache_tokens
    return (
        str(number),
        f"{fmt_int(m.prompt_tokens)}\n{fmt_int(m.cached_tokens)}"
        + (f" ⤓{m.restored_tokens:,}" if m.restored_tokens else ""),
        f"{_num(m.ttft_ms, 1)}\n{_num(m.itl_ms_p95, 1)}",
        f"{_num(m.prefill_tokens_per_s, 0)}\n{_num(m.decode_tokens_per_s, 1)}",
        f"{fmt_int(m.decode_tokens)}\n{fmt_int(below_decode)}",
        _stop_cell(m),
    )


def _stop_cell(m: TurnMetrics) -> str:
    """The stop reason (``context_full`` on two lines, like the figures beside it); under it, for a turn
    decoded speculatively, its tokens per target step and speed-up (``2.7×1.6``)."""
    if m.spec_mode is None:
        return m.stop_reason.replace("_", "\n", 1)
    steps = DASH if m.spec_tokens_per_step is None else f"{m.spec_tokens_per_step:.1f}"
    speedup = "" if m.spec_speedup is None else f"×{m.spec_speedup:.1f}"
    return f"{m.stop_reason.replace('_', ' ')}\n{steps}{speedup}"


def _cell(key: str, text: str) -> Text:
    return Text(text, justify="left" if key in TEXT_COLUMNS else "right")


class TurnHistoryTable(DataTable):
    """Every turn of this chat with its headline metrics; row key = the turn number as a string. ``thinking``:
    whether the table shows :data:`THINKING_COLUMNS` (a turn had thinking)."""

    DEFAULT_CSS = """
    TurnHistoryTable {
        height: auto;
        max-height: 13;  /* the header and five turns */
        scrollbar-size-vertical: 1;
    }
    """

    @dataclass
    class TurnChosen(Message):
        """The user moved the cursor to (or selected) the row of ``number``."""

        number: int

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, header_height=HEADER_HEIGHT, **kwargs)
        self.thinking = False
        self._turns: dict[int, TurnMetrics] = {}  # the rows shown, to redraw them in the other columns

    @property
    def columns_shown(self) -> tuple[tuple[str, str], ...]:
        """:data:`COLUMNS` or :data:`THINKING_COLUMNS`."""
        return THINKING_COLUMNS if self.thinking else COLUMNS

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        for key, header in self.columns_shown:
            self.add_column(_cell(key, header), key=key)

    def upsert_turn(self, number: int, metrics: TurnMetrics) -> None:
        """Add the turn as the last row, or update its cells when the number is already shown (regenerate).
        The first turn with thinking switches the table to :data:`THINKING_COLUMNS`."""
        if metrics.thought and not self.thinking:
            self._turns[number] = metrics
            self._switch_columns(True)
            return
        self._turns[number] = metrics
        columns = self.columns_shown
        texts = format_row(number, metrics, self.thinking)
        cells = [_cell(key, value) for (key, _), value in zip(columns, texts, strict=True)]
        key = str(number)
        if key in self.rows:
            for (col, _), value in zip(columns, cells, strict=True):
                self.update_cell(key, col, value, update_width=True)
        else:
            self.add_row(*cells, height=ROW_HEIGHT, key=key)
            self.move_cursor(row=self.row_count - 1, animate=False)
        self._drop_stale_lines()

    def _drop_stale_lines(self) -> None:
        """Forget the rendered lines and cells of every row. DataTable keys them by its update count,
        which each change above advanced, so none can be drawn again; its LRU caches (1,000 lines and
        rows, 10,000 cells) would otherwise keep them, and as the table renders all its rows (it grows
        in a scrolling pane), a chat's first hundred turns would fill them: about 100 KiB a turn."""
        self._clear_caches()

    def _switch_columns(self, thinking: bool) -> None:
        """Show the other columns, every row kept (the cursor on the newest)."""
        self.thinking = thinking
        turns = dict(self._turns)
        self.clear(columns=True)
        self._add_columns()
        for number, metrics in turns.items():
            self.upsert_turn(number, metrics)

    def reset(self) -> None:
        """Forget every row (a new chat), back to :data:`COLUMNS`."""
        self._turns.clear()
        if self.thinking:
            self._switch_columns(False)
        else:
            self.clear()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.TurnChosen(int(event.row_key.value)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.TurnChosen(int(event.row_key.value)))
