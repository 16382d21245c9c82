"""Session files into history rows: the catch-up and the live updater.

The session files (:mod:`chatphase.sessions.store`) are the record; the database is their index. A file is
indexed whole, in one transaction: its session row and turn rows are deleted and written again from what the
file holds now, so indexing is idempotent and a turn that grew (a partial turn finished, a rename, a
replacement) is simply read again. ``sessions.file_size`` / ``file_mtime_ns`` remember the file as it was read
(stat'ed before the read: a file that grows meanwhile is read again next time).

- :func:`catch_up` indexes every new or changed file and drops the rows of deleted ones: the first run takes
  over every session already on disk (the migration), later runs read only what changed. ``logs``, ``stats``
  and the TUI's history plot run it before they read.
- :class:`LiveIndex` indexes the file of the turn that just ended, on its own thread: the chat never waits for
  the database, and a write the process did not live to make is caught up later.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatphase.history.context import context_row
from chatphase.history.db import CONTEXT_COLUMNS, METRIC_COLUMNS, HistoryError, connect, write_refusal
from chatphase.sessions.store import (
    DAMAGED,
    SUFFIX,
    SessionError,
    parse_records,
    session_from_records,
    sessions_dir,
)

log = logging.getLogger(__name__)

#: session files a catch-up indexes in one transaction: a live writer waits at most about a second behind it
CATCH_UP_BATCH_FILES = 64
#: stale files from which a catch-up reads them in worker processes (:func:`read_file`) while it writes: starting
#: a process costs about as much as reading a few dozen files
PARALLEL_MIN_FILES = 200
#: the most worker processes, and the files each reads ahead of the writer
MAX_WORKERS = 8
READ_AHEAD_FILES = 4

_TURN_COLUMNS = (
    "session_id",
    "turn",
    "started",
    "finished",
    "status",
    "replaced",
    "error",
    "context_id",
    *METRIC_COLUMNS,
    "metrics",
    "sampling",
    "user",
    "reply",
    "thinking",
)
#: a file's new turn rows go to this temporary table, then into ``turns`` in one statement: SQLite opens a statement
#: savepoint for each INSERT that fires a trigger, and FTS5 writes its pending terms out as a new segment at every
#: savepoint, so a row at a time made a segment a turn (and merged them, on and on): two thirds of the inserts' time
_STAGE = "temp.index_stage"
_CREATE_STAGE = (
    f"CREATE TEMP TABLE IF NOT EXISTS index_stage AS SELECT {', '.join(_TURN_COLUMNS)} FROM main.turns WHERE 0"
)
_INSERT_STAGE = f"INSERT INTO {_STAGE} VALUES ({', '.join('?' * len(_TURN_COLUMNS))})"
_INSERT_TURNS = f"INSERT INTO turns ({', '.join(_TURN_COLUMNS)}) SELECT {', '.join(_TURN_COLUMNS)} FROM {_STAGE}"
_CONTEXT_KEYS = ("key", *CONTEXT_COLUMNS, "extra")
_INSERT_CONTEXT = (
    f"INSERT OR IGNORE INTO contexts ({', '.join(_CONTEXT_KEYS)}) VALUES ({', '.join('?' * len(_CONTEXT_KEYS))})"
)


@dataclass(frozen=True)
class CatchUp:
    """What :func:`catch_up` did: files indexed (new or changed), files whose rows were dropped (deleted)."""

    indexed: int
    removed: int


def turn_contexts(records: list[dict[str, Any]]) -> dict[int, tuple[dict, dict, dict | None]]:
    """Each turn's ``(model, settings, context record)`` in effect at its ``turn_start``: the header's model and
    settings as later ``model`` records change them, and the last ``context`` record (``None`` before any). Turns
    that share them share the tuple."""
    model: dict = {}
    settings: dict = {}
    context: dict | None = None
    now: tuple[dict, dict, dict | None] = (model, settings, context)
    out: dict[int, tuple[dict, dict, dict | None]] = {}
    for rec in records:
        kind = rec.get("type")
        try:
            if kind == "session" or kind == "model":
                model = rec.get("model") or model
                settings = rec.get("settings") or settings
            elif kind == "context":
                context = rec
            elif kind == "turn_start":
                if now[0] is not model or now[1] is not settings or now[2] is not context:
                    now = (model, settings, context)
                out[int(rec["turn"])] = now
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _end_metrics(records: list[dict[str, Any]]) -> dict[int, dict]:
    """Each turn's metrics dict as its last ``turn_end`` wrote it (fields of a newer chatphase included)."""
    out = {}
    for rec in records:
        if rec.get("type") == "turn_end" and isinstance(rec.get("metrics"), dict):
            try:
                out[int(rec["turn"])] = rec["metrics"]
            except (KeyError, TypeError, ValueError):
                continue
    return out


