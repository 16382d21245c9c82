"""The token view's two widgets, both on Textual's Line API (a ``ScrollView`` that draws only the lines in view, never a
widget per token), so a 20,000-token prompt opens and scrolls as a short one does.

:class:`TokenGrid`: the turn's tokens wrapped to the width, one section each for the tokens an overflow left out,
the prompt and the reply, each prompt token on its source's colour (:data:`~chatphase.chat.token_view.PALETTE`,
neighbours in two shades so their edges show), an attached file's text italic, special tokens bold and underlined. :class:`GapStrip`: the reply's
tokens on a time strip, one cell each, its height the gap before it (ITL) against the turn's longest, accepted
drafts and a reasoning model's thinking in their own colours. Arrow keys move a selection in either; each says it with :class:`TokenSelected`.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

from rich.cells import cell_len, chop_cells
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.cache import LRUCache
from textual.color import Color
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from chatphase.chat.token_view import ACCEPTED_COLOUR, NEWLINE_MARK, PALETTE, THINKING_COLOUR, file_at, file_runs, shown
from chatphase.engine.tokens import TurnTokens

Part = Literal["left_out", "prompt", "reply"]
BLOCKS = "▁▂▃▄▅▆▇█"
_INK = Color.parse("#000000")
_WHITE = Color.parse("#ffffff")
_ITALIC = Style(italic=True)
_SPECIAL = Style(bold=True, underline=True)
_BOLD = Style(bold=True)
_REVERSE = Style(reverse=True)
#: the grid's drawn lines kept (a few screens' worth: what scrolls back into view is drawn once)
STRIP_CACHE_LINES = 160


@dataclass(frozen=True)
class TokenRef:
    """One token of the view: ``part`` and its index there (a prompt index is its position)."""

    part: Part
    index: int


def first_ref(t: TurnTokens) -> TokenRef:
    """The token a new grid selects: the first of its first part (the left-out tokens, else the prompt's, else the
    reply's).

    Raises:
        IndexError: the turn has no tokens.
    """
    for part, ids in (("left_out", t.left_out_ids), ("prompt", t.prompt_ids), ("reply", t.reply_ids)):
        if ids:
            return TokenRef(part, 0)  # type: ignore[arg-type]
    raise IndexError(0)


class TokenSelected(Message):
    """The selection moved to ``ref``."""

    def __init__(self, ref: TokenRef) -> None:
        super().__init__()
        self.ref = ref


def _shades(hex_colour: str) -> tuple[Style, Style]:
    """The source's two backgrounds (its colour, and lighter), black ink on both."""
    base = Color.parse(hex_colour)
    light = base.blend(_WHITE, 0.35)
    return (
        Style(color=_INK.rich_color, bgcolor=base.rich_color),
        Style(color=_INK.rich_color, bgcolor=light.rich_color),
    )


class _Entries:
    """The grid's tokens in order as parallel arrays: where each comes from and its index there; headers between
    the parts. Built once per turn."""

    def __init__(self, t: TurnTokens) -> None:
        self.t = t
        self.parts: list[tuple[Part, int, int, str]] = []  # (part, first entry, count, header)
        n_left, n_prompt, n_reply = len(t.left_out_ids), len(t.prompt_ids), len(t.reply_ids)
        start = 0
        if n_left:
            self.parts.append(("left_out", start, n_left, f"left out by the overflow ({t.left_out_how}) · {n_left:,}"))
            start += n_left
        self.parts.append(("prompt", start, n_prompt, f"prompt · {n_prompt:,} tok"))
        start += n_prompt
        if n_reply:
            self.parts.append(("reply", start, n_reply, f"reply · {n_reply:,} tok"))
        self.n = start + n_reply

    def ref(self, entry: int) -> TokenRef:
        for part, first, count, _ in self.parts:
            if first <= entry < first + count:
                return TokenRef(part, entry - first)
        raise IndexError(entry)

    def entry(self, ref: TokenRef) -> int:
        for part, first, _, _ in self.parts:
            if part == ref.part:
                return first + ref.index
        raise KeyError(ref.part)

    def token(self, ref: TokenRef) -> int:
        t = self.t
        ids = {"left_out": t.left_out_ids, "prompt": t.prompt_ids, "reply": t.reply_ids}[ref.part]
        return ids[ref.index]


class _LineOf:
    """Entry -> its line in a layout, by bisection in the token lines' first entries (``starts``, ascending) and
    their line numbers (``lines``, headers between them)."""

    def __init__(self, starts: array[int], lines: array[int]) -> None:
        self.starts, self.lines = starts, lines

    def __getitem__(self, entry: int) -> int:
        return self.lines[bisect_right(self.starts, entry) - 1]


class TokenGrid(ScrollView, can_focus=True):
    """The turn's tokens wrapped to the width (:mod:`module docstring <chatphase.ui.screens.token_grid>`)."""

    DEFAULT_CSS = """
    TokenGrid {
        height: 1fr;
        background: $surface;
    }
    TokenGrid:focus {
        background-tint: $foreground 3%;
    }
    """

    BINDINGS = [
        Binding("left", "move(-1)", "Previous token", show=False),
        Binding("right", "move(1)", "Next token", show=False),
        Binding("up", "line(-1)", "Line up", show=False),
        Binding("down", "line(1)", "Line down", show=False),
        Binding("pageup", "line(-10)", "Page up", show=False),
        Binding("pagedown", "line(10)", "Page down", show=False),
        Binding("home", "ends(0)", "First token", show=False),
        Binding("end", "ends(1)", "Last token", show=False),
    ]

    def __init__(
        self, tokens: TurnTokens, *, id: str | None = None, files: list[tuple[int, int, str]] | None = None
    ) -> None:
        super().__init__(id=id)
        self.entries = _Entries(tokens)
        self.cursor = self.entries.parts[0][1] if self.entries.n else 0
        self._ids = array("i", (*tokens.left_out_ids, *tokens.prompt_ids, *tokens.reply_ids))
        self._pieces: dict[int, tuple[str, int, bool]] = {}  # id -> (shown text, cells, ends a line)
        self._accepted = frozenset(tokens.reply_accepted)
        shades = {src: _shades(colour) for src, colour in PALETTE.items()}
        self._shades = {key: (*pair, *(st + _SPECIAL for st in pair)) for key, pair in shades.items()}
        self._accepted_shades = (*(pair := _shades(ACCEPTED_COLOUR)), *(st + _SPECIAL for st in pair))
        self._thinking_shades = (*(pair := _shades(THINKING_COLOUR)), *(st + _SPECIAL for st in pair))
        self._files = file_runs(tokens) if files is None else files  # the attached files' text (italic)
        self._plain = (Style(), Style(dim=True), _SPECIAL, Style(dim=True) + _SPECIAL)
        self._width = -1
        # the layout: each line's first entry (-1 - part for a header line) and each entry's line; the last two
        # widths' layouts are kept (a scrollbar that comes and goes flips between two)
        self._line_first: list[int] = []
        self._entry_line = _LineOf(array("i"), array("i"))
        self._layouts: dict[int, tuple[list[int], _LineOf]] = {}
        # what the wrap needs at any width, worked out here (the screen's build), not in its first layout's frame:
        # the entries' running width (cells; one more than entries) and 1 where a line ends after an entry
        pieces = {tok: self._piece(tok) for tok in set(self._ids)}  # once per vocabulary entry
        cells = {tok: w for tok, (_, w, _) in pieces.items()}
        ends = {tok: int(e) for tok, (_, _, e) in pieces.items()}
        self._cum = array("q", accumulate(map(cells.__getitem__, self._ids), initial=0))
        self._ends_line = bytes(map(ends.__getitem__, self._ids))
        self._strips: LRUCache[tuple[int, int, int, Style], Strip] = LRUCache(STRIP_CACHE_LINES)
        self._line_style: Style | None = None

    # -- layout ----------------------------------------------------------------------------------
    def _piece(self, token: int) -> tuple[str, int, bool]:
        """Token ``token``'s text as drawn, its width in cells and whether a line ends after it; worked out once
        per vocabulary entry, not once per token (a long prompt repeats its pieces)."""
        piece = self._pieces.get(token)
        if piece is None:
            text = shown(self.entries.t.text(token)) or "∅"
            piece = self._pieces[token] = (text, cell_len(text), text.endswith(NEWLINE_MARK))
        return piece

    def _style(self, entry: int) -> Style:
        """The entry's style: its source's shade by parity (a reply token's: plain, an accepted draft's or the
        thinking's), italic for an attached file's text, bold and underlined for a special token. Worked out for
        the tokens in view only."""
        ref = self.entries.ref(entry)
        t, i = self.entries.t, ref.index
        if ref.part == "left_out":
            shades = self._shades[t.left_out_how]
        elif ref.part == "prompt":
            shades = self._shades[t.source(i)]
        elif i in self._accepted:
            shades = self._accepted_shades
        else:
            shades = self._thinking_shades if t.thinking(i) else self._plain
        style = shades[i % 2 + 2 * t.special(self._ids[entry])]
        if ref.part == "prompt" and file_at(self._files, i) is not None:
            style += _ITALIC
        return style

    def _layout(self, width: int) -> None:
        """Wrap the entries to ``width`` cells: a part's header on a line of its own, a line broken after a
        newline piece or where the next token would not fit (a piece wider than the line alone on one, cut).
        Per line, not per token: each line's end is found by bisection in the entries' running width and a
        search for the next newline piece (both in C), so a 20,000-token prompt wraps in a few ms, not ~25."""
        width = max(width, 8)
        self._width = width
        if width not in self._layouts:
            cum, ends_line = self._cum, self._ends_line
            first: list[int] = []
            for p, (_, start, count, _) in enumerate(self.entries.parts):
                first.append(-1 - p)
                s, end = start, start + count
                while s < end:
                    first.append(s)
                    k = bisect_right(cum, cum[s] + width, s + 1, end + 1) - 1  # the most that fit: s..k-1
                    nl = ends_line.find(1, s, max(k, s + 1))
                    s = nl + 1 if nl >= 0 else max(k, s + 1)
            starts = array("i", (e for e in first if e >= 0))
            token_lines = array("i", (line for line, e in enumerate(first) if e >= 0))
            if len(self._layouts) >= 2:
                self._layouts.pop(next(iter(self._layouts)))
            self._layouts[width] = (first, _LineOf(starts, token_lines))
        self._line_first, self._entry_line = self._layouts[width]
        self.virtual_size = Size(width, len(self._line_first))

    def _line_end(self, line: int) -> int:
        """One past token line ``line``'s last entry."""
        first = self._line_first
        if line + 1 < len(first) and first[line + 1] >= 0:
            return first[line + 1]
        for _, start, count, _ in self.entries.parts:
            if start <= first[line] < start + count:
                return start + count
        raise IndexError(line)

    def _x(self, entry: int) -> int:
        """The column ``entry`` starts at on its line."""
        return min(self._cum[entry] - self._cum[self._line_first[self._entry_line[entry]]], self._width)

    def on_resize(self) -> None:
        width = self.scrollable_content_region.width
        if width != self._width:
            self._layout(width)
            self.scroll_to_cursor(animate=False)
            self.refresh()

    # -- drawing ---------------------------------------------------------------------------------
    def render_lines(self, crop: Region) -> list[Strip]:
        self._line_style = self.rich_style  # once a frame, not once a line (it walks the widget's ancestors)
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        """Line ``y`` of the view, the same :class:`Strip` object again while its line, the width, the selection
        on it and the widget's style are unchanged: Textual keeps what it derives from a strip (the line
        filters' pass, crops, the compositor's cuts) in the strip, so a line scrolled back into view costs a look-up,
        and a frame makes few new objects for the garbage collector to walk."""
        line = self.scroll_offset.y + y
        width = self.scrollable_content_region.width
        base = self._line_style or self.rich_style
        if self._width < 0 or line >= len(self._line_first):
            return Strip.blank(width, base)
        first = self._line_first[line]
        on_line = first >= 0 and self._entry_line[self.cursor] == line
        key = (line, width, self.cursor if on_line else -1, base)
        strip = self._strips.get(key)
        if strip is None:
            strip = self._strips[key] = self._draw_line(line, width, base)
        return strip

    def _draw_line(self, line: int, width: int, base: Style) -> Strip:
        first = self._line_first[line]
        if first < 0:  # a header
            header = self.entries.parts[-1 - first][3]
            text = f"── {header} " + "─" * max(0, width - cell_len(header) - 4)
            return Strip([Segment(text[:width], _BOLD)]).adjust_cell_length(width, base)
        segments = []
        for e in range(first, self._line_end(line)):
            text, cells, _ = self._piece(self._ids[e])
            if cells > width:
                text = chop_cells(text, width)[0]
            style = self._style(e)
            if e == self.cursor:
                style = style + _REVERSE
            segments.append(Segment(text, style))
        return Strip(segments).adjust_cell_length(width, base)

    # -- selection -------------------------------------------------------------------------------
    def select(self, ref: TokenRef, notify: bool = True) -> None:
        """Move the selection to ``ref`` and bring it into view."""
        old, self.cursor = self.cursor, max(0, min(self.entries.entry(ref), self.entries.n - 1))
        self.scroll_to_cursor()  # a scroll repaints the whole view itself
        if self._width >= 0 and old != self.cursor:
            for line in {self._entry_line[old], self._entry_line[self.cursor]}:
                self.refresh_line(line)  # only the lines the selection left and came to
        if notify:
            self.post_message(TokenSelected(self.entries.ref(self.cursor)))

    @property
    def selected(self) -> TokenRef:
        return self.entries.ref(self.cursor)

    def scroll_to_cursor(self, animate: bool = False) -> None:
        if not self.entries.n or self._width < 0:
            return
        e = self.cursor
        line = self._entry_line[e]
        if line > 0 and self._line_first[line - 1] < 0:
            line -= 1  # the part's header with its first line
        self.scroll_to_region(Region(0, line, 1, 1 + self._entry_line[e] - line), animate=animate, immediate=True)

    def action_move(self, delta: int) -> None:
        if self.entries.n:
            self.select(self.entries.ref(max(0, min(self.cursor + delta, self.entries.n - 1))))

    def action_line(self, delta: int) -> None:
        """The token under the cursor's column ``delta`` token lines away (headers skipped)."""
        if not self.entries.n or self._width < 0:
            return
        first, step = self._line_first, 1 if delta > 0 else -1
        target = self._entry_line[self.cursor]
        for _ in range(abs(delta)):
            line = target + step
            while 0 <= line < len(first) and first[line] < 0:
                line += step
            if not 0 <= line < len(first):
                break
            target = line
        x = self._x(self.cursor)
        e = self._line_first[target]
        while e + 1 < self._line_end(target) and self._x(e + 1) <= x:
            e += 1
        self.select(self.entries.ref(e))

    def action_ends(self, last: int) -> None:
        if self.entries.n:
            self.select(self.entries.ref(self.entries.n - 1 if last else 0))


class GapStrip(ScrollView, can_focus=True):
    """The reply's tokens on a time strip: one cell each, its block's height the gap before it against the
    turn's longest (the first token, whose time is the TTFT, a bar of its own colour); scrolls sideways."""

    DEFAULT_CSS = """
    GapStrip {
        height: 2;
        background: $surface;
        scrollbar-size-horizontal: 1;
        overflow-y: hidden;
    }
    GapStrip:focus {
        background-tint: $foreground 3%;
    }
    """

    BINDINGS = [
        Binding("left", "move(-1)", "Previous token", show=False),
        Binding("right", "move(1)", "Next token", show=False),
        Binding("home", "ends(0)", "First token", show=False),
        Binding("end", "ends(1)", "Last token", show=False),
    ]

    def __init__(self, tokens: TurnTokens, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.t = tokens
        n = len(tokens.reply_ids)
        gaps = [tokens.itl_ms(i) or 0.0 for i in range(n)]
        longest = max(gaps, default=0.0)
        self._cells = "".join(
            "▕" if i == 0 else BLOCKS[min(7, int(8 * g / longest))] if longest > 0 else BLOCKS[0]
            for i, g in enumerate(gaps)
        )
        accepted = frozenset(tokens.reply_accepted)
        plain, draft = Style(color=PALETTE["prefilled"]), Style(color=ACCEPTED_COLOUR)
        thinking = Style(color=THINKING_COLOUR)
        self._styles = [draft if i in accepted else thinking if tokens.thinking(i) else plain for i in range(n)]
        self.cursor = 0
        self.virtual_size = Size(n, 1)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if y != 0 or not self._cells:
            return Strip.blank(width, self.rich_style)
        x0 = self.scroll_offset.x
        segments = []
        for i in range(x0, min(x0 + width, len(self._cells))):
            style = self._styles[i] + Style(reverse=True) if i == self.cursor else self._styles[i]
            segments.append(Segment(self._cells[i], style))
        return Strip(segments).adjust_cell_length(width, self.rich_style)

    def select(self, index: int, notify: bool = True) -> None:
        if not self._cells:
            return
        self.cursor = max(0, min(index, len(self._cells) - 1))
        self.scroll_to_region(Region(self.cursor, 0, 1, 1), animate=False, immediate=True)
        self.refresh()
        if notify:
            self.post_message(TokenSelected(TokenRef("reply", self.cursor)))

    def action_move(self, delta: int) -> None:
        self.select(self.cursor + delta)

    def action_ends(self, last: int) -> None:
        self.select(len(self._cells) - 1 if last else 0)
