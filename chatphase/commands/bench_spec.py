"""``chatphase bench --spec off,lookup,auto,draft:MODEL``: decode modes side by side (:mod:`chatphase.bench.spec.arms`).

Each listed mode is an arm (plain decode, ``off``, is always one: the ratios are to it), run interleaved over
``--reps`` on the input-grounded and open-ended prompts, then the verify-step cost for k = 1…16 tokens.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from chatphase.bench.spec.arms import parse_arms, run_arms, summary_rows, verify_cost
from chatphase.bench.spec.run import SpecPlan, SpecResult
from chatphase.commands.options import settings_from_args
from chatphase.engine.text import inert
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model


def measure(args: argparse.Namespace) -> SpecResult:
    """Run the arms, then the verify-cost sweep; the result for :mod:`chatphase.commands.bench` to write in
    ``--format`` (table, csv or json: checked before, as every experiment's)."""
    specs = parse_arms(args.spec)
    if args.server:
        raise UsageError("bench --spec runs the local engine; a server's drafting shows in its timings (chat, ask)")
    settings = settings_from_args(argparse.Namespace(**dict(vars(args), spec=None)))
    info = read_model_info(resolve_model(settings.model, settings.models_dir))
    config = replace(settings.engine, spec="off")

    def progress(text: str) -> None:
        print(f"\rchatphase: {inert(text):<60}", end="", file=sys.stderr, flush=True)

    reps = max(1, args.reps)
    results = run_arms(info, config, specs, reps=reps, progress=progress)
    progress("verify-step cost, k = 1…16")
    costs = verify_cost(info, config)
    print(file=sys.stderr)
    plan = SpecPlan(tuple(dict.fromkeys(["off", *specs])), reps=reps)
    return SpecResult(summary_rows(results), costs, plan.to_dict())
