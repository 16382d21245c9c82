"""``chatphase bench``: run any registered experiment (:mod:`chatphase.bench.experiments`) on this machine or a server.

The flags are made from the experiments' plans (each field's flag, help and default,
:mod:`chatphase.bench.core.experiment`); the flag that picks an experiment (``--parallel``, ``--spec``, ``--gpu-layers``,
``--interference``, ``--rates``; comma lists in ``--model``, ``--cache-type-k/-v``, ``--flash-attn``, ``--n-ubatch`` or
``--threads``: the lever grid) chooses it, else the prompt-length and depth sweep runs: TTFT against prompt length and
decode speed against context depth, with the roofline (measured memory bandwidth and matmul FLOP/s). A flag the chosen
experiment does not take is refused (it would be ignored silently). ``--rerun FILE`` runs a saved result's plan again
and sets the two side by side (old, new and new/old per row and figure).
Exit codes: 0 ok; 130 cancelled by Ctrl+C (the first lets the current run end, the second stops at once;
either way the results so far are written); 2 bad usage or unusable model; 1 engine failure.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

from chatphase.bench.core.contract import FORMATS, Done, Progress, check_format
from chatphase.bench.core.experiment import LEVERS, Experiment, PlanField, compare_rows, show
from chatphase.bench.experiments import EXPERIMENTS, check_outputs
from chatphase.commands.options import add_model_options, count_or_auto, settings_from_args
from chatphase.commands.server_options import add_server_options, remote_bench_options, validate_bench_plan
from chatphase.engine.text import inert
from chatphase.errors import UsageError
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


def _flag_type(parse):
    """``parse`` for argparse: its ValueError or UsageError as argparse's one-line error."""

    def parse_flag(text: str):
        try:
            return parse(text)
        except (ValueError, UsageError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse_flag.__name__ = getattr(parse, "__name__", "value")
    return parse_flag


def plan_flags() -> dict[str, list[tuple[Experiment, PlanField]]]:
    """Every experiment's knobs by flag, in the order first registered."""
    flags: dict[str, list[tuple[Experiment, PlanField]]] = {}
    for experiment in EXPERIMENTS.values():
        for f in experiment.fields():
            if f.flag:
                flags.setdefault(f.flag, []).append((experiment, f))
    return flags


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _help(flag: str, knobs: list[tuple[Experiment, PlanField]]) -> str:
    """The first knob's help and its default: the most experiments' first, then each other experiment's (the
    picking flag has none)."""
    from collections import Counter

    defaults = {
        e.kind: show(f.default)
        for e, f in knobs
        if e.pick != flag and isinstance(f.default, int | float | str | tuple) and show(f.default)
    }
    text = knobs[0][1].help
    if not defaults:
        return text
    common = Counter(defaults.values()).most_common(1)[0][0]
    others = [f"with {_words(EXPERIMENTS[k])} {v}" for k, v in defaults.items() if v != common]
    return f"{text} (default {'; '.join([common, *others])})"


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="measure TTFT vs prompt length and decode speed vs context depth",
        description=__doc__.split("\n\n")[0],
    )
    add_model_options(p, lists=True)
    add_server_options(p)
    taken = {s for action in p._actions for s in action.option_strings}  # --spec is the engine's decode mode too
    g = p.add_argument_group("experiments")
    for flag, knobs in plan_flags().items():
        if flag in taken:
            continue
        f = knobs[0][1]
        parse = _flag_type(f.parse) if f.parse else str
        g.add_argument(flag, dest=_dest(flag), type=parse, metavar=f.metavar, help=_help(flag, knobs))
    g.add_argument(
        "--rerun", metavar="FILE", help="run a saved result's plan again and show the two side by side (.json)"
    )
    g.add_argument("--no-roofline", dest="roofline", action="store_false", help="skip the bandwidth/FLOP/s measurement")
    out = p.add_argument_group("output")
    out.add_argument("--format", default="table", metavar="|".join(FORMATS), help="output format (default table)")
    out.add_argument("--output", "-o", metavar="FILE", help="write the output here instead of stdout")
    out.add_argument("--plot", metavar="FILE", help="draw the experiment's plots (.svg or .png; needs chatphase[plot])")
    p.set_defaults(func=run)


