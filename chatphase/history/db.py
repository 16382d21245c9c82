"""The history database: schema, migrations and connections (stdlib :mod:`sqlite3`, WAL).

``<data dir>/history.db`` (beside ``sessions/``), an index of the session files: every row can be rebuilt
from them (:mod:`chatphase.history.index`). The schema's version is ``PRAGMA user_version``; :data:`MIGRATIONS`
takes a database of any earlier version to :data:`SCHEMA_VERSION`, one step at a time, each in its own
transaction. docs/history.md documents the tables.

``turns_figures`` covers what ``stats`` reads of a turn, so it never reads the rows' texts (a table scan of
100,000 turns with their replies reads hundreds of MB; the index a few).

Metrics: the main figures have typed columns (:data:`METRIC_COLUMNS`, for fast filters and sorting), and every
field of :class:`~chatphase.engine.metrics.TurnMetrics` is in the ``metrics`` JSON column, so a field added to
it later is stored without a migration (``json_extract(metrics, '$.field')`` reads it).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from chatphase.errors import ChatPhaseError
from chatphase.system.paths import data_dir

DB_NAME = "history.db"
#: the typed metric columns of ``turns`` (every metric is in its ``metrics`` JSON too).
METRIC_COLUMNS: tuple[str, ...] = (
    "prompt_tokens",
    "cached_tokens",
    "prefill_tokens",
    "prefill_ms",
    "prefill_tokens_per_s",
    "ttft_ms",
    "decode_tokens",
    "decode_ms",
    "decode_tokens_per_s",
    "tpot_ms",
    "itl_ms_p50",
    "itl_ms_p95",
    "kv_cache_tokens",
    "kv_cache_bytes",
    "stop_reason",
)
#: the columns of ``contexts`` besides ``id``, ``key`` and ``extra`` (docs/history.md says what each holds).
CONTEXT_COLUMNS: tuple[str, ...] = (
    "model_name",
    "model_path",
    "model_size_bytes",
    "model_hash",
    "model_architecture",
    "model_n_params",
    "model_quantization",
    "model_synthetic",
    "backend",
    "backend_build",
    "server",
    "remote_model",
    "n_ctx",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "n_threads_batch",
    "type_k",
    "type_v",
    "flash_attn",
    "n_gpu_layers",
    "offload_kqv",
    "layers_offloaded",
    "devices",
    "spec",
    "machine",
    "cpu",
    "physical_cores",
    "logical_cpus",
    "memory_bytes",
    "gpu",
    "chatphase_version",
)

_V1 = f"""
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    title TEXT,
    created TEXT,
    file_size INTEGER,
    file_mtime_ns INTEGER,
    corrupt_lines INTEGER
);
CREATE TABLE contexts (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    {", ".join(CONTEXT_COLUMNS)},
    extra TEXT
);
CREATE TABLE turns (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn INTEGER NOT NULL,
    started TEXT,
    finished TEXT,
    status TEXT,
    replaced INTEGER,
    error TEXT,
    context_id INTEGER REFERENCES contexts(id),
    {", ".join(METRIC_COLUMNS)},
    metrics TEXT,
    sampling TEXT,
    user TEXT,
    reply TEXT,
    thinking TEXT,
    UNIQUE (session_id, turn)
);
CREATE INDEX turns_started ON turns(started);
CREATE INDEX turns_context ON turns(context_id);
CREATE INDEX turns_figures ON turns(
    context_id, stop_reason, started, session_id, prompt_tokens, cached_tokens, prefill_tokens, ttft_ms,
    prefill_tokens_per_s, decode_tokens_per_s, kv_cache_tokens
);
CREATE VIRTUAL TABLE turns_fts USING fts5(user, reply, thinking, content='turns', content_rowid='id');
CREATE TRIGGER turns_ai AFTER INSERT ON turns BEGIN
    INSERT INTO turns_fts(rowid, user, reply, thinking) VALUES (new.id, new.user, new.reply, new.thinking);
END;
CREATE TRIGGER turns_ad AFTER DELETE ON turns BEGIN
    INSERT INTO turns_fts(turns_fts, rowid, user, reply, thinking)
    VALUES ('delete', old.id, old.user, old.reply, old.thinking);
END;
CREATE VIEW turn_log AS
    SELECT t.id, t.session_id, s.title AS session_title, t.turn, t.started, t.finished, t.status, t.replaced,
           t.error, {", ".join("t." + c for c in METRIC_COLUMNS)}, t.metrics, t.sampling, t.user, t.reply,
           t.thinking, {", ".join("c." + c for c in CONTEXT_COLUMNS)}
    FROM turns t JOIN sessions s ON s.id = t.session_id LEFT JOIN contexts c ON c.id = t.context_id;
