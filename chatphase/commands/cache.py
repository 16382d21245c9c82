"""``chatphase cache``: the prefix store (saved KV prefixes, :mod:`chatphase.engine.local.prefix_store`).

``chatphase cache`` lists the saved prefixes (model, tokens, size, last use; a file that would be refused says
why) and the totals against the cap; ``--json`` for scripts; ``chatphase cache clear`` removes them all.
Exit codes: 0 ok; 1 the store's path is not a folder (a file in its place); 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone

from chatphase.engine.local.prefix_store import clear, default_cap_bytes, list_files, not_a_folder, store_dir
from chatphase.engine.text import inert, json_inert
from chatphase.errors import ChatPhaseError
from chatphase.sessions.store import local_minute
from chatphase.settings.file import load_settings
from chatphase.units import fmt_bytes


def register(sub) -> None:
    p = sub.add_parser(
        "cache",
        help="list or clear the prefix store (KV prefixes saved on disk)",
        description="List the saved KV prefixes (newest use first) with their totals, or clear them.",
    )
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=run, action=None)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.add_parser("clear", help="remove every saved prefix")


def _when(mtime: float) -> str:
    return local_minute(datetime.fromtimestamp(mtime, timezone.utc))


def run(args: argparse.Namespace) -> int:
    """List or clear; see the module docstring."""
    directory = store_dir()
    blocked = not_a_folder(directory)
    if blocked is not None:  # listing nothing, or removing nothing, would read as an empty store
        where = "" if blocked == directory else f" ({directory} is inside it)"
        raise ChatPhaseError(
            f"the prefix store's path {blocked} is not a folder{where}: no prefix is saved or restored until it is"
            " moved away"
        )
    if args.action == "clear":
        n, size = clear(directory)
        print(f"removed {_prefixes(n)} ({fmt_bytes(size)}) from {directory}")
        return 0
    rows = list_files(directory)
    total = sum(size for _, size, *_ in rows)
    engine = load_settings().engine
    mib = engine.prefix_cache_mib
    cap = default_cap_bytes(directory) if mib is None else mib * 2**20
    cap_words = "5% of the free disk, at most 4 GiB" if mib is None else "prefix_cache_mib"
    if args.json:
        data = {
            "directory": str(directory),
            "total_bytes": total,
            "cap_bytes": cap,
            "enabled": engine.prefix_cache != "off",
            "mode": engine.prefix_cache,
            "files": [
                {
                    "file": p.name,
                    "bytes": size,
                    "last_used": mtime,
                    "model": e.model if e else None,
                    "tokens": e.n_tokens if e else None,
                    "refused": why,
                }
                for p, size, mtime, e, why in rows
            ],
        }
        sys.stdout.write(json_inert(json.dumps(data, indent=2, ensure_ascii=False)) + "\n")
        return 0
    if not rows:
        print(f"no saved prefixes (they are kept in {directory}; the store is {_mode(engine.prefix_cache)})")
        return 0
    head = ("MODEL", "TOKENS", "SIZE", "LAST USED")
    body = [
        (inert(e.model), f"{e.n_tokens:,}", fmt_bytes(size), _when(mtime))
        if e
        else (inert(f"refused: {why}"), "?", fmt_bytes(size), _when(mtime))
        for _, size, mtime, e, why in rows
    ]
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    for r in (head, *body):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print(
        f"{_prefixes(len(rows))}, {fmt_bytes(total)} in {directory} (cap {fmt_bytes(cap)}: {cap_words}); "
        f"the store is {_mode(engine.prefix_cache)}"
    )
    return 0


def _mode(setting: str) -> str:
    """``on``, ``off``, or ``on (exact restores)`` for ``prefix_cache = exact``."""
    return "on (exact restores)" if setting == "exact" else setting


def _prefixes(n: int) -> str:
    """``1 saved prefix``, ``3 saved prefixes``."""
    return f"{n:,} saved prefix{'' if n == 1 else 'es'}"
