"""The experiment contract: every experiment takes the output flags the same way, every saved result records its
``kind`` and schema ``version`` and loads back through the one loader, and a future version is refused."""

from __future__ import annotations

import json

import pytest
from test_bench_interference import scripted
from test_bench_parallel import _cell as parallel_cell
from test_bench_results import make_cell, make_result

from chatphase.bench.compare.result import CompareResult, CompareTurn
from chatphase.bench.core.contract import SCHEMA_VERSION
from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.results import save_result
from chatphase.bench.experiments import EXPERIMENTS, load_bench_result, load_result
from chatphase.bench.grid.levers import Prediction
from chatphase.bench.grid.result import GridCell, GridResult
from chatphase.bench.interference.analysis import analyse
from chatphase.bench.interference.result import InterferenceResult
from chatphase.bench.offload.run import OffloadDone, Placement
from chatphase.bench.parallel.result import ParallelResult
from chatphase.bench.rates.accounting import Slo, summarise
from chatphase.bench.rates.result import RateResult
from chatphase.bench.rpc.result import RpcResult
from chatphase.bench.rpc.run import rows_of
from chatphase.bench.spec.run import SpecResult
from chatphase.cli import main
from chatphase.errors import UsageError
from tests.bench.test_rpc_sweep import sample as rpc_sample

#: the flags that pick each experiment (a model that does not exist: the output flags are checked first).
PICK = {
    "sweep": [],
    "parallel": ["--parallel", "2"],
    "grid": ["--threads", "1,2"],
    "spec": ["--spec", "off,lookup"],
    "offload": ["--gpu-layers", "0,all"],
    "interference": ["--interference", "2"],
    "rates": ["--server", "http://127.0.0.1:9", "--rates", "1"],
    "rpc": ["--rpc-rtt", "1"],
    "compare": ["--compare", __file__, "--compare-b", "type_k=q8_0"],  # any text file holds turns
}


def test_every_experiment_is_picked_by_a_flag():
    assert sorted(PICK) == sorted(EXPERIMENTS)


def _bench(capsys, kind: str, *argv: str) -> tuple[int, str]:
    rc = main(["bench", "--model", "/nonexistent/model.gguf", *PICK[kind], *argv])
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("kind", sorted(PICK))
def test_a_bogus_format_exits_2_with_one_line_for_every_experiment(capsys, tmp_path, kind):
    rc, err = _bench(capsys, kind, "--format", "bogus", "--plot", str(tmp_path / "x.svg"))
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "unknown --format 'bogus': choose one of " + ", ".join(EXPERIMENTS[kind].formats) in err
    assert not (tmp_path / "x.svg").exists()


@pytest.mark.parametrize("kind", ["grid", "spec", "rates"])
def test_a_plot_an_experiment_cannot_draw_is_refused_in_one_line(capsys, tmp_path, kind):
    rc, err = _bench(capsys, kind, "--plot", str(tmp_path / "x.svg"))
    assert rc == 2 and len(err.splitlines()) == 1 and "draws no plot" in err
    assert not (tmp_path / "x.svg").exists()


def compare_turn(side: str) -> CompareTurn:
    return CompareTurn(0, side, 0 if side == "A" else 1, 10, 0, 10, 50.0, 40.0, 250.0, 8, 80.0, 100.0, 1000, None,
                       "length", "a reply")  # fmt: skip