def split_levers(args: argparse.Namespace):
    """The :class:`~chatphase.bench.grid.levers.LeverGrid` of the lever flags in ``args`` (kept as text by
    ``add_model_options(lists=True)``); single values are written back into ``args`` as the settings read them
    (``--n-ubatch`` an int, ``--threads`` an int or ``auto``), lists set to ``None``.

    Raises:
        UsageError: a value a lever does not take (one line naming the flag and the choices).
    """
    from chatphase.bench.grid.levers import LEVERS as LEVER_FLAGS
    from chatphase.bench.grid.levers import LeverGrid, check_values, parse_lever

    values: dict[str, tuple] = {}
    for lever in LEVER_FLAGS:  # each lever's flag fills the ``args`` attribute of its name (the setting's key)
        text = getattr(args, lever, None)
        if text is None:
            continue
        # a model file whose name holds a comma is one model, not a list
        items = (text,) if lever == "model" and Path(text).expanduser().is_file() else parse_lever(lever, text)
        values[lever] = check_values(lever, items)
        single = items[0] if len(items) == 1 else None
        if lever == "n_threads" and single is not None:
            single = count_or_auto(str(single))
        setattr(args, lever, single)
    return LeverGrid(values)


def _given(args: argparse.Namespace, flag: str) -> bool:
    return getattr(args, _dest(flag), None) is not None


def pick(args: argparse.Namespace, levers: dict[str, tuple]) -> Experiment:
    """The experiment the flags ask for: the last registered whose picking flag is given (comma lists in a lever
    pick the lever grid), else the one picked by no flag (the sweep)."""
    for experiment in reversed(EXPERIMENTS.values()):
        if experiment.pick == LEVERS and levers:
            return experiment
        if experiment.pick and experiment.pick != LEVERS and _given(args, experiment.pick):
            return experiment
    return next(e for e in EXPERIMENTS.values() if not e.pick)


def _words(experiment: Experiment) -> str:
    """How a line names ``experiment``: its picking flag."""
    return "a lever grid (comma lists in the levers)" if experiment.pick == LEVERS else experiment.pick or "the sweep"


def refuse_others(args: argparse.Namespace, experiment: Experiment, levers: dict[str, tuple]) -> None:
    """Refuse a flag the chosen experiment does not take (it would be ignored silently), and levers it has none of.

    Raises:
        UsageError: one line naming the flag and where it applies.
    """
    own = {f.flag for f in experiment.fields()} | ({experiment.pick} if experiment.pick != LEVERS else set())
    picks = {e.pick for e in EXPERIMENTS.values() if e.pick}
    for flag, knobs in plan_flags().items():
        if flag in own or not _given(args, flag):
            continue
        users = [e for e, _ in knobs]
        if flag not in picks and all(e.pick and e.pick != LEVERS for e in users):
            raise UsageError(f"{flag} applies to {', '.join(dict.fromkeys(_words(e) for e in users))}")
        raise UsageError(f"{flag} does not apply to {_words(experiment)}")
    if levers and experiment.pick != LEVERS:
        raise UsageError(f"{LEVERS} does not apply to {_words(experiment)}")


def plan_from_args(args: argparse.Namespace, experiment: Experiment, levers: dict[str, tuple], settings, resolve):
    """The chosen experiment's plan from its flags (each not given: its default), validated before any work
    (against ``--n-ctx`` and ``--n-batch``; over ``--server`` the server's are checked after connecting).

    Raises:
        UsageError: a flag that does not apply (over ``--server`` too) or a plan that does not fit (one line).
    """
    values = {}
    for f in experiment.fields():
        if f.flag is None or not _given(args, f.flag):
            continue
        if settings.server and f.local:
            raise UsageError(f"{f.flag} does not apply over --server: {f.local}")
        raw = getattr(args, _dest(f.flag))
        if isinstance(raw, str) and f.parse:  # a setting's flag too (--spec): argparse kept its text
            raw = f.parse(raw)
        values[f.name] = f.value(raw)
    plan = experiment.make_plan(values, levers, resolve)
    return validate_bench_plan(plan, settings)


