"""UserMessage: one user message in the chat log; a file in it is one line, expanded by a click or Enter."""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual.binding import Binding
from textual.events import Click
from textual.widgets import Static

from chatphase.chat.attachments import Attachment, split_message
from chatphase.engine.text import inert
from chatphase.ui.transcript.folded_turn import USER_BACKGROUND, USER_BORDER_COLOR, USER_MARGIN_LEFT, USER_PADDING

#: marks a file's line in a message (closed, open).
FILE_MARKS = ("▸", "▾")


class UserMessage(Static):
    """One user message, shown verbatim (no markup) but inert (a paste can carry escape sequences too).

    A message with files in it (:mod:`chatphase.chat.attachments`) shows the user's own text and one line
    per file (name, size, tokens where ``file_tokens`` knows them, keyed by name and size); the message can
    then take the focus, and a click or Enter shows the files' text (again to fold it). ``text`` is the
    message as the model saw it.
    """

    # an old turn draws its message with these looks itself (:mod:`~chatphase.ui.transcript.folded_turn`)
    DEFAULT_CSS = f"""
    UserMessage {{
        margin: 1 0 0 {USER_MARGIN_LEFT};
        padding: 0 {USER_PADDING};
        background: {USER_BACKGROUND};
        border-left: wide {USER_BORDER_COLOR};
    }}
    UserMessage:focus {{ border-left: wide $warning; }}
    """
    BINDINGS = [Binding("enter", "toggle_files", "Show files", show=False)]

    def __init__(self, text: str, file_tokens: Mapping[tuple[str, int], int] | None = None) -> None:
        self.text = text
        self.own, self.files = split_message(text)
        self.files = [
            Attachment(a.name, a.text, a.size_bytes, (file_tokens or {}).get((a.name, a.size_bytes)))
            for a in self.files
        ]
        self.expanded = False
        super().__init__(self._content(), markup=False, classes="user")
        self.can_focus = bool(self.files)

    def _content(self) -> str | Text:
        if not self.files:
            return inert(self.text)
        out = Text(inert(self.own) + "\n" if self.own else "")
        mark = FILE_MARKS[self.expanded]
        for i, att in enumerate(self.files):
            out.append(("\n" if i else "") + f"{mark} 📎 {inert(att.line())}", style="bold")
            if self.expanded:
                out.append("\n" + inert(att.text.rstrip("\n")), style="dim")
        return out

    def action_toggle_files(self) -> None:
        """Show or fold the files' text."""
        if self.files:
            self.expanded = not self.expanded
            self.update(self._content())

    def on_click(self, event: Click) -> None:
        if self.files:
            event.stop()
            self.action_toggle_files()
