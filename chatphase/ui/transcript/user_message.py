"""UserMessage: one user message in the chat log."""

from __future__ import annotations

from textual.widgets import Static

from chatphase.engine.text import inert


class UserMessage(Static):
    """One user message, shown verbatim (no markup) but inert (a paste can carry escape sequences too)."""

    DEFAULT_CSS = """
    UserMessage {
        margin: 1 0 0 6;
        padding: 0 1;
        background: $boost;
        border-left: wide $accent;
    }
    """

    def __init__(self, text: str) -> None:
        super().__init__(inert(text), markup=False, classes="user")
        self.text = text
