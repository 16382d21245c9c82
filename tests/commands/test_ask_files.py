"""`chatphase ask -f FILE` headless: every bad file is one line and exit 2 with nothing sent; good files go
into the first message, counted by the engine's tokenizer (the fake engine: one token a word)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from fake_engine import FakeEngine, fake_model_info

from chatphase.chat.attachments import split_message
from chatphase.cli import main
from chatphase.commands import ask


@pytest.fixture
def engines(monkeypatch):
    """The engines ``ask`` starts (fakes, no model file); the model is never looked up on disk."""
    made: list[FakeEngine] = []

    def engine_for(settings, info):
        made.append(FakeEngine(info, settings.engine, replies=["fine"], notes=()))
        return made[-1]

    monkeypatch.setattr(ask, "model_info_for", lambda settings, pull=False: fake_model_info())
    monkeypatch.setattr(ask, "engine_for", engine_for)
    return made


def run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(["ask", "--no-save", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chatphase: "), err
    assert "Traceback" not in err and "Error" not in err
    return lines[0]


def _bad_files(tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"GGUF\x00\x01")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"ok \xe9t\xe9")
    return {
        "binary": (binary, "binary file (a NUL byte at offset 4)"),
        "not utf-8": (latin, "is not UTF-8 text (a bad byte at offset 3)"),
        "directory": (tmp_path, "is a directory"),
        "missing": (tmp_path / "gone.txt", "no such file"),
    }


@pytest.mark.parametrize("case", ["binary", "not utf-8", "directory", "missing"])
def test_a_bad_file_is_one_line_exit_2_and_nothing_is_sent(case, tmp_path, capsys, engines):
    path, says = _bad_files(tmp_path)[case]
    code, out, err = run(capsys, "-f", str(path), "summarise")
    assert code == 2 and out == ""
    assert says in one_line(err)
    assert engines == []  # refused before the model was even loaded


def test_a_fifo_is_one_line_exit_2_at_once(tmp_path):
    """A named pipe is refused from its mode: ``ask`` never opens it (that waits for a writer forever)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    argv = [sys.executable, "-m", "chatphase", "ask", "--no-save", "-f", str(fifo), "summarise"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:  # the child is killed: the suite goes on
        pytest.fail("ask -f FIFO blocked for 30 s")
    assert done.returncode == 2 and done.stdout == ""
    assert one_line(done.stderr) == f"chatphase: {fifo}: not a regular file (a named pipe): only text files go in"


def test_an_unreadable_file_is_refused(tmp_path, capsys, engines, monkeypatch):
    f = tmp_path / "locked.txt"
    f.write_text("x")

    def denied(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    from chatphase.chat import attachments

    monkeypatch.setattr(attachments, "open", denied, raising=False)
    code, _out, err = run(capsys, "-f", str(f), "summarise")
    assert code == 2 and "permission denied" in one_line(err) and engines == []


def test_a_file_of_more_tokens_than_the_context_is_refused_before_sending(tmp_path, capsys, engines):
    f = tmp_path / "long.txt"
    f.write_text("word " * 100)  # 100 tokens to the fake, 500 bytes: under the unread limit of 64 × 64
    code, _out, err = run(capsys, "--n-ctx", "64", "-f", str(f), "summarise")
    assert code == 2
    assert one_line(err) == (
        f"chatphase: {f} is 100 tokens: larger than the context of 64 tokens (raise --n-ctx or attach a part of it)"
    )
    assert engines[0].requests == []  # counted, never sent


def test_a_message_that_would_not_fit_says_so_with_the_numbers(tmp_path, capsys, engines):
    f = tmp_path / "mid.txt"
    f.write_text("word " * 60)
    code, _out, err = run(capsys, "--n-ctx", "64", "-f", str(f), "summarise")
    assert code == 2 and engines[0].requests == []
    assert one_line(err).startswith(
        "chatphase: message not sent: Does not fit: the message needs more than the context"
    )


def test_files_and_stdin_go_into_the_first_message_with_their_budget(tmp_path, capsys, engines, monkeypatch):
    f = tmp_path / "notes.txt"
    f.write_text("alpha beta gamma\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"piped words here")))
    code, out, err = run(capsys, "--json", "-f", str(f), "-f", "-", "Summarise both.", "Thanks.")
    assert code == 0, err
    turns = json.loads(out)["turns"]
    own, files = split_message(turns[0]["prompt"])
    assert own == "Summarise both." and [(a.name, a.text) for a in files] == [
        (str(f), "alpha beta gamma\n"),
        ("stdin", "piped words here"),
    ]
    assert turns[1]["prompt"] == "Thanks."
    sent = engines[0].requests[0].messages[-1].content
    assert sent == turns[0]["prompt"]
    assert turns[0]["metrics"]["ttft_predicted_ms"] is None  # nothing measured before the first turn
    assert turns[0]["metrics"]["ttft_prediction_note"] == "not enough turns yet (0)"
    assert turns[1]["metrics"]["ttft_predicted_ms"] is None  # one turn measured: not enough
    assert turns[1]["metrics"]["ttft_prediction_note"] == "not enough turns yet (1)"


def test_without_json_the_files_and_the_budget_go_to_stderr(tmp_path, capsys, engines):
    f = tmp_path / "notes.txt"
    f.write_text("alpha beta gamma\n")
    code, _out, err = run(capsys, "-f", str(f), "Summarise.", "Thanks.")
    assert code == 0, err
    lines = err.splitlines()
    assert "(not predicted: not enough turns yet (0))" in lines[2] and lines[2].startswith("[turn 1]")
    assert lines[3].startswith("[turn 2]") and " (not predicted: not enough turns yet (1)" in lines[3]
    assert lines[0] == f"chatphase: {f} · 17 B · 3 tok"
    assert lines[1].startswith("chatphase: +") and "context 0 % → " in lines[1]
    assert "TTFT: not enough turns yet (0)" in lines[1]
