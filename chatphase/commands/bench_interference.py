"""``chatphase bench --interference N``: N streams decode while a new prompt arrives (:mod:`chatphase.bench.interference`).

The newcomer's prompt is ``--prompt-lengths P`` tokens (one length); it runs whole first, then chunked-mixed with each
``--chunks`` size; ``--gen`` decode steps before it arrives and after its first token. :mod:`chatphase.commands.bench`
hands over to :func:`run_interference` when ``--interference`` is given. Over ``--server`` the N streams and the
newcomer are requests to the server, batched by its own policy (:mod:`chatphase.bench.interference.remote`).
"""

from __future__ import annotations

import argparse

from chatphase.bench.interference.plan import DEFAULT_CHUNKS, DEFAULT_NEWCOMER_TOKENS, InterferencePlan
from chatphase.commands.options import refuse_flags, settings_from_args
from chatphase.commands.server_options import remote_bench_options, validate_bench_plan
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model


def add_interference_options(g, count_list) -> None:
    """The sweep group's interference options (``count_list``: the command's list parser)."""
    g.add_argument(
        "--interference",
        type=int,
        metavar="N",
        help="instead: N streams decode in one context while a new prompt (--prompt-lengths P, default "
        f"{DEFAULT_NEWCOMER_TOKENS}) arrives, run whole first and chunked with each of --chunks",
    )
    g.add_argument(
        "--chunks",
        type=count_list,
        metavar="C,C,...",
        help=f"with --interference: prompt tokens per mixed step (default {','.join(map(str, DEFAULT_CHUNKS))})",
    )


def interference_plan(args: argparse.Namespace, settings) -> InterferencePlan:
    """The plan the flags ask for, validated against ``--n-ctx`` and ``--n-batch`` before any work.

    Raises:
        UsageError: a flag that does not apply, or a plan that does not fit (one line).
    """
    if settings.server and args.chunks is not None:
        raise UsageError("--chunks does not apply over --server: the server's own batching (its -b) sets the chunk")
    refuse_flags(
        (
            ("--parallel", args.parallel is not None),
            ("--depths", args.depths is not None),
            ("--gpu-layers", args.gpu_layers is not None),
        ),
        "does not apply to --interference (the local engine, one context)",
    )
    lengths = args.prompt_lengths
    if lengths is not None and len(lengths) != 1:
        raise UsageError("--interference takes one --prompt-lengths value: the newcomer's prompt tokens")
    plan = InterferencePlan(
        n_running=args.interference,
        newcomer_tokens=lengths[0] if lengths else DEFAULT_NEWCOMER_TOKENS,
        chunks=DEFAULT_CHUNKS if args.chunks is None else args.chunks,
        gen_tokens=args.gen,
        reps=args.reps,
        warmup=args.warmup,
    )
    return validate_bench_plan(plan, settings)


def run_interference(args: argparse.Namespace, execute) -> int:
    """Run the experiment through the command's ``execute`` (:func:`chatphase.commands.bench.execute`: progress,
    Ctrl+C, output, plot, exit code).

    Raises:
        UsageError: as :func:`interference_plan`, or a model that cannot be used.
    """
    from chatphase.bench.core.events import BenchDone
    from chatphase.bench.interference.plot import write_interference_plot
    from chatphase.bench.interference.run import InterferenceRun

    settings = settings_from_args(args)
    plan = interference_plan(args, settings)
    info = read_model_info(resolve_model(settings.model, settings.models_dir))
    # --server: the streams run on the server; --model names its GGUF (the vocabulary); no roofline (this machine's
    # peaks do not bound a server)
    run = InterferenceRun(
        info, settings.engine, plan, roofline=args.roofline and not settings.server,
        **remote_bench_options(settings, info),
    )  # fmt: skip
    return execute(
        args,
        run,
        plan.total_runs,
        BenchDone,
        plot=lambda done, path: write_interference_plot([done.result], path),
        partial=run.partial_done,
    )