def index_file(conn: sqlite3.Connection, path: Path) -> int:
    """(Re)index one session file in one transaction; returns the turns the file holds (0 for a file that is not
    a session: it is remembered, so it is not read again until it changes; a file gone: its rows dropped). Only
    the turns whose row differs from the one indexed are written again (a live update writes the turn that ended).

    Raises:
        sqlite3.Error: the database could not be written (locked past the busy timeout, disk full).
    """
    return _store(conn, read_file(path))


@dataclass(frozen=True)
class FileRows:
    """A session file as the database will hold it (:func:`read_file`): the ``sessions`` row's fields, the contexts
    its turns ran in (:func:`~chatphase.history.context.context_row` dicts) and its ``turns`` rows, whose
    ``context_id`` is still the position of their context in ``contexts``. ``gone``: the file no longer exists."""

    path: Path
    gone: bool = False
    file_size: int = 0
    file_mtime_ns: int = 0
    title: str | None = None
    created: str | None = None
    corrupt_lines: int | None = None
    contexts: list[dict[str, Any]] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)
    turns: int = 0


#: where ``context_id`` is in a ``turns`` row
_CONTEXT_AT = _TURN_COLUMNS.index("context_id")


def read_file(path: Path) -> FileRows | None:
    """Read and parse one session file into its rows (no database: :func:`catch_up` runs this in worker
    processes); ``None`` when it cannot be read (logged)."""
    try:
        st = path.stat()
        with open(path, encoding="utf-8", errors="replace") as fh:
            records, _ = parse_records(fh, keep_damaged=True)
    except FileNotFoundError:
        return FileRows(path, gone=True)
    except OSError as exc:
        log.debug("history: cannot read %s: %s", path, exc)
        return None
    try:
        session = session_from_records(records, path=str(path))
    except SessionError:
        return FileRows(path, file_size=st.st_size, file_mtime_ns=st.st_mtime_ns)
    readable = [r for r in records if r.get("type") != DAMAGED]
    contexts, ends = turn_contexts(readable), _end_metrics(readable)
    sid = path.stem
    context_at: dict[int, int] = {}  # id() of a turn_contexts tuple -> its position in context_rows
    context_rows: list[dict[str, Any]] = []
    fallback: tuple[dict, dict, dict | None] = (session.model, session.settings, None)
    rows: list[tuple] = []
    for t in session.turns:
        where = contexts.get(t.index, fallback)
        if id(where) not in context_at:
            context_at[id(where)] = len(context_rows)
            context_rows.append(context_row(*where))
        m = ends.get(t.index) if t.metrics is not None else None
        if t.metrics is not None and m is None:
            m = t.metrics.to_dict()
        rows.append(
            (
                sid,
                t.index,
                t.started,
                t.finished,
                t.status,
                int(t.replaced),
                t.error,
                context_at[id(where)],
                *((m or {}).get(c) for c in METRIC_COLUMNS),
                json.dumps(m) if m else None,
                json.dumps(t.sampling) if t.sampling else None,
                t.user,
                t.reply,
                t.thinking or None,
            )
        )
    return FileRows(
        path,
        file_size=st.st_size,
        file_mtime_ns=st.st_mtime_ns,
        title=session.title,
        created=session.created,
        corrupt_lines=session.corrupt_lines,
        contexts=context_rows,
        rows=rows,
        turns=len(session.turns),
    )


