"""Crash-safe session files: every conversation and its per-turn metrics, append-only JSON lines.

One file per session, ``<id>.jsonl`` in :func:`chatphase.system.paths.sessions_dir` (``sessions`` in the data
directory, ``$CHATPHASE_DATA_DIR``). Each line is one JSON record
with a ``type``:

- ``session`` (first line): ``id``, ``title``, ``created`` (ISO 8601 UTC), ``model`` (``ModelInfo``
  dict), ``settings`` (``Settings`` dict), ``version``.
- ``turn_start``: ``turn`` (1-based), ``time``, ``user`` (the user's message), ``sampling`` (the turn's
  ``SamplingParams`` dict; older files lack it, and the settings in effect stand in) — written and
  fsync'd at submit, before any token, so a turn in flight is on disk as *partial*.
- ``thinking``: ``turn``, ``text`` — a reasoning model's thinking text as it streams (like ``text``).
- ``text``: ``turn``, ``text`` — reply text as it streams, at most every :data:`chatphase.sessions.writer.TEXT_FLUSH_S`
  seconds; flushed to the OS (survives SIGKILL of the process), not fsync'd.
- ``turn_end``: ``turn``, ``time``, ``reply`` (full text), ``metrics`` (``TurnMetrics.to_dict()`` or
  ``null``), ``error`` (``null`` or the engine's message), ``thinking`` (the thinking text, when there was
  any), ``thinking_budget_reached`` (``true`` when the engine closed the thinking block at the budget),
  ``interrupted`` (``true`` for a turn whose engine stopped mid-reply: ``metrics`` are the figures
  measured until then, and the turn stays *partial*) — fsync'd.
- ``title``: ``title``, ``time`` (a rename); ``model``: ``model``, ``settings``, ``time`` (a model
  or settings change inside the session; later turns record the new model name).
- ``context``: what the next turns run on — the model's content hash, the resolved engine settings, the
  backend and its build, the machine, chatphase's version (:mod:`chatphase.history.context`); written before a
  turn's start when it changed. Read by the history index (:mod:`chatphase.history.index`), not here.

Why append-only: a process killed at any byte leaves every earlier record intact, and at worst one
half-written last line, which :func:`load_session` skips (counted in ``Session.corrupt_lines``). A
writer that reopens such a file first ends the torn line, so new records are never glued to it.
- ``replace``: ``turns`` (indices), ``time`` — those turns were taken back (regenerated, or the
  message edited and sent again): kept in the file and exports, left out of the resumed conversation.

A turn without ``turn_end`` loads with ``status="partial"`` and the text streamed so far; when lines that
cannot be read follow its start, they are counted in its ``damaged_lines`` too (its end may be among
them: damaged, not interrupted).

Writing is :class:`chatphase.sessions.writer.SessionWriter`; this module reads, lists, renames and
deletes, and holds the record-level I/O both use.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from chatphase.engine.metrics import TurnMetrics
from chatphase.errors import ChatPhaseError
from chatphase.sessions.message_files import message_preview, title_before_block
from chatphase.system.paths import data_dir

if TYPE_CHECKING:  # imported where used: ``logs`` and ``stats`` read sessions without the engine's events
    from chatphase.engine.events import Message

FORMAT_VERSION = 1
SUFFIX = ".jsonl"
TITLE_CHARS = 60

TurnStatus = Literal["complete", "partial", "failed"]


class SessionError(ChatPhaseError):
    """A session that does not exist, is ambiguous, or cannot be read (exit code 1)."""


def sessions_dir() -> Path:
    """Where session files live: ``sessions`` in :func:`chatphase.system.paths.data_dir` (not created here)."""
    return data_dir() / "sessions"


def utc_now() -> str:
    """The current time as ISO 8601 UTC with seconds, e.g. ``2026-11-30T14:55:00+00:00``."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def local_minute(when: datetime) -> str:
    """``YYYY-MM-DD HH:MM`` of ``when`` in the local time zone (a naive ``when`` is taken as local time)."""
    return when.astimezone().strftime("%Y-%m-%d %H:%M")


