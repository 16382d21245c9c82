"""The parallel-decode sweep's record (:class:`~chatphase.bench.core.experiment.Experiment`)."""

from __future__ import annotations

from chatphase.bench.core.experiment import Experiment
from chatphase.bench.parallel.plot import write_parallel_plot
from chatphase.bench.parallel.result import ParallelResult
from chatphase.bench.parallel.run import make_run
from chatphase.bench.parallel.sweep import ParallelPlan

EXPERIMENT = Experiment(
    "parallel", "parallel decode", ParallelPlan, make_run, ParallelResult.from_dict, plot=write_parallel_plot,
    pick="--parallel", overlays=True, tab=True, key=("prompt_tokens", "n_seq"),
    figures=("aggregate_decode_tokens_per_s_mean", "decode_tokens_per_s_mean"),
)  # fmt: skip
