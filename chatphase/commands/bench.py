"""``chatphase bench``: how TTFT grows with the prompt and decode speed with context depth, on this machine.

For each prompt length a prompt of exactly that many tokens (cut on token boundaries), the KV cache
cleared before each repetition, warm-up runs not counted; for each depth, decode speed with that many
tokens already cached. Prints mean ± sample sd, median, min and max per cell, a least-squares fit of
TTFT against prompt length, and the roofline (measured memory bandwidth and matmul FLOP/s).
``--spec off,lookup,auto,draft:MODEL`` compares decode modes instead (:mod:`chatphase.commands.bench_spec`).
``--interference N`` runs N streams while a new prompt arrives (:mod:`chatphase.commands.bench_interference`).
``--server URL --rates R,R`` loads a served model at rising request rates (:mod:`chatphase.commands.bench_rates`).
``--parallel N,N,...`` runs the parallel-decode sweep instead: N sequences prefilled and decoded together
in one context (over ``--server``: N concurrent streams), with the step's roofline per N.
A comma list in ``--model``, ``--cache-type-k/-v``, ``--flash-attn``, ``--n-ubatch`` or ``--threads`` runs a
lever grid instead (:mod:`chatphase.commands.bench_grid`): every combination, interleaved, beside the roofline.
Exit codes: 0 ok; 130 cancelled by Ctrl+C (the first lets the current run end, the second stops at once;
either way the results so far are written); 2 bad usage or unusable model; 1 engine failure.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from chatphase.bench.core.contract import FORMATS, validate_plan
from chatphase.bench.core.plot import write_plot
from chatphase.bench.core.report import render, sample_progress
from chatphase.bench.core.runner import (
    DEFAULT_DEPTHS,
    DEFAULT_PROMPT_LENGTHS,
    SweepPlan,
    SweepProgress,
)
from chatphase.bench.experiments import check_outputs
from chatphase.bench.parallel.sweep import DEFAULT_PARALLEL_PROMPT_LENGTHS, ParallelPlan
from chatphase.commands.bench_interference import add_interference_options
from chatphase.commands.bench_offload import add_offload_options, run_offload
from chatphase.commands.bench_rates import add_rate_options
from chatphase.commands.options import add_model_options, settings_from_args
from chatphase.commands.server_options import add_server_options, remote_bench_options, validate_bench_plan
from chatphase.engine.text import inert
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model
from chatphase.units import parse_counts


def count_list(text: str) -> tuple[int, ...]:
    """:func:`chatphase.units.parse_counts` for argparse.

    Raises:
        argparse.ArgumentTypeError: for anything that is not comma-separated whole numbers.
    """
    try:
        return parse_counts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="measure TTFT vs prompt length and decode speed vs context depth",
        description=__doc__.split("\n\n")[0],
    )
    add_model_options(p, lists=True)
    add_server_options(p)
    g = p.add_argument_group("sweep")
    g.add_argument(
        "--prompt-lengths",
        type=count_list,
        metavar="N,N,...",
        help=f"prompt lengths in tokens (default {','.join(map(str, DEFAULT_PROMPT_LENGTHS))}, with --parallel "
        f"{','.join(map(str, DEFAULT_PARALLEL_PROMPT_LENGTHS))}; 'none' to skip)",
    )
    g.add_argument(
        "--depths",
        type=count_list,
        metavar="N,N,...",
        help=f"KV cache depths in tokens for decode speed (default {','.join(map(str, DEFAULT_DEPTHS))}; 'none' to skip)",
    )
    g.add_argument(
        "--parallel",
        type=count_list,
        metavar="N,N,...",
        help="instead: decode N sequences together for each N, e.g. 1,2,4,8,16 (each its own prompt of "
        "--prompt-lengths tokens; over --server N concurrent streams)",
    )
    g.add_argument(
        "--gen",
        type=int,
        default=32,
        metavar="N",
        help="tokens decoded per run; with --parallel decode steps (default 32)",
    )
    g.add_argument("--reps", type=int, default=3, metavar="R", help="counted repetitions per cell (default 3)")
    g.add_argument("--warmup", type=int, default=1, metavar="W", help="uncounted warm-up runs per cell (default 1)")
    add_offload_options(g)
    add_interference_options(g, count_list)
    add_rate_options(g)
    g.add_argument("--no-roofline", dest="roofline", action="store_false", help="skip the bandwidth/FLOP/s measurement")
    out = p.add_argument_group("output")
    out.add_argument("--format", default="table", metavar="|".join(FORMATS), help="output format (default table)")
    out.add_argument("--output", "-o", metavar="FILE", help="write the output here instead of stdout")
    out.add_argument(
        "--plot", metavar="FILE", help="draw TTFT and decode-vs-depth plots (.svg or .png; needs chatphase[plot])"
    )
    p.set_defaults(func=run)


def experiment_kind(args: argparse.Namespace, grid=None) -> str:
    """Which experiment the flags ask for (a kind of :data:`~chatphase.bench.experiments.EXPERIMENTS`)."""
    if args.spec:
        return "spec"
    if args.interference is not None:
        return "interference"
    if args.rates is not None:
        return "rates"
    if grid is not None and grid.is_sweep:
        return "grid"
    if args.gpu_layers is not None:
        return "offload"
    return "parallel" if args.parallel is not None else "sweep"


def run(args: argparse.Namespace) -> int:
    """Validate everything (the output flags the same way for every experiment: :func:`check_outputs`), run the
    experiment with a progress bar on stderr, write the outputs."""
    check_experiment_flags(args)
    from chatphase.commands.bench_grid import run_grid, split_levers

    # comma lists in --model, --cache-type-k/-v, --flash-attn, --n-ubatch, --threads; single values are written back
    # as the settings read them, for every experiment (a --threads of "1" left a string broke --spec)
    grid = split_levers(args)
    if grid.is_sweep and (args.spec or args.interference is not None or args.rates is not None):
        raise UsageError("a comma list in a lever (a lever grid) does not apply to --spec, --interference or --rates")
    if args.spec:  # decode modes side by side (chatphase.commands.bench_spec)
        from chatphase.commands.bench_spec import run_spec

        check_outputs("spec", args.format, args.plot, args.output)
        return run_spec(args, execute)
    if args.interference is not None:  # prefill meets decode (chatphase.commands.bench_interference)
        from chatphase.commands.bench_interference import run_interference

        check_outputs("interference", args.format, args.plot, args.output)
        return run_interference(args, execute)
    if args.rates is not None:  # a served model under rising load (chatphase.commands.bench_rates)
        from chatphase.commands.bench_rates import run_rates

        check_outputs("rates", args.format, args.plot, args.output)
        return run_rates(args, execute)
    check_outputs(experiment_kind(args, grid), args.format, args.plot, args.output)
    settings = settings_from_args(args)
    plan = _plan(args, settings)
    if grid.is_sweep:
        return run_grid(args, grid, settings, plan, execute)
    info = read_model_info(resolve_model(settings.model, settings.models_dir))
    if args.gpu_layers is not None:  # the offload sweep (chatphase.commands.bench_offload)
        return run_offload(args, settings, info, plan, execute)

    from chatphase.bench.core.events import BenchDone
    from chatphase.bench.core.run import ModelRun
    from chatphase.bench.parallel.plot import write_parallel_plot
    from chatphase.bench.parallel.run import ParallelRun
    from chatphase.bench.sweep.run import BenchRun

    # --server: the sweep runs on the server; --model names its GGUF (the vocabulary); this machine's peaks
    # do not bound a remote server, so no roofline
    kind: type[ModelRun] = ParallelRun if isinstance(plan, ParallelPlan) else BenchRun
    bench = kind(
        info,
        settings.engine,
        plan,
        roofline=args.roofline and not settings.server,
        **remote_bench_options(settings, info),
    )
    return execute(
        args,
        bench,
        plan.total_runs,
        BenchDone,
        text_of=lambda done: render(done.result, args.format),
        plot=lambda done, path: (write_parallel_plot if kind is ParallelRun else write_plot)([done.result], path),
        cancelled=lambda done: done.result.cancelled,
        partial=lambda: BenchDone(result) if (result := bench.partial()) is not None else None,
    )


def check_experiment_flags(args: argparse.Namespace) -> None:
    """Refuse an experiment's flag given without the flag that picks it (``--chunks`` without ``--interference``,
    ``--slo`` without ``--rates``…): it would be ignored silently.

    Raises:
        UsageError: one line naming both flags.
    """
    from chatphase.commands.bench_rates import rate_flags_given

    if args.chunks is not None and args.interference is None:
        raise UsageError("--chunks applies to --interference N (the prompt tokens of a mixed step)")
    if args.rates is None and (given := rate_flags_given(args)):
        raise UsageError(f"{given[0]} applies to --rates (with --server URL)")


#: seconds without a finished run after which a progress line says the run is still going.
HEARTBEAT_S = 30.0


def execute(
    args,
    run,
    total_runs: int,
    done_type: type,
    text_of=None,
    plot=None,
    cancelled=None,
    partial=None,
    heartbeat_s=HEARTBEAT_S,
) -> int:
    """Run ``run`` (an iterable of bench events ending with a ``done_type`` event) with a progress bar on
    stderr and Ctrl+C cancelling it, then write ``text_of(done)`` (to ``--output`` or stdout) and
    ``plot(done, path)`` for ``--plot``; exit 130 when ``cancelled(done)``, else 0. By default the text is
    ``done.result.render(args.format)`` and ``cancelled`` is ``done.result.cancelled``; ``plot`` may be ``None``
    where ``check_outputs`` refused ``--plot``.

    The run goes on in a worker thread, so that Ctrl+C is seen at once even while llama.cpp evaluates a
    batch (a signal reaches Python only between two C calls of the main thread: on a software GPU one batch
    took minutes). The first Ctrl+C cancels (the current turn ends at its next batch); a second stops
    waiting and writes ``partial()`` (``run``'s results so far, a ``done_type``; ``None``: nothing ran yet).
    Without ``partial`` a second Ctrl+C interrupts as before. Every ``heartbeat_s`` without a finished run, a
    line says what is still running."""
    with _Progress(total_runs) as progress:
        done = _run_in_thread(run, progress, done_type, partial, heartbeat_s)
    if done is None:
        print("chatphase: stopped before any run finished: no results", file=sys.stderr)
        return 130
    write_output(text_of(done) if text_of else done.result.render(args.format), args.output)
    if args.plot and plot:
        plot(done, Path(args.plot).expanduser())
        print(f"chatphase: wrote {args.plot}", file=sys.stderr)
    if cancelled(done) if cancelled else done.result.cancelled:
        print("chatphase: cancelled; the results above are partial", file=sys.stderr)
        return 130
    return 0


def write_output(text: str, output: str | None) -> None:
    """``text`` to the ``--output`` file (saying so on stderr), else to stdout; inert (model names and paths are
    the files' text)."""
    text = inert(text)
    if output:
        Path(output).expanduser().write_text(text, encoding="utf-8")
        print(f"chatphase: wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def _plan(args: argparse.Namespace, settings) -> SweepPlan | ParallelPlan:
    """The sweep the arguments ask for, validated before any work (a server's context is checked later).

    Raises:
        UsageError: a plan that does not fit, or ``--depths`` with ``--parallel``.
    """
    if args.parallel is None:
        sweep = SweepPlan(
            prompt_lengths=DEFAULT_PROMPT_LENGTHS if args.prompt_lengths is None else args.prompt_lengths,
            depths=DEFAULT_DEPTHS if args.depths is None else args.depths,
            gen_tokens=args.gen,
            reps=args.reps,
            warmup=args.warmup,
        )
        return validate_plan(sweep, settings.engine.n_ctx)
    if args.depths is not None:
        raise UsageError("--depths does not apply to --parallel: each sequence decodes from its own prompt")
    parallel = ParallelPlan(
        n_seqs=args.parallel,
        prompt_lengths=DEFAULT_PARALLEL_PROMPT_LENGTHS if args.prompt_lengths is None else args.prompt_lengths,
        gen_tokens=args.gen,
        reps=args.reps,
        warmup=args.warmup,
    )
    return validate_bench_plan(parallel, settings)


def follow(events, progress: _Progress, done_type: type):
    """Show a run's status, notices and progress on ``progress``; returns its final ``done_type`` event."""
    from chatphase.bench.core.events import BenchNotice, BenchStatus
    from chatphase.bench.interference.run import InterferenceProgress
    from chatphase.bench.load.run import RateProgress
    from chatphase.bench.spec.run import SpecProgress

    done = None
    for event in events:
        if isinstance(event, BenchStatus):
            progress.status(event.text)
        elif isinstance(event, BenchNotice):
            progress.notice(event.text)
        elif isinstance(event, SweepProgress):
            label, figures = sample_progress(event.sample)
            progress.advance(event.done_runs, event.total_runs, label, figures, counted=not event.sample.warmup)
        elif isinstance(event, SpecProgress):
            progress.advance(event.done_runs, event.total_runs, *event.line())
        elif isinstance(event, RateProgress):
            progress.advance(event.done_runs, event.total_runs, *event.line())
        elif isinstance(event, InterferenceProgress):
            progress.advance(event.done_runs, event.total_runs, *event.line(), counted=not event.sample.warmup)
        elif isinstance(event, done_type):
            done = event
    assert done is not None
    return done


def _run_in_thread(run, progress: _Progress, done_type: type, partial, heartbeat_s: float):
    """:func:`follow` ``run`` in a worker thread while the main thread handles Ctrl+C (see :func:`execute`);
    the ``done_type`` event, or ``partial()`` after a second Ctrl+C. Re-raises the worker's exception."""
    if threading.current_thread() is not threading.main_thread():
        return follow(run, progress, done_type)
    box: dict = {}

    def work() -> None:
        try:
            box["done"] = follow(run, progress, done_type)
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc

    stop_now = threading.Event()
    presses = 0

    def on_sigint(signum, frame) -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            progress.status("cancelling after the current batch — Ctrl+C again to stop now with the results so far")
            run.cancel()
        elif partial is None:
            raise KeyboardInterrupt
        else:
            stop_now.set()

    worker = threading.Thread(target=work, name="chatphase-bench", daemon=True)
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, on_sigint)
    try:
        worker.start()
        while worker.is_alive() and not stop_now.is_set():
            worker.join(0.2)
            progress.heartbeat(heartbeat_s)
    finally:
        signal.signal(signal.SIGINT, previous)
    if stop_now.is_set() and worker.is_alive():
        return partial()
    if "error" in box:
        raise box["error"]
    return box["done"]


class _Progress:
    """A rich progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        console = Console(stderr=True)
        self._plain = not console.is_terminal
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=self._plain,
        )
        self._task = self._bar.add_task("starting", total=total)
        self._description = "starting"
        self._last_event = self._last_line = time.monotonic()

    def __enter__(self) -> _Progress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def heartbeat(self, every_s: float) -> None:
        """A line saying what still runs, when nothing was shown for ``every_s`` seconds (a run on a slow
        device: one turn may take minutes)."""
        now = time.monotonic()
        if now - self._last_line < every_s:
            return
        self._last_line = now
        self.notice_plain(f"still running: {self._description} ({now - self._last_event:.0f} s since the last line)")

    def notice_plain(self, text: str) -> None:
        """A progress line on stderr, kept above the bar."""
        self._bar.console.print(inert(f"chatphase bench: {text}"), markup=False, highlight=False, soft_wrap=True)

    def status(self, text: str) -> None:
        self._description = text
        self._last_event = self._last_line = time.monotonic()
        self._bar.update(self._task, description=text)
        if self._plain:
            print(inert(f"chatphase bench: {text}"), file=sys.stderr, flush=True)

    def notice(self, text: str) -> None:
        """A line the user must see (printed above the bar, and kept)."""
        self._bar.console.print(inert(f"chatphase: warning: {text}"), markup=False, highlight=False, soft_wrap=True)

    def advance(self, done_runs: int, total_runs: int, label: str, figures: str, counted: bool = True) -> None:
        """The ``done_runs``-th run of ``total_runs`` ended: ``label`` (what ran) and ``figures`` (what it
        measured) on the bar, and as a line when plain and ``counted`` (not a warm-up)."""
        label = inert(label)  # it may name a model
        self._description = label
        self._last_event = self._last_line = time.monotonic()
        self._bar.update(self._task, completed=done_runs, total=total_runs, description=label)
        if self._plain and counted:
            print(f"chatphase bench: [{done_runs}/{total_runs}] {label}: {figures}", file=sys.stderr, flush=True)