def local_time(iso: str) -> str:
    """ISO 8601 (UTC) -> ``YYYY-MM-DD HH:MM`` in the local time zone; unparsable text unchanged."""
    try:
        return local_minute(datetime.fromisoformat(iso))
    except ValueError:
        return iso


def new_session_id() -> str:
    """A sortable unique id: ``YYYYMMDD-HHMMSS-xxxx`` (UTC time, 4 random hex digits)."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def title_from(text: str) -> str:
    """A session title from a user message: its preview (the user's words, each file short, white space
    collapsed; :func:`~chatphase.sessions.message_files.message_preview`), at most :data:`TITLE_CHARS` chars."""
    return message_preview(text, TITLE_CHARS)


@dataclass
class RecordedTurn:
    """One recorded turn. ``status``: ``complete`` (``turn_end`` with metrics), ``failed`` (the engine
    reported an error; ``error`` holds it) or ``partial`` (interrupted: the process ended mid-turn, or
    the turn was abandoned; ``reply`` is the text streamed until then, and ``metrics`` what was measured
    until then: ``None`` when the process died with it, the figures so far when only its engine did).
    ``replaced``: the user took the turn back (regenerate, edit); it is not part of the conversation.
    ``sampling``: the ``SamplingParams`` dict the turn was generated with. ``thinking_budget_reached``:
    the engine closed the thinking block at the thinking budget. ``damaged_lines``: lines of the file after
    the turn's start that could not be read, with no readable ``turn_end`` after them — a turn that is
    *partial* because its end record may be among them, not because it was interrupted."""

    index: int
    user: str
    reply: str
    status: TurnStatus
    started: str
    finished: str | None = None
    metrics: TurnMetrics | None = None
    error: str | None = None
    model: str = ""
    replaced: bool = False
    thinking: str = ""
    sampling: dict[str, Any] = field(default_factory=dict)
    thinking_budget_reached: bool = False
    damaged_lines: int = 0

    @property
    def in_conversation(self) -> bool:
        """Whether the turn belongs to the conversation a resume continues (not failed, not replaced,
        with reply text)."""
        return self.status != "failed" and not self.replaced and bool(self.reply)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``metrics`` as ``TurnMetrics.to_dict()`` or ``None``)."""
        d = asdict(self)
        d["metrics"] = self.metrics.to_dict() if self.metrics else None
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecordedTurn:
        """Inverse of :meth:`to_dict`."""
        d = dict(data)
        d["metrics"] = TurnMetrics.from_dict(d["metrics"]) if d.get("metrics") else None
        return cls(**d)


@dataclass
class Session:
    """A loaded session: header values, turns in order, and how many unreadable lines were skipped."""

    id: str
    title: str
    created: str
    model: dict[str, Any]
    settings: dict[str, Any]
    turns: list[RecordedTurn] = field(default_factory=list)
    last_used: str = ""
    corrupt_lines: int = 0
    path: str = ""

    @property
    def model_name(self) -> str:
        """The model's name as the header recorded it (``""`` when unknown)."""
        return str(self.model.get("name", "")) if self.model else ""

    def history(self) -> list[Message]:
        """The conversation to continue from: system prompt (from the settings) then user/assistant
        pairs of the turns :attr:`RecordedTurn.in_conversation` (partial replies included)."""
        from chatphase.engine.events import Message

        out: list[Message] = []
        system = (self.settings or {}).get("system_prompt")
        if system:
            out.append(Message("system", system))
        for t in self.turns:
            if t.in_conversation:
                out += [Message("user", t.user), Message("assistant", t.reply, t.thinking)]
        return out

    def to_dict(self) -> dict[str, Any]:
        """Everything as a plain JSON-ready dict (the JSON export's body)."""
        d = asdict(self)
        d["turns"] = [t.to_dict() for t in self.turns]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Session:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        names = set(cls.__dataclass_fields__)
        d = {k: v for k, v in data.items() if k in names}
        d["turns"] = [RecordedTurn.from_dict(t) for t in data.get("turns", [])]
        return cls(**d)