def run(args: argparse.Namespace) -> int:
    """Validate everything (the output flags the same way for every experiment: :func:`check_outputs`), run the
    experiment with a progress bar on stderr, write the outputs."""
    if args.rerun:
        return rerun(args)
    # comma lists in the levers; single values are written back as the settings read them, for every experiment
    grid = split_levers(args)
    levers = grid.values if grid.is_sweep else {}
    experiment = pick(args, levers)
    refuse_others(args, experiment, levers)
    check_outputs(experiment.kind, args.format, args.plot, args.output)
    settings, resolve = _settings(args, experiment)
    plan = plan_from_args(args, experiment, levers, settings, resolve)
    return run_plan(args, experiment, plan, settings, resolve(levers["model"][0] if "model" in levers else None))


def _settings(args: argparse.Namespace, experiment: Experiment):
    """The settings of the flags (a plan's flag that is a setting's too, ``--spec``, left to the plan) and the model
    resolver (``None``: the settings' model).

    Raises:
        UsageError: a bad setting, or the experiment's ``--server`` rule broken.
    """
    from chatphase.models.gguf_meta import read_model_info
    from chatphase.models.resolve import resolve_model
    from chatphase.settings.schema import FIELDS

    # a plan's flag that is also a setting's (--spec: the decode mode) is the plan's here
    shared = {f.key for f in FIELDS if set(f.metadata.get("flags") or ()) & {k.flag for k in experiment.fields()}}
    settings = settings_from_args(argparse.Namespace(**{**vars(args), **dict.fromkeys(shared)}))
    if experiment.server == "local" and settings.server:
        raise UsageError(experiment.server_note)
    if experiment.server == "only" and not settings.server:
        raise UsageError(experiment.server_note)
    infos: dict = {}

    def resolve(spec: str | None):
        if spec not in infos:
            infos[spec] = read_model_info(resolve_model(spec or settings.model, settings.models_dir))
        return infos[spec]

    return settings, resolve


def run_plan(args: argparse.Namespace, experiment: Experiment, plan, settings, info) -> int:
    """Run ``plan`` (validated) through :func:`execute` (progress, Ctrl+C, output, plot, exit code). Over
    ``--server`` the run talks to the server (``--model`` names its GGUF, the vocabulary); this machine's peaks do
    not bound a server, so no roofline there."""
    run = _make_run(args, experiment, plan, settings, info)
    for note in getattr(plan, "notes", ()):  # a lever grid's left-out points
        print(inert(f"chatphase: {note}"), file=sys.stderr)
    return execute(
        args,
        run,
        plan.total_runs,
        Done,
        text_of=lambda done: experiment.text(done.result, args.format),
        plot=(lambda done, path: experiment.plot([done.result], path)) if experiment.plot else None,
        partial=run.partial_done,
    )


def _make_run(args: argparse.Namespace, experiment: Experiment, plan, settings, info):
    options = remote_bench_options(settings, info)
    return experiment.make_run(info, settings.engine, plan, args.roofline and not settings.server, None, **options)


