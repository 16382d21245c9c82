"""The saved sessions as a collection: list them, find one by id, prefix or "last", rename, delete.

One session's file format and reading are :mod:`chatphase.sessions.store`'s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chatphase.sessions.store import (
    SUFFIX,
    Session,
    SessionError,
    load_session_file,
    open_append,
    session_path,
    sessions_dir,
    utc_now,
    write_record,
)


@dataclass(frozen=True)
class SessionSummary:
    """One line of the session list. ``last_used`` is the file's modification time (ISO 8601 UTC)."""

    id: str
    title: str
    model: str
    turns: int
    partial_turns: int
    created: str
    last_used: str
    path: str

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)


def list_sessions(directory: Path | None = None) -> list[SessionSummary]:
    """Every readable session, most recently used first (files without a header are skipped)."""
    d = directory or sessions_dir()
    out = []
    for path in d.glob(f"*{SUFFIX}") if d.is_dir() else []:
        try:
            s = load_session_file(path)
        except SessionError:
            continue
        out.append(
            SessionSummary(
                id=s.id or path.stem,
                title=s.title,
                model=s.model_name,
                turns=len(s.turns),
                partial_turns=sum(t.status == "partial" for t in s.turns),
                created=s.created,
                last_used=s.last_used,
                path=str(path),
            )
        )
    out.sort(key=lambda x: (x.last_used, x.id), reverse=True)
    return out


def resolve_session_path(session_id: str | None, directory: Path | None = None) -> Path:
    """Find a session file by exact id, unique prefix, or ``None``/``"last"`` for the latest.

    Raises:
        SessionError: no sessions, no match, or a prefix matching several.
    """
    d = directory or sessions_dir()
    if not session_id or session_id == "last":
        sessions = list_sessions(d)
        if not sessions:
            raise SessionError(f"no saved sessions in {d}")
        return Path(sessions[0].path)
    exact = session_path(session_id, d)
    if exact.is_file():
        return exact
    matches = sorted(d.glob(f"{session_id}*{SUFFIX}")) if d.is_dir() else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise SessionError(f"no session {session_id!r} (see `chatphase sessions`)")
    raise SessionError(f"session id {session_id!r} is ambiguous: {', '.join(m.stem for m in matches[:5])}")


def delete_session(session_id: str, directory: Path | None = None) -> Session:
    """Delete a session file; returns what it held (for the confirmation line).

    Raises:
        SessionError: as :func:`resolve_session_path`, or when the file cannot be removed.
    """
    path = resolve_session_path(session_id, directory)
    s = load_session_file(path)
    try:
        path.unlink()
    except OSError as exc:
        raise SessionError(f"cannot delete {path}: {exc.strerror or exc}") from None
    return s


def rename_session(session_id: str, title: str, directory: Path | None = None) -> Session:
    """Give a session a new title (appends a ``title`` record); returns the renamed session.

    Raises:
        SessionError: as :func:`resolve_session_path`, or an empty title.
    """
    title = " ".join(title.split())
    if not title:
        raise SessionError("a session title cannot be empty")
    path = resolve_session_path(session_id, directory)
    s = load_session_file(path)
    with open_append(path) as fh:
        write_record(fh, {"type": "title", "title": title, "time": utc_now()}, sync=True)
    s.title = title
    return s


def load_session(session_id: str, directory: Path | None = None) -> Session:
    """Load a session by id, unique id prefix, or ``"last"`` (most recently used).

    Raises:
        SessionError: unknown or ambiguous id, or an unreadable file.
    """
    path = resolve_session_path(session_id, directory)
    return load_session_file(path)
