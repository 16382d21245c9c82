"""``chatphase compare``: the same conversation on two sides, side by side.

Side A is the model and engine flags given (``--model``, ``--cache-type-k``, ``--server`` …) with ``--a`` on top;
side B is A with ``--b KEY=VALUE,...`` on top, by the settings' config keys (``--b model=gemma-3-270m``,
``--b type_k=q8_0``, ``--b spec=lookup``). Each PROMPT is the next user turn (``--turns FILE`` reads them from a
file, paragraphs separated by blank lines). Both sides reply greedily, ``--gen`` tokens at most; they run one
after the other, never at once, the first alternating each turn (:mod:`chatphase.bench.compare.run`).

Output: the turns side by side and the ratios B ÷ A per turn (``--format table|md|csv|json``, ``--output FILE``,
``--plot FILE``); a saved JSON result loads back and runs again with ``chatphase bench --rerun FILE``. Progress
goes to stderr. Exit codes: 0 ok; 2 bad usage or unusable model (one line on stderr); 1 engine failure; 130
cancelled (the turns that ran are written).
"""

from __future__ import annotations

import argparse

from chatphase.bench.core.contract import FORMATS
from chatphase.bench.core.experiment import whole_number
from chatphase.commands.options import add_model_options, settings_from_args
from chatphase.commands.server_options import add_server_options, model_info_for
from chatphase.errors import UsageError


def _side(text: str):
    from chatphase.bench.compare.plan import parse_side

    try:
        return parse_side(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub) -> None:
    p = sub.add_parser(
        "compare", help="one conversation on two models or two settings, side by side",
        description=__doc__.split("\n\n")[0],
    )  # fmt: skip
    add_model_options(p)
    add_server_options(p)
    g = p.add_argument_group("the two sides")
    g.add_argument("--b", dest="side_b", type=_side, required=True, metavar="KEY=VALUE,...",
                   help="side B: side A's settings with these on top, by config keys (model=NAME, type_k=q8_0, "
                   "spec=lookup, n_gpu_layers=0, n_ctx=8192)")  # fmt: skip
    g.add_argument("--a", dest="side_a", type=_side, default={}, metavar="KEY=VALUE,...",
                   help="side A: the flags' settings with these on top")  # fmt: skip
    g.add_argument("--gen", type=whole_number, default=64, metavar="N", help="tokens per reply at most (default 64)")
    g.add_argument("--turns", metavar="FILE", help="read the user turns from FILE (paragraphs; - reads stdin)")
    out = p.add_argument_group("output")
    out.add_argument("--format", default="table", metavar="|".join(FORMATS), help="output format (default table)")
    out.add_argument("--output", "-o", metavar="FILE", help="write the output here instead of stdout")
    out.add_argument("--plot", metavar="FILE", help="draw each turn's phases and the ratios (.svg or .png)")
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="user turns, in order")
    p.set_defaults(func=run, roofline=False)


def run(args: argparse.Namespace) -> int:
    """Build the plan, then run it as ``chatphase bench`` runs an experiment (progress, Ctrl+C, outputs)."""
    from chatphase.bench.compare.plan import ComparePlan, read_turns
    from chatphase.bench.compare.result import write_compare_plot
    from chatphase.bench.core.contract import Done
    from chatphase.bench.experiments import EXPERIMENTS, check_outputs
    from chatphase.commands.bench import execute

    if args.turns and args.prompts:
        raise UsageError("give the turns as PROMPTs or with --turns FILE, not both")
    try:
        turns = read_turns(args.turns) if args.turns else tuple(args.prompts)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    experiment = EXPERIMENTS["compare"]
    check_outputs(experiment.kind, args.format, args.plot, args.output)
    settings = settings_from_args(args)
    plan = ComparePlan(turns=turns, b=args.side_b, a=args.side_a, gen_tokens=args.gen).validate(None)
    info = model_info_for(settings)
    run_ = experiment.make_run(info, settings.engine, plan, False, None, settings=settings)
    run_.side_settings()  # two equal sides: one line before anything loads
    return execute(
        args,
        run_,
        plan.total_runs,
        Done,
        text_of=lambda done: done.result.render(args.format),
        plot=lambda done, path: write_compare_plot([done.result], path),
        partial=run_.partial_done,
        prog="chatphase compare",
    )
