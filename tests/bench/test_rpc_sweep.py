"""The RPC link sweep's plan, rows, prediction and saved form (chatphase/bench/rpc/), on samples made here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chatphase.bench.experiments import EXPERIMENTS, load_result
from chatphase.bench.rpc.link import LinkCounters, LinkShape
from chatphase.bench.rpc.network import network_ms, predicted_ms
from chatphase.bench.rpc.result import RpcResult, RpcSample
from chatphase.bench.rpc.run import RpcPlan, rows_of, rtt_list
from chatphase.errors import UsageError


def test_the_network_term_is_round_trips_times_rtt_plus_bytes_at_the_rate():
    carried = LinkCounters(bytes_up=6_000, bytes_down=4_000, round_trips=8)
    assert network_ms(carried, LinkShape(rtt_ms=5)) == 40
    # 10,000 bytes = 80,000 bits at 8 Mbit/s = 10 ms, spread over 4 steps with the RTTs
    assert network_ms(carried, LinkShape(rtt_ms=5, mbit_per_s=8), per=4) == pytest.approx((40 + 10) / 4)
    assert predicted_ms(12.0, carried, LinkShape(rtt_ms=1), per=8) == 13.0
    assert predicted_ms(None, carried, LinkShape(rtt_ms=1)) is None
    with pytest.raises(ValueError):
        network_ms(carried, LinkShape(), per=0)


def test_the_plan_measures_the_baseline_first_and_checks_its_knobs():
    plan = RpcPlan(rpc_rtt_ms=(5.0, 0.0, 1.0), rpc_devices=(0, 2), rpc_mbit=100, reps=2, warmup=1)
    assert plan.links == (LinkShape(), LinkShape(5, 100), LinkShape(0, 100), LinkShape(1, 100))
    assert plan.total_runs == (1 + 4) * 3
    assert RpcPlan(rpc_rtt_ms=(0.0, 1.0)).links == (LinkShape(), LinkShape(1))
    assert plan.validate(4096) is plan
    for bad, words in (
        (RpcPlan(rpc_rtt_ms=(1,), rpc_devices=(5,)), "--rpc-devices"),
        (RpcPlan(rpc_rtt_ms=(1,), gen_tokens=1), "--gen"),
        (RpcPlan(rpc_rtt_ms=(1,), rpc_mbit=0), "--rpc-mbit"),
        (RpcPlan(rpc_rtt_ms=(1,), server_threads=0), "--rpc-server-threads"),
        (RpcPlan(rpc_rtt_ms=(1,), prompt_tokens=4090), "n_ctx"),
    ):
        with pytest.raises(UsageError, match=words):
            bad.validate(4096)
    assert rtt_list("0, 1,5") == (0, 1, 5)
    for text in ("", "1,x", "-1", "2000"):
        with pytest.raises(ValueError):
            rtt_list(text)


def sample(devices, rtt, step, rt, *, rep=0, warm=False, ttft=100.0, mbit=None, prefill_rt=10):
    return RpcSample(
        devices=devices, rtt_ms=rtt, mbit_per_s=mbit, rep=rep, warmup=warm, ttft_ms=ttft,
        prefill_tokens_per_s=1000.0, decode_step_ms=step, decode_steps=10,
        prefill_link=LinkCounters(5_000, 5_000, prefill_rt), decode_link=LinkCounters(1_000, 1_000, rt * 10),
    )  # fmt: skip


def test_rows_take_medians_of_counted_turns_and_predict_from_the_baseline():
    samples = [
        sample(0, 0, 8.0, 0, warm=True),
        sample(0, 0, 8.0, 0),
        sample(1, 0, 99.0, 2, warm=True),  # a warm-up never counts
        *(sample(1, 0, step, 2, rep=i) for i, step in enumerate((10.0, 11.0, 30.0))),
        *(sample(1, 5, step, 2, rep=i, ttft=160.0) for i, step in enumerate((21.0, 22.0, 23.0))),
    ]
    local, base, slow = rows_of(samples)
    assert (local.devices, local.decode_step_predicted_ms) == (0, None)
    assert (base.reps, base.decode_step_ms, base.decode_round_trips_per_step) == (3, 11.0, 2.0)
    assert base.decode_step_predicted_ms == pytest.approx(11.0)  # the baseline predicts itself
    assert slow.decode_step_predicted_ms == pytest.approx(11.0 + 2 * 5)
    assert slow.decode_error == pytest.approx(21.0 / 22.0 - 1)
    assert slow.ttft_predicted_ms == pytest.approx(100.0 + 10 * 5)
    assert slow.decode_bytes_per_step == 200


def test_a_rate_capped_cell_is_predicted_from_the_uncapped_baseline():
    samples = [sample(2, 0, 10.0, 3), sample(2, 1, 20.0, 3, mbit=16)]
    _, capped = rows_of(samples)
    # 3 RTTs of 1 ms, and 200 bytes per step at 16 Mbit/s = 0.1 ms
    assert capped.decode_step_predicted_ms == pytest.approx(10.0 + 3 + 0.1)


def test_a_result_saves_renders_and_loads_back(tmp_path):
    samples = [sample(0, 0, 8.0, 0), sample(1, 0, 10.0, 2), sample(1, 5, 21.0, 2)]
    result = RpcResult(
        model={"name": "m"}, settings={"plan": RpcPlan(rpc_rtt_ms=(5.0,)).to_dict(), "engine": {"n_threads": 2}},
        placements={"1": {"devices": [{"name": "CPU"}, {"name": "RPC0", "host": "127.0.0.1:1"}],
                          "placement": [{"device": "CPU", "layers": [0, 1]},
                                        {"device": "RPC0", "layers": [2, 3], "output_layer": True}]}},
        rows=rows_of(samples), samples=samples,
    )  # fmt: skip
    path = tmp_path / "rpc.json"
    path.write_text(result.to_json())
    back = load_result(path)
    assert isinstance(back, RpcResult) and back.rows == result.rows and back.samples == result.samples
    table = result.render("table")
    assert "+5 ms" in table and "-5%" in table
    assert "1 RPC devices: CPU layers 0-1; RPC0 at 127.0.0.1:1 layers 2-3 + output" in table
    assert result.render("csv").splitlines()[0].startswith("devices,rtt_ms,")
    assert EXPERIMENTS["rpc"].plan_from_dict(result.settings["plan"]) == RpcPlan(rpc_rtt_ms=(5.0,))
    with pytest.raises(UsageError, match="bench --rpc-rtt"):
        RpcResult.from_dict({"kind": "rpc"})


def test_the_plot_draws_measured_and_predicted(tmp_path):
    samples = [sample(0, 0, 8.0, 0), sample(1, 0, 10.0, 2), sample(1, 5, 21.0, 2)]
    out = EXPERIMENTS["rpc"].plot([RpcResult(rows=rows_of(samples))], tmp_path / "rpc.png")
    assert out.stat().st_size > 10_000


@pytest.mark.model
@pytest.mark.timeout(600)
def test_a_real_sweep_splits_the_model_and_every_round_trip_costs_the_added_rtt(tmp_path):
    """``bench --rpc-rtt 20`` on the default model with one local rpc-server (the tools build): the load puts the
    layers there, each decode step waits for the server at least once, and the step at +20 ms is at least its round trips
    times 20 ms (a lower bound the link enforces, whatever the machine's speed)."""
    from tests.engine.test_rpc_servers import _tools

    out = tmp_path / "rpc.json"
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(_tools()))
    args = ["--rpc-rtt", "20", "--rpc-devices", "1", "--reps", "1", "--warmup", "0", "--gen", "6",
            "--prompt-lengths", "16", "--n-ctx", "256", "--format", "json", "-o", str(out)]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "chatphase", "bench", *args], capture_output=True, text=True,
                          env=env, timeout=540)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = load_result(out)
    assert isinstance(result, RpcResult)
    base, slow = result.rows
    assert (base.rtt_ms, slow.rtt_ms) == (0, 20)
    assert base.decode_round_trips_per_step is not None and base.decode_round_trips_per_step >= 1
    assert slow.decode_step_ms is not None and slow.decode_step_ms >= 20 * slow.decode_round_trips_per_step
    assert slow.decode_step_predicted_ms is not None and slow.ttft_predicted_ms is not None
    # with a GPU-like device present llama.cpp puts no repeating layer on the CPU: all go to the one server
    placement = {p["device"]: p for p in result.placements["1"]["placement"]}
    assert placement["RPC0"]["output_layer"] and len(placement["RPC0"]["layers"]) == result.model["n_layer"]
