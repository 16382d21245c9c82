"""The crash test: SIGKILL a real ``chatphase ask`` mid-reply, then list and export the session, and read it
back from the history database (``chatphase logs``).

Every finished turn must be there with its metrics, and the turn in flight kept as partial with the
text streamed so far. Uses the bundled default model (greedy, small n_ctx); the first two prompts get
short replies, the third a long one, which is killed as soon as its first text is on disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from chatphase.sessions.export import rows_from_csv
from chatphase.sessions.store import parse_records, sessions_dir

PROMPTS = ("What is 2+2?", "What is the capital of France?", "Write a very long story about a dragon and a knight.")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chatphase", *args], capture_output=True, text=True, timeout=60)


def records_on_disk() -> list[dict]:
    files = list(sessions_dir().glob("*.jsonl"))
    assert len(files) <= 1
    if not files:
        return []
    with open(files[0], encoding="utf-8") as fh:
        return parse_records(fh)[0]


def wait_for_turn_text(proc: subprocess.Popen, turn: int, timeout_s: float = 240) -> None:
    """Poll the session file until turn ``turn`` has streamed text (and has not ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"ask exited ({proc.returncode}) before the kill: {proc.stderr.read()}")
        recs = records_on_disk()
        if any(r["type"] == "turn_end" and r["turn"] == turn for r in recs):
            pytest.fail(f"turn {turn} finished before it could be killed; use a longer prompt")
        if any(r["type"] == "text" and r["turn"] == turn for r in recs):
            return
        time.sleep(0.05)
    raise AssertionError(f"no text of turn {turn} after {timeout_s} s")


def test_sigkill_mid_reply_keeps_finished_turns_and_marks_the_partial_one(default_model_path):
    cmd = [
        sys.executable,
        "-m",
        "chatphase",
        "ask",
        "--max-tokens",
        "400",
        "--temperature",
        "0",
        "--n-ctx",
        "1024",
        *PROMPTS,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_turn_text(proc, 3)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # ask and its engine process: no chance to clean up
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    listed = cli("sessions", "--json")
    assert listed.returncode == 0, listed.stderr
    (summary,) = json.loads(listed.stdout)
    assert (summary["turns"], summary["partial_turns"]) == (3, 1)
    assert summary["title"] == PROMPTS[0] and "smollm2" in summary["model"].lower()

    exported = cli("export", summary["id"], "--format", "json")
    assert exported.returncode == 0, exported.stderr
    turns = json.loads(exported.stdout)["turns"]
    assert [t["user"] for t in turns] == list(PROMPTS)
    assert [t["status"] for t in turns] == ["complete", "complete", "partial"]
    for t in turns[:2]:
        m = t["metrics"]
        assert t["reply"] and m["decode_tokens"] > 0 and m["ttft_ms"] > 0 and m["stop_reason"] in ("stop", "length")
        assert m["prompt_tokens"] == m["prefill_tokens"] + m["cached_tokens"]
    assert turns[1]["metrics"]["cached_tokens"] > 0  # the conversation's prefix was reused in one process
    assert turns[2]["metrics"] is None and turns[2]["reply"]  # partial: the streamed text is kept

    csv_out = cli("export", summary["id"], "--format", "csv")
    assert [r["status"] for r in rows_from_csv(csv_out.stdout)] == ["complete", "complete", "partial"]
    md = cli("export", "last", "--format", "md").stdout
    assert md.count("_partial turn:") == 1 and "| 3 | partial |" in md

    logged = cli("logs", "--json")  # the history: the turns the live index wrote, and the killed one caught up
    assert logged.returncode == 0, logged.stderr
    rows = sorted(json.loads(logged.stdout), key=lambda r: r["turn"])
    assert [(r["user"], r["status"]) for r in rows] == list(
        zip(PROMPTS, ["complete", "complete", "partial"], strict=True)
    )
    assert rows[2]["reply"] == turns[2]["reply"] and rows[0]["ttft_ms"] == turns[0]["metrics"]["ttft_ms"]
    assert rows[0]["backend"] == "llama.cpp" and rows[0]["model_hash"] and rows[0]["machine"] is not None
