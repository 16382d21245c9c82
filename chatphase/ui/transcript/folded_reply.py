"""FoldedReply: a folded reply's text and footer drawn as one widget, below the reply's thinking block."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from textual.widget import Widget

if TYPE_CHECKING:
    from chatphase.ui.transcript.reply_markdown import FinishedReply


class FoldedText(Protocol):
    """What draws a folded reply: its :class:`~chatphase.ui.transcript.reply_view.ReplyView`."""

    def drawing(self) -> FinishedReply: ...


class FoldedReply(Widget):
    """A folded reply's text and footer, one widget below its thinking block (:meth:`ReplyView.fold`)."""

    DEFAULT_CSS = """
    FoldedReply { height: auto; padding: 0 1; }
    """

    def __init__(self, view: FoldedText) -> None:
        super().__init__(classes="reply-folded")
        self.view = view

    def render(self) -> FinishedReply:
        return self.view.drawing()
