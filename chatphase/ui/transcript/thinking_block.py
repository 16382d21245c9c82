"""ThinkingBlock: a reasoning model's thinking, shown above its answer in the chat log.

While the model thinks, a one-line header with the running count ("Thinking… 312 tok · 4.1 s": the
turn's figures, on the engine's clock) sits over a fixed-height, dimmed tail of the thinking's last lines.
The text is read from the turn it streams in (the chat's :class:`~chatphase.chat.turn.Turn`, never copied
here); :meth:`ThinkingBlock.draw`, called at the chat's tick rate, redraws the header and the tail without
a layout (their sizes are fixed in its ``DEFAULT_CSS``). When the answer starts, or the reply ends inside the
block, :meth:`ThinkingBlock.finish` collapses it to one line (:func:`thought_title`: "Thought for 4.1 s ·
312 tok"), a :class:`~textual.widgets.Collapsible` that expands to the whole thinking text (Enter on its
title, or a click); ``open`` keeps it expanded (the ``thinking_open`` setting).
"""

from __future__ import annotations

from textual.containers import Vertical
from textual.widgets import Collapsible, Static

from chatphase.chat.turn import Turn
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.text import inert
from chatphase.ui.transcript.reply_tail import tail_lines
from chatphase.units import fmt_int, fmt_seconds

#: height of the streaming thinking's tail (lines); ``.thinking-tail`` in ``DEFAULT_CSS`` has the same.
THINKING_TAIL_LINES = 4


def thinking_live(tokens: int, seconds: float | None) -> str:
    """The running count of a block being thought: ``312 tok · 4.1 s``."""
    return f"{fmt_int(tokens)} tok · {fmt_seconds(seconds)}"


def thought_title(tokens: int | None, thinking_ms: float | None, cut_short: bool = False, forced: bool = False) -> str:
    """The collapsed block's line: ``Thought for 4.1 s · 312 tok``; ``Thinking cut short after …`` when the
    reply ended inside the block; ``· budget reached`` when the engine closed it (the thinking budget)."""
    figures = f"{fmt_seconds((thinking_ms or 0.0) / 1000)} · {fmt_int(tokens)} tok"
    if cut_short:
        return f"Thinking cut short after {figures}"
    return f"Thought for {figures}" + (" · budget reached" if forced else "")


def metrics_title(m: TurnMetrics | None, forced: bool = False) -> str:
    """:func:`thought_title` of a finished turn's metrics (``None``: a turn without metrics)."""
    if m is None or not m.thought:
        return "Thought (no metrics)"
    return thought_title(m.thinking_tokens, m.thinking_ms, m.thinking_cut_short, forced)


class ThinkingBlock(Vertical):
    """One reply's thinking (see the module docstring).

    Args:
        text: the whole thinking of a finished block.
        turn: the turn whose thinking streams into the block (read from it until :meth:`finish`).
        title: the collapsed line; given, the block starts finished (a restored turn).
        open: a finished block starts expanded.
    """

    DEFAULT_CSS = """
    /* dimmed, above the answer; while it streams a one-line count over a fixed tail (THINKING_TAIL_LINES
       lines, so updates need no layout), then one collapsible line */
    ThinkingBlock { height: auto; }
    ThinkingBlock .thinking-live { height: 1; padding: 0 1; color: $text-muted; text-style: italic; }
    ThinkingBlock .thinking-tail {
        height: 4;
        margin: 0 0 0 1;
        padding: 0 1;
        border-left: outer $panel-lighten-2;
        color: $text-muted;
        text-wrap: nowrap;
        text-overflow: clip;
    }
    ThinkingBlock Collapsible { background: transparent; border-top: none; padding: 0; }
    /* .thinking puts the title's looks above Textual's own CollapsibleTitle:focus and :hover */
    ThinkingBlock.thinking CollapsibleTitle { color: $text-muted; text-style: italic; }
    ThinkingBlock Collapsible Contents { padding: 0 1 0 1; }
    ThinkingBlock .thinking-text { margin: 0 0 0 1; padding: 0 1; border-left: outer $panel-lighten-2; color: $text-muted; }
    """

    def __init__(
        self, text: str = "", *, turn: Turn | None = None, title: str | None = None, open: bool = False
    ) -> None:
        super().__init__(classes="thinking")
        self._turn = turn
        self._text = text
        self.title = title or ""
        self.finished = title is not None
        self.open = open
        self._composed = False
        self._fold: Collapsible | None = None  # the finished block (made by :meth:`_make_fold`)
        self._drawn: tuple | None = None  # what the header and tail last drawn were made of

    @property
    def text(self) -> str:
        """The thinking text so far: its turn's while it streams, then the finished block's."""
        return self._turn.thinking if self._turn is not None else self._text

    def compose(self):
        self._header = Static("Thinking…", markup=False, classes="thinking-live")
        self._tail = Static("", markup=False, classes="thinking-tail")
        self._header.display = self._tail.display = not self.finished
        self._composed = True
        yield self._header
        yield self._tail
        if self.finished:
            yield self._make_fold()

    def _make_fold(self) -> Collapsible:
        """The finished block's line and text. Made when the block finishes: a Collapsible opened later by
        code would scroll itself into view, taking the chat log off the streaming answer."""
        self._body = Static(inert(self.text.strip()), markup=False, classes="thinking-text")
        self._fold = Collapsible(self._body, title=self.title, collapsed=not self.open, classes="thinking-fold")
        return self._fold

    @property
    def expanded(self) -> bool:
        """Whether the finished block shows the whole thinking text."""
        return self._fold is not None and not self._fold.collapsed

    def draw(self, tokens: int, seconds: float) -> None:
        """Redraw the running count and the tail (no layout); nothing when unchanged or finished."""
        if self.finished or not self._composed or not self.is_attached:  # finished, or cleared from the log
            return
        tail = self._tail
        width = max(1, tail.content_size.width or self.content_size.width - 3)
        lines = tail.content_size.height or THINKING_TAIL_LINES
        text = self.text
        header = f"Thinking… {thinking_live(tokens, seconds)}"
        drawn = (header, len(text), width, lines)  # the text only grows: its length says what it is
        if drawn == self._drawn:
            return
        self._drawn = drawn
        start = text.rfind("\n", 0, max(0, len(text) - width * lines)) + 1  # only the lines the tail can show
        shown = text[start:] if start else text.lstrip()  # models start the block with a new line
        self._header.update(header, layout=False)
        tail.update(tail_lines(inert(shown), width, lines), layout=False)

    def finish(self, title: str, open: bool = False, text: str | None = None) -> None:
        """Collapse to ``title`` (expanded when ``open``) with the whole thinking text inside (one layout).
        Called again (the turn's final figures, ``text`` its final thinking), it only updates the title and
        the text: the user may have expanded or collapsed the block meanwhile. From now on the block keeps
        ``text`` (default: what streamed), no longer its turn."""
        self._turn, self._text = None, self.text if text is None else text
        first = not self.finished
        self.finished, self.title = True, title
        if first:
            self.open = open
        if not self._composed:
            return  # compose draws the finished block
        if first:
            self._header.display = self._tail.display = False
            self.mount(self._make_fold())
        elif self._fold is not None:
            self._body.update(inert(self.text.strip()))
            self._fold.title = title