# ---------------------------------------------------------------- reading


#: the type of the stand-in record :func:`parse_records` keeps for a line it cannot read (``keep_damaged``).
DAMAGED = " damaged line"


def parse_records(lines: Iterable[str], *, keep_damaged: bool = False) -> tuple[list[dict[str, Any]], int]:
    """Decode JSON-lines text into record dicts; returns ``(records, corrupt_line_count)``.

    Lines that are not a JSON object with a ``type`` (a torn last line, garbage) are counted, and skipped,
    or with ``keep_damaged`` kept in place as ``{"type": DAMAGED}`` (so that :func:`session_from_records`
    knows which turn they interrupt).
    """
    records, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict) and isinstance(rec.get("type"), str) and rec["type"] != DAMAGED:
            records.append(rec)
        else:
            bad += 1
            if keep_damaged:
                records.append({"type": DAMAGED})
    return records, bad


def session_from_records(records: list[dict[str, Any]], *, corrupt_lines: int = 0, path: str = "") -> Session:
    """Replay records into a :class:`Session`. A ``DAMAGED`` stand-in (:func:`parse_records`) or a record
    that cannot be replayed counts in ``corrupt_lines``, and in the open turn's ``damaged_lines``.

    Raises:
        SessionError: when the first readable record is not a ``session`` header.
    """
    lead = 0
    while lead < len(records) and records[lead].get("type") == DAMAGED:
        lead += 1
    if lead == len(records) or records[lead].get("type") != "session":
        raise SessionError(f"not a chatphase session file (no header): {path or '<records>'}")
    h = records[lead]
    s = Session(
        id=str(h.get("id", "")),
        title=title_before_block(str(h.get("title", ""))),
        created=str(h.get("created", "")),
        model=h.get("model") or {},
        settings=h.get("settings") or {},
        corrupt_lines=corrupt_lines + lead,
        path=path,
    )
    model_name = s.model_name
    by_index: dict[int, RecordedTurn] = {}
    open_turn: RecordedTurn | None = None  # started, its turn_end not read (yet)
    for rec in records[lead + 1 :]:
        kind = rec["type"]
        try:
            if kind == DAMAGED:
                raise ValueError("a line that could not be read")
            if kind == "turn_start":
                t = RecordedTurn(
                    index=int(rec["turn"]),
                    user=str(rec.get("user", "")),
                    reply="",
                    status="partial",
                    started=str(rec.get("time", "")),
                    model=model_name,
                    sampling=_turn_sampling(rec, s.settings),
                )
                by_index[t.index] = t
                s.turns.append(t)
                open_turn = t
            elif kind == "text" and int(rec["turn"]) in by_index:
                by_index[int(rec["turn"])].reply += str(rec.get("text", ""))
            elif kind == "thinking" and int(rec["turn"]) in by_index:
                by_index[int(rec["turn"])].thinking += str(rec.get("text", ""))
            elif kind == "turn_end" and int(rec["turn"]) in by_index:
                t = by_index[int(rec["turn"])]
                t.reply = str(rec.get("reply", t.reply))
                t.thinking = str(rec.get("thinking", t.thinking))
                t.finished = rec.get("time")
                t.error = rec.get("error")
                t.metrics = TurnMetrics.from_dict(rec["metrics"]) if rec.get("metrics") else None
                t.thinking_budget_reached = bool(rec.get("thinking_budget_reached", False))
                done = t.metrics is not None and not rec.get("interrupted")
                t.status = "failed" if t.error else "complete" if done else "partial"
                t.damaged_lines = 0  # its end holds the whole reply: what was lost before it is not
                open_turn = None if open_turn is t else open_turn
            elif kind == "replace":
                for i in rec["turns"]:
                    if int(i) in by_index:
                        by_index[int(i)].replaced = True
            elif kind == "title":
                s.title = str(rec.get("title", s.title))
            elif kind == "model":
                s.model = rec.get("model") or s.model
                s.settings = rec.get("settings") or s.settings
                model_name = s.model_name
        except (KeyError, TypeError, ValueError):
            s.corrupt_lines += 1
            if open_turn is not None:
                open_turn.damaged_lines += 1
    return s


