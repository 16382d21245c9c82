"""benchmarks/serving_compare.py without AIPerf or a network: AIPerf's files read from a saved run (AIPerf 0.13.0
against llama-server, two requests of 8 tokens), chatphase's rate-sweep records, and the one line when AIPerf is
not installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import serving_compare as sc

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def test_aiperf_records_are_read_with_every_gap_and_its_itl_formula_reproduced():
    first, second = sc.aiperf_requests((DATA / "aiperf_profile_export.jsonl").read_text())
    assert first.ttft_ms == pytest.approx(261.978541) and first.tokens == 8 and first.chunks == 8
    assert first.gaps_ms[:2] == pytest.approx((15.525993, 14.53462)) and len(second.gaps_ms) == 7
    assert first.start_lag_ms == pytest.approx(1.224046)  # credit_issued → request_start
    for r in (first, second):  # AIPerf's "inter token latency": (last − first content chunk) / (tokens − 1)
        assert r.aiperf_itl_ms == pytest.approx(r.tool_itl_ms) and r.tpot_ms == pytest.approx(r.tool_itl_ms)
    assert second.tool_itl_ms == pytest.approx(58.473241571)


def test_aiperf_summary_percentiles_are_read_as_it_reports_them():
    summary = sc.aiperf_summary(json.loads((DATA / "aiperf_profile_export_aiperf.json").read_text()))
    assert summary["ttft"][0] == pytest.approx(248.9607345) and summary["icl"][2] == pytest.approx(175.49816962)
    assert summary["itl"][1] == pytest.approx(48.957493485714295)


def test_aiperf_records_with_an_error_or_no_token_are_left_out():
    line = json.loads((DATA / "aiperf_profile_export.jsonl").read_text().splitlines()[0])
    failed = {**line, "error": {"code": 500, "message": "boom"}}
    empty = {**line, "metrics": {}}
    assert sc.aiperf_requests("\n".join(json.dumps(x) for x in (failed, empty, line))) == sc.aiperf_requests(
        json.dumps(line)
    )


def test_chatphase_records_give_ttft_from_the_send_and_every_gap():
    records = [
        {"index": 0, "prompt_tokens": 8, "send_ms": 10.0, "token_ms": [110.0, 120.0, 150.0], "end_ms": 151.0,
         "status": "ok"},
        {"index": 1, "prompt_tokens": 8, "send_ms": 20.0, "token_ms": [], "end_ms": None, "status": "over_capacity"},
    ]  # fmt: skip
    (r,) = sc.chatphase_requests({"records": [records]})
    assert r.ttft_ms == 100.0 and r.gaps_ms == (10.0, 30.0) and r.tpot_ms == 20.0 and r.aiperf_itl_ms == 20.0


def test_percentiles_and_in_flight():
    assert sc.pcts([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx([3.0, 4.6, 4.96])
    reqs = [sc.Request(0.0, 1.0, (), 10.0, 1), sc.Request(5.0, 1.0, (), 8.0, 1), sc.Request(20.0, 1.0, (), 25.0, 1)]
    rate, most = sc.realised(reqs)
    assert rate == pytest.approx(2 / 0.020) and most == 2


def test_aiperf_missing_is_one_line_saying_how_to_install_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.serving_compare", "--aiperf", str(tmp_path / "aiperf")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr
    assert "--install" in lines[0] and "venv-aiperf" in lines[0]


def test_lateness_is_measured_against_the_schedule_from_each_runs_first_send():
    records = [
        {"index": 0, "prompt_tokens": 8, "send_ms": 300.0, "token_ms": [400.0, 410.0], "end_ms": 411.0, "status": "ok"},
        {"index": 1, "prompt_tokens": 8, "send_ms": 503.0, "token_ms": [600.0, 610.0], "end_ms": 611.0, "status": "ok"},
    ]  # fmt: skip
    got = sc.chatphase_requests({"records": [records]}, schedule_ms=[280.0, 480.0])
    assert [r.late_ms for r in got] == pytest.approx([0.0, 3.0])
    lines = (DATA / "aiperf_profile_export.jsonl").read_text()
    first, second = sc.aiperf_requests(lines, schedule_ms=[0.0, 760.0])  # sessions r0, r1
    assert first.late_ms == 0.0 and second.late_ms == pytest.approx(762.331092 - 760.0)


def test_run_cost_is_the_servers_metrics_delta_per_token():
    before = {"prompt_seconds_total": 1.0, "prompt_tokens_total": 100, "tokens_predicted_seconds_total": 2.0,
              "tokens_predicted_total": 50, "n_decode_total": 50}  # fmt: skip
    after = {"prompt_seconds_total": 1.5, "prompt_tokens_total": 200, "tokens_predicted_seconds_total": 3.0,
             "tokens_predicted_total": 90, "n_decode_total": 70}  # fmt: skip
    cost = sc.RunCost.of(before, after, 1.25)
    assert cost.prefill_ms_per_token == pytest.approx(5.0) and cost.decode_ms_per_token == pytest.approx(25.0)
    assert cost.decode_steps == 20 and cost.client_cpu_s == 1.25
    assert sc.RunCost.of(after, after, 0.0).decode_ms_per_token is None
    assert sc.RunCost.of(before, after, 1.25, 5.0).client_cores == pytest.approx(0.25)
