"""A reply's Markdown as a few widgets: segments of text, each drawn by Rich's Markdown renderer.

Why not Textual's ``Markdown`` widget: it builds a tree of widgets per block (a bullet list is about ten),
and Textual lays out and styles every widget of a screen on each layout pass. Streaming a long reply
into it mounts new blocks at each commit, and measured at 150×45 a commit cost 40 ms of CPU at the
14th block and 185 ms at the 77th — CPU taken from the engine when it decodes on every core — and
every later layout of the chat (a new message, a resize) paid for all the blocks of all the replies
above. A :class:`MarkdownSegment` is one widget whatever its text, so a commit re-renders one segment
of at most a few thousand characters and the screen's widget count stays small.

Code fences are highlighted with Pygments' built-in lexers only, looked up once per language name
(:func:`fence_language`): an unknown name otherwise scans the installed packages' plugin lexers (entry
points; importing IPython's takes a quarter of a second) at every render; an unknown or missing
language is shown as plain text.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import ClassVar

from pygments.lexers import get_all_lexers
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markdown import CodeBlock, ListItem, Markdown
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from chatphase.engine.text import inert
from chatphase.ui.transcript.md_blocks import markdown_parser

#: the language name Pygments renders without highlighting.
PLAIN = "text"
#: Pygments styles for code blocks in dark and light themes.
CODE_THEMES = {True: "monokai", False: "friendly"}


@lru_cache(maxsize=1)
def _builtin_aliases() -> frozenset[str]:
    return frozenset(alias for _, aliases, _, _ in get_all_lexers(plugins=False) for alias in aliases)


@lru_cache(maxsize=256)
def fence_language(info: str | None) -> str:
    """The Pygments lexer alias for a fence's info string (``"Python"``, ``"py title=x"``), or
    :data:`PLAIN` when it is empty or names no built-in lexer. Never scans plugins, never guesses."""
    words = (info or "").split()
    name = words[0].lower() if words else ""
    return name if name in _builtin_aliases() else PLAIN


class _CodeBlock(CodeBlock):
    """Rich's code block with :func:`fence_language`."""

    @classmethod
    def create(cls, markdown: Markdown, token) -> CodeBlock:
        return cls(fence_language(token.info), markdown.code_theme)


class _ListItem(ListItem):
    """Rich's list item, its number written as the model wrote it: ``3.`` (Rich draws ``3``)."""

    def render_number(self, console: Console, options: ConsoleOptions, number: int, last_number: int) -> RenderResult:
        width = len(str(last_number)) + 3  # the number, its period and a space, after a space
        lines = console.render_lines(self.elements, options.update(width=options.max_width - width), style=self.style)
        style = console.get_style("markdown.item.number", default="none")
        numeral, padding = Segment(f"{number}.".rjust(width - 1) + " ", style), Segment(" " * width, style)
        for i, line in enumerate(lines):
            yield numeral if i == 0 else padding
            yield from line
            yield Segment.line()


class _Markdown(Markdown):
    """Rich's Markdown with :func:`fence_language`, numbered items as written (:class:`_ListItem`) and :func:`~chatphase.ui.transcript.md_blocks.markdown_parser`,
    of the text made inert (:func:`~chatphase.engine.text.inert`: the model's escape sequences are shown, not
    obeyed; one character for one, so the reply's offsets hold)."""

    elements: ClassVar[dict] = {
        **Markdown.elements, "fence": _CodeBlock, "code_block": _CodeBlock, "list_item_open": _ListItem
    }  # fmt: skip

    def __init__(self, markup: str, **kwargs) -> None:
        super().__init__("", **kwargs)  # Rich's own parse (HTML on) of nothing; the reply is parsed here
        self.markup = inert(markup)
        self.parsed = markdown_parser().parse(self.markup)


class FinishedReply:
    """A finished reply as one renderable: its whole Markdown, drawn once (the segments it streamed in
    read as this one rendering), over its one-line metrics footer ``meta`` (drawn even when empty, as a
    ``Static`` of no text is one line high).

    The Markdown is parsed each time it is drawn or measured, and not kept: Textual keeps a widget's
    renderable until its next refresh, and a folded reply is rarely refreshed, so a kept Rich ``Markdown``
    (its markdown-it tokens) would cost a long chat some 12 KiB a turn for nothing (a reply is drawn again
    only when it is scrolled back into view or the terminal is resized)."""

    def __init__(self, text: str, meta: str, code_theme: str, meta_style: Style) -> None:
        self.text, self.meta, self.code_theme, self.meta_style = text, meta, code_theme, meta_style

    def _group(self) -> Group:
        return Group(_Markdown(self.text, code_theme=self.code_theme), Text(self.meta, style=self.meta_style))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._group()

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self._group())


class ContinuedMarkdown:
    """Markdown ``source`` drawn as it reads after ``lead`` (the last block of the segment above): the
    lines of ``lead + source`` after those of ``lead`` alone, so the blank line Rich puts between two
    blocks (or not: after a rule, before a list) is the one a single rendering would have."""

    def __init__(self, lead: str, source: str, code_theme: str) -> None:
        self.lead, self.source, self.code_theme = lead, source, code_theme

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # Without a height: Textual renders a widget with its height set, and ``render_lines`` pads its
        # result to it — the lead alone would then count as tall as the widget and nothing would be left.
        options = options.reset_height()
        skip = len(console.render_lines(_Markdown(self.lead, code_theme=self.code_theme), options, pad=False))
        lines = console.render_lines(_Markdown(self.lead + self.source, code_theme=self.code_theme), options, pad=False)
        new_line = Segment.line()
        for line in lines[skip:]:
            yield from line
            yield new_line


class MarkdownSegment(Widget):
    """One widget showing a run of whole Markdown blocks of a reply, drawn by Rich: the characters
    ``start:end`` of ``text()`` (``end=None``: to its end), drawn as they read after the lead
    ``lead_start:start`` (the last block of the segment above; none when ``lead_start`` is ``None``), for
    the join (:class:`ContinuedMarkdown`). It keeps offsets, not text: the reply is held by its owner.

    :meth:`extend` takes more text in and asks for a layout (the height may change). The renderable is
    built on demand and cached by Textual until the next change, so an unchanged segment costs nothing to
    lay out. Its code theme follows the app's theme: the chat log redraws its segments when the theme
    changes.
    """

    DEFAULT_CSS = """
    MarkdownSegment {
        height: auto;
    }
    """

    def __init__(
        self, text: Callable[[], str], start: int = 0, end: int | None = None, lead_start: int | None = None, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self._text = text
        self.start, self.end, self.lead_start = start, end, lead_start

    @property
    def source(self) -> str:
        """The Markdown this segment shows."""
        return self._text()[self.start : self.end]

    @property
    def lead(self) -> str:
        """The last block of the segment above ("" for the first segment)."""
        return "" if self.lead_start is None else self._text()[self.lead_start : self.start]

    def render(self) -> Markdown | ContinuedMarkdown:
        theme = CODE_THEMES[self.app.current_theme.dark]
        lead = self.lead
        if lead:
            return ContinuedMarkdown(lead, self.source, theme)
        return _Markdown(self.source, code_theme=theme)

    def extend(self, end: int) -> None:
        """Show the text up to ``end`` (whole Markdown blocks); nothing when that is no more."""
        if self.end is not None and end > self.end:
            self.end = end
            self.refresh(layout=True)

    def show_all(self) -> None:
        """Show the whole text, drawn on its own (no segment above)."""
        self.start, self.end, self.lead_start = 0, None, None
        self.refresh(layout=True)
