"""`chatphase ask` as a user runs it: a real process on the default model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chatphase import __version__
from chatphase.cli import main


def chatphase(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "chatphase", *args], capture_output=True, text=True, timeout=timeout)


def test_version():
    result = chatphase("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"chatphase {__version__}"


@pytest.mark.model
def test_ask_json_two_turns_are_consistent():
    result = chatphase(
        "ask",
        "--json",
        "--temperature",
        "0",
        "--max-tokens",
        "24",
        "--n-ctx",
        "1024",
        "Name a fruit.",
        "Name a vegetable.",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    for key in ("path", "name", "architecture", "n_params", "size_bytes", "n_layer"):
        assert key in data["model"]
    for key in ("n_ctx", "n_batch", "n_threads", "n_gpu_layers", "gpu_offload_supported", "gpu_margin_mib"):
        assert key in data["settings"]
    if not data["settings"]["gpu_offload_supported"]:  # n_gpu_layers auto (the default): 0, and why; all on the host
        assert data["model"]["placement"] == [{"device": "CPU", "host": None, "layers": "0-29", "output_layer": True}]
        assert data["settings"]["n_gpu_layers"] == 0
        assert (
            data["settings"]["n_gpu_layers_why"] == "auto: 0 layers, CPU-only build: no GPU support in this llama.cpp"
        )
    t1, t2 = (t["metrics"] for t in data["turns"])
    for m in (t1, t2):
        assert m["prefill_tokens"] + m["cached_tokens"] == m["prompt_tokens"]
        assert m["kv_cache_bytes"] == m["kv_cache_tokens"] * m["kv_bytes_per_token"] == m["kv_cache_tokens"] * 23_040
        if m["decode_tokens"] >= 2:
            assert m["decode_tokens_per_s"] == pytest.approx((m["decode_tokens"] - 1) / (m["decode_ms"] / 1000))
    assert t1["cached_tokens"] == 0 and t2["cached_tokens"] >= t1["prompt_tokens"]
    assert t2["kv_cache_tokens"] > t1["kv_cache_tokens"]
    assert all(t["reply"] for t in data["turns"])
    assert "llama_" not in result.stderr  # llama.cpp's log stays in the log file


@pytest.mark.model
def test_ask_streams_reply_and_prints_a_metrics_line():
    result = chatphase("ask", "--temperature", "0", "--max-tokens", "12", "Say hello.")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "[turn 1]" in result.stderr and "TTFT" in result.stderr and "tok/s" in result.stderr


def test_bad_usage_and_bad_models_exit_2_with_one_line(tmp_path):
    html = tmp_path / "page.gguf"
    html.write_text("<!doctype html><html><body>Not found</body></html>")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    cases = [
        ("--model", str(tmp_path / "missing.gguf")),
        ("--model", str(tmp_path)),
        ("--model", str(html)),
        ("--model", str(empty)),
        ("--n-ctx", "4"),
        ("--temperature", "-1"),
    ]
    for args in cases:
        result = chatphase("ask", *args, "hello", timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("chatphase: "), (args, result.stderr)
        assert "Traceback" not in result.stderr


@pytest.mark.model
def test_a_message_too_long_for_the_context_is_refused():
    result = chatphase("ask", "--n-ctx", "64", "--max-tokens", "8", "word " * 300)
    assert result.returncode == 2
    assert "refused" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.model
@pytest.mark.parametrize("n_ctx", ["16", "31"])
def test_an_n_ctx_under_a_prompt_s_length_runs_the_context_llama_cpp_made(n_ctx):
    """Seen: ``--n-ctx 16`` to 31 aborted the engine (SIGABRT) on a 40-token prompt. llama.cpp pads n_ctx to 256
    but clamps n_batch to the n_ctx asked for; the prefill chunked by the setting (256) and llama_decode's
    ``n_tokens_all <= n_batch`` assert fired. It chunks by llama.cpp's own n_batch now."""
    result = chatphase("ask", "--no-save", "--n-ctx", n_ctx, "--max-tokens", "4", "Hello there, how are you today?")
    assert result.returncode == 0, result.stderr
    assert f"n_ctx {n_ctx} -> 256" in result.stderr and "prompt " in result.stderr


@pytest.mark.model
def test_truncated_model_exits_2(tmp_path, default_model_path):
    truncated = tmp_path / "truncated.gguf"
    with open(default_model_path, "rb") as src:
        truncated.write_bytes(src.read(5_000_000))
    result = chatphase("ask", "--model", str(truncated), "hello", timeout=60)
    assert result.returncode == 2 and "truncated" in result.stderr.lower(), result.stderr


@pytest.mark.parametrize(
    "argv, start",
    [
        (["ask"], "chatphase ask: the following arguments are required: PROMPT"),
        (["ask", "--n-ctx", "x", "hi"], "chatphase ask: argument --n-ctx: expected a number or auto, got 'x'"),
        (["--n-ctx", "x"], "chatphase chat: argument --n-ctx"),
        (["sessions", "rename"], "chatphase sessions rename: the following arguments are required: ID, TITLE"),
        (["frob"], "chatphase: unknown command 'frob' (commands: chat, ask,"),
    ],
)
def test_usage_errors_are_one_line_not_the_whole_usage(argv, start, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits itself
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(start) and err.count("\n") == 1, err
    assert "usage:" not in err
