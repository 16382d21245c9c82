"""``chatphase sessions``: list saved sessions (``--json`` for scripts), rename or delete one.

``chatphase sessions`` prints id, title, model, turns (partial ones counted) and last use, newest
first; ``chatphase sessions rename ID TITLE``; ``chatphase sessions delete ID [--yes]``. ``ID`` is a
session id, a unique prefix of one, or ``last``. Sessions are files in the user data directory
(:mod:`chatphase.sessions.store`). Exit codes: 0 ok; 1 unknown session; 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys

from chatphase.engine.text import inert, json_inert
from chatphase.errors import UsageError
from chatphase.sessions.catalog import SessionSummary, delete_session, list_sessions, rename_session
from chatphase.sessions.store import local_time, sessions_dir


def register(sub) -> None:
    p = sub.add_parser(
        "sessions",
        help="list, rename or delete saved conversations",
        description="List saved sessions (newest first), rename or delete one.",
    )
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=run, action=None)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    r = actions.add_parser("rename", help="give a session a new title")
    r.add_argument("id", metavar="ID", help="session id, unique prefix, or 'last'")
    r.add_argument("title", nargs="+", metavar="TITLE")
    d = actions.add_parser("delete", help="delete a session file")
    d.add_argument("id", metavar="ID", help="session id, unique prefix, or 'last'")
    d.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


def format_table(rows: list[SessionSummary]) -> str:
    """The session list as aligned text columns (ID, TITLE, MODEL, TURNS, LAST USED); titles and model names
    inert (:func:`~chatphase.engine.text.inert`), before they are measured."""
    head = ("ID", "TITLE", "MODEL", "TURNS", "LAST USED")
    body = [
        (
            s.id,
            inert(s.title if len(s.title) <= 40 else s.title[:39] + "…"),
            inert(s.model or "?"),
            f"{s.turns}" + (f" ({s.partial_turns} partial)" if s.partial_turns else ""),
            local_time(s.last_used),
        )
        for s in rows
    ]
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (head, *body))


def run(args: argparse.Namespace) -> int:
    """List, rename or delete; see the module docstring."""
    if args.action == "rename":
        s = rename_session(args.id, " ".join(args.title))
        print(inert(f"renamed {s.id}: {s.title}"))
        return 0
    if args.action == "delete":
        return _delete(args)
    rows = list_sessions()
    if args.json:
        sys.stdout.write(json_inert(json.dumps([r.to_dict() for r in rows], indent=2, ensure_ascii=False)) + "\n")
    elif not rows:
        print(f"no saved sessions (they are kept in {sessions_dir()})")
    else:
        print(format_table(rows))
    return 0


def _delete(args) -> int:
    from chatphase.sessions.catalog import load_session

    s = load_session(args.id)
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError(f"not deleting {s.id} without --yes (no terminal to confirm on)")
        answer = input(f"delete session {s.id} ({s.title!r}, {len(s.turns)} turns)? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("kept")
            return 0
    delete_session(s.id)
    print(inert(f"deleted {s.id}: {s.title}"))
    return 0
