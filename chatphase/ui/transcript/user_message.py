"""UserMessage: one user message in the chat log."""

from __future__ import annotations

from textual.widgets import Static

from chatphase.engine.text import inert
from chatphase.ui.transcript.folded_turn import USER_BACKGROUND, USER_BORDER_COLOR, USER_MARGIN_LEFT, USER_PADDING


class UserMessage(Static):
    """One user message, shown verbatim (no markup) but inert (a paste can carry escape sequences too)."""

    # an old turn draws its message with these looks itself (:mod:`~chatphase.ui.transcript.folded_turn`)
    DEFAULT_CSS = f"""
    UserMessage {{
        margin: 1 0 0 {USER_MARGIN_LEFT};
        padding: 0 {USER_PADDING};
        background: {USER_BACKGROUND};
        border-left: wide {USER_BORDER_COLOR};
    }}
    """

    def __init__(self, text: str) -> None:
        super().__init__(inert(text), markup=False, classes="user")
        self.text = text
