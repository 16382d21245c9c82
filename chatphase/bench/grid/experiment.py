"""The lever grid's record (:class:`~chatphase.bench.core.experiment.Experiment`): picked by comma lists in the model
and engine flags (its levers); its knobs are the sweep's cells (:class:`~chatphase.bench.sweep.loop.SweepPlan`)."""

from __future__ import annotations

from collections.abc import Callable

from chatphase.bench.core.experiment import LEVERS, Experiment
from chatphase.bench.grid.result import GridResult
from chatphase.bench.grid.run import GridPlan, make_run
from chatphase.bench.sweep.loop import SweepPlan
from chatphase.models.gguf_meta import ModelInfo


def build(values: dict, levers: dict[str, tuple], resolve: Callable[[str | None], ModelInfo]) -> GridPlan:
    """The grid of ``levers`` on the sweep of ``values``, each model spec resolved by ``resolve``.

    Raises:
        UsageError: too many points, none valid, or a model that cannot be used.
    """
    infos = {spec: resolve(spec) for spec in levers.get("model", (None,))}
    return GridPlan.of(levers, SweepPlan(**values), infos)


EXPERIMENT = Experiment(
    "grid", "lever grid", GridPlan, make_run, GridResult.from_dict, plot_note="a lever grid compares its points in "
    "its table", pick=LEVERS, server="local", server_note="--server does not combine with a lever grid (comma lists "
    "in the levers)", tab=True, knobs=SweepPlan, build=build, key=("point", "kind", "prompt_tokens", "depth"),
    figures=("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s"),
)  # fmt: skip
