"""The RPC link sweep's record (:class:`~chatphase.bench.core.experiment.Experiment`)."""

from __future__ import annotations

from chatphase.bench.core.experiment import Experiment
from chatphase.bench.rpc.result import RpcResult, rpc_rows, write_rpc_plot
from chatphase.bench.rpc.run import RpcPlan, make_run

EXPERIMENT = Experiment(
    "rpc", "RPC link sweep", RpcPlan, make_run, RpcResult.from_dict, plot=write_rpc_plot, pick="--rpc-rtt",
    server="local", server_note="--rpc-rtt starts rpc-servers on this machine and loads the model: not with "
    "--server", rows=rpc_rows, key=("devices", "rtt_ms"), figures=("ttft_ms", "decode_step_ms"),
)  # fmt: skip
