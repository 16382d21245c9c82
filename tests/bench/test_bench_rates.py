"""``chatphase bench --server URL --rates``: arrivals, the per-rate accounting with scripted times, the CLI's bad
inputs. The run against a real llama-server is in ``test_bench_llama_server.py``."""

from __future__ import annotations

import statistics

import pytest

from chatphase.bench.rates.accounting import RequestRecord, Slo, arrival_times_s, summarise
from chatphase.bench.rates.result import RateResult
from chatphase.cli import main


def test_arrivals_are_open_loop_at_the_rate_and_repeatable():
    times = arrival_times_s(4.0, 4000, seed=1)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert times == arrival_times_s(4.0, 4000, seed=1) and times != arrival_times_s(4.0, 4000, seed=2)
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.05)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.1)  # Poisson: CV 1


@pytest.mark.parametrize(("burstiness", "cv"), [(0.25, 2.0), (4.0, 0.5)])
def test_burstiness_is_the_gamma_shape_of_the_gaps(burstiness, cv):
    times = arrival_times_s(2.0, 6000, burstiness=burstiness)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.5, rel=0.08)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)


def _ok(i, send, first, gap, n, queued=False):
    tokens = tuple(first + gap * k for k in range(n))
    return RequestRecord(i, 16, send, tokens, tokens[-1] + 1.0, "ok", queued)


def test_a_rate_keeps_every_gap_counts_what_was_not_served_and_its_goodput():
    records = [
        _ok(0, 0.0, 100.0, 10.0, 5),  # TTFT 100, TPOT 10
        _ok(1, 100.0, 400.0, 20.0, 5, queued=True),  # TTFT 300, TPOT 20
        _ok(2, 200.0, 300.0, 50.0, 3),  # TTFT 100, TPOT 50
        RequestRecord(3, 16, 250.0, (), None, "over_capacity"),
        RequestRecord(4, 16, 260.0, (400.0,), 999.0, "cut"),
        RequestRecord(5, 16, 270.0, (), 280.0, "failed", error="boom"),
    ]
    s = summarise(2.0, records, Slo(ttft_ms=200.0, tpot_ms=30.0))
    assert (s.sent, s.completed, s.over_capacity, s.queued, s.failed, s.cut) == (5, 3, 1, 1, 1, 1)
    assert s.ttft_ms == [100.0, pytest.approx(260.0), pytest.approx(296.0)]  # 100, 100, 300 interpolated
    # every gap pooled: 4 of 10 ms, 4 of 20, 2 of 50 (a mean per request would hide the 50s)
    assert s.itl_ms == [20.0, pytest.approx(50.0), pytest.approx(50.0)]
    assert s.tpot_ms[0] == 20.0
    # the span: the first send (0 ms) to the last completed end (481 ms); 5 + 5 + 3 tokens
    assert s.span_s == pytest.approx(0.481)
    assert s.output_tokens_per_s == pytest.approx(13 / 0.481) and s.requests_per_s == pytest.approx(3 / 0.481)
    assert s.goodput_requests_per_s == pytest.approx(1 / 0.481)  # only the first meets both bounds
    assert summarise(2.0, records, Slo()).goodput_requests_per_s is None  # no SLO: no goodput


def test_result_round_trips(tmp_path):
    from chatphase.bench.experiments import load_result

    records = [_ok(0, 0.0, 100.0, 10.0, 5)]
    result = RateResult(model={"name": "m"}, summaries=[summarise(1.0, records, Slo())], records=[records])
    path = tmp_path / "r.json"
    path.write_text(result.to_json())
    back = load_result(path)
    assert isinstance(back, RateResult) and back.records == [records] and back.summaries == result.summaries
    assert "rate/s" in back.render("table") and back.to_csv().startswith("rate,sent,completed")


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--rates", "1,2"], "give --server URL"),
        (["--server", "http://127.0.0.1:9", "--rates", "0"], "--rates: 1 to 16 rates, each above 0"),
        (["--server", "http://127.0.0.1:9", "--rates", "1", "--requests", "0"], "--requests must be 1 to 1000"),
        (["--server", "http://127.0.0.1:9", "--rates", "1", "--burstiness", "0"], "--burstiness must be above 0"),
        (["--server", "http://127.0.0.1:9", "--rates", "1", "--parallel", "2"], "--parallel does not apply to --rates"),
        (["--server", "http://127.0.0.1:9", "--rates", "1", "--plot", "x.svg"], "draws no plot"),
        (["--slo", "ttft=500"], "--slo applies to --rates"),
        (["--parallel", "2", "--requests", "8"], "--requests applies to --rates"),
    ],
)
def test_cli_bad_inputs_exit_2_with_one_line(capsys, argv, match):
    assert main(["bench", "--model", "/nonexistent/model.gguf", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--rates", "1,x"], ["--rates", "1", "--slo", "ttft=fast"], ["--slo", "e2e=5"]])
def test_malformed_rates_and_slo_are_argparse_errors(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2 and "Traceback" not in capsys.readouterr().err
