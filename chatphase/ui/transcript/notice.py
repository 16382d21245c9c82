"""Notice: an inline line in the chat log (info, warning or error)."""

from __future__ import annotations

from textual.widgets import Static

from chatphase.engine.text import inert


class Notice(Static):
    """An inline line in the log (``kind``: ``info``, ``warning`` or ``error``), inert (it may quote a server,
    a model or a file name)."""

    DEFAULT_CSS = """
    Notice { padding: 0 1; margin: 1 0 0 0; color: $text-muted; }
    Notice.-warning { color: $warning; }
    Notice.-error { color: $error; text-style: bold; }
    """

    def __init__(self, text: str, kind: str = "info") -> None:
        super().__init__(inert(text), markup=False, classes=f"notice -{kind}")
