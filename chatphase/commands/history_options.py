"""The options ``logs`` and ``stats`` share: the filters of :class:`chatphase.history.query.Filters`, and opening the
history (caught up with the session files first, :func:`chatphase.history.index.catch_up`)."""

from __future__ import annotations

import argparse
import sqlite3
import sys

from chatphase.engine.text import inert
from chatphase.history.db import HistoryError, HistoryUnwritable, connect, connect_read_only, db_path
from chatphase.history.index import catch_up
from chatphase.history.query import Filters


def add_filter_options(p: argparse.ArgumentParser) -> None:
    """``--model --session --backend --machine --since --until -q``."""
    f = p.add_argument_group("which turns")
    f.add_argument("--model", metavar="TEXT", help="model file name (part of it) or content hash prefix")
    f.add_argument("--session", metavar="ID", help="session id or its prefix")
    f.add_argument("--backend", metavar="TEXT", help="llama.cpp, its build, or a server's address or model (part)")
    f.add_argument("--machine", metavar="TEXT", help="host name, CPU or GPU (part of it)")
    f.add_argument(
        "--since", metavar="WHEN", help="from: 2026-12-01, 2026-12-01T09:30 (local), or back from now: 2h, 7d"
    )
    f.add_argument("--until", metavar="WHEN", help="before: same forms as --since")
    f.add_argument("-q", "--query", metavar="TEXT", help="turns whose message, reply or thinking hold these words")


def filters_of(args: argparse.Namespace) -> Filters:
    """The :class:`Filters` the options ask for (their values checked when the query is built)."""
    return Filters(args.model, args.session, args.backend, args.machine, args.since, args.until, args.query)


def open_history() -> sqlite3.Connection:
    """The history database, caught up with the session files. A history that cannot be written (read-only, the
    disk full) is read as it is, and one line on stderr says that new turns are not being indexed.

    Raises:
        HistoryError: it cannot be opened or read.
    """
    try:
        conn = connect()
    except HistoryUnwritable as exc:  # read-only: not even opened for writing
        conn = connect_read_only()
        _not_indexed(exc)
        return conn
    try:
        catch_up(conn, parallel=True)  # python -m chatphase: its main module runs nothing on import
    except HistoryUnwritable as exc:
        _not_indexed(exc)
    except HistoryError:
        conn.close()
        raise
    return conn


def _not_indexed(exc: HistoryUnwritable) -> None:
    print(
        inert(f"chatphase: {exc}; showing the turns {db_path()} already holds (new turns are not being indexed)"),
        file=sys.stderr,
    )
