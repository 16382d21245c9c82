"""FoldedTurn: an old turn — the user's message over its folded reply — drawn by one widget, its reply's.

A widget costs the UI process some 20–40 KiB however little it shows (its styles, message queue and task,
its place in the compositor's map), so once a reply is folded (:meth:`ReplyView.fold`) it also draws the
user message above it, which then leaves the DOM: an old turn costs one widget instead of two.

It reads as the two widgets did: the message with the looks of :class:`UserMessage` (its margins,
padding, border and background are :data:`USER_MARGIN_LEFT`, :data:`USER_PADDING`, the ``user--message``
and ``user--border`` component styles of the chat log), a blank line (the reply's top margin), then the
reply's text and footer with its padding (:data:`REPLY_PADDING`). The message's text is wrapped by
Textual, as the ``Static`` drew it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.style import Style
from textual.content import Content
from textual.strip import Strip
from textual.visual import RenderOptions, Visual, visualize

from chatphase.engine.text import inert

if TYPE_CHECKING:
    from textual.css.styles import RulesMap
    from textual.style import Style as VisualStyle
    from textual.widget import Widget

    from chatphase.ui.transcript.reply_markdown import FinishedReply

#: a user message's left margin (cells); the CSS of ``UserMessage`` uses it.
USER_MARGIN_LEFT = 6
#: a user message's left and right padding (cells).
USER_PADDING = 1
#: the left border of a user message (Textual's ``wide`` border, drawn in the ``user--border`` style).
USER_BORDER = "▎"
#: the left border of a turn the model no longer sees (Textual's ``dashed`` border, as ``UserMessage.left-out``).
USER_BORDER_LEFT_OUT = "╏"
#: a user message's background and border colour (CSS).
USER_BACKGROUND, USER_BORDER_COLOR = "$boost", "$accent"
#: a folded reply's left and right padding (cells).
REPLY_PADDING = 1


class FoldedTurn(Visual):
    """A Textual visual: ``user``'s message (in the chat log's ``message_style``, a visual style, with the
    ``inner`` background and ``border`` Rich styles), a blank line, then ``reply`` inside its padding, for
    ``widget`` (the folded reply). Built at each draw, not kept (as :class:`FinishedReply`). A visual, not
    a Rich renderable, so that its margins and padding are drawn in the reply's background alone, as
    Textual draws margins and padding (not in its text style too)."""

    def __init__(
        self,
        widget: Widget,
        user: str,
        message_style: VisualStyle,
        inner: Style,
        border: Style,
        reply: FinishedReply,
        bar: str = USER_BORDER,
    ) -> None:
        self.widget, self.user, self.reply, self.bar = widget, user, reply, bar
        self.message_style, self.inner, self.border = message_style, inner, border

    @property
    def _blank(self) -> Style:
        """The style of the margins and the reply's padding: the reply's background (as Textual draws them)."""
        base, background = self.widget.background_colors
        return Style(bgcolor=(base + background).rich_color)

    def _user_strips(self, width: int, options: RenderOptions) -> list[Strip]:
        """The message's lines, ``width`` cells each (margin, border, padding, text, padding)."""
        text_width = max(1, width - USER_MARGIN_LEFT - len(USER_BORDER) - 2 * USER_PADDING)
        # no selection drawn: its offsets are the reply's, not the message's (an old turn's text is not selectable)
        options = replace(options, selection=None)
        strips = Content(inert(self.user)).render_strips(text_width, None, self.message_style, options)
        margin = Segment(" " * USER_MARGIN_LEFT, self._blank)
        border = Segment(self.bar, self.border)
        pad = Segment(" " * USER_PADDING, self.inner)
        return [
            Strip([margin, border, pad, *strip.adjust_cell_length(text_width, self.inner), pad], width)
            for strip in strips or [Strip.blank(0)]
        ]

    def _reply_strips(self, width: int, style: VisualStyle, options: RenderOptions) -> list[Strip]:
        """The reply's lines inside its padding, ``width`` cells each."""
        inner_width = max(1, width - 2 * REPLY_PADDING)
        pad = Segment(" " * REPLY_PADDING, self._blank)
        strips = visualize(self.widget, self.reply).render_strips(inner_width, None, style, options)
        return [Strip([pad, *strip.adjust_cell_length(inner_width, self._blank), pad], width) for strip in strips]

    def render_strips(self, width: int, height: int | None, style: VisualStyle, options: RenderOptions) -> list[Strip]:
        blank = Strip.blank(width, self._blank)
        strips = [*self._user_strips(width, options), blank, *self._reply_strips(width, style, options)]
        return strips if height is None else strips[:height]

    def get_optimal_width(self, rules: RulesMap, container_width: int) -> int:
        return container_width

    def get_height(self, rules: RulesMap, width: int) -> int:
        text_width = max(1, width - USER_MARGIN_LEFT - len(USER_BORDER) - 2 * USER_PADDING)
        user = max(1, Content(inert(self.user)).get_height(rules, text_width))
        return user + 1 + visualize(self.widget, self.reply).get_height(rules, max(1, width - 2 * REPLY_PADDING))
