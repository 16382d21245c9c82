"""``chatphase bench --server URL --rates R,R``: a served model under rising load (:mod:`chatphase.bench.load`).

Per rate, open-loop arrivals (``--burstiness``: Gamma-distributed gaps, 1 = Poisson) of token-id prompts of
``--prompt-lengths`` tokens, ``--gen`` tokens each, at most ``--requests`` requests or ``--duration`` seconds; TTFT,
ITL and TPOT p50/p90/p99, throughput and goodput under ``--slo ttft=MS,tpot=MS``. :mod:`chatphase.commands.bench`
hands over to :func:`run_rates` when ``--rates`` is given.
"""

from __future__ import annotations

import argparse

from chatphase.bench.load.accounting import Slo
from chatphase.bench.load.run import RatePlan
from chatphase.commands.options import refuse_flags, settings_from_args
from chatphase.commands.server_options import remote_bench_options
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model


def rate_list(text: str) -> tuple[float, ...]:
    """``0.5,1,2,4`` -> rates.

    Raises:
        argparse.ArgumentTypeError: anything but comma-separated numbers.
    """
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated requests/s like 0.5,1,2,4 (got {text!r})") from None


def parse_slo(text: str) -> Slo:
    """``ttft=500,tpot=50`` (ms) -> :class:`Slo`.

    Raises:
        argparse.ArgumentTypeError: an unknown key or a value that is not a positive number.
    """
    values: dict[str, float] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key = key.strip().lower()
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if key not in ("ttft", "tpot") or number <= 0:
            raise argparse.ArgumentTypeError(f"expected ttft=MS,tpot=MS with positive milliseconds (got {text!r})")
        values[key] = number
    return Slo(ttft_ms=values.get("ttft"), tpot_ms=values.get("tpot"))


def add_rate_options(g) -> None:
    """The sweep group's rate-sweep options."""
    g.add_argument("--rates", type=rate_list, metavar="R,R,...",
                   help="instead, over --server: open-loop arrivals at each rate (requests/s), e.g. 0.5,1,2,4")  # fmt: skip
    g.add_argument("--burstiness", type=float, default=1.0, metavar="B",
                   help="with --rates: Gamma shape of the gaps between requests (1 = Poisson, default)")  # fmt: skip
    g.add_argument("--slo", type=parse_slo, metavar="ttft=MS,tpot=MS", help="with --rates: the SLO goodput counts")
    g.add_argument("--requests", type=int, default=16, metavar="N", help="with --rates: requests per rate (default 16)")
    g.add_argument("--duration", type=float, default=60.0, metavar="S",
                   help="with --rates: seconds of arrivals per rate at most (default 60)")  # fmt: skip
    g.add_argument("--max-concurrency", type=int, metavar="N",
                   help="with --rates: requests in flight at most (default twice the server's slots)")  # fmt: skip


#: the rate sweep's own flags, their argparse names and defaults.
_RATE_FLAGS = (("--burstiness", "burstiness", 1.0), ("--slo", "slo", None), ("--requests", "requests", 16),
               ("--duration", "duration", 60.0), ("--max-concurrency", "max_concurrency", None))  # fmt: skip


def rate_flags_given(args: argparse.Namespace) -> list[str]:
    """The rate sweep's flags given a value other than their default."""
    return [flag for flag, name, default in _RATE_FLAGS if getattr(args, name, default) != default]


def rate_plan(args: argparse.Namespace, settings) -> RatePlan:
    """The plan the flags ask for, checked before any work.

    Raises:
        UsageError: no ``--server``, a flag that does not apply, or a value out of range (one line).
    """
    if not settings.server:
        raise UsageError("--rates measures a served model: give --server URL (and --model naming its GGUF)")
    refuse_flags(
        (
            ("--parallel", args.parallel is not None),
            ("--depths", args.depths is not None),
            ("--interference", args.interference is not None),
            ("--gpu-layers", args.gpu_layers is not None),
        ),
        "does not apply to --rates",
    )
    plan = RatePlan(
        rates=args.rates,
        prompt_lengths=args.prompt_lengths or (128,),
        gen_tokens=args.gen,
        requests=args.requests,
        duration_s=args.duration,
        burstiness=args.burstiness,
        slo=args.slo or Slo(),
        max_concurrency=args.max_concurrency,
    )
    return plan.validate(None)


def run_rates(args: argparse.Namespace, execute) -> int:
    """Run the sweep through the command's ``execute`` (progress, Ctrl+C keeping what was measured, output).

    Raises:
        UsageError: as :func:`rate_plan`, or a model that cannot be used.
    """
    from chatphase.bench.core.events import BenchDone
    from chatphase.bench.load.run import RateRun

    settings = settings_from_args(args)
    plan = rate_plan(args, settings)
    info = read_model_info(resolve_model(settings.model, settings.models_dir))
    run = RateRun(info, settings.engine, plan, roofline=False, **remote_bench_options(settings, info))
    return execute(
        args,
        run,
        plan.total_runs,
        BenchDone,
        partial=run.partial_done,
    )
