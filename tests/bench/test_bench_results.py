"""Result records: JSON and CSV round trips, loading/saving, and the rendered formats and plot."""

from __future__ import annotations

import json

import pytest

from chatphase.bench.core.plot import write_plot
from chatphase.bench.core.report import FORMATS, render, sample_progress
from chatphase.bench.core.results import (
    CSV_COLUMNS,
    CellResult,
    Sample,
    SweepResult,
    parse_csv,
    save_result,
)
from chatphase.bench.experiments import load_result
from chatphase.bench.parallel.records import ParallelSample
from chatphase.bench.parallel.report import parallel_progress
from chatphase.errors import UsageError
from chatphase.plotting import check_plot_path
from chatphase.timing.stats import summarize


def make_cell(
    kind="prompt", prompt_tokens=64, depth=0, gen=16, ttft=(10.0, 12.0), prefill=(300.0, 280.0), decode=(50.0, None)
):
    return CellResult(
        kind,
        prompt_tokens,
        depth,
        gen,
        len(ttft),
        summarize(ttft),
        summarize(prefill),
        summarize(decode),
        summarize([20.0, 21.0]),
        23_040 * (prompt_tokens + gen),
    )


def make_result() -> SweepResult:
    return SweepResult(
        model={"name": "Tiny", "quantization": "Q4_1", "n_params": 135_000_000},
        settings={"engine": {"n_ctx": 1024, "n_threads": 2}, "plan": {"gen_tokens": 16, "reps": 2, "warmup": 1}},
        system={"cpu": "test"},
        results=[
            make_cell(),
            make_cell("prompt", 256, 0, ttft=(30.5, 31.5)),
            make_cell("depth", 260, 256, ttft=(5.0,)),
        ],
        fits={"ttft_ms_vs_prompt_tokens": {"intercept": 3.0, "slope": 0.1, "r2": 0.99, "n": 4}},
        samples=[Sample("prompt", 64, 0, 0, False, 10.0, 300.0, None, None, 64, 0, 1, 1000, "length")],
    )


def test_json_round_trip_keeps_everything():
    res = make_result()
    back = SweepResult.from_dict(json.loads(res.to_json()))
    assert back == res
    data = json.loads(res.to_json())
    assert set(data) >= {"model", "settings", "system", "results", "fits", "roofline"}
    entry = data["results"][0]
    assert set(entry) >= {
        "prompt_tokens",
        "depth",
        "gen_tokens",
        "reps",
        "ttft_ms",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "kv_cache_bytes",
    }
    assert set(entry["ttft_ms"]) >= {"mean", "sd", "median", "min", "max"}


def test_csv_round_trip_of_the_cells():
    res = make_result()
    text = res.to_csv()
    assert text.splitlines()[0].split(",") == list(CSV_COLUMNS)
    assert parse_csv(text) == res.results  # None (undefined sd) survives as an empty cell


def test_save_and_load_files(tmp_path):
    res = make_result()
    assert load_result(save_result(res, tmp_path / "r.json")) == res
    loaded = load_result(save_result(res, tmp_path / "r.csv"))
    assert loaded.results == res.results and loaded.display_label() == "r"
    with pytest.raises(UsageError, match="unknown result file type"):
        save_result(res, tmp_path / "r.txt")


@pytest.mark.parametrize(
    "content,suffix,match",
    [
        ("{not json", ".json", r"not JSON \(line 1, column 2: expecting property name"),
        ('{"a": 1}', ".json", "not a chatphase bench result"),
        ('{"results": [{"kind": "prompt"}]}', ".json", "malformed"),
        ("x,y\n1,2\n", ".csv", "missing columns"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, content, suffix, match):
    p = tmp_path / f"bad{suffix}"
    p.write_text(content)
    with pytest.raises(UsageError, match=match):
        load_result(p)
    with pytest.raises(UsageError, match="cannot read"):
        load_result(tmp_path / "missing.json")


def test_table_and_markdown_show_mean_sd_median_and_range():
    res = make_result()
    table = render(res, "table")
    assert "11.0 ± 1.4" in table  # mean ± sample sd of 10, 12
    assert "11.0 (10.0–12.0)" in table  # median (min–max)
    assert "TTFT ms = 3.0 + 0.100 × prompt_tokens" in table
    md = render(res, "md")
    assert md.count("| prompt |") == 4 and "| --- |" in md
    assert json.loads(render(res, "json")) == json.loads(res.to_json())
    assert render(res, "csv") == res.to_csv()
    assert set(FORMATS) == {"table", "csv", "json", "md"}
    with pytest.raises(UsageError):
        render(res, "yaml")


def test_progress_lines_of_both_kinds_of_run():
    """One wording for the CLI's plain progress and the Experiments screen's status line."""
    sweep = Sample("depth", 4, 256, 1, False, 41.04, 300.0, None, None, 4, 256, 1, 1000, "length")
    assert sample_progress(sweep) == ("depth 256 rep 2", "TTFT 41.0 ms, decode –")
    par = ParallelSample(64, 4, 16, 0, True, 21.0, 47.55, 190.2, 900.0, (5.0,), 20.0, 22.0, 64, None, "length")
    assert parallel_progress(par) == ("N=4 prompt 64 warm-up", "aggregate 190.2 tok/s, per sequence 47.5 tok/s")


@pytest.mark.parametrize("suffix,magic", [(".svg", b"<svg"), (".png", b"\x89PNG")])
def test_plot_files(tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    other = make_result()
    other.label = "other run"
    p = write_plot([make_result(), other], tmp_path / f"plot{suffix}")
    head = p.read_bytes()[:400]
    assert magic in head


def test_plot_path_checked_before_work(tmp_path):
    with pytest.raises(UsageError, match=r"\.svg or \.png"):
        check_plot_path(tmp_path / "plot.pdf")
