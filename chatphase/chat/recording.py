"""SessionRecording: the chat controller's listener that saves the chat as a session file as it happens.

A turn is recorded from its ``prefill_started`` (a turn refused before prefill is never on disk) to its
end, its text read from the chat's :class:`~chatphase.chat.turn.Turn` (never copied here); what the end
means (complete, failed, partial) is the controller's verdict, passed on. Turns the user takes back
(regenerate, edit and resend) are marked ``replaced`` when the turn that replaces them starts, so a
resume continues the conversation the chat had. A new chat starts a new session at its first turn; a
model or settings change is recorded before the next turn. Saving problems (disk full, permissions)
are reported once through ``on_error`` and recording stops; the chat goes on. The file format is
:mod:`chatphase.sessions.store`'s. A chat that is not saved (``--no-save``) is recorded in memory the
same way, so it can still be exported (:meth:`SessionRecording.session`).

What the turns run on (the loaded model's identity and settings, the backend, the machine) goes into the file
as a ``context`` record before the next turn; each ended turn's file is handed to the history index
(:class:`~chatphase.history.index.LiveIndex`, on its own thread: the chat never waits for the database).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from typing_extensions import override

from chatphase.chat.controller import ChatController
from chatphase.chat.listener import ChatListener
from chatphase.chat.turn import Turn
from chatphase.engine.events import FirstToken, LoadedModel, PrefillStarted, TokensDecoded, TurnFinished
from chatphase.history.context import live_context
from chatphase.history.index import LiveIndex
from chatphase.sessions.store import Session
from chatphase.sessions.writer import SessionWriter


class SessionRecording(ChatListener):
    """Records ``controller``'s chat (see the module docstring).

    Args:
        controller: the chat whose model and settings go into the session header.
        on_error: called once with the first write error's message (then nothing more is written).
        in_memory: keep the sessions in memory, never on disk (``--no-save``).
    """

    def __init__(
        self, controller: ChatController, on_error: Callable[[str], None] | None = None, in_memory: bool = False
    ) -> None:
        self.chat = controller
        self.on_error = on_error
        self.in_memory = in_memory
        self.writer: SessionWriter | None = None
        #: the first write error's message, kept after the writer is closed (the chat says it at quit)
        self.failed: str | None = None
        self._model_key: tuple[object, str] | None = None
        self._turn_id: int | None = None  # the turn being recorded
        self._live: list[int] = []  # writer indices of the turns in the conversation, oldest first
        #: the history index told of each ended turn's file (``None`` in memory)
        self.history: LiveIndex | None = None if in_memory else LiveIndex()
        self._context: dict[str, Any] | None = None  # what the next turns run on (engine_ready)

    # -- what the chat tells us ---------------------------------------------------------------------
    @override
    def engine_ready(self, loaded: LoadedModel) -> None:
        self._context = live_context(loaded)

    @override
    def prefill_started(self, turn: Turn, event: PrefillStarted) -> None:
        writer = self._writer()
        if self._context is not None:
            writer.set_context(self._context)
        if len(self._live) > turn.position:  # the turns after this one's user message were taken back
            writer.replace_turns(self._live[turn.position :])
            del self._live[turn.position :]
        self._turn_id = turn.turn_id
        self._live.append(writer.begin_turn(turn.user, asdict(turn.request.sampling), turn, index=turn.number))

    @override
    def first_token(self, turn: Turn, event: FirstToken) -> None:
        self._stream(turn)

    @override
    def tokens_decoded(self, turn: Turn, event: TokensDecoded) -> None:
        self._stream(turn)

    @override
    def turn_finished(self, turn: Turn, event: TurnFinished) -> None:
        if (writer := self._recording(turn)) is not None:
            writer.finish_turn(
                event.reply,
                event.metrics,
                error=turn.error,
                thinking=event.thinking,
                budget_reached=turn.budget_reached,
            )
            self._turn_id = None
            self._index(writer)

    @override
    def turn_failed(self, turn: Turn, message: str) -> None:
        if (writer := self._recording(turn)) is not None:
            writer.finish_turn(turn.reply, None, error=message)
            self._turn_id = None
            self._index(writer)
            if self._live and self._live[-1] == writer.turns_recorded:
                self._live.pop()  # its user message left the conversation

    @override
    def turn_abandoned(self, turn: Turn, why: str) -> None:
        """The chat keeps what streamed as the reply, so the session does too: a partial turn (no error)
        with the figures measured until its engine stopped (:meth:`Turn.metrics_so_far`), which a resume
        continues with."""
        if (writer := self._recording(turn)) is not None:
            writer.finish_turn(
                turn.reply,
                turn.metrics_so_far(),
                thinking=turn.thinking,
                budget_reached=turn.budget_reached,
                interrupted=True,
            )
            self._turn_id = None
            self._index(writer)

    @override
    def chat_cleared(self) -> None:
        self.close()  # the next turn starts a new session

    @override
    def history_restored(self, session: Session) -> None:
        """Keep recording into the restored session's own file."""
        if self.writer is None or self.writer.path != Path(session.path):
            make = SessionWriter.in_memory_continuing if self.in_memory else SessionWriter.continuing
            self.adopt(make(session), session)

    # -- writer --------------------------------------------------------------------------------
    def adopt(self, writer: SessionWriter, session: Session) -> None:
        """Record into ``writer`` (a resumed ``session``) from now on."""
        if self.writer is not None and self.writer is not writer:
            self.writer.close()
        self._use(writer)
        self._live = [t.index for t in session.turns if t.in_conversation]
        self._model_key = (session.model.get("path"), repr(session.settings))

    def session(self) -> Session | None:
        """This chat's session as recorded so far (``None`` before its first turn)."""
        return self.writer.session() if self.writer is not None else None

    @property
    def saved(self) -> SessionWriter | None:
        """The writer of this chat's session file (``None`` in memory or before the first turn)."""
        return None if self.in_memory else self.writer

    def close(self) -> None:
        """Write what is buffered and close the file; a turn still running (quitting mid-reply: the chat closed
        first) stays partial, with what it measured so far. Idempotent."""
        turn = self.chat.turn
        if turn is not None and turn.turn_id == self._turn_id:
            self.turn_abandoned(turn, "cancelled (quit)")
        if self.writer is not None:
            self.writer.close()
            self._index(self.writer)
        self.writer, self._turn_id, self._live = None, None, []
        if self.history is not None:
            self.history.close()  # the updates asked for are done (a later one starts its thread again)

    def _writer(self) -> SessionWriter:
        key = (self.chat.model_info.path, repr(self.chat.settings.to_dict()))
        if self.writer is None:
            make = SessionWriter.in_memory if self.in_memory else SessionWriter.create
            self._use(make(model=self.chat.model_info.to_dict(), settings=self.chat.settings.to_dict()))
        elif self._model_key != key:
            self.writer.set_model(self.chat.model_info.to_dict(), self.chat.settings.to_dict())
        self._model_key = key
        assert self.writer is not None  # made above when there was none
        return self.writer

    def _use(self, writer: SessionWriter) -> None:
        writer.on_error = self._failed
        self.writer = writer
        self._turn_id = None
        self._live = []

    def _failed(self, message: str) -> None:
        self.failed = self.failed or message
        if self.on_error is not None:
            self.on_error(message)

    def _recording(self, turn: Turn) -> SessionWriter | None:
        """The writer when it records ``turn``, else ``None``."""
        return self.writer if turn.turn_id == self._turn_id else None

    def _index(self, writer: SessionWriter) -> None:
        """Hand the session's file to the history index (a saved, healthy session whose file exists)."""
        if self.history is not None and writer.records is None and not writer.failed and writer.path.exists():
            self.history.update(writer.path)

    def _stream(self, turn: Turn) -> None:
        if (writer := self._recording(turn)) is not None:
            writer.stream()
