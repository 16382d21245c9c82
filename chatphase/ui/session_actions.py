"""Sessions and settings in the TUI: a mixin for :class:`~chatphase.ui.app.ChatPhaseApp`.

Recording needs no call from the app: Textual dispatches a message to the handler of *every* class in
the app's MRO, so the ``on_*`` handlers here see the same engine messages as the app's own (after
them). A turn is recorded from its ``PrefillBegan`` (the user message is then the conversation's last
message) to its ``TurnDone`` / ``EngineError``; after "Chat: New" (conversation and dashboard
cleared) the next turn starts a new session. Saving problems (disk full, permissions) are shown once as a
notice and recording stops; the chat goes on. Turns the user takes back (regenerate, edit and resend) are
marked ``replaced`` when the next turn starts, so a resume continues the conversation the app had.

Also here: resuming a saved session (history, chat log and dashboard history restored; the next
turn is a cold prefill and the notice says so) and the actions behind the "Session: ..." and
"Settings: Edit" commands.
"""

from __future__ import annotations

from chatphase.errors import ChatPhaseError
from chatphase.sessions.catalog import load_session
from chatphase.sessions.recorder import SessionRecorder
from chatphase.sessions.store import Session
from chatphase.ui import messages as msg
from chatphase.ui.sessions_screen import ExportScreen, SessionsScreen
from chatphase.ui.settings_screen import SettingsChange, SettingsScreen

COLD_PREFILL_NOTE = "Resumed session: cold prefill"


