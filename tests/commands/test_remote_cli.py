"""``--server`` on the commands: ``ask`` against a scripted llama-server on loopback, and the one-line
errors and exit codes for an unreachable server, a malformed URL and an unset API-key variable."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from remote_support import ScriptedServer, content_chunk, free_port, sse

from chatphase.cli import main

pytestmark = pytest.mark.timeout(60)

MODELS = {"data": [{"id": "tiny", "object": "model"}]}
PROPS = {"default_generation_settings": {"n_ctx": 1024}, "total_slots": 1}
TIMINGS = {"prompt_n": 12, "prompt_ms": 4.0, "cache_n": 0, "predicted_n": 3, "predicted_ms": 5.0}


def _routes():
    stream = sse(
        content_chunk("Hi"),
        content_chunk(" there"),
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "timings": TIMINGS,
            "usage": {"prompt_tokens": 12, "completion_tokens": 3},  # the EOG token counted
        },
        "[DONE]",
    )
    return {"GET /v1/models": (200, MODELS), "GET /props": (200, PROPS), "POST /v1/chat/completions": (200, stream)}


def test_ask_json_over_a_server(capsys, monkeypatch):
    secret = "sk-cli-secret-987"
    monkeypatch.setenv("CLI_TEST_KEY", secret)
    with ScriptedServer(_routes()) as srv:
        rc = main(["ask", "--server", srv.url, "--api-key-env", "CLI_TEST_KEY", "--json", "hello"])
        sent = srv.requests[-1]
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(out)
    turn = data["turns"][0]
    assert turn["reply"] == "Hi there" and turn["metrics"]["decode_tokens"] == 2
    assert turn["metrics"]["prompt_tokens"] == 12 and turn["metrics"]["prefill_ms"] == 4.0
    assert data["model"]["name"] == "tiny" and data["settings"]["n_ctx"] == 1024
    assert sent[2]["Authorization"] == f"Bearer {secret}" and sent[3]["messages"][-1]["content"] == "hello"
    assert secret not in out and secret not in err


def test_ask_unreachable_server_is_one_line_exit_1(capsys):
    rc = main(["ask", "--server", f"http://127.0.0.1:{free_port()}", "hello"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "connection refused" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--server", "ftp://example"], "http(s) URL"),
        (["--server", "http://127.0.0.1:9", "--api-key-env", "CHATPHASE_TEST_UNSET_VAR"], "CHATPHASE_TEST_UNSET_VAR"),
        (["--remote-model", "x"], "need --server"),
    ],
)
def test_bad_server_options_are_usage_errors(capsys, monkeypatch, argv, needle):
    monkeypatch.delenv("CHATPHASE_TEST_UNSET_VAR", raising=False)
    rc = main(["ask", *argv, "hello"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and needle in err


def test_bench_over_a_server_sends_exact_token_prompts(default_model_path):
    """Run as the CLI runs: a fresh process (it loads the model's vocabulary into llama.cpp)."""
    text = lambda t: {"choices": [{"index": 0, "text": t, "finish_reason": None}]}  # noqa: E731
    stream = sse(
        text("a"),
        text("b"),
        {
            "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
            "timings": {"prompt_n": 16, "prompt_ms": 3.0, "cache_n": 0, "predicted_n": 2, "predicted_ms": 2.0},
            "usage": {"prompt_tokens": 16, "completion_tokens": 2},
        },
        "[DONE]",
    )
    routes = {"GET /v1/models": (200, MODELS), "GET /props": (200, PROPS), "POST /v1/completions": (200, stream)}
    with ScriptedServer(routes) as srv:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "chatphase",
                "bench",
                "--server",
                srv.url,
                "--model",
                str(default_model_path),
                "--prompt-lengths",
                "16",
                "--depths",
                "none",
                "--gen",
                "2",
                "--reps",
                "2",
                "--warmup",
                "0",
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        bodies = [r[3] for r in srv.requests if r[1] == "/v1/completions"]
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err
    assert len(bodies) == 2 and all(len(b["prompt"]) == 16 and b["cache_prompt"] is False for b in bodies)
    assert all(b["ignore_eos"] is True and b["max_tokens"] == 2 for b in bodies)
    assert json.loads(out)["results"][0]["prompt_tokens"] == 16
