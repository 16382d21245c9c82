"""The registry of experiments: one line per experiment, each record defined in its own package.

A record (:class:`~chatphase.bench.core.experiment.Experiment`) holds the kind, title, plan type, run, reader, text
forms and plot of its experiment; the plan's fields hold its knobs (flag, label, default, help). ``chatphase bench``
(:mod:`chatphase.commands.bench`) makes its flags from them and picks the experiment by its flag; the Experiments
screen makes its tabs' forms from them and runs any plan with :func:`job_for`; :func:`load_result` reads back any
saved result by its ``kind`` (files written before results carried one are recognised by their keys, as the
version 1 they are) and refuses a ``version`` newer than this chatphase knows. :func:`register` adds one more
(each experiment's package, or a test's).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from chatphase.bench.compare.experiment import EXPERIMENT as COMPARE
from chatphase.bench.core.contract import check_format, saved_version
from chatphase.bench.core.experiment import Experiment
from chatphase.bench.core.job import ExperimentJob
from chatphase.bench.core.results import CellResult, SweepResult, csv_rows, malformed_row, save_result
from chatphase.bench.grid.experiment import EXPERIMENT as GRID
from chatphase.bench.interference.experiment import EXPERIMENT as INTERFERENCE
from chatphase.bench.offload.experiment import EXPERIMENT as OFFLOAD
from chatphase.bench.parallel.experiment import EXPERIMENT as PARALLEL
from chatphase.bench.parallel.records import ParallelCell
from chatphase.bench.parallel.result import ParallelResult
from chatphase.bench.rates.experiment import EXPERIMENT as RATES
from chatphase.bench.rpc.experiment import EXPERIMENT as RPC
from chatphase.bench.spec.experiment import EXPERIMENT as SPEC
from chatphase.bench.sweep.experiment import EXPERIMENT as SWEEP
from chatphase.engine.config import EngineConfig
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import ModelInfo

__all__ = [
    "EXPERIMENTS",
    "Experiment",
    "check_outputs",
    "experiment_of",
    "job_for",
    "load_bench_result",
    "load_result",
    "read_csv",
    "read_saved",
    "register",
    "save_result",
]

#: every experiment by its kind, in the order of the Experiments screen's tabs and ``chatphase bench --help``.
EXPERIMENTS: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Add ``experiment`` (replacing one of its kind); returns it."""
    EXPERIMENTS[experiment.kind] = experiment
    return experiment


register(SWEEP)
register(PARALLEL)
register(GRID)
register(SPEC)
register(OFFLOAD)
register(INTERFERENCE)
register(RATES)
register(RPC)
register(COMPARE)


def experiment_of(plan) -> Experiment:
    """The experiment whose plan ``plan`` is.

    Raises:
        UsageError: a plan of no registered experiment.
    """
    for experiment in EXPERIMENTS.values():
        if type(plan) is experiment.plan:
            return experiment
    raise UsageError(f"no experiment runs a {type(plan).__name__}")


def check_outputs(kind: str, fmt: str, plot: str | None, output: str | None) -> None:
    """The output flags, the same for every experiment, checked before any work: ``--format`` one the
    experiment renders, ``--plot`` only where it draws one (a .svg/.png name, matplotlib installed),
    ``--output`` in an existing directory.

    Raises:
        UsageError: one line naming the flag.
    """
    experiment = EXPERIMENTS[kind]
    check_format(fmt, experiment.formats)
    if plot:
        if experiment.plot is None:
            picked = f" ({experiment.pick})" if experiment.pick else ""
            raise UsageError(f"--plot: {experiment.title}{picked} draws no plot: {experiment.plot_note}")
        from chatphase.plotting import check_plot_path

        check_plot_path(plot)
    if output and not Path(output).expanduser().parent.is_dir():
        raise UsageError(f"--output directory does not exist: {Path(output).parent}")


def job_for(
    info: ModelInfo, config: EngineConfig, plan, roofline: bool = True, log_path: str | None = None
) -> ExperimentJob:
    """``plan``'s experiment in a child process (:class:`~chatphase.bench.core.job.ExperimentJob`).

    Raises:
        UsageError: the plan does not fit ``config``'s n_ctx and n_batch, or no experiment runs it.
    """
    return ExperimentJob(info, config, plan, experiment_of(plan).make_run, roofline, log_path)


