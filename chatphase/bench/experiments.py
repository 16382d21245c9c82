"""The registry of experiments: each kind's result type, text forms, plot, child-process run and CLI flag.

The one place that knows every experiment (each imports only :mod:`chatphase.bench.core`): ``chatphase bench``
(:mod:`chatphase.commands.bench`) picks the kind from its flags and checks ``--format``/``--plot`` here before
any work; the Experiments screen's tabs build their jobs with :func:`job_for`; :func:`load_result` reads back any
saved result by its ``kind`` (files written before results carried one are recognised by their keys, as the
version 1 they are) and refuses a ``version`` newer than this chatphase knows.

=========  ============================  ====================  ==========================
kind       flag                          formats               plot
=========  ============================  ====================  ==========================
sweep      (none)                        table, csv, json, md  TTFT, decode vs depth
parallel   ``--parallel N,N``            table, csv, json, md  aggregate, per-seq, step
grid       comma lists in a lever        table, csv, json, md  none
spec       ``--spec off,lookup,...``     table, csv, json      none
offload    ``--gpu-layers 0,8,all``      table, json           prefill, decode vs layers
interf.    ``--interference N``          table, csv, json, md  stall vs TTFT, swim lanes
rates      ``--server URL --rates R,R``  table, csv, json, md  none
=========  ============================  ====================  ==========================
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chatphase.bench.core.contract import FORMATS, check_format, saved_version
from chatphase.bench.core.job import ExperimentJob, RunBuilder
from chatphase.bench.core.results import BenchResult, read_csv, save_result
from chatphase.bench.grid.result import GridResult
from chatphase.bench.interference.plan import InterferencePlan
from chatphase.bench.interference.result import InterferenceResult
from chatphase.bench.load.result import RateResult
from chatphase.bench.offload.run import OFFLOAD_FORMATS, offload_from_dict
from chatphase.bench.parallel.result import ParallelResult
from chatphase.bench.parallel.sweep import ParallelPlan
from chatphase.bench.spec.run import SPEC_FORMATS, SpecPlan, SpecResult
from chatphase.engine.config import EngineConfig
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import ModelInfo

__all__ = [
    "EXPERIMENTS",
    "BenchJob",
    "Experiment",
    "check_outputs",
    "job_for",
    "load_bench_result",
    "load_result",
    "save_result",
]


@dataclass(frozen=True)
class Experiment:
    """One experiment: its ``kind``, what it is (``title``), the ``flag`` that picks it on the command line,
    the text ``formats`` its result renders, whether it draws a ``--plot`` (``plot_note`` says why not),
    ``read`` (a saved JSON object back into its result), and whether its results loaded from a file are drawn
    over the Experiments screen's plots (``overlays``)."""

    kind: str
    title: str
    flag: str
    formats: tuple[str, ...]
    plots: bool
    read: Callable[[dict], object]
    plot_note: str = ""
    overlays: bool = False


EXPERIMENTS: dict[str, Experiment] = {
    e.kind: e
    for e in (
        Experiment("sweep", "prompt length & depth", "", FORMATS, True, BenchResult.from_dict, overlays=True),
        Experiment("parallel", "parallel decode", "--parallel", FORMATS, True, ParallelResult.from_dict, overlays=True),
        Experiment(
            "grid",
            "lever grid",
            "comma lists in a lever",
            FORMATS,
            False,
            GridResult.from_dict,
            "a lever grid compares its points in its table",
        ),
        Experiment(
            "spec",
            "decode modes",
            "--spec",
            SPEC_FORMATS,
            False,
            SpecResult.from_dict,
            "the decode modes compare in their table",
        ),
        Experiment("offload", "offload sweep", "--gpu-layers", OFFLOAD_FORMATS, True, offload_from_dict),
        Experiment(
            "interference", "prefill meets decode", "--interference", FORMATS, True, InterferenceResult.from_dict
        ),
        Experiment(
            "rates", "rate sweep", "--rates", FORMATS, False, RateResult.from_dict, "the rates compare in their table"
        ),
    )
}


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
        if not experiment.plots:
            raise UsageError(f"--plot: {experiment.title} ({experiment.flag}) draws no plot: {experiment.plot_note}")
        from chatphase.plotting import check_plot_path

        check_plot_path(plot)
    if output and not Path(output).expanduser().parent.is_dir():
        raise UsageError(f"--output directory does not exist: {Path(output).parent}")


def _builder(plan) -> RunBuilder:
    """The run builder of ``plan``'s experiment (the plans a one-model job takes)."""
    if isinstance(plan, ParallelPlan):
        from chatphase.bench.parallel.run import make_run as parallel_run

        return parallel_run
    if isinstance(plan, InterferencePlan):
        from chatphase.bench.interference.run import make_run as interference_run

        return interference_run
    if isinstance(plan, SpecPlan):
        from chatphase.bench.spec.run import make_run as spec_run

        return spec_run
    from chatphase.bench.sweep.run import make_run as sweep_run

    return sweep_run


def job_for(
    info: ModelInfo, config: EngineConfig, plan, roofline: bool = True, log_path: str | None = None
) -> ExperimentJob:
    """``plan``'s experiment in a child process (:class:`~chatphase.bench.core.job.ExperimentJob`).

    Raises:
        UsageError: the plan does not fit ``config``'s n_ctx and n_batch.
    """
    return ExperimentJob(info, config, plan, _builder(plan), roofline, log_path)


#: the one-model job by its old name (a sweep's or a parallel plan's).
BenchJob = job_for


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


def load_result(path: str | os.PathLike):
    """Read any saved result: ``.json`` by its ``kind`` (:func:`kind_of`; a ``version`` newer than this
    chatphase reads is refused) or ``.csv`` (a sweep's or a parallel sweep's cells, labelled by file name).

    Raises:
        UsageError: a missing/unreadable file or one that is not UTF-8, an unknown suffix, a future version,
            or content that is not a result (one line each).
    """
    from chatphase.engine.text import read_utf8

    p = Path(path)
    text = read_utf8(p, "result file")
    suffix = p.suffix.lower()
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{p} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg.lower()})") from None
        if not isinstance(data, dict):
            raise UsageError('not a chatphase bench result (no "results" list)')
        saved_version(data)
        return EXPERIMENTS[kind_of(data)].read(data)
    if suffix == ".csv":
        cells, parallel = read_csv(text)
        if parallel and cells:
            raise UsageError(f"{p.name} holds both sweep and parallel cells: save each kind's result on its own")
        if parallel:
            return ParallelResult(parallel=parallel, label=p.stem)
        return BenchResult(results=cells, label=p.stem)
    raise UsageError(f"unknown result file type {suffix or '(none)'!r}: use .json or .csv")


def load_bench_result(path: str | os.PathLike) -> BenchResult | ParallelResult:
    """:func:`load_result` for a result that overlays on the sweep's and parallel sweep's plots.

    Raises:
        UsageError: as :func:`load_result`, or a result of another kind (one line naming it).
    """
    result = load_result(path)
    experiment = EXPERIMENTS[getattr(result, "kind", "offload")]
    if not experiment.overlays or not isinstance(result, BenchResult | ParallelResult):
        drawn = " and ".join(e.kind for e in EXPERIMENTS.values() if e.overlays)
        raise UsageError(f"{Path(path).name} is a {experiment.title} result: only {drawn} results overlay here")
    return result