def _turn_sampling(turn_start: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """A ``turn_start`` record's sampling; from a file written before turns carried it, the sampling of
    the settings in effect (the header's, or the last ``model`` record's)."""
    sampling = turn_start.get("sampling")
    if not isinstance(sampling, dict):
        sampling = (settings or {}).get("sampling")
    return dict(sampling) if isinstance(sampling, dict) else {}


def records_of(session: Session) -> list[dict[str, Any]]:
    """The records that replay into ``session`` (:func:`session_from_records`' inverse, up to time stamps
    of renames and replacements)."""
    out: list[dict[str, Any]] = [
        {
            "type": "session",
            "version": FORMAT_VERSION,
            "id": session.id,
            "title": session.title,
            "created": session.created,
            "model": session.model,
            "settings": session.settings,
        }
    ]
    for t in session.turns:
        start = {"type": "turn_start", "turn": t.index, "time": t.started, "user": t.user}
        if t.sampling:
            start["sampling"] = t.sampling
        out.append(start)
        if t.status == "partial" and t.metrics is None:
            if t.thinking:
                out.append({"type": "thinking", "turn": t.index, "text": t.thinking})
            out.append({"type": "text", "turn": t.index, "text": t.reply})
        else:
            metrics = t.metrics.to_dict() if t.metrics else None
            end = {"type": "turn_end", "turn": t.index, "time": t.finished, "reply": t.reply, "metrics": metrics}
            end["error"] = t.error
            if t.thinking:
                end["thinking"] = t.thinking
            if t.thinking_budget_reached:
                end["thinking_budget_reached"] = True
            if t.status == "partial":
                end["interrupted"] = True
            out.append(end)
    replaced = [t.index for t in session.turns if t.replaced]
    if replaced:
        out.append({"type": "replace", "turns": replaced, "time": session.last_used or session.created})
    return out


def session_path(session_id: str, directory: Path | None = None) -> Path:
    """The file of ``session_id`` (which must look like an id: no path separators)."""
    if not session_id or "/" in session_id or "\\" in session_id or session_id.startswith("."):
        raise SessionError(f"not a session id: {session_id!r}")
    return (directory or sessions_dir()) / f"{session_id}{SUFFIX}"


def load_session_file(path: Path) -> Session:
    """Load one session file (tolerating unreadable lines, see :func:`parse_records`).

    Raises:
        SessionError: the file is missing, unreadable, or has no header.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            records, _ = parse_records(fh, keep_damaged=True)  # counted where they are, by session_from_records
        mtime = path.stat().st_mtime
    except OSError as exc:
        raise SessionError(f"cannot read session {path}: {exc.strerror or exc}") from None
    s = session_from_records(records, path=str(path))
    s.last_used = datetime.fromtimestamp(mtime, timezone.utc).isoformat(timespec="seconds")
    return s


# ---------------------------------------------------------------- writing


def open_append(path: Path) -> TextIO:
    """Open for appending (mode 0600); if the file ends in a torn line, end it first so new records
    stay whole."""
    torn = False
    try:
        with open(path, "rb") as f:
            if f.seek(0, os.SEEK_END):
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    fh = os.fdopen(fd, "a", encoding="utf-8")
    if torn:
        fh.write("\n")
    return fh


def write_record(fh: TextIO, record: dict[str, Any], *, sync: bool) -> None:
    """Append one record as a JSON line and flush it to the OS; ``sync`` also fsyncs it to disk.
    Text that is not valid Unicode (a lone surrogate, e.g. from an environment variable) is written as
    U+FFFD: it could not be encoded, and a session must never fail to save for it."""
    from chatphase.engine.text import clean_text, json_inert

    fh.write(json_inert(clean_text(json.dumps(record, ensure_ascii=False, separators=(",", ":")))[0]) + "\n")
    fh.flush()
    if sync:
        os.fsync(fh.fileno())
