"""``chatphase logs``: the last recorded turns with their figures, from every session (the history database,
:mod:`chatphase.history`).

Newest first, ``-n`` of them (default 20); filters by model, session, backend, machine, time and text (``-q``);
``--json`` (every figure, ``metrics`` with every field measured) or ``--csv``. Text from outside (messages,
replies, model and host names) is made inert. Exit codes: 0 ok (also when no turn matches, and when the history
cannot be written: what it holds is shown, and one line on stderr says new turns are not being indexed); 1 the
history cannot be read; 2 bad usage.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from contextlib import closing

from chatphase.commands.history_options import add_filter_options, filters_of, open_history
from chatphase.engine.text import inert, json_inert
from chatphase.errors import UsageError
from chatphase.history.query import LOG_COLUMNS, logs
from chatphase.sessions.message_files import message_preview
from chatphase.sessions.store import local_time


def register(sub) -> None:
    p = sub.add_parser(
        "logs",
        help="the last recorded turns with their figures, from every session",
        description="The last recorded turns (newest first) with TTFT, prefill and decode figures.",
    )
    p.add_argument("-n", "--limit", type=int, default=20, metavar="N", help="how many turns (default 20)")
    add_filter_options(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the turns as a JSON list")
    out.add_argument("--csv", action="store_true", help="print the turns as CSV")
    p.set_defaults(func=run)


def _num(value, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_table(rows: list[dict]) -> str:
    """Aligned columns: time, session/turn, model, prompt (cached), TTFT, prefill and decode rates, tokens, the
    user's message (first line, cut); outside text inert."""
    head = (
        "TIME",
        "SESSION/TURN",
        "MODEL",
        "PROMPT",
        "CACHED",
        "TTFT ms",
        "PREFILL t/s",
        "DECODE t/s",
        "TOKENS",
        "MESSAGE",
    )
    body = []
    for r in rows:
        user = message_preview(r["user"] or "", 40)  # the user's words, each file short
        status = "" if r["status"] == "complete" else f" ({r['status']})"
        body.append(
            (
                local_time(r["started"] or ""),
                f"{r['session_id']}/{r['turn']}",
                inert(r["model_name"] or "?"),
                _num(r["prompt_tokens"]),
                _num(r["cached_tokens"]),
                _num(r["ttft_ms"], 1),
                _num(r["prefill_tokens_per_s"], 1),
                _num(r["decode_tokens_per_s"], 1),
                _num(r["decode_tokens"]),
                inert(user + status),
            )
        )
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (head, *body))


def to_csv(rows: list[dict]) -> str:
    """:data:`LOG_COLUMNS` as CSV (empty cells for unknown figures), inert."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(LOG_COLUMNS)
    for r in rows:
        w.writerow(["" if r[c] is None else r[c] for c in LOG_COLUMNS])
    return inert(buf.getvalue())


def run(args: argparse.Namespace) -> int:
    """Print the turns; see the module docstring."""
    if args.limit < 1:
        raise UsageError(f"-n needs a positive number of turns (got {args.limit})")
    filters = filters_of(args)
    filters.where()  # bad filters are usage errors before the history is opened
    with closing(open_history()) as conn:
        rows = logs(conn, filters, args.limit)
    if args.json:
        sys.stdout.write(json_inert(json.dumps(rows, indent=2, ensure_ascii=False)) + "\n")
    elif args.csv:
        sys.stdout.write(to_csv(rows))
    elif not rows:
        print("no recorded turns match" if any(vars(filters).values()) else "no recorded turns yet")
    else:
        print(format_table(rows))
    return 0
