"""The token view of one turn (a key and the palette open it for the selected or last turn): the counts that equal
its metrics, a legend, the prompt's tokens coloured by where they came from, the reply's tokens on a time strip,
and the selected token's id, position, text (inert) and time. Tab moves between the grid and the strip; Esc or q
closes it. The data is :class:`~chatphase.engine.tokens.TurnTokens`; the words are :mod:`chatphase.chat.token_view`'s.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Label, Static

from chatphase.chat.token_view import (
    ACCEPTED_COLOUR,
    LEGEND,
    PALETTE,
    THINKING_COLOUR,
    counts_line,
    file_at,
    file_runs,
    shown,
    sources_present,
)
from chatphase.engine.tokens import TurnTokens
from chatphase.ui.screens.modals import CloseableScreen
from chatphase.ui.screens.token_grid import GapStrip, TokenGrid, TokenRef, TokenSelected, first_ref
from chatphase.units import fmt_ms


def legend(t: TurnTokens, files: list[tuple[int, int, str]] | None = None) -> Text:
    """A swatch and the words per source this turn has, then the marks for special tokens, an attached file's text
    (``files``: the turn's :func:`~chatphase.chat.token_view.file_runs`), accepted drafts and thinking."""
    out = Text()
    for src in sources_present(t):
        out.append("  ", style=f"on {PALETTE[src]}")
        out.append(f" {LEGEND[src]}  ")
    out.append("special", style="bold underline")
    out.append(" template token")
    if files:
        out.append("  ")
        out.append("italic", style="italic")
        out.append(" a file's text")
    if t.reply_accepted:
        out.append("  ")
        out.append("  ", style=f"on {ACCEPTED_COLOUR}")
        out.append(" accepted draft")
    if t.thinking_tokens:
        out.append("  ")
        out.append("  ", style=f"on {THINKING_COLOUR}")
        out.append(" thinking")
    return out


def detail(t: TurnTokens, ref: TokenRef, files: list[tuple[int, int, str]] | None = None) -> Text:
    """The selected token in one line: where it is, its id, source, the file it is from (``files``: the turn's
    :func:`~chatphase.chat.token_view.file_runs`), time (a reply token) and text, inert."""
    if ref.part == "reply":
        tok = t.reply_ids[ref.index]
        gap = t.itl_ms(ref.index)
        when = f"t {fmt_ms(t.t_ms(ref.index))} · " + ("TTFT" if gap is None else f"gap {fmt_ms(gap)}")
        draft = " · accepted draft" if ref.index in t.reply_accepted else ""
        draft += " · thinking" if t.thinking(ref.index) else ""
        head = f"reply #{ref.index:,} · id {tok} · {when}{draft}"
    elif ref.part == "left_out":
        tok = t.left_out_ids[ref.index]
        head = f"left out #{ref.index:,} · id {tok} · {t.left_out_how}"
    else:
        tok = t.prompt_ids[ref.index]
        name = file_at(files or [], ref.index)
        where = f" · from {shown(name)}" if name else ""
        head = f"prompt position {ref.index:,} · id {tok} · {t.source(ref.index)}{where}"
    special = " · special" if t.special(tok) else ""
    return Text(f"{head}{special} · «{shown(t.text(tok))}»")


class TokenScreen(CloseableScreen):
    """Turn ``number``'s tokens (:mod:`module docstring <chatphase.ui.screens.tokens>`)."""

    CSS_PATH = "tokens.tcss"

    def __init__(self, number: int, tokens: TurnTokens) -> None:
        super().__init__()
        self.number, self.tokens = number, tokens
        self.files = file_runs(tokens)  # once: each selection names its token's file
        self._detail_cells = 0  # the detail line's width as last shown (cells)

    def compose(self) -> ComposeResult:
        t = self.tokens
        with Vertical(id="tokens-box", classes="modal-box"):
            yield Label(self.titled(f"Turn {self.number} tokens  ·  Tab grid/strip"), classes="panel-title")
            yield Static(Text(counts_line(t)), id="tokens-counts")
            yield Static(legend(t, self.files), id="tokens-legend")
            yield Vertical(id="tokens-body")  # the grid and the strip: mounted once the rest is drawn
            first = detail(t, first_ref(t), self.files)  # drawn with the rest, not updated once it is up
            self._detail_cells = first.cell_len
            yield Static(first, id="tokens-detail")

    def on_mount(self) -> None:
        # the screen's first build in two event-loop turns, each well under a frame's budget: the frame and its
        # lines, then the grid and the strip (benchmarks/token_view.py: one turn for both blocked the UI ~50 ms)
        self.call_after_refresh(self._mount_body)

    async def _mount_body(self) -> None:
        t = self.tokens
        grid = TokenGrid(t, id="tokens-grid", files=self.files)
        body: list[Widget] = [grid]
        if t.reply_ids:
            body.append(
                Label("reply on a time strip: each token's height is the gap before it", id="tokens-strip-title")
            )
            body.append(GapStrip(t, id="tokens-strip"))
        await self.query_one("#tokens-body", Vertical).mount_all(body)
        grid.focus()

    def on_token_selected(self, message: TokenSelected) -> None:
        message.stop()
        ref = message.ref
        if ref.part == "reply":  # the other widget follows, without saying it again
            for strip in self.query(GapStrip):
                if message.control is not strip:
                    strip.select(ref.index, notify=False)
        grid = self.query_one(TokenGrid)
        if grid.selected != ref:
            grid.select(ref, notify=False)
        self._show(ref)

    def _show(self, ref: TokenRef) -> None:
        """The detail line for ``ref``; a layout of the screen only where its height may change (a line as wide
        as the box, before or after: it wraps), not on every selection move."""
        widget = self.query_one("#tokens-detail", Static)
        text = detail(self.tokens, ref, self.files)
        width = widget.content_region.width
        wraps = not 0 < max(text.cell_len, self._detail_cells) < width
        self._detail_cells = text.cell_len
        widget.update(text, layout=wraps)