def _store(conn: sqlite3.Connection, read: FileRows | None) -> int:
    """Write what :func:`read_file` read (see :func:`index_file`); returns the file's turns."""
    if read is None:
        return 0
    path, sid = read.path, read.path.stem
    if read.gone:
        _write(conn, lambda: conn.execute("DELETE FROM sessions WHERE path = ? OR id = ?", (str(path), sid)))
        return 0

    def write() -> None:
        conn.execute("DELETE FROM sessions WHERE (path = ?) != (id = ?)", (str(path), sid))  # moved or renamed
        conn.execute(
            "INSERT INTO sessions (id, path, title, created, file_size, file_mtime_ns, corrupt_lines) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET path = excluded.path, title = excluded.title,"
            " created = excluded.created, file_size = excluded.file_size, file_mtime_ns = excluded.file_mtime_ns,"
            " corrupt_lines = excluded.corrupt_lines",
            (sid, str(path), read.title, read.created, read.file_size, read.file_mtime_ns, read.corrupt_lines),
        )
        cols = ", ".join(_TURN_COLUMNS)
        indexed = {r[1]: r for r in conn.execute(f"SELECT {cols} FROM turns WHERE session_id = ?", (sid,))}
        context_ids = [_context_id(conn, c) for c in read.contexts]
        changed: list[tuple[str, int]] = []  # (session, turn) of the rows to write again
        rows: list[tuple] = []
        for parsed in read.rows:
            row = (*parsed[:_CONTEXT_AT], context_ids[parsed[_CONTEXT_AT]], *parsed[_CONTEXT_AT + 1 :])
            before = indexed.pop(row[1], None)
            if before != row:
                if before is not None:
                    changed.append((sid, row[1]))
                rows.append(row)
        # the rows' turns changed or gone, then the new rows: one statement each (a first catch-up of 100,000
        # turns spent a third of its time in per-turn DELETE and INSERT calls)
        conn.executemany("DELETE FROM turns WHERE session_id = ? AND turn = ?", changed + [(sid, g) for g in indexed])
        if rows:
            conn.execute(_CREATE_STAGE)
            conn.executemany(_INSERT_STAGE, rows)
            conn.execute(_INSERT_TURNS)
            conn.execute(f"DELETE FROM {_STAGE}")

    _write(conn, write)
    return read.turns


def _context_id(conn: sqlite3.Connection, row: dict[str, Any]) -> int:
    conn.execute(_INSERT_CONTEXT, tuple(row.get(k) for k in _CONTEXT_KEYS))
    return int(conn.execute("SELECT id FROM contexts WHERE key = ?", (row["key"],)).fetchone()[0])


def _write(conn: sqlite3.Connection, body: Callable[[], object]) -> None:
    """Run ``body`` in an immediate transaction (a concurrent writer waits its turn: the busy timeout), or, where a
    transaction is open, in that one: :func:`catch_up` takes over files in batches (a commit per file was a sixth
    of a first catch-up), and a failure takes the whole batch back. No savepoint per file: FTS5 writes its pending
    terms out as a new segment at every savepoint, and a first catch-up then merged a thousand small ones (one a
    file)."""
    if conn.in_transaction:
        body()
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        body()
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _index_files(
    conn: sqlite3.Connection, paths: list[str], reads: Generator[FileRows | None, None, None] | None
) -> None:
    """Index ``paths``: read here (:func:`index_file`), or taken from ``reads`` (the files read ahead)."""
    for p in paths:
        if reads is None:
            index_file(conn, Path(p))
        else:
            _store(conn, next(reads))


def _read_ahead(paths: list[str], workers: int) -> Generator[FileRows | None, None, None]:
    """:func:`read_file` of each path, in order, read by ``workers`` processes a few files ahead of the writer;
    where the processes cannot start or break, the rest is read here."""
    import multiprocessing  # here: ``logs`` and ``stats`` over a history caught up need neither (~15 ms)
    from concurrent.futures import ProcessPoolExecutor

    done = 0
    try:
        context = multiprocessing.get_context("spawn")  # no fork: a TUI calling this has threads
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            ahead: collections.deque = collections.deque()
            for p in paths[: READ_AHEAD_FILES * workers]:
                ahead.append(pool.submit(read_file, Path(p)))
            while ahead:
                result = ahead.popleft().result()
                if done + len(ahead) + 1 < len(paths):
                    ahead.append(pool.submit(read_file, Path(paths[done + len(ahead) + 1])))
                done += 1
                yield result
    except GeneratorExit:
        raise
    except Exception as exc:  # a worker that broke: read the rest here (read_file's own errors come back there)
        log.debug("history: reading in worker processes stopped (%s); reading here", exc)
    for p in paths[done:]:
        yield read_file(Path(p))