def kind_of(data: dict) -> str:
    """The ``kind`` of a saved JSON result; files written before results carried one by their keys.

    Raises:
        UsageError: an unknown kind, or an object no experiment wrote.
    """
    kind = data.get("kind")
    if kind is None:
        if "grid" in data:
            return "grid"
        if "offload" in data:
            return "offload"
        if "rows" in data and "verify_step_ms" in data:
            return "spec"
        if isinstance(data.get("results"), list) or isinstance(data.get("parallel"), list):
            # a sweep's, or a parallel sweep's: before it had a result of its own, a sweep's with no "results"
            # cells and its cells in "parallel" (its plan says so when cancelled before any cell)
            settings = data.get("settings")
            plan = settings.get("plan") if isinstance(settings, dict) else None
            parallel = bool(data.get("parallel")) or "results" not in data
            parallel |= isinstance(plan, dict) and plan.get("sweep") == "parallel"
            return "parallel" if parallel and not data.get("results") else "sweep"
        raise UsageError('not a chatphase bench result (no "kind" and no "results" list)')
    if kind not in EXPERIMENTS:
        raise UsageError(f"unknown bench result kind {kind!r}: this chatphase reads {', '.join(EXPERIMENTS)}")
    return str(kind)


def read_csv(text: str) -> tuple[list[CellResult], list[ParallelCell]]:
    """Prompt/depth cells and parallel cells from CSV text written by :meth:`SweepResult.to_csv` or the parallel
    sweep's result (older files may hold both kinds' rows).

    Raises:
        UsageError: when the header lacks the expected columns or a row is malformed.
    """
    cells: list[CellResult] = []
    parallel: list[ParallelCell] = []
    try:
        for row in csv_rows(text):
            if row["kind"] == "parallel":
                parallel.append(ParallelCell.from_csv_row(row))
            else:
                cells.append(CellResult.from_csv_row(row))
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed_row(exc) from None
    return cells, parallel


def read_saved(path: str | os.PathLike) -> dict:
    """A saved JSON result as its object, its ``kind`` set (:func:`kind_of`; a ``version`` newer than this chatphase
    reads is refused).

    Raises:
        UsageError: a missing/unreadable file or one that is not UTF-8 or not JSON, a future version, or content
            that is not a result (one line each).
    """
    from chatphase.engine.text import read_utf8

    p = Path(path)
    text = read_utf8(p, "result file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{p} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg.lower()})") from None
    if not isinstance(data, dict):
        raise UsageError('not a chatphase bench result (no "results" list)')
    saved_version(data)
    return {**data, "kind": kind_of(data)}


def load_result(path: str | os.PathLike):
    """Read any saved result: ``.json`` by its ``kind`` (:func:`read_saved`) or ``.csv`` (a sweep's or a parallel
    sweep's cells, labelled by file name).

    Raises:
        UsageError: a missing/unreadable file or one that is not UTF-8, an unknown suffix, a future version,
            or content that is not a result (one line each).
    """
    from chatphase.engine.text import read_utf8

    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".json":
        data = read_saved(p)
        return EXPERIMENTS[data["kind"]].read(data)
    text = read_utf8(p, "result file")
    if suffix == ".csv":
        cells, parallel = read_csv(text)
        if parallel and cells:
            raise UsageError(f"{p.name} holds both sweep and parallel cells: save each kind's result on its own")
        if parallel:
            return ParallelResult(parallel=parallel, label=p.stem)
        return SweepResult(results=cells, label=p.stem)
    raise UsageError(f"unknown result file type {suffix or '(none)'!r}: use .json or .csv")


def load_bench_result(path: str | os.PathLike) -> SweepResult | ParallelResult:
    """:func:`load_result` for a result that overlays on the sweep's and parallel sweep's plots.

    Raises:
        UsageError: as :func:`load_result`, or a result of another kind (one line naming it).
    """
    result = load_result(path)
    experiment = EXPERIMENTS[getattr(result, "kind", "offload")]
    if not experiment.overlays or not isinstance(result, SweepResult | ParallelResult):
        drawn = " and ".join(e.kind for e in EXPERIMENTS.values() if e.overlays)
        raise UsageError(f"{Path(path).name} is a {experiment.title} result: only {drawn} results overlay here")
    return result
