"""The prefill-meets-decode experiment's record (:class:`~chatphase.bench.core.experiment.Experiment`)."""

from __future__ import annotations

from chatphase.bench.core.experiment import Experiment
from chatphase.bench.interference.plan import InterferencePlan
from chatphase.bench.interference.plot import write_interference_plot
from chatphase.bench.interference.result import InterferenceResult
from chatphase.bench.interference.run import make_run

EXPERIMENT = Experiment(
    "interference", "prefill meets decode", InterferencePlan, make_run, InterferenceResult.from_dict,
    plot=write_interference_plot, pick="--interference", tab=True, key=("policy",),
    figures=("itl_ms_p50", "stall_ms", "newcomer_ttft_ms_mean", "aggregate_decode_tokens_per_s_mean"),
)  # fmt: skip