def rerun(args: argparse.Namespace) -> int:
    """``--rerun FILE``: the saved result's plan run again (the model: ``--model``, else the saved one where its file
    is still there), then the two side by side: per row and figure the old value, the new one and new / old
    (``--format`` table, md, csv or json; ``--plot`` draws both).

    Raises:
        UsageError: a file that is not a saved result, one saved without its plan, a flag of a plan (the plan is
            the file's), or a plan that does not fit.
    """
    from chatphase.bench.experiments import load_result, read_saved

    data = read_saved(args.rerun)
    old = load_result(args.rerun)
    experiment = EXPERIMENTS[data["kind"]]
    saved = experiment.saved_plan(data)
    if saved is None:
        raise UsageError(f"{Path(args.rerun).name} was saved without its plan: it cannot run again")
    for flag in plan_flags():
        if _given(args, flag):
            raise UsageError(f"{flag} does not apply to --rerun: the plan is the file's")
    if split_levers(args).is_sweep:
        raise UsageError(f"{LEVERS} does not apply to --rerun: the plan is the file's")
    check_format(args.format, FORMATS)  # the comparison's forms, whichever the experiment's are
    check_outputs(experiment.kind, experiment.formats[0], args.plot, args.output)
    model = data.get("model")
    if args.model is None and isinstance(model, dict) and model.get("path") and Path(model["path"]).is_file():
        args.model = model["path"]
    settings, resolve = _settings(args, experiment)
    plan = validate_bench_plan(experiment.plan_from_dict(saved), settings)
    run = _make_run(args, experiment, plan, settings, resolve(None))

    def compare(done) -> str:
        rows = compare_rows(experiment.rows(old), experiment.rows(done.result), experiment.key, experiment.figures)
        return render_comparison(rows, args.format, experiment, args.rerun, plan, old, done.result)

    return execute(
        args,
        run,
        plan.total_runs,
        Done,
        text_of=compare,
        plot=(lambda done, path: experiment.plot([done.result, old], path)) if experiment.plot else None,
        partial=run.partial_done,
    )


def render_comparison(rows: list[dict], fmt: str, experiment: Experiment, path: str, plan, old, new) -> str:
    """The rerun's comparison in ``fmt``: ``table``/``md`` (row, figure, old, new, new/old), ``csv`` (the same
    columns) or ``json`` (``{"kind", "rerun_of", "plan", "compare": [rows], "old", "new"}``)."""
    if fmt == "json":
        data = {"kind": experiment.kind, "rerun_of": str(path), "plan": plan.to_dict(), "compare": rows,
                "old": json.loads(old.to_json()), "new": json.loads(new.to_json())}  # fmt: skip
        return json.dumps(data, indent=2) + "\n"

    def cell(v) -> str:
        return "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    header = ["row", "figure", "old", "new", "new/old"]
    body = [[r["row"], r["figure"], cell(r["old"]), cell(r["new"]),
             "" if r["ratio"] is None else f"{r['ratio']:.2f}x"] for r in rows]  # fmt: skip
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["row", "figure", "old", "new", "ratio"])
        writer.writerows([r["row"], r["figure"], r["old"], r["new"], r["ratio"]] for r in rows)
        return buf.getvalue()
    if fmt == "md":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in body)]) + "\n"
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
    title = f"{experiment.title}: {Path(path).name} (old) against this run (new)"
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
              for r in body]  # fmt: skip
    return "\n".join(lines) + "\n"


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
    prog: str = "chatphase bench",
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
    line says what is still running. ``prog`` heads the progress lines (``chatphase compare`` runs here too)."""
    with _Progress(total_runs, prog) as progress:
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


def follow(events, progress: _Progress, done_type: type):
    """Show a run's status, notices and progress on ``progress``; returns its final ``done_type`` event."""
    from chatphase.bench.core.events import BenchNotice, BenchStatus

    done = None
    for event in events:
        if isinstance(event, BenchStatus):
            progress.status(event.text)
        elif isinstance(event, BenchNotice):
            progress.notice(event.text)
        elif isinstance(event, Progress):  # any experiment's
            progress.advance(event.done_runs, event.total_runs, *event.line(), counted=event.counted)
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

    def __init__(self, total: int, prog: str = "chatphase bench") -> None:
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
        self._prog = prog  # each line's head
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
        self._bar.console.print(inert(f"{self._prog}: {text}"), markup=False, highlight=False, soft_wrap=True)

    def status(self, text: str) -> None:
        self._description = text
        self._last_event = self._last_line = time.monotonic()
        self._bar.update(self._task, description=text)
        if self._plain:
            print(inert(f"{self._prog}: {text}"), file=sys.stderr, flush=True)

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
            print(f"{self._prog}: [{done_runs}/{total_runs}] {label}: {figures}", file=sys.stderr, flush=True)
