"""The "Session: …" and "Settings: Edit" commands of the chat app: export, the sessions list (open,
rename, delete) and the settings screen.

:class:`SessionCommands` works through the chat controller (resuming a session, applying settings) and
the session recording (which file this chat is saved to, or the chat in memory when it is not
saved); the app calls it from its actions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import App

from chatphase.chat.controller import ChatController, NotNow
from chatphase.chat.recording import SessionRecording
from chatphase.chat.settings_apply import apply_settings
from chatphase.errors import ChatPhaseError
from chatphase.sessions.catalog import load_session
from chatphase.sessions.store import Session

if TYPE_CHECKING:
    from chatphase.ui.screens.settings import SettingsChange


class SessionCommands:
    """Export, the sessions list and the settings screen for ``app``'s chat.

    Args:
        app: the app whose screens and notices these are.
        chat: the chat controller.
        recording: the chat's session recording (in memory when the chat is not saved).
    """

    def __init__(self, app: App, chat: ChatController, recording: SessionRecording) -> None:
        self.app, self.chat, self.recording = app, chat, recording

    def export(self) -> None:
        """Export this chat (Markdown, JSON or CSV) through the export dialog, saved or not."""
        try:
            session = self.recording.session()
        except ChatPhaseError as exc:
            self.app.notify(str(exc), title="Session: Export", severity="error")
            return
        if session is None or not session.turns:
            self.app.notify(
                "Nothing to export yet: it starts with the first turn.", title="Session: Export", severity="warning"
            )
            return
        from chatphase.ui.screens.sessions import ExportScreen  # screens load when first opened (startup)

        self.app.push_screen(ExportScreen(session))

    def open_list(self) -> None:
        """List saved sessions; choosing one resumes it here (when no reply is running)."""
        from chatphase.ui.screens.sessions import SessionsScreen

        saved = self.recording.saved
        self.app.push_screen(SessionsScreen(saved.id if saved else None), self._open)

    def _open(self, session_id: str | None) -> None:
        saved = self.recording.saved
        if not session_id or (saved is not None and session_id == saved.id):
            return
        try:
            session = load_session(session_id)
        except ChatPhaseError as exc:
            self.app.notify(str(exc), title="Sessions", severity="error")
            return
        self.resume(session)

    def resume(self, session: Session) -> None:
        """Show ``session`` in place of the current chat and continue it (not while a reply runs)."""
        if self.chat.turn is not None:
            self.app.notify("Wait for the reply (Esc stops it), then open the session.", severity="warning")
            return
        self.chat.new_chat()
        try:
            self.chat.restore(session)
        except NotNow as exc:
            self.app.notify(str(exc), severity="warning")

    def edit_settings(self) -> None:
        """Open the settings screen; apply its result (reloading the model when needed)."""
        from chatphase.ui.screens.settings import SettingsScreen

        screen = SettingsScreen(self.chat.settings, list(self.app.available_themes))
        self.app.push_screen(screen, self.apply)

    def apply(self, change: SettingsChange | None) -> None:
        """Use new settings: sampling, system prompt and theme at once; model and engine settings by
        loading the model again (the conversation is kept)."""
        if change is None:
            return
        note = f"saved to {change.saved_path}" if change.saved_path else "for this session"
        try:
            done = apply_settings(self.chat, change.settings, change.reload_keys if change.reload_needed else ())
        except ChatPhaseError as exc:
            self.app.notify(f"{exc}. Settings not applied.", title="Settings", severity="error")
            return
        if change.settings.theme in self.app.available_themes:
            self.app.theme = change.settings.theme
        self.app.notify(f"{done} ({note}).", title="Settings")