def _workers(files: int) -> int:
    """Worker processes for reading ``files`` stale files: one CPU left to the writer, none for a few files."""
    if files < PARALLEL_MIN_FILES:
        return 0
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(0, min(cpus - 1, MAX_WORKERS))


def catch_up(conn: sqlite3.Connection, directory: Path | None = None, *, parallel: bool = False) -> CatchUp:
    """Index the session files of ``directory`` (default :func:`sessions_dir`) that are new or changed since they
    were indexed, and drop the rows of those deleted (see the module docstring).

    With ``parallel``, :data:`PARALLEL_MIN_FILES` stale files or more (a first catch-up) are read and parsed in
    worker processes while this one writes (parsing was half of a first catch-up's time). Those are *spawned*,
    which imports the program's main module again: only a program whose main module runs nothing on import
    (``python -m chatphase``) may ask for it.

    Raises:
        HistoryUnwritable: the database refused the writes (read-only, the disk full, locked); what it holds
            can still be read.
        HistoryError: the database could not be written otherwise.
    """
    d = directory or sessions_dir()
    on_disk: dict[str, os.stat_result] = {}
    for f in d.glob(f"*{SUFFIX}") if d.is_dir() else ():
        try:
            on_disk[str(f)] = f.stat()
        except OSError:
            continue
    known = {
        path: (size, mtime)
        for path, size, mtime in conn.execute("SELECT path, file_size, file_mtime_ns FROM sessions").fetchall()
    }
    try:
        stale = [p for p, st in on_disk.items() if known.get(p) != (st.st_size, st.st_mtime_ns)]
        stale.sort()
        workers = _workers(len(stale)) if parallel else 0
        reads = _read_ahead(stale, workers) if workers else None  # a generator: closed below
        try:
            for at in range(0, len(stale), CATCH_UP_BATCH_FILES):
                _write(conn, functools.partial(_index_files, conn, stale[at : at + CATCH_UP_BATCH_FILES], reads))
        finally:
            if reads is not None:
                reads.close()
        gone = [p for p in known if p not in on_disk and Path(p).parent == d]
        if gone:
            _write(conn, lambda: conn.executemany("DELETE FROM sessions WHERE path = ?", [(p,) for p in gone]))
    except sqlite3.Error as exc:
        raise write_refusal(exc, f"cannot update the history: {exc}") from None
    return CatchUp(len(stale), len(gone))


@dataclass(frozen=True)
class _Marker:
    """Put on the queue by :meth:`LiveIndex.wait`: set once the updates before it are done."""

    done: threading.Event


class LiveIndex:
    """Indexes session files on a daemon thread as their turns end (:meth:`update`); the database is opened there,
    at the first update. Failures are logged (``--verbose``) and dropped: the next catch-up redoes them.

    Args:
        db: the database path (default :func:`chatphase.history.db.db_path`).
    """

    def __init__(self, db: Path | None = None) -> None:
        self.db = db
        self._queue: queue.Queue[Path | _Marker | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def update(self, path: str | os.PathLike) -> None:
        """Index ``path`` soon (returns at once)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="chatphase-history", daemon=True)
                self._thread.start()
        self._queue.put(Path(path))

    def wait(self, timeout_s: float = 10.0) -> bool:
        """Wait until every update asked for so far is done; ``False`` when ``timeout_s`` passed first."""
        done = threading.Event()
        self._queue.put_nowait(_Marker(done))
        return done.wait(timeout_s) if self._thread is not None else True

    def close(self, timeout_s: float = 5.0) -> None:
        """Finish the updates asked for (up to ``timeout_s``) and stop the thread; idempotent."""
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        while True:
            item = self._queue.get()
            if item is None:
                break
            if isinstance(item, _Marker):
                item.done.set()
                continue
            pending = {item}
            while not self._queue.empty() and isinstance(
                self._queue.queue[0], Path
            ):  # a file asked for twice: read once
                nxt = self._queue.get()
                assert isinstance(nxt, Path)  # the one just looked at (this thread alone takes from the queue)
                pending.add(nxt)
            try:
                conn = conn or connect(self.db)
                for path in sorted(pending):
                    index_file(conn, path)
            except (HistoryError, sqlite3.Error, OSError) as exc:
                log.debug("history: cannot index %s: %s", sorted(pending), exc)
        if conn is not None:
            conn.close()
