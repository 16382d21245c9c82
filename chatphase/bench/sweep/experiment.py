"""The prompt-length and depth sweep's record (:class:`~chatphase.bench.core.experiment.Experiment`)."""

from __future__ import annotations

from chatphase.bench.core.experiment import Experiment
from chatphase.bench.core.plot import write_plot
from chatphase.bench.core.report import render
from chatphase.bench.core.results import SweepResult
from chatphase.bench.sweep.loop import SweepPlan
from chatphase.bench.sweep.run import make_run

EXPERIMENT = Experiment(
    "sweep", "prompt length & depth", SweepPlan, make_run, SweepResult.from_dict, plot=write_plot, overlays=True,
    tab=True, text=render, key=("kind", "prompt_tokens", "depth"),
    figures=("ttft_ms_mean", "prefill_tokens_per_s_mean", "decode_tokens_per_s_mean"),
)  # fmt: skip
