"""``chatphase bench`` on the command line: bad arguments exit 2 before any work; a real JSON run."""

from __future__ import annotations

import json

import pytest

from chatphase.cli import main


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--prompt-lengths", "4096"], "prompt length 4096 must be below n_ctx 4096"),
        (["--prompt-lengths", "64", "--n-ctx", "64"], "below n_ctx 64"),
        (["--reps", "0"], "--reps must be at least 1"),
        (["--format", "yaml"], "unknown --format 'yaml'"),
        (["--plot", "out.pdf"], ".svg or .png"),
        (["--depths", "5000"], "depth 5000"),
        (["--output", "/no/such/dir/r.json"], "--output directory does not exist"),
        (["--parallel", "0"], "N must be 1 to 256"),
        (["--parallel", "1,8", "--prompt-lengths", "480", "--n-ctx", "2048"], "n_ctx 2,048 holds 4 such sequences"),
        (["--parallel", "4", "--depths", "0"], "--depths does not apply to --parallel"),
        (["--parallel", "1,8", "--n-batch", "4"], "over n_batch 4"),
        (["--spec", "off,lookup", "--threads", "1"], "model not found"),  # was a TypeError: "1" read as a string
        (["--spec", "off,lookup", "--threads", "1,2"], "a lever grid) does not apply to --spec"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_before_any_work(capsys, argv, match):
    # a model that does not exist: the argument error must come first (nothing is loaded)
    assert main(["bench", "--model", "/nonexistent/model.gguf", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_malformed_length_list_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--prompt-lengths", "64,abc"])
    assert exc.value.code == 2
    assert "expected comma-separated whole numbers like 64,256,1024 (got '64,abc')" in capsys.readouterr().err


def test_missing_model_is_reported_after_the_plan(capsys):
    assert main(["bench", "--model", "/nonexistent/model.gguf", "--prompt-lengths", "16"]) == 2
    assert "model" in capsys.readouterr().err


def test_real_bench_writes_json_and_csv(tmp_path, capsys, default_model_path):
    argv = [
        "bench",
        "--prompt-lengths",
        "16,64",
        "--depths",
        "none",
        "--gen",
        "4",
        "--reps",
        "2",
        "--warmup",
        "0",
        "--n-ctx",
        "256",
        "--threads",
        "1",
        "--no-roofline",
    ]
    assert main([*argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["prompt_tokens"] for r in data["results"]] == [16, 64]
    assert all(r["reps"] == 2 and r["ttft_ms"]["n"] == 2 for r in data["results"])
    assert data["settings"]["engine"]["n_ctx"] == 256
    assert data["fits"]["ttft_ms_vs_prompt_tokens"]["n"] == 4
    out = tmp_path / "r.csv"
    assert main([*argv, "--format", "csv", "--output", str(out), "--prompt-lengths", "16"]) == 0
    assert out.read_text().splitlines()[1].startswith("prompt,16,0,4,2,")


def test_first_ctrl_c_cancels_and_prints_partial_results(default_model_path):
    import signal
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "chatphase",
        "bench",
        "--prompt-lengths",
        "16,32,48,64",
        "--depths",
        "none",
        "--gen",
        "4",
        "--reps",
        "5",
        "--warmup",
        "0",
        "--n-ctx",
        "128",
        "--threads",
        "1",
        "--no-roofline",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # plain progress lines (stderr is not a terminal)
        if "[1/20]" in line:
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "CANCELLED: partial results" in out and "prompt" in out
    assert "cancelled; the results above are partial" in err and "Traceback" not in err


def test_real_parallel_bench_writes_json_csv_and_a_plot(tmp_path, capsys, default_model_path):
    argv = ["bench", "--parallel", "1,2", "--prompt-lengths", "16", "--gen", "4", "--reps", "2", "--warmup", "0"]
    argv += ["--n-ctx", "256", "--threads", "1", "--no-roofline"]
    assert main([*argv, "--format", "json", "--plot", str(tmp_path / "p.png")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["results"] == [] and [c["n_seq"] for c in data["parallel"]] == [1, 2]
    assert all(c["reps"] == 2 and c["aggregate_decode_tokens_per_s"]["n"] == 2 for c in data["parallel"])
    assert data["settings"]["engine"]["n_seq_max"] == 2 and data["parallel"][1]["kv_cache_bytes"] == 2 * 20 * 23_040
    assert (tmp_path / "p.png").stat().st_size > 1000
    out = tmp_path / "r.csv"
    assert main([*argv, "--format", "csv", "--output", str(out), "--parallel", "2"]) == 0
    assert out.read_text().splitlines()[1].startswith("parallel,16,2,4,2,")