"""

#: ``MIGRATIONS[i]`` takes a database from version ``i`` to ``i + 1``.
MIGRATIONS: tuple[str, ...] = (_V1,)
SCHEMA_VERSION = len(MIGRATIONS)


class HistoryError(ChatPhaseError):
    """The history database cannot be opened, read or migrated (exit code 1)."""


class HistoryUnwritable(HistoryError):
    """The history database can be read but not written now: a read-only file or folder, an immutable file, the
    disk full, another writer holding it past the busy timeout. ``read_only``: SQLite said read-only."""

    def __init__(self, message: str, read_only: bool) -> None:
        super().__init__(message)
        self.read_only = read_only


#: SQLite's primary result codes that refuse a write, not a damaged database: BUSY, LOCKED, READONLY, FULL.
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_FULL = 5, 6, 8, 13
#: their messages, for Python 3.10 (whose sqlite3 errors carry no code).
_REFUSAL_WORDS = {_SQLITE_READONLY: "readonly", _SQLITE_FULL: "is full", _SQLITE_BUSY: "is locked"}


def write_refusal(exc: sqlite3.Error, message: str) -> HistoryError:
    """``message`` as a :class:`HistoryUnwritable` when ``exc`` refused a write (the codes above), else as a
    :class:`HistoryError`."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        primary = code & 0xFF
    else:
        primary = next((c for c, words in _REFUSAL_WORDS.items() if words in str(exc)), 0)
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_FULL):
        return HistoryUnwritable(message, read_only=primary == _SQLITE_READONLY)
    return HistoryError(message)


def db_path() -> Path:
    """``data_dir() / "history.db"``."""
    return data_dir() / DB_NAME


def connect(path: Path | None = None, *, timeout_s: float = 30.0) -> sqlite3.Connection:
    """Open (creating it) and migrate the history database: WAL, ``synchronous=NORMAL`` (the session files are
    the durable record), foreign keys on, a busy timeout of ``timeout_s`` for concurrent writers.

    Raises:
        HistoryError: it cannot be opened, is not a database, or is newer than this chatphase.
    """
    p = path or db_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        conn = sqlite3.connect(p, timeout=timeout_s, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise HistoryError(f"cannot open the history {p}: {exc}") from None
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        migrate(conn)
    except sqlite3.Error as exc:
        conn.close()
        error = write_refusal(exc, f"cannot update the history: {exc}")
        if isinstance(error, HistoryUnwritable) and error.read_only:
            raise error from None
        raise HistoryError(
            f"cannot use the history {p}: {exc} (it only indexes the session files: delete it to rebuild it)"
        ) from None
    except HistoryError:
        conn.close()
        raise
    return conn


def connect_read_only(path: Path | None = None) -> sqlite3.Connection:
    """The history as it is in its file, for reading only, where this process cannot write it (:func:`connect`
    raised a read-only :class:`HistoryUnwritable`: SQLite in WAL mode cannot even read a database in a read-only
    folder without its ``-shm`` file). Opened ``immutable``: no lock and no ``-shm``, and what a ``-wal`` file
    holds beyond the database file is not read.

    Raises:
        HistoryError: it cannot be read, or its schema is not this chatphase's.
    """
    p = path or db_path()
    try:
        conn = sqlite3.connect(
            f"{p.resolve().as_uri()}?immutable=1", uri=True, isolation_level=None, check_same_thread=False
        )
        found = int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error as exc:
        raise HistoryError(f"cannot read the history {p}: {exc}") from None
    if found != SCHEMA_VERSION:
        conn.close()
        raise HistoryError(f"cannot read the history {p}: it is version {found}, this chatphase reads {SCHEMA_VERSION}")
    return conn


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION`, each step in an immediate transaction (another process
    migrating at once waits, then finds it done); returns the version found.

    Raises:
        HistoryError: the database is newer than this chatphase knows.
    """
    found = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if found > SCHEMA_VERSION:
        raise HistoryError(f"the history database is version {found}; this chatphase reads up to {SCHEMA_VERSION}")
    while (version := int(conn.execute("PRAGMA user_version").fetchone()[0])) < SCHEMA_VERSION:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if int(conn.execute("PRAGMA user_version").fetchone()[0]) == version:
                for statement in _statements(MIGRATIONS[version]):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return found


def _statements(script: str) -> list[str]:
    """A script's statements, split where :func:`sqlite3.complete_statement` says one ends (``executescript``
    would commit the open transaction first)."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    return [s for s in out if s]
