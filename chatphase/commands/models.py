"""``chatphase models [--json]``: every model chatphase can use — the bundled default, the models
directory, the Hugging Face cache — with architecture, parameters, quantisation, size, training context
and KV bytes per token. Files that fail validation are listed separately with the reason.
"""

from __future__ import annotations

import json

from chatphase.models.resolve import FIGURE_COLUMNS, list_models


def register(sub) -> None:
    p = sub.add_parser(
        "models",
        help="list local GGUF models (models directory, Hugging Face cache, bundled default)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--models-dir", metavar="DIR", help="directory of the user's GGUF files")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run)


def run(args) -> int:
    entries = list_models(args.models_dir)
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], indent=2))
        return 0
    header = ("", "MODEL (--model)", *FIGURE_COLUMNS, "SOURCE")
    rows = [header]
    broken = []
    for e in entries:
        if e.info is None:
            broken.append(e)
            continue
        rows.append(("*" if e.is_default else "", e.spec or f"(default) {e.info.name}", *e.figures(), e.source))
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    print("\n* default model · KV/TOK = f16 KV cache bytes per token")
    for e in broken:
        print(f"unusable: {e.error}")
    return 0
