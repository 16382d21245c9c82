"""``chatphase bench --gpu-layers 0,8,16,all``: the offload sweep (:mod:`chatphase.bench.offload.run`), its options
and its run; :mod:`chatphase.commands.bench` hands over to :func:`run_offload` when ``--gpu-layers`` is given."""

from __future__ import annotations

import argparse

from chatphase.errors import UsageError


def gpu_layer_list(text: str) -> tuple[int, ...]:
    """:func:`chatphase.bench.offload.run.parse_gpu_layers` for argparse."""
    from chatphase.bench.offload.run import parse_gpu_layers

    try:
        return parse_gpu_layers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_offload_options(g) -> None:
    """The sweep group's offload options."""
    g.add_argument(
        "--gpu-layers",
        type=gpu_layer_list,
        metavar="N,N,...|all",
        help="instead: the offload sweep, one load per layer count on the GPU (e.g. 0,8,16,all), prefill and "
        "decode with the roofline of each placement",
    )
    g.add_argument(
        "--device-bandwidth",
        type=float,
        metavar="GB/s",
        help="with --gpu-layers: the GPU's memory bandwidth for the roofline (not measurable from the host)",
    )


def run_offload(args, settings, info, plan, execute) -> int:
    """Run the offload sweep through the command's ``execute`` (:func:`chatphase.commands.bench.execute`:
    progress, Ctrl+C, output, plot, exit code) and write its table or JSON and its plot; each placement runs
    the sweep's run (:func:`chatphase.bench.sweep.run.placement_run`)."""
    from chatphase.bench.core.runner import SweepPlan
    from chatphase.bench.offload.run import OffloadDone, OffloadRun, write_offload_plot
    from chatphase.bench.sweep.run import placement_run

    if settings.server or args.parallel is not None:
        raise UsageError("--gpu-layers runs local loads of the model: not with --server or --parallel")
    assert isinstance(plan, SweepPlan)
    bandwidth = args.device_bandwidth * 1e9 if args.device_bandwidth else None
    sweep = OffloadRun(info, settings.engine, plan, args.gpu_layers, args.roofline, bandwidth, placement_run)
    return execute(
        args,
        sweep,
        plan.total_runs * len(args.gpu_layers),
        OffloadDone,
        text_of=lambda done: done.render(args.format),
        plot=write_offload_plot,
        cancelled=lambda done: done.cancelled,
        partial=sweep.partial,
    )
