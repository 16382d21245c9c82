"""Every benchmark in benchmarks/ runs, so none can rot unseen: its argument parsing (``--help``, a bad flag: one
usage line and exit 2, no traceback) and its smallest configuration (tiny gen and reps, the bundled 135M model,
llama.cpp's tools from ``scripts/llama_build.sh``). The figures mean nothing here; only that each
benchmark runs to its report. gpu_summary's smallest run is tests/benchmarks/test_gpu_check.py's (real ``ask``/``bench``
output of this CPU).

The llama.cpp tools: where they are not built, those cases skip, unless ``CHATPHASE_REQUIRE_LLAMA_TOOLS=1``
(``.ci/run``, which builds them first) turns the skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import harness

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = (
    "decode_step",
    "engine_speed",
    "exactness",
    "gguf_reader",
    "gpu_summary",
    "history_db",
    "levers",
    "memory_plan",
    "parallel_decode",
    "prefix_restore",
    "roofline_vs_stream",
    "serving_compare",
    "shared_cpu",
    "spec_decode",
    "startup",
    "terminal_share",
    "token_view",
    "ttft_prediction",
    "tui_overhead",
    "ui_memory",
)


def run(module: str, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.<module> args`` from the repository root, chatphase's files in a temporary place."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def test_every_benchmark_is_smoke_tested_and_none_edits_sys_path():
    files = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"__init__", "harness"}
    assert files == set(BENCHMARKS)
    for name in files:
        assert "sys.path" not in (ROOT / "benchmarks" / f"{name}.py").read_text(encoding="utf-8"), name


@pytest.mark.parametrize("module", BENCHMARKS)
def test_arguments_are_parsed(module):
    done = run(module, "--help", timeout_s=60)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr
    bad = run(module, "--no-such-flag", timeout_s=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert ": error: " in bad.stderr.strip().splitlines()[-1]  # argparse's one line under the usage


# --- the smallest configurations ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools():
    """The folder of llama.cpp's tools (skips, or fails under CHATPHASE_REQUIRE_LLAMA_TOOLS=1, when not built)."""
    folder = harness.tools_dir()
    if folder is None or not all((folder / t).is_file() for t in harness.TOOLS):
        message = "llama.cpp's tools are not built: run scripts/llama_build.sh"
        if os.environ.get("CHATPHASE_REQUIRE_LLAMA_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return folder


def ok(done: subprocess.CompletedProcess[str], *codes: int) -> None:
    assert done.returncode in (codes or (0,)), done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]


def test_tools_run_as_chatphase_repacks(fake_cpu, monkeypatch, tmp_path):
    """Every tool gets the product's repacking choice: llama-bench --repack 0|1, the others -nr where it is off."""
    fake_cpu("amx", probe_safe=False)
    ran = []
    monkeypatch.setattr(harness.subprocess, "run", lambda argv, **kw: ran.append(argv))
    for name in harness.TOOLS:
        harness.run_tool(str(tmp_path / name), ["-m", "x.gguf"])
    assert [argv[3:] for argv in ran] == [["--repack", "0"], ["-nr"], ["-nr"], ["-nr"]]
    fake_cpu("other", probe_safe=False)
    ran.clear()
    for name in harness.TOOLS:
        harness.run_tool(str(tmp_path / name), ["-m", "x.gguf"])
    assert [argv[3:] for argv in ran] == [["--repack", "1"], [], [], []]


def test_ratio_is_the_median_of_per_rep_ratios_with_the_ratio_of_medians_beside_it():
    r = harness.ratio([10.0, 30.0, 20.0], [10.0, 10.0, 40.0])
    assert r.per_rep == (1.0, 3.0, 0.5) and r.median_of_ratios == 1.0 and r.of_medians == 2.0
    assert harness.rotation(["a", "b", "c"], 4) == ["b", "c", "a"] and harness.rotation(["a", "b"], 1) == ["b", "a"]
    with pytest.raises(ValueError, match="same reps"):
        harness.ratio([1.0], [1.0, 2.0])


