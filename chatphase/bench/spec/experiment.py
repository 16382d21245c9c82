"""The decode modes' record (:class:`~chatphase.bench.core.experiment.Experiment`)."""

from __future__ import annotations

from chatphase.bench.core.experiment import Experiment
from chatphase.bench.spec.run import SPEC_FORMATS, SpecPlan, SpecResult, make_run

EXPERIMENT = Experiment(
    "spec", "decode modes", SpecPlan, make_run, SpecResult.from_dict, SPEC_FORMATS,
    plot_note="the decode modes compare in their table", pick="--spec", server="local",
    server_note="bench --spec runs the local engine; a server's drafting shows in its timings (chat, ask)", tab=True,
    key=("spec", "kind"), figures=("decode_tokens_per_s", "ratio_to_off", "acceptance", "tokens_per_step"),
)  # fmt: skip
