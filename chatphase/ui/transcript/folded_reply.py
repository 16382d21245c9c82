"""FoldedReply: a folded reply's text and footer drawn as one widget, below the reply's thinking block."""

from __future__ import annotations

from typing import ClassVar, Protocol

from rich.console import Group
from textual.widget import Widget


class FoldedText(Protocol):
    """What draws a folded reply: its :class:`~chatphase.ui.transcript.reply_view.ReplyView`."""

    def drawing(self, widget: Widget) -> Group: ...


class FoldedReply(Widget):
    """A folded reply's text and footer, one widget below its thinking block (:meth:`ReplyView.fold`)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"reply--meta"}
    """``reply--meta``: the metrics footer (as ``.reply-meta``)."""

    DEFAULT_CSS = """
    FoldedReply { height: auto; padding: 0 1; }
    FoldedReply > .reply--meta { color: $text-muted; text-style: italic; }
    """

    def __init__(self, view: FoldedText) -> None:
        super().__init__(classes="reply-folded")
        self.view = view

    def render(self) -> Group:
        return self.view.drawing(self)