def test_ui_memory_smallest(tmp_path):
    done = run("ui_memory", "--turns", "12", "--no-trace", "--out", str(tmp_path / "m.md"))
    ok(done)
    assert "MiB/turn" in (tmp_path / "m.md").read_text()


def test_token_view_smallest(tmp_path):
    out = tmp_path / "t.md"
    args = ["--tokens", "200,400", "--sizes", "80x24", "--reps", "1", "--reply", "8", "--wheel", "3"]
    done = run("token_view", *args, "--output", str(out))
    ok(done)
    text = out.read_text()
    assert "| open (first) ms |" in text and "| longest event-loop block ms |" in text and "| 400 ÷ 200 |" in text


def test_history_db_smallest_queries(tmp_path):
    done = run("history_db", "--turns", "120", "--per-session", "40", "--reps", "1", "--decode-reps", "0")
    ok(done)
    assert "Queries over 120 turns (3 sessions)" in done.stdout and "| python -m chatphase stats |" in done.stdout


@pytest.mark.model
def test_history_db_smallest_decode(tmp_path):
    out = tmp_path / "h.md"
    done = run("history_db", "--turns", "20", "--reps", "1", "--decode-reps", "1", "--gen", "4", "--out", str(out))
    ok(done)
    assert "the store costs decode" in out.read_text()


@pytest.mark.model
def test_gguf_reader_smallest():
    ok(run("gguf_reader", "--repeats", "1"))


@pytest.mark.model
def test_engine_speed_smallest(tools, tmp_path):
    done = run(
        "engine_speed", "--reps", "1", "--pp", "16", "--tg", "4", "--llama-bench", "--json", str(tmp_path / "e.json")
    )
    ok(done)
    assert "(d) llama-bench" in done.stdout and (tmp_path / "e.json").exists()


@pytest.mark.model
def test_decode_step_smallest(tools, tmp_path):
    done = run(
        "decode_step", "--reps", "1", "--depths", "32", "--gen", "8", "--pp", "32", "--output", str(tmp_path / "d.md")
    )
    ok(done)
    assert "llama-completion sampled d0" in (tmp_path / "d.md").read_text()


@pytest.mark.model
def test_parallel_decode_smallest(tools, tmp_path):
    done = run("parallel_decode", "--parallel", "1,2", "--prompt-tokens", "16", "--gen", "4", "--rounds", "1")
    ok(done, 0, 1)  # 1: the target was not met (figures mean nothing here)
    assert "| 2 |" in done.stdout


@pytest.mark.model
def test_prefix_restore_smallest(tmp_path):
    done = run("prefix_restore", "--models", "default", "--depths", "96,160", "--reps", "1", "--gen", "2")
    ok(done)
    assert "| 96 |" in done.stdout and "Disk sequential read" in done.stdout


@pytest.mark.model
def test_exactness_smallest(tmp_path):
    done = run("exactness", "--lengths", "100", "--prompts", "1", "--gen", "6")
    ok(done)
    assert "| exact (last chunk again) |" in done.stdout
    done = run("exactness", "--cost", "--lengths", "100", "--prompts", "1", "--gen", "6", "--reps", "1")
    ok(done)
    assert "| exact restore ms |" in done.stdout and "exact ÷ fast restore" in done.stdout


@pytest.mark.model
def test_shared_cpu_smallest(tools, tmp_path):
    args = ["--reps", "1", "--pp", "16", "--tg", "4", "--conditions", "quiet", "--settle-s", "0", "--spin-s", "60"]
    done = run("shared_cpu", *args, "--llama-bench", "--output", str(tmp_path / "s.md"))
    ok(done)
    assert "llama-bench 1" in (tmp_path / "s.md").read_text()


