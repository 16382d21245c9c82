"""The offload sweep's record (:class:`~chatphase.bench.core.experiment.Experiment`)."""

from __future__ import annotations

from chatphase.bench.core.experiment import Experiment
from chatphase.bench.offload.run import (
    OFFLOAD_FORMATS,
    OffloadPlan,
    make_run,
    offload_from_dict,
    offload_rows,
    write_offload_plots,
)

EXPERIMENT = Experiment(
    "offload", "offload sweep", OffloadPlan, make_run, offload_from_dict, OFFLOAD_FORMATS, plot=write_offload_plots,
    pick="--gpu-layers", server="local", server_note="--gpu-layers runs local loads of the model: not with --server",
    rows=offload_rows, key=("n_gpu_layers",),
)  # fmt: skip
