"""``chatphase bench --gpu-layers 0,8,16,all``: the offload sweep (:mod:`chatphase.bench.offload`), its options
and its run; :mod:`chatphase.commands.bench` hands over to :func:`run_offload` when ``--gpu-layers`` is given."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from chatphase.errors import UsageError


def gpu_layer_list(text: str) -> tuple[int, ...]:
    """:func:`chatphase.bench.offload.parse_gpu_layers` for argparse."""
    from chatphase.bench.offload import parse_gpu_layers

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


def run_offload(args, settings, info, plan, progress_cls, cancels) -> int:
    """Run the offload sweep with the command's progress bar (``progress_cls``) and Ctrl+C handling
    (``cancels``), write the table or JSON and the plot. Exit codes as ``bench``."""
    from chatphase.bench.api import BenchNotice, BenchStatus
    from chatphase.bench.offload import OffloadDone, OffloadRun, offload_json, render_offload, write_offload_plot
    from chatphase.bench.runner import SweepPlan, SweepProgress

    if settings.server or args.parallel is not None:
        raise UsageError("--gpu-layers runs local loads of the model: not with --server or --parallel")
    if args.format not in ("table", "json"):
        raise UsageError("--gpu-layers writes --format table or json")
    assert isinstance(plan, SweepPlan)
    bandwidth = args.device_bandwidth * 1e9 if args.device_bandwidth else None
    sweep = OffloadRun(info, settings.engine_config(), plan, args.gpu_layers, args.roofline, bandwidth)
    done = None
    with progress_cls(plan.total_runs * len(args.gpu_layers)) as progress, cancels(sweep, progress):
        for event in sweep:
            if isinstance(event, BenchStatus):
                progress.status(event.text)
            elif isinstance(event, BenchNotice):
                progress.notice(event.text)
            elif isinstance(event, SweepProgress):
                progress.advance(event)
            elif isinstance(event, OffloadDone):
                done = event
    assert done is not None
    text = json.dumps(offload_json(done), indent=2) + "\n" if args.format == "json" else render_offload(done)
    if args.output:
        Path(args.output).expanduser().write_text(text, encoding="utf-8")
        print(f"chatphase: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if args.plot:
        write_offload_plot(done, Path(args.plot).expanduser())
        print(f"chatphase: wrote {args.plot}", file=sys.stderr)
    if done.cancelled:
        print("chatphase: cancelled; the results above are partial", file=sys.stderr)
        return 130
    return 0
