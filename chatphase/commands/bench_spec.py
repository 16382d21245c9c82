"""``chatphase bench --spec off,lookup,auto,draft:MODEL``: decode modes side by side (:mod:`chatphase.bench.spec.arms`).

Each listed mode is an arm (plain decode, ``off``, is always one: the ratios are to it), run interleaved over
``--reps`` on the input-grounded and open-ended prompts, then the verify-step cost for k = 1…16 tokens.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from chatphase.bench.spec.arms import format_costs, format_rows, parse_arms, run_arms, summary_rows, verify_cost
from chatphase.commands.options import settings_from_args
from chatphase.engine.text import inert
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model


def run(args: argparse.Namespace) -> int:
    """Run the arms and print (or write to ``--output``) the table and the verify-cost sweep."""
    specs = parse_arms(args.spec)
    if args.server:
        raise UsageError("bench --spec runs the local engine; a server's drafting shows in its timings (chat, ask)")
    settings = settings_from_args(argparse.Namespace(**dict(vars(args), spec=None)))
    info = read_model_info(resolve_model(settings.model, settings.models_dir))
    config = replace(settings.engine, spec="off")

    def progress(text: str) -> None:
        print(f"\rchatphase: {inert(text):<60}", end="", file=sys.stderr, flush=True)

    results = run_arms(info, config, specs, reps=max(1, args.reps), progress=progress)
    progress("verify-step cost, k = 1…16")
    costs = verify_cost(info, config)
    print(file=sys.stderr)
    text = inert(
        f"{format_rows(summary_rows(results))}\n\nverify-step cost (256 tokens cached)\n{format_costs(costs)}\n"
    )
    if args.output:
        Path(args.output).expanduser().write_text(text, encoding="utf-8")
        print(f"chatphase: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