@pytest.mark.model
def test_levers_smallest(tools, tmp_path):
    args = ["--dir", str(tmp_path), "--parts", "decode,kv", "--shapes", "tiny-llama", "--kv-shape", "tiny-qwen3"]
    args += ["--gen", "4", "--depth", "16", "--kv-depth", "16", "--reps", "1", "--warmup", "0"]
    done = run("levers", *args, "--out", str(tmp_path / "l.md"))
    ok(done)
    text = (tmp_path / "l.md").read_text()
    assert "llama-bench with `--repack" in text and "## KV cache q8_0 vs f16" in text


@pytest.mark.model
def test_spec_decode_smallest(tmp_path):
    ok(run("spec_decode", "--reps", "1", "--max-tokens", "8", "--arms", "lookup", "--out", str(tmp_path)))
    assert list(tmp_path.glob("spec_decode-*.md"))


@pytest.mark.model
def test_roofline_vs_stream_smallest(tmp_path):
    """STREAM is no llama.cpp tool and is not built here: a stand-in prints its four kernel lines."""
    stream = tmp_path / "stream"
    stream.write_text('#!/bin/sh\nfor k in Copy Scale Add Triad; do echo "$k:  12345.6  0.1  0.1  0.1"; done\n')
    stream.chmod(0o755)
    done = run("roofline_vs_stream", "--stream", str(stream), "--rounds", "1", "--threads", "1")
    ok(done)
    assert "| 1 |" in done.stdout and "12.3" in done.stdout


@pytest.mark.model
def test_ttft_prediction_smallest(tmp_path):
    args = ["--models", "default", "--reps", "1", "--long-tokens", "64", "--file-tokens", "40", "--gen", "2"]
    done = run("ttft_prediction", *args, "--n-ctx", "512", "--output", str(tmp_path / "t.md"))
    ok(done, 0, 1)  # 1: a target was not met (figures mean nothing here)
    text = (tmp_path / "t.md").read_text()
    for case in ("long first turn", "deep follow-ups", "resumed (restore)", "after an overflow", "after a cancelled"):
        assert f"| {case}" in text, case
    assert "not enough turns yet (0)" in text and "\nAll: " in text


@pytest.mark.model
def test_tui_overhead_smallest():
    done = run("tui_overhead", "--reps", "1", "--max-tokens", "8", "--long-tokens", "24")
    ok(done, 0, 1)  # 1: a target was not met (figures mean nothing here)
    assert "overall:" in done.stdout


needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.mark.model
@needs_tmux
def test_startup_smallest():
    ok(run("startup", "--runs", "1"))


@pytest.mark.model
@needs_tmux
def test_terminal_share_smallest():
    done = run("terminal_share", "--reps", "1", "--tokens", "8", "--size", "120x40")
    ok(done, 0, 1)  # 1: the target was not met (figures mean nothing here)
    assert "median of the per-rep ratios" in done.stdout


@needs_tmux
def test_a_terminal_whose_command_ended_is_read_as_exited_not_a_broken_pipe():
    """A command that ends before its ``%exit`` line is read closes tmux's pipe: the next
    ``capture-pane`` must see an exited terminal (CI once met this with ``ask`` at 8 tokens)."""
    from benchmarks.startup import Terminal

    term = Terminal(["true"], (80, 24), {})
    try:
        term.proc.wait(10)  # the session has closed and control mode with it
        screen = term.capture(timeout_s=1.0)  # before the fix: BrokenPipeError
        for _ in range(20):
            term.pump(0.05)
        assert term.exited
        assert screen == ""
    finally:
        term.close()


def test_a_missing_tool_is_one_line(tmp_path):
    env = dict(os.environ, CHATPHASE_LLAMA_TOOLS=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.parallel_decode"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 1 and done.stderr.strip() == (
        f"benchmarks: llama-batched-bench: not an executable file: {tmp_path}/llama-batched-bench"
    )
