"""Writes a session as it happens (the format is described in :mod:`chatphase.sessions.store`).

Durability: the header, each ``turn_start`` and each ``turn_end`` are fsync'd, so finished turns
survive a power loss; streamed reply text is flushed to the OS at most every :data:`TEXT_FLUSH_S`
seconds, so a killed process (SIGKILL) keeps the partial reply up to that point.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

from chatphase.engine.events import EngineFailed, Event, FirstToken, TokensDecoded, TurnFinished
from chatphase.engine.metrics import TurnMetrics
from chatphase.sessions.catalog import resolve_session_path
from chatphase.sessions.store import (
    FORMAT_VERSION,
    Session,
    SessionError,
    load_session_file,
    new_session_id,
    open_append,
    records_of,
    session_from_records,
    session_path,
    title_from,
    utc_now,
    write_record,
)

#: streamed reply text is written at most this often (seconds); a SIGKILL loses at most this much.
TEXT_FLUSH_S = 0.25


class SessionRecorder:
    """Writes one session as it happens. Not thread-safe: call it from one thread (or under a lock).

    Typical use (``ask``, the TUI)::

        rec = SessionRecorder.create(model=info.to_dict(), settings=settings.to_dict())
        rec.begin_turn(user_text)
        for event in engine.run_turn(request):
            rec.observe(event)          # streams text, ends the turn on TurnFinished / EngineFailed
        rec.close()

    Nothing touches the disk before the first :meth:`begin_turn` (no empty sessions); the title
    defaults to the first user message.

    Write errors (disk full, permissions) raise :class:`~chatphase.sessions.store.SessionError`, unless
    ``on_error`` is set: then it is called once with the message, :attr:`failed` keeps it, and the
    recorder stops writing (the chat goes on unsaved).

    An in-memory recorder (:meth:`in_memory`, for a chat that is not saved) keeps the same records in
    :attr:`records` instead of a file, so :meth:`session` reads an unsaved chat back the same way.
    """

    #: called once with the message of the first write error (instead of raising); see the class doc.
    on_error: Callable[[str], None] | None = None
    #: the first write error's message once writing has stopped.
    failed: str | None = None

    def __init__(
        self,
        path: Path,
        session_id: str,
        header: dict[str, Any] | None,
        next_turn: int = 1,
        records: list[dict[str, Any]] | None = None,
    ):
        self.path = path
        self.records = records  # in memory instead of the file when not None
        self.id = session_id
        self._header = header  # written lazily (None once on disk)
        self._fh: TextIO | None = None
        self._turn: int | None = None
        self._next_turn = next_turn
        self._buf: list[str] = []
        self._streamed: list[str] = []
        self._thinking_buf: list[str] = []
        self._thought: list[str] = []  # the open turn's thinking text so far
        self._error: str | None = None  # a non-fatal engine error of the open turn
        self._last_text_write = 0.0

    @classmethod
    def create(
        cls, *, model: dict[str, Any], settings: dict[str, Any], title: str | None = None, directory: Path | None = None
    ) -> SessionRecorder:
        """A recorder for a new session (file created at the first turn)."""
        sid = new_session_id()
        header = {
            "type": "session",
            "version": FORMAT_VERSION,
            "id": sid,
            "title": title or "",
            "created": utc_now(),
            "model": model,
            "settings": settings,
        }
        return cls(session_path(sid, directory), sid, header)

    @classmethod
    def resume(cls, session_id: str | None = None, directory: Path | None = None) -> tuple[SessionRecorder, Session]:
        """Continue a saved session (``None``/``"last"`` = the most recent); returns it as loaded too.

        Raises:
            SessionError: as :func:`load_session`.
        """
        s = load_session_file(resolve_session_path(session_id, directory))
        return cls.continuing(s), s

    @classmethod
    def continuing(cls, session: Session) -> SessionRecorder:
        """A recorder that appends to the file ``session`` was loaded from, numbering turns on from its."""
        path = Path(session.path)
        nxt = max((t.index for t in session.turns), default=0) + 1
        return cls(path, session.id or path.stem, None, nxt)

    @classmethod
    def in_memory(cls, *, model: dict[str, Any], settings: dict[str, Any], title: str | None = None) -> SessionRecorder:
        """A recorder for a new session that is kept in memory (nothing touches the disk); its id starts
        with ``unsaved-``, so an export of it never passes for a saved session."""
        rec = cls.create(model=model, settings=settings, title=title)
        rec.id = f"unsaved-{rec.id}"
        if rec._header is not None:  # a new session's header is not written yet
            rec._header["id"] = rec.id
        rec.records = []
        return rec

    @classmethod
    def in_memory_continuing(cls, session: Session) -> SessionRecorder:
        """An in-memory recorder that starts with ``session``'s records (a loaded session continued unsaved)."""
        nxt = max((t.index for t in session.turns), default=0) + 1
        return cls(Path(session.path), session.id, None, nxt, records=records_of(session))

    def session(self) -> Session | None:
        """The session as recorded so far (``None`` before its first turn)."""
        if self.records is not None:
            return session_from_records(self.records) if self.records else None
        return load_session_file(self.path) if self.path.exists() else None

    @property
    def turn_in_flight(self) -> int | None:
        """The index of the turn begun and not yet ended, if any."""
        return self._turn

    @property
    def turns_recorded(self) -> int:
        """How many turns this session holds (begun ones included, earlier runs' too when resumed)."""
        return self._next_turn - 1

    def _emit(self, record: dict[str, Any], *, sync: bool) -> None:
        """Append a record (opening the file and writing the header first if needed).

        Raises:
            SessionError: the file cannot be created or written (disk full, permissions), unless
                :attr:`on_error` is set.
        """
        if self.failed:
            return
        if self.records is not None:
            if self._header is not None:
                self.records.append(self._header)
                self._header = None
            self.records.append(record)
            return
        try:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                self._fh = open_append(self.path)
                if self._header is not None:
                    write_record(self._fh, self._header, sync=True)
                    self._header = None
            write_record(self._fh, record, sync=sync)
        except OSError as exc:
            message = f"cannot save the session to {self.path}: {exc.strerror or exc}"
            if self.on_error is None:
                raise SessionError(message) from None
            self.failed = message
            self.on_error(message)

    def begin_turn(self, user: str, sampling: dict[str, Any] | None = None) -> int:
        """Record the user's message (and the ``sampling`` dict the turn is generated with) before
        generation starts; returns the turn's 1-based index. A turn still open is first ended as partial
        (interrupted)."""
        if self._turn is not None:
            self.finish_turn("".join(self._streamed), None)  # interrupted: ends as partial
        if self._header is not None and not self._header["title"]:
            self._header["title"] = title_from(user) or "untitled"
        self._turn, self._next_turn = self._next_turn, self._next_turn + 1
        self._buf, self._streamed, self._error = [], [], None
        self._thinking_buf, self._thought = [], []
        start = {"type": "turn_start", "turn": self._turn, "time": utc_now(), "user": user}
        if sampling is not None:
            start["sampling"] = sampling
        self._emit(start, sync=True)
        self._last_text_write = time.monotonic()
        return self._turn

    def append_text(self, text: str, thinking: str = "") -> None:
        """Stream reply text (and a reasoning model's thinking text) of the open turn (buffered; written
        at most every :data:`TEXT_FLUSH_S`)."""
        if self._turn is None or not (text or thinking):
            return
        if text:
            self._buf.append(text)
            self._streamed.append(text)
        if thinking:
            self._thinking_buf.append(thinking)
            self._thought.append(thinking)
        if time.monotonic() - self._last_text_write >= TEXT_FLUSH_S:
            self._flush_text()

    def _flush_text(self) -> None:
        if self._turn is not None:
            if self._thinking_buf:
                self._emit({"type": "thinking", "turn": self._turn, "text": "".join(self._thinking_buf)}, sync=False)
                self._thinking_buf = []
            if self._buf:
                self._emit({"type": "text", "turn": self._turn, "text": "".join(self._buf)}, sync=False)
                self._buf = []
        self._last_text_write = time.monotonic()

    def finish_turn(
        self,
        reply: str,
        metrics: TurnMetrics | None,
        *,
        error: str | None = None,
        thinking: str | None = None,
        budget_reached: bool = False,
        interrupted: bool = False,
    ) -> None:
        """End the open turn with its full reply and metrics (and ``thinking`` text: default, what
        streamed); fsync'd. No-op if none is open. ``error`` (or a non-fatal engine error seen in the
        turn) marks it failed; no metrics and no error, or ``interrupted`` (its engine stopped: the
        metrics are the figures measured until then), mark it partial. ``budget_reached``: the engine
        closed the thinking block at the thinking budget."""
        if self._turn is None:
            return
        error = error or self._error
        rec = {
            "type": "turn_end",
            "turn": self._turn,
            "time": utc_now(),
            "reply": reply,
            "metrics": metrics.to_dict() if metrics else None,
            "error": error,
        }
        thinking = "".join(self._thought) if thinking is None else thinking
        if thinking:
            rec["thinking"] = thinking
        if budget_reached:
            rec["thinking_budget_reached"] = True
        if interrupted:
            rec["interrupted"] = True
        self._buf, self._thinking_buf = [], []
        self._turn = None
        self._emit(rec, sync=True)

    def observe(self, event: Event) -> None:
        """Feed an engine event: text events stream; ``TurnFinished`` ends the turn with its metrics;
        a fatal ``EngineFailed`` ends it as failed keeping the text so far; a non-fatal one is kept
        for the turn's end (an engine may still send ``TurnFinished`` with the partial reply's metrics;
        if none comes, the next turn or :meth:`close` ends this one as failed)."""
        if self._turn is None:
            return
        if isinstance(event, (FirstToken, TokensDecoded)):
            self.append_text(event.text, event.thinking)
        elif isinstance(event, TurnFinished):
            self.finish_turn(event.reply, event.metrics, thinking=event.thinking)
        elif isinstance(event, EngineFailed):
            if event.fatal:
                self.finish_turn("".join(self._streamed), None, error=event.message)
            else:
                self._error = event.message

    def replace_turns(self, indices: Iterable[int]) -> None:
        """Mark turns as taken back (regenerated or edited): kept, but out of the resumed conversation."""
        indices = sorted(int(i) for i in indices)
        if indices:
            self._emit({"type": "replace", "turns": indices, "time": utc_now()}, sync=True)

    def set_model(self, model: dict[str, Any], settings: dict[str, Any]) -> None:
        """Record a model or settings change; later turns are attributed to the new model."""
        rec = {"type": "model", "model": model, "settings": settings, "time": utc_now()}
        if self._header is not None:
            self._header.update(model=model, settings=settings)
        else:
            self._emit(rec, sync=True)

    def rename(self, title: str) -> None:
        """Set the title (before the first turn it goes into the header)."""
        if self._header is not None:
            self._header["title"] = " ".join(title.split())
        else:
            self._emit({"type": "title", "title": " ".join(title.split()), "time": utc_now()}, sync=True)

    def close(self) -> None:
        """Write buffered text and close the file; idempotent. An open turn stays partial, unless the
        engine reported an error in it: then it ends as failed."""
        if self._turn is not None and self._error is not None:
            self.finish_turn("".join(self._streamed), None)
        if self._fh is not None:
            try:
                self._flush_text()
            finally:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> SessionRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
