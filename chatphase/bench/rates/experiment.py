"""The rate sweep's record (:class:`~chatphase.bench.core.experiment.Experiment`)."""

from __future__ import annotations

from chatphase.bench.core.experiment import Experiment
from chatphase.bench.rates.result import RateResult
from chatphase.bench.rates.run import RatePlan, make_run

EXPERIMENT = Experiment(
    "rates", "rate sweep", RatePlan, make_run, RateResult.from_dict, plot_note="the rates compare in their table",
    pick="--rates", server="only", server_note="--rates measures a served model: give --server URL (and --model "
    "naming its GGUF)", key=("rate",), figures=("ttft_ms_p50", "tpot_ms_p50", "output_tokens_per_s",
    "goodput_requests_per_s"),
)  # fmt: skip