def _results() -> dict[str, object]:
    """One result of every kind, with cells."""
    prediction = Prediction(50.0, 500.0, 128.0, 1e6, 2e8)
    rpc_samples = [rpc_sample(1, 0, 10.0, 2), rpc_sample(1, 5, 21.0, 2)]
    peaks = MachinePeaks(20e9, "scripted copy", 100e9, "scripted matmul", threads=2)
    grid_cell = GridCell("t=2", {"n_threads": 2}, "m", False, make_cell(), prediction, 1000, 10_000, None, 100)
    return {
        "sweep": make_result(),
        "parallel": ParallelResult(model={"name": "Tiny"}, parallel=[parallel_cell(1, 40.0), parallel_cell(4, 120.0)]),
        "grid": GridResult(cells=[grid_cell], peaks={2: peaks}, plan={"reps": 1}, notes=["a note"]),
        "spec": SpecResult([{"spec": "off", "kind": "grounded", "decode_tokens_per_s": 50.0}], {1: 2.0, 2: 2.5}, {}),
        "offload": OffloadDone([Placement(0, make_result(), {"bound_by": "host memory"})]),
        "interference": InterferenceResult(model={"name": "Tiny"}, samples=[analyse(scripted(16, 40, 8))]),
        "rates": RateResult(model={"name": "Tiny"}, summaries=[summarise(1.0, [], Slo())], records=[[]]),
        "rpc": RpcResult(model={"name": "Tiny"}, rows=rows_of(rpc_samples), samples=rpc_samples),
        "compare": CompareResult(model={"name": "Tiny"}, turns=[compare_turn("A"), compare_turn("B")]),
    }


@pytest.mark.parametrize("kind", sorted(EXPERIMENTS))
def test_every_saved_result_has_kind_and_version_and_loads_back(tmp_path, kind):
    result = _results()[kind]
    path = save_result(result, tmp_path / f"{kind}.json")
    data = json.loads(path.read_text())
    assert (data["kind"], data["version"]) == (kind, SCHEMA_VERSION)
    back = load_result(path)
    assert type(back) is type(result) and json.loads(back.to_json()) == data


@pytest.mark.parametrize("kind", sorted(EXPERIMENTS))
def test_a_file_from_before_kind_and_version_loads_as_version_1(tmp_path, kind):
    data = json.loads(_results()[kind].to_json())
    del data["version"]
    if kind not in ("spec", "interference", "rates", "rpc", "compare"):  # these always recorded their kind
        del data["kind"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    back = load_result(path)
    assert json.loads(back.to_json()) == {**data, "kind": kind, "version": 1}


@pytest.mark.parametrize("kind", sorted(EXPERIMENTS))
def test_a_future_version_is_refused_in_one_line(tmp_path, kind):
    path = tmp_path / "future.json"
    path.write_text(json.dumps({**json.loads(_results()[kind].to_json()), "version": SCHEMA_VERSION + 1}))
    with pytest.raises(UsageError) as exc:
        load_result(path)
    message = str(exc.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in message and "\n" not in message


def test_only_results_that_draw_the_sweep_plots_overlay(tmp_path):
    results = _results()
    assert load_bench_result(save_result(results["parallel"], tmp_path / "p.json")).parallel
    with pytest.raises(UsageError, match=r"g\.json is a lever grid result: only sweep and parallel results overlay"):
        load_bench_result(save_result(results["grid"], tmp_path / "g.json"))


def test_an_unknown_kind_is_refused_in_one_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"kind": "weather", "version": 1}))
    with pytest.raises(UsageError, match="unknown bench result kind 'weather'"):
        load_result(path)


@pytest.mark.model
def test_a_real_spec_comparison_writes_json_that_loads_back(tmp_path, capsys, default_model_path):
    out = tmp_path / "spec.json"
    argv = ["bench", "--spec", "off", "--reps", "1", "--model", default_model_path, "--n-ctx", "1024"]
    assert main([*argv, "--format", "json", "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    assert (data["kind"], data["version"]) == ("spec", SCHEMA_VERSION) and data["rows"]
    assert sorted(map(int, data["verify_step_ms"])) == list(range(1, 17))
    back = load_result(out)
    assert isinstance(back, SpecResult) and back.rows == data["rows"]


def test_every_experiments_tab_is_a_registered_experiment():
    from chatphase.ui.experiments.levers import LeversPane
    from chatphase.ui.experiments.panes import ParallelPane, SweepPane
    from chatphase.ui.experiments.spec import SpecPane

    tabs = [tab.kind for tab in (SweepPane, ParallelPane, LeversPane, SpecPane)]
    assert tabs == ["sweep", "parallel", "grid", "spec"] and set(tabs) <= set(EXPERIMENTS)
    assert [kind for kind, e in EXPERIMENTS.items() if e.overlays] == ["sweep", "parallel"]
