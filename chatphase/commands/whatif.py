"""``chatphase whatif MODEL --device NAME``: how fast MODEL would be on another machine — TTFT at prompt
lengths and decode tok/s at depths, from the device's spec-sheet peaks scaled by the efficiency this
machine reached against its own measured peaks (:mod:`chatphase.bench.whatif`). Upper bounds with their
assumptions, never measurements; this machine is in the table with predicted beside measured.

This machine is measured first (a short bench: peaks, one prompt, depth 0 and ``--check-depth``), unless
``--from`` gives a saved ``chatphase bench`` JSON result with a roofline.
"""

from __future__ import annotations

import argparse
import json
import sys

from chatphase.commands.bench import count_list
from chatphase.commands.options import add_model_options, settings_from_args
from chatphase.engine.text import inert
from chatphase.errors import UsageError
from chatphase.units import fmt_bytes, fmt_params

DEFAULT_PROMPT_LENGTHS = (512, 2048, 8192)
DEFAULT_DEPTHS = (0, 4096, 16384)


def register(sub) -> None:
    from chatphase.bench.whatif import DEVICES

    p = sub.add_parser(
        "whatif",
        help="predict TTFT and decode speed of a model on another machine (upper bounds from the roofline)",
        description=__doc__.split("\n\n")[0],
    )
    # not dest "spec": settings_from_args reads every setting's key from args, and --spec's is "spec"
    p.add_argument("model_arg", nargs="?", metavar="MODEL", help="the model (as --model; default: the bundled one)")
    p.add_argument(
        "--device",
        default="all",
        metavar="NAME[,NAME]",
        help=f"devices to predict for, or all (default): {', '.join(d.key for d in DEVICES)}",
    )
    p.add_argument(
        "--prompt-lengths", type=count_list, metavar="N,N,...", help="prompt lengths for TTFT (default 512,2048,8192)"
    )
    p.add_argument(
        "--depths", type=count_list, metavar="N,N,...", help="context depths for decode (default 0,4096,16384)"
    )
    p.add_argument(
        "--check-depth",
        type=int,
        default=1024,
        metavar="D",
        help="depth measured here to check the prediction (default 1024)",
    )
    p.add_argument(
        "--from", dest="from_file", metavar="RESULT.json", help="take this machine's figures from a saved bench result"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    add_model_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chatphase.bench.whatif import DEVICES, Device, assumptions, device_rows, efficiency_from, find_device

    devices = (
        list(DEVICES) if args.device.strip().lower() == "all" else [find_device(n) for n in args.device.split(",")]
    )
    lengths = args.prompt_lengths or DEFAULT_PROMPT_LENGTHS
    depths = args.depths or DEFAULT_DEPTHS
    if args.check_depth < 1:
        raise UsageError("--check-depth must be at least 1")
    synthetic = False
    if args.from_file:
        from chatphase.bench.core.results import SweepResult
        from chatphase.bench.experiments import load_result

        result = load_result(args.from_file)
        if not isinstance(result, SweepResult):
            raise UsageError(
                f"--from-file needs a prompt-length sweep's result (chatphase bench); this is a {result.kind} result"
            )
        synthetic = bool(result.model.get("synthetic"))
    else:
        if args.model_arg:
            args.model = args.model_arg
        result, synthetic = _measure_here(args)
    eff, model, measured = efficiency_from(result)
    here = Device("this-machine", f"this machine ({result.system.get('cpu', '?')})", eff.bandwidth_bytes_per_s,
                  eff.flops_per_s, "measured peaks (chatphase.bench.core.peaks)", "measured here")  # fmt: skip
    rows = device_rows([*devices, here], eff, model, lengths, depths)
    from chatphase.bench.whatif import predict_decode, predict_ttft_ms

    checks = [
        {
            "what": f"decode at depth {d}",
            "predicted": predict_decode(here.bandwidth_bytes_per_s, eff.decode, model, ctx, here.flops_per_s),
            "measured": tps,
            "calibration": d == eff.decode_depth,
        }
        for d, (tps, ctx) in measured["decode"].items()
    ] + [
        {
            "what": f"TTFT at {n} prompt tokens (ms)",
            "predicted": predict_ttft_ms(here.flops_per_s, eff.prefill, model, n, eff.prefill_bound),
            "measured": ms,
            "calibration": n == eff.prefill_tokens,
        }
        for n, ms in measured["ttft_ms"].items()
    ]
    notes = assumptions(eff, model)
    if args.json:
        out = {"model": model.__dict__, "synthetic": synthetic, "efficiency": eff.__dict__, "devices": rows,
               "this_machine": checks, "assumptions": notes}  # fmt: skip
        print(json.dumps(out, indent=2))
        return 0
    label = " (synthetic: timings only)" if synthetic else ""
    print(
        inert(
            f"what-if: {model.name}{label} — {fmt_bytes(model.weight_bytes)} of weights read per token, "
            f"{fmt_params(model.n_params)} parameters, {fmt_bytes(model.kv_bytes_per_token)} of KV cache per token"
        )
    )
    headers = ["device", "GB/s", "TFLOP/s", *(f"TTFT {n}" for n in lengths), *(f"decode @{d}" for d in depths)]
    table = [headers]
    for r in rows:
        table.append(
            [r["name"], f"{r['bandwidth_bytes_per_s'] / 1e9:,.0f}", f"{r['flops_per_s'] / 1e12:,.2f}"]
            + [_ms(r["ttft_ms"][n]) for n in lengths]
            + [f"{r['decode_tokens_per_s'][d]:,.1f}" for d in depths]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    for row in table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    print("\nthis machine, predicted vs measured:")
    above = {"decode": eff.decode_above_bound, "TTFT": eff.prefill_above_bound}
    for c in checks:
        how = f"measured / predicted {c['measured'] / c['predicted']:.2f}"
        if c["calibration"]:
            clamped = above[c["what"].split()[0]]
            how = (
                "calibration: measured above its bound, efficiency clamped to 100%"
                if clamped
                else ("calibration (equal by construction)")
            )
        print(f"  {c['what']}: predicted {c['predicted']:,.1f}, measured {c['measured']:,.1f} — {how}")
    print("\nassumptions:")
    for line in notes:
        print(f"  - {line}")
    print("\nsources (theoretical peaks):")
    for d in devices:
        print(f"  {d.name}: {d.flops_what}; {d.source}")
    return 0


def _ms(ms: float) -> str:
    """A predicted TTFT: seconds from 1 s, whole ms from 10 ms, two significant digits below, ``< 0.01 ms``
    below that (never a rounded "0 ms")."""
    if ms >= 1000:
        return f"{ms / 1000:,.1f} s"
    if ms >= 10:
        return f"{ms:,.0f} ms"
    return f"{ms:.2g} ms" if ms >= 0.01 else "< 0.01 ms"


def _measure_here(args: argparse.Namespace):
    """A short bench of the model on this machine (peaks, a 256-token prompt, depth 0 and ``--check-depth``;
    one warm-up and one counted run each) with progress lines on stderr; returns ``(SweepResult, synthetic)``."""
    from chatphase.bench.core.events import BenchStatus, RunDone
    from chatphase.bench.sweep.loop import SweepPlan, SweepProgress
    from chatphase.bench.sweep.run import SweepRun
    from chatphase.models.gguf_meta import read_model_info
    from chatphase.models.resolve import resolve_model

    settings = settings_from_args(args)
    info = read_model_info(resolve_model(settings.model, settings.models_dir))
    plan = SweepPlan(prompt_lengths=(256,), depths=(0, args.check_depth), gen_tokens=16, reps=1, warmup=1)
    plan.validate(settings.engine.n_ctx_before_load)
    result = None
    for event in SweepRun(info, settings.engine, plan):
        if isinstance(event, BenchStatus):
            print(f"chatphase whatif: {event.text}", file=sys.stderr, flush=True)
        elif isinstance(event, SweepProgress) and not event.sample.warmup:
            print(f"chatphase whatif: measured {event.done_runs}/{event.total_runs}", file=sys.stderr, flush=True)
        elif isinstance(event, RunDone):
            result = event.result
    assert result is not None
    return result, info.synthetic
