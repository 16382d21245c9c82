"""``chatphase export [ID] [--format md|json|csv] [--output FILE]``: a saved session as a file.

``md``: transcript with a metrics table; ``json``: everything; ``csv``: one row per turn, one column
per metric (units in the column names). ``ID`` defaults to the most recent session. Without
``--output`` the export goes to stdout; the format defaults to the output file's extension, else md.
Exit codes: 0 ok; 1 unknown session; 2 bad usage or an unwritable file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chatphase.engine.text import inert
from chatphase.errors import UsageError
from chatphase.sessions.catalog import load_session
from chatphase.sessions.export import FORMATS, export_session, format_from_path, write_export
from chatphase.units import fmt_count


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="export a saved session as Markdown, JSON or CSV",
        description="Export a saved session: Markdown transcript with a metrics table, JSON of everything, or CSV with one row per turn.",
    )
    p.add_argument("id", nargs="?", default="last", metavar="ID", help="session id, unique prefix, or 'last' (default)")
    p.add_argument(
        "--format", "-f", choices=FORMATS, help="md | json | csv (default: from --output's extension, else md)"
    )
    p.add_argument("--output", "-o", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export one session; see the module docstring."""
    fmt = args.format or (format_from_path(args.output) if args.output else None) or "md"
    if args.output is not None and args.output.is_dir():
        raise UsageError(f"--output is a directory: {args.output}")
    session = load_session(args.id)
    if args.output is None:
        sys.stdout.write(export_session(session, fmt))
        return 0
    path = write_export(session, fmt, args.output)
    print(inert(f"exported {session.id} ({fmt_count(len(session.turns), 'turn')}) as {fmt} to {path}"), file=sys.stderr)
    return 0
