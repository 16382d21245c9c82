"""``chatphase sessions`` and ``chatphase export`` through the real CLI entry point."""

from __future__ import annotations

import argparse
import json

import pytest
from session_support import MODEL, SETTINGS, record_turns

from chatphase.cli import main
from chatphase.commands.options import settings_from_args
from chatphase.errors import UsageError
from chatphase.sessions import writer as session_writer
from chatphase.sessions.catalog import load_session
from chatphase.sessions.export import rows_from_csv, session_from_json
from chatphase.sessions.writer import SessionWriter


@pytest.fixture
def two_sessions(monkeypatch):
    ids = iter(["20260101-000000-aaaa", "20260102-000000-bbbb"])
    monkeypatch.setattr(session_writer, "new_session_id", lambda: next(ids))
    a = SessionWriter.create(model=MODEL, settings=SETTINGS)
    record_turns(a, [("What is TTFT?", ["Time", " to first token."])])
    a.close()
    b = SessionWriter.create(model=MODEL, settings=SETTINGS)
    record_turns(b, [("one", ["1"]), ("two", ["2"])])
    b.begin_turn("three")
    b.close()
    return a, b


def test_list_empty(capsys):
    assert main(["sessions"]) == 0
    assert "no saved sessions" in capsys.readouterr().out
    assert main(["sessions", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_list_table_and_json(two_sessions, capsys):
    assert main(["sessions"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ID", "TITLE", "MODEL", "TURNS", "LAST", "USED"]
    assert {line.split()[0] for line in out[1:]} == {"20260101-000000-aaaa", "20260102-000000-bbbb"}
    assert any("3 (1 partial)" in line for line in out)
    assert main(["sessions", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["20260101-000000-aaaa"]["title"] == "What is TTFT?"
    assert (rows["20260102-000000-bbbb"]["turns"], rows["20260102-000000-bbbb"]["partial_turns"]) == (3, 1)
    assert rows["20260102-000000-bbbb"]["model"] == "TestModel-1M"


def test_rename_and_delete(two_sessions, capsys):
    assert main(["sessions", "rename", "20260101", "TTFT", "notes"]) == 0
    assert load_session("20260101-000000-aaaa").title == "TTFT notes"
    assert main(["sessions", "delete", "20260101-000000-aaaa"]) == 2  # stdin is not a terminal: needs --yes
    assert "without --yes" in capsys.readouterr().err
    assert main(["sessions", "delete", "20260101-000000-aaaa", "--yes"]) == 0
    assert "deleted 20260101-000000-aaaa: TTFT notes" in capsys.readouterr().out
    assert main(["sessions", "delete", "20260101-000000-aaaa", "--yes"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "chatphase: no session '20260101-000000-aaaa' (see `chatphase sessions`)"


def test_export_formats(two_sessions, capsys, tmp_path):
    assert main(["export", "20260101", "--format", "json"]) == 0
    assert session_from_json(capsys.readouterr().out) == load_session("20260101-000000-aaaa")
    assert main(["export", "20260102", "-o", str(tmp_path / "t.csv")]) == 0  # format from the extension
    assert "as csv" in capsys.readouterr().err
    rows = rows_from_csv((tmp_path / "t.csv").read_text())
    assert [r["status"] for r in rows] == ["complete", "complete", "partial"]
    assert main(["export"]) == 0  # the latest session, as Markdown
    md = capsys.readouterr().out
    assert md.startswith("# ") and "## Metrics" in md and "_partial turn:" in md


def test_export_counts_one_turn_in_the_singular(two_sessions, capsys, tmp_path):
    assert main(["export", "20260101", "-o", str(tmp_path / "t.md")]) == 0
    assert "exported 20260101-000000-aaaa (1 turn) as md" in capsys.readouterr().err
    assert main(["export", "20260102", "-o", str(tmp_path / "t.md")]) == 0
    assert "(3 turns)" in capsys.readouterr().err


def test_export_errors(two_sessions, capsys, tmp_path):
    assert main(["export", "nope"]) == 1
    assert capsys.readouterr().err.startswith("chatphase: no session 'nope'")
    assert main(["export", "20260101", "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "--format", "xml"])


def test_chat_resume_of_an_unknown_session_is_one_line_before_the_tui(capsys):
    assert main(["chat", "--resume", "nope"]) == 1
    assert capsys.readouterr().err.strip() == "chatphase: no session 'nope' (see `chatphase sessions`)"
    assert main(["--resume"]) == 1  # chat is the default command; nothing saved yet
    assert "no saved sessions" in capsys.readouterr().err


def test_commands_start_from_the_config_file_and_environment(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "config.toml"
    cfg.write_text("[sampling]\ntemperature = 'hot'\n")
    monkeypatch.setenv("CHATPHASE_CONFIG", str(cfg))
    monkeypatch.setenv("CHATPHASE_N_CTX", "huge")
    with pytest.raises(UsageError, match="environment variable CHATPHASE_N_CTX: expected an integer"):
        settings_from_args(argparse.Namespace())
    monkeypatch.setenv("CHATPHASE_N_CTX", "2048")
    s = settings_from_args(argparse.Namespace(top_k=5))
    assert (s.engine.n_ctx, s.sampling.top_k, s.sampling.temperature) == (2048, 5, 0.7)  # env, flag, default (bad file)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"chatphase: config file {cfg}, line 2, key 'sampling.temperature': expected a number, "
        "got 'hot'; using built-in defaults"
    )


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """``chatphase sessions | head``: the broken pipe is no traceback, just the exit status of one."""
    import subprocess
    import sys

    code = (
        "import sys; from chatphase import cli; from chatphase.commands import sessions;"
        "sessions.run = lambda args: (_ for _ in ()).throw(BrokenPipeError());"
        "sys.exit(cli.main(['sessions']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 141 and result.stderr == ""
