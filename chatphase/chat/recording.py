"""SessionRecording: the chat controller's listener that saves the chat as a session file as it happens.

A turn is recorded from its ``prefill_started`` (a turn refused before prefill is never on disk) to its
end. Turns the user takes back (regenerate, edit and resend) are marked ``replaced`` when the turn that
replaces them starts, so a resume continues the conversation the chat had. A new chat starts a new
session at its first turn; a model or settings change is recorded before the next turn. Saving
problems (disk full, permissions) are reported once through ``on_error`` and recording stops; the
chat goes on. The file format is :mod:`chatphase.sessions.store`'s. A chat that is not saved
(``--no-save``) is recorded in memory the same way, so it can still be exported (:meth:`SessionRecording.session`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from typing_extensions import override

from chatphase.chat.controller import ChatController
from chatphase.chat.listener import ChatListener
from chatphase.chat.turn import Turn
from chatphase.engine.events import FirstToken, PrefillStarted, TokensDecoded, TurnFinished
from chatphase.sessions.recorder import SessionRecorder
from chatphase.sessions.store import Session


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
        self.recorder: SessionRecorder | None = None
        self._model_key: tuple[object, str] | None = None
        self._turn_id: int | None = None  # the turn being recorded
        self._live: list[int] = []  # recorder indices of the turns in the conversation, oldest first

    # -- what the chat tells us ---------------------------------------------------------------------
    @override
    def prefill_started(self, turn: Turn, event: PrefillStarted) -> None:
        recorder = self._recorder()
        if len(self._live) > turn.position:  # the turns after this one's user message were taken back
            recorder.replace_turns(self._live[turn.position :])
            del self._live[turn.position :]
        self._turn_id = turn.turn_id
        self._live.append(recorder.begin_turn(turn.user, asdict(turn.request.sampling)))

    @override
    def first_token(self, turn: Turn, event: FirstToken) -> None:
        self._observe(turn, event)

    @override
    def tokens_decoded(self, turn: Turn, event: TokensDecoded) -> None:
        self._observe(turn, event)

    @override
    def turn_finished(self, turn: Turn, event: TurnFinished) -> None:
        if (recorder := self._recording(turn)) is not None:
            recorder.finish_turn(
                event.reply,
                event.metrics,
                error=turn.error,
                thinking=event.thinking,
                budget_reached=turn.budget_reached,
            )
            self._turn_id = None

    @override
    def turn_failed(self, turn: Turn, message: str) -> None:
        if (recorder := self._recording(turn)) is not None:
            recorder.finish_turn(turn.reply, None, error=message)
            self._turn_id = None
            if self._live and self._live[-1] == recorder.turns_recorded:
                self._live.pop()  # its user message left the conversation

    @override
    def turn_abandoned(self, turn: Turn, why: str) -> None:
        """The chat keeps what streamed as the reply, so the session does too: a partial turn (no error)
        with the figures measured until its engine stopped (:meth:`Turn.metrics_so_far`), which a resume
        continues with."""
        if (recorder := self._recording(turn)) is not None:
            recorder.finish_turn(
                turn.reply,
                turn.metrics_so_far(),
                thinking=turn.thinking,
                budget_reached=turn.budget_reached,
                interrupted=True,
            )
            self._turn_id = None

    @override
    def chat_cleared(self) -> None:
        self.close()  # the next turn starts a new session

    @override
    def history_restored(self, session: Session) -> None:
        """Keep recording into the restored session's own file."""
        if self.recorder is None or self.recorder.path != Path(session.path):
            make = SessionRecorder.in_memory_continuing if self.in_memory else SessionRecorder.continuing
            self.adopt(make(session), session)

    # -- recorder --------------------------------------------------------------------------------
    def adopt(self, recorder: SessionRecorder, session: Session) -> None:
        """Record into ``recorder`` (a resumed ``session``) from now on."""
        if self.recorder is not None and self.recorder is not recorder:
            self.recorder.close()
        self._use(recorder)
        self._live = [t.index for t in session.turns if t.in_conversation]
        self._model_key = (session.model.get("path"), repr(session.settings))

    def session(self) -> Session | None:
        """This chat's session as recorded so far (``None`` before its first turn)."""
        return self.recorder.session() if self.recorder is not None else None

    @property
    def saved(self) -> SessionRecorder | None:
        """The recorder of this chat's session file (``None`` in memory or before the first turn)."""
        return None if self.in_memory else self.recorder

    def close(self) -> None:
        """Write what is buffered and close the file (an open turn stays partial). Idempotent."""
        if self.recorder is not None:
            self.recorder.close()
        self.recorder, self._turn_id, self._live = None, None, []

    def _recorder(self) -> SessionRecorder:
        key = (self.chat.model_info.path, repr(self.chat.settings.to_dict()))
        if self.recorder is None:
            make = SessionRecorder.in_memory if self.in_memory else SessionRecorder.create
            self._use(make(model=self.chat.model_info.to_dict(), settings=self.chat.settings.to_dict()))
        elif self._model_key != key:
            self.recorder.set_model(self.chat.model_info.to_dict(), self.chat.settings.to_dict())
        self._model_key = key
        assert self.recorder is not None  # made above when there was none
        return self.recorder

    def _use(self, recorder: SessionRecorder) -> None:
        recorder.on_error = self._failed
        self.recorder = recorder
        self._turn_id = None
        self._live = []

    def _failed(self, message: str) -> None:
        if self.on_error is not None:
            self.on_error(message)

    def _recording(self, turn: Turn) -> SessionRecorder | None:
        """The recorder when it records ``turn``, else ``None``."""
        return self.recorder if turn.turn_id == self._turn_id else None

    def _observe(self, turn: Turn, event: FirstToken | TokensDecoded) -> None:
        if (recorder := self._recording(turn)) is not None:
            recorder.observe(event)
