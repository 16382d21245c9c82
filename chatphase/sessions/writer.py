"""Writes a session as it happens (the format is described in :mod:`chatphase.sessions.store`).

Durability: the header, each ``turn_start`` and each ``turn_end`` are fsync'd, so finished turns
survive a power loss; streamed reply text is flushed to the OS at most every :data:`TEXT_FLUSH_S`
seconds, so a killed process (SIGKILL) keeps the partial reply up to that point.

The writer keeps no copy of a reply: the open turn's text is read from the :class:`TurnText` it was begun
with (the chat's :class:`~chatphase.chat.turn.Turn`, which accumulates it), and only how much of it is
written is kept here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, TextIO

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


class TurnText(Protocol):
    """The text of a turn so far, as its owner accumulates it (:class:`~chatphase.chat.turn.Turn`)."""

    @property
    def reply(self) -> str: ...

    @property
    def thinking(self) -> str: ...


class SessionWriter:
    """Writes one session as it happens. Not thread-safe: call it from one thread (or under a lock).

    A turn is :meth:`begin_turn` (with the :class:`TurnText` it streams into), :meth:`stream` as its text
    grows, and :meth:`finish_turn`; what a turn's events mean (failed, partial) is decided by the caller
    (:class:`~chatphase.chat.recording.SessionRecording` follows the chat controller's verdict).

    Nothing touches the disk before the first :meth:`begin_turn` (no empty sessions); the title
    defaults to the first user message.

    Write errors (disk full, permissions) raise :class:`~chatphase.sessions.store.SessionError`, unless
    ``on_error`` is set: then it is called once with the message, :attr:`failed` keeps it, and the
    writer stops writing (the chat goes on unsaved).

    An in-memory writer (:meth:`in_memory`, for a chat that is not saved) keeps the same records in
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
        self._text: TurnText | None = None  # the open turn's text
        self._written = (0, 0)  # characters of its reply and thinking written so far
        self._last_text_write = 0.0
        self._context: dict[str, Any] | None = None  # the last context recorded (or to record)
        self._context_due = False

    @classmethod
    def create(
        cls, *, model: dict[str, Any], settings: dict[str, Any], title: str | None = None, directory: Path | None = None
    ) -> SessionWriter:
        """A writer for a new session (file created at the first turn)."""
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
    def resume(cls, session_id: str | None = None, directory: Path | None = None) -> tuple[SessionWriter, Session]:
        """Continue a saved session (``None``/``"last"`` = the most recent); returns it as loaded too.

        Raises:
            SessionError: as :func:`load_session`.
        """
        s = load_session_file(resolve_session_path(session_id, directory))
        return cls.continuing(s), s

    @classmethod
    def continuing(cls, session: Session) -> SessionWriter:
        """A writer that appends to the file ``session`` was loaded from, numbering turns on from its."""
        path = Path(session.path)
        nxt = max((t.index for t in session.turns), default=0) + 1
        return cls(path, session.id or path.stem, None, nxt)

    @classmethod
    def in_memory(cls, *, model: dict[str, Any], settings: dict[str, Any], title: str | None = None) -> SessionWriter:
        """A writer for a new session that is kept in memory (nothing touches the disk); its id starts
        with ``unsaved-``, so an export of it never passes for a saved session."""
        rec = cls.create(model=model, settings=settings, title=title)
        rec.id = f"unsaved-{rec.id}"
        if rec._header is not None:  # a new session's header is not written yet
            rec._header["id"] = rec.id
        rec.records = []
        return rec

    @classmethod
    def in_memory_continuing(cls, session: Session) -> SessionWriter:
        """An in-memory writer that starts with ``session``'s records (a loaded session continued unsaved)."""
        nxt = max((t.index for t in session.turns), default=0) + 1
        return cls(Path(session.path), session.id, None, nxt, records=records_of(session))

    def session(self) -> Session | None:
        """The session as recorded so far (``None`` before its first turn)."""
        if self.records is not None:
            return session_from_records(self.records + self._open_text()) if self.records else None
        return load_session_file(self.path) if self.path.exists() else None

    def _open_text(self) -> list[dict[str, Any]]:
        """The open turn's text as the records a file would hold (in memory it is not copied as it streams)."""
        if self._turn is None or self._text is None:
            return []
        thinking, reply = self._text.thinking, self._text.reply
        out: list[dict[str, Any]] = [{"type": "thinking", "turn": self._turn, "text": thinking}] if thinking else []
        return out + [{"type": "text", "turn": self._turn, "text": reply}] if reply else out

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
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        """Stop writing after ``exc``: :attr:`on_error` is told once, or :class:`SessionError` raised."""
        message = f"cannot save the session to {self.path}: {exc.strerror or exc}"
        if self.on_error is None:
            raise SessionError(message) from None
        if self.failed is None:
            self.failed = message
            self.on_error(message)

    def begin_turn(
        self, user: str, sampling: dict[str, Any] | None = None, text: TurnText | None = None, index: int | None = None
    ) -> int:
        """Record the user's message (and the ``sampling`` dict the turn is generated with) before
        generation starts; returns the turn's 1-based index: ``index`` (the chat's number for it), by
        default the one after the last. ``text``: where the turn's reply and thinking accumulate (read by
        :meth:`stream` and :meth:`finish_turn`; ``None``: no text streams). A turn still open is first
        ended as partial (interrupted).

        Raises:
            ValueError: ``index`` is not after every turn recorded so far (two turns would share it).
        """
        if index is not None and index < self._next_turn:
            raise ValueError(f"turn {index} is not after the last recorded turn ({self._next_turn - 1})")
        if self._turn is not None:
            self.finish_turn(self._text.reply if self._text else "", None)  # interrupted: ends as partial
        if self._header is not None and not self._header["title"]:
            self._header["title"] = title_from(user) or "untitled"
        self._turn = self._next_turn if index is None else index
        self._next_turn = self._turn + 1
        self._text, self._written = text, (0, 0)
        if self._context_due and self._context is not None:  # flushed, not fsync'd: turn_start's fsync covers it
            self._emit({"type": "context", **self._context}, sync=False)
            self._context_due = False
        start = {"type": "turn_start", "turn": self._turn, "time": utc_now(), "user": user}
        if sampling is not None:
            start["sampling"] = sampling
        self._emit(start, sync=True)
        self._last_text_write = time.monotonic()
        return self._turn

    def stream(self) -> None:
        """The open turn's text grew: write what is new (reply and thinking) once :data:`TEXT_FLUSH_S`
        has passed since the last write."""
        if self._turn is not None and time.monotonic() - self._last_text_write >= TEXT_FLUSH_S:
            self._flush_text()

    def _flush_text(self) -> None:
        text = self._text
        if self._turn is not None and text is not None and self.records is None:  # in memory: read when asked
            reply_at, thinking_at = self._written
            thinking, reply = text.thinking, text.reply
            if len(thinking) > thinking_at:
                self._emit({"type": "thinking", "turn": self._turn, "text": thinking[thinking_at:]}, sync=False)
            if len(reply) > reply_at:
                self._emit({"type": "text", "turn": self._turn, "text": reply[reply_at:]}, sync=False)
            self._written = (len(reply), len(thinking))
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
        streamed); fsync'd. No-op if none is open. ``error`` marks it failed; no metrics and no error, or
        ``interrupted`` (its engine stopped: the metrics are the figures measured until then), mark it
        partial. ``budget_reached``: the engine closed the thinking block at the thinking budget."""
        if self._turn is None:
            return
        rec = {
            "type": "turn_end",
            "turn": self._turn,
            "time": utc_now(),
            "reply": reply,
            "metrics": metrics.to_dict() if metrics else None,
            "error": error,
        }
        if thinking is None:
            thinking = self._text.thinking if self._text is not None else ""
        if thinking:
            rec["thinking"] = thinking
        if budget_reached:
            rec["thinking_budget_reached"] = True
        if interrupted:
            rec["interrupted"] = True
        self._turn, self._text = None, None
        self._emit(rec, sync=True)

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

    def set_context(self, context: dict[str, Any]) -> None:
        """What the next turns run on (:func:`chatphase.history.context.live_context`): written as a ``context``
        record before the next turn's start when it differs from the last one."""
        if context != self._context:
            self._context, self._context_due = dict(context), True

    def rename(self, title: str) -> None:
        """Set the title (before the first turn it goes into the header)."""
        if self._header is not None:
            self._header["title"] = " ".join(title.split())
        else:
            self._emit({"type": "title", "title": " ".join(title.split()), "time": utc_now()}, sync=True)

    def close(self) -> None:
        """Write the open turn's text not yet written and close the file (the turn stays partial); idempotent.
        In memory, the open turn's text goes into :attr:`records` now (the turn is no longer read).

        Raises:
            SessionError: what was buffered cannot be written (disk full), unless :attr:`on_error` is set
                (then it is told, as for any write error); the file is closed either way.
        """
        if self.records is not None:
            self.records += self._open_text()
            self._text = None
        if self._fh is not None:
            try:
                self._flush_text()
            finally:
                fh, self._fh = self._fh, None
                try:
                    fh.close()  # flushes what a failed write left buffered: ENOSPC again
                except OSError as exc:
                    self._fail(exc)

    def __enter__(self) -> SessionWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
