"""``chatphase bench --spec off,lookup,auto,draft:MODEL``: decode modes side by side (:mod:`chatphase.bench.spec.arms`).

Each listed mode is an arm (plain decode, ``off``, is always one: the ratios are to it), run interleaved over
``--reps`` on the input-grounded and open-ended prompts, then the verify-step cost for k = 1…16 tokens.
:mod:`chatphase.commands.bench` hands over to :func:`run_spec` when ``--spec`` is given.
"""

from __future__ import annotations

import argparse

from chatphase.bench.core.contract import validate_plan
from chatphase.bench.spec.arms import parse_arms, with_off
from chatphase.bench.spec.run import SpecDone, SpecPlan, SpecRun
from chatphase.commands.options import settings_from_args
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model


def run_spec(args: argparse.Namespace, execute) -> int:
    """Run the arms, then the verify-cost sweep (:class:`~chatphase.bench.spec.run.SpecRun`), through the
    command's ``execute`` (:func:`chatphase.commands.bench.execute`: progress, Ctrl+C, output, exit code), and
    write the result in ``--format`` (table, csv or json: checked before, as every experiment's).

    Raises:
        UsageError: ``--server``, an unknown mode, or a verify step that does not fit the context.
    """
    specs = parse_arms(args.spec)
    if args.server:
        raise UsageError("bench --spec runs the local engine; a server's drafting shows in its timings (chat, ask)")
    settings = settings_from_args(argparse.Namespace(**dict(vars(args), spec=None)))
    info = read_model_info(resolve_model(settings.model, settings.models_dir))
    plan = validate_plan(
        SpecPlan(tuple(with_off(specs)), reps=max(1, args.reps)), settings.engine.n_ctx, settings.engine.n_batch
    )
    run = SpecRun(info, settings.engine, plan)
    return execute(
        args,
        run,
        plan.total_runs,
        SpecDone,
        partial=run.partial,
    )