class SessionActions:
    """Mixin: records turns to a session file, resumes sessions, and offers export, the sessions
    list and the settings screen. Expects the app's attributes (``settings``, ``model_info``,
    ``conversation``, ``turn_id``, ``active_turn``, ``busy``, ``loaded``, ``engine_id``) and widgets
    (``ChatLog``, ``Dashboard``)."""

    #: ``False`` (``chat --no-save``) turns recording off.
    save_sessions: bool = True
    #: messages to show as warnings once the app is up (e.g. config-file problems found at start).
    startup_notices: tuple[str, ...] = ()
    recorder: SessionRecorder | None = None
    _recorded_turn: int | None = None
    _recorded_model: tuple | None = None
    #: recorder indices of the turns in the app's conversation, oldest first (set with the recorder).
    _live_turns: list[int]
    _pending_resume: tuple[SessionRecorder, Session] | None = None

    # -- recording -------------------------------------------------------------------------------
    def _use_recorder(self, recorder: SessionRecorder) -> SessionRecorder:
        """Make ``recorder`` this chat's, reporting its first write error as a notice."""
        recorder.on_error = self._save_failed
        self.recorder = recorder
        self._live_turns = []
        return recorder

    def _save_failed(self, message: str) -> None:
        self.notify(f"{message}. This chat is no longer being saved.", title="Session not saved", severity="error")

    def _model_key(self) -> tuple:
        return (self.model_info.path, repr(self.settings.to_dict()))

    def on_prefill_began(self, message: msg.PrefillBegan) -> None:
        ev = message.event
        if not self.save_sessions or ev.turn_id != self.active_turn:
            return
        users = [m for m in self.conversation if m.role == "user"]
        if not users or self.conversation[-1].role != "user":
            return
        if self.recorder is not None and len(users) == 1 and self._live_turns and not self.dashboard.turns:
            self.recorder.close()  # "Chat: New" cleared the conversation and the dashboard: a new session
            self.recorder = None
        if self.recorder is None:
            self._use_recorder(
                SessionRecorder.create(model=self.model_info.to_dict(), settings=self.settings.to_dict())
            )
            self._recorded_model = self._model_key()
        elif self._recorded_model != self._model_key():
            self.recorder.set_model(self.model_info.to_dict(), self.settings.to_dict())
            self._recorded_model = self._model_key()
        kept = len(users) - 1  # turns still in the conversation; newer recorded ones were taken back
        if len(self._live_turns) > kept:
            self.recorder.replace_turns(self._live_turns[kept:])
            del self._live_turns[kept:]
        self._recorded_turn = ev.turn_id
        self._live_turns.append(self.recorder.begin_turn(self.conversation[-1].content))

    def _recording(self, turn_id: int | None) -> bool:
        return self.recorder is not None and turn_id is not None and turn_id == self._recorded_turn

    def on_first_token_arrived(self, message: msg.FirstTokenArrived) -> None:
        if self._recording(message.event.turn_id):
            self.recorder.observe(message.event)

    def on_text_decoded(self, message: msg.TextDecoded) -> None:
        if self._recording(message.event.turn_id):
            self.recorder.observe(message.event)

    def on_turn_done(self, message: msg.TurnDone) -> None:
        if self._recording(message.event.turn_id):
            self.recorder.observe(message.event)
            self._recorded_turn = None

    def on_engine_error(self, message: msg.EngineError) -> None:
        ev = message.event
        if self._recording(ev.turn_id) or (ev.fatal and self._recording(self._recorded_turn)):
            self.recorder.observe(ev)  # a non-fatal error may still be followed by the turn's TurnDone
            if ev.fatal:
                self._recorded_turn = None
            if self._live_turns and self._live_turns[-1] == self.recorder.turns_recorded:
                self._live_turns.pop()  # the app drops a failed turn's message from the conversation

    def on_unmount(self) -> None:
        if self.recorder is not None:
            self.recorder.close()

    # -- resume ----------------------------------------------------------------------------------
    def resume_on_start(self, recorder: SessionRecorder, session: Session) -> None:
        """Restore ``session`` when the app mounts and keep recording into it (call before ``run``)."""
        self._pending_resume = (recorder, session)

    def on_mount(self) -> None:
        for notice in self.startup_notices:
            self.notify(notice, title="Settings", severity="warning", timeout=15)
        if self._pending_resume is not None:  # after every on_mount (the app's builds the widgets)
            self.call_after_refresh(self.restore_session, *self._pending_resume)
            self._pending_resume = None

    def restore_session(self, recorder: SessionRecorder, session: Session) -> None:
        """Show ``session``'s turns in the chat log and dashboard, continue its conversation, and
        record new turns into it. The KV cache does not hold it: the next turn is a cold prefill."""
        from chatphase.ui.chat_log import ChatLog, metrics_line

        if self.recorder is not None and self.recorder is not recorder:
            self.recorder.close()
        self._use_recorder(recorder)
        self._recorded_turn = None
        self._live_turns = [t.index for t in session.turns if t.in_conversation]
        self._recorded_model = (session.model.get("path"), repr(session.settings))
        self.conversation[:] = [m for m in session.history() if m.role != "system"]
        log = self.query_one(ChatLog)
        for t in session.turns:
            if not t.in_conversation:
                continue
            log.add_user(t.user)
            view = log.add_reply(t.index, t.reply)
            meta = metrics_line(t.metrics) if t.metrics else f"{t.status} turn (no metrics)"
            self.call_after_refresh(view.set_meta, meta)
            if t.metrics is not None:
                self.dashboard.turn_finished(t.index, t.metrics)
        self.turn_id = max([self.turn_id, *(t.index for t in session.turns)])
        log.add_notice(
            f"Resumed session {session.id} “{session.title}” ({len(session.turns)} turns). "
            "The KV cache starts empty: the next turn prefills the whole conversation (cold prefill)."
        )
        self._reuse_note = COLD_PREFILL_NOTE
        self.sub_title = f"{self.model_info.name} · {session.title}"

    # -- actions ---------------------------------------------------------------------------------
    def _saved_session(self) -> Session | None:
        if self.recorder is None or not self.recorder.path.exists():
            return None
        return load_session(self.recorder.id, self.recorder.path.parent)

    def action_export_session(self) -> None:
        """Export this chat's session (Markdown, JSON or CSV) through the export dialog."""
        try:
            session = self._saved_session()
        except ChatPhaseError as exc:
            self.notify(str(exc), title="Session: Export", severity="error")
            return
        if session is None:
            why = "saving is off (--no-save)" if not self.save_sessions else "it is saved from its first turn"
            self.notify(f"Nothing to export yet: {why}.", title="Session: Export", severity="warning")
            return
        self.push_screen(ExportScreen(session))

    def action_sessions(self) -> None:
        """List saved sessions; choosing one resumes it here (when no reply is running)."""
        current = self.recorder.id if self.recorder is not None else None
        self.push_screen(SessionsScreen(current), self._open_session)

    def _open_session(self, session_id: str | None) -> None:
        if not session_id or (self.recorder is not None and session_id == self.recorder.id):
            return
        if self.busy:
            self.notify("Wait for the reply (Esc stops it), then open the session.", severity="warning")
            return
        try:
            recorder, session = SessionRecorder.resume(session_id)
        except ChatPhaseError as exc:
            self.notify(str(exc), title="Sessions", severity="error")
            return
        self.run_worker(self._switch_session(recorder, session), group="ui")

    async def _switch_session(self, recorder: SessionRecorder, session: Session) -> None:
        await self.action_new_chat()
        self.restore_session(recorder, session)

    def action_edit_settings(self) -> None:
        """Open the settings screen; apply its result (reloading the model when needed)."""
        self.push_screen(SettingsScreen(self.settings, list(self.available_themes)), self.apply_settings)

    def apply_settings(self, change: SettingsChange | None) -> None:
        """Use new settings: sampling, system prompt and theme at once; model and engine settings by
        loading the model again (the conversation is kept)."""
        if change is None:
            return
        old = self.settings
        self.settings = change.settings
        if change.settings.theme != old.theme and change.settings.theme in self.available_themes:
            self.theme = change.settings.theme
        note = f"saved to {change.saved_path}" if change.saved_path else "for this session"
        if not change.reload_needed:
            self.notify(f"Settings applied ({note}).", title="Settings")
            return
        if {"model", "models_dir"} & set(change.reload_keys):
            from chatphase.models.gguf_meta import read_model_info
            from chatphase.models.resolve import resolve_model

            try:
                info = read_model_info(resolve_model(change.settings.model, change.settings.models_dir))
            except ChatPhaseError as exc:
                self.settings = old
                self.notify(f"{exc}. Settings not applied.", title="Settings", severity="error")
                return
            self.notify(f"Loading {info.name} ({note}).", title="Settings")
            self.switch_model(info)
            return
        self.notify(f"Reloading the model for {', '.join(change.reload_keys)} ({note}).", title="Settings")
        self.action_restart_engine()
