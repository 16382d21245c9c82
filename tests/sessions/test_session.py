"""Session files: append-only records, partial turns, torn lines, list/rename/delete/resume."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from session_support import MODEL, SETTINGS, FullDisk, Streamed, record_turns, scripted_metrics

from chatphase.engine.events import Message
from chatphase.sessions import writer as session_writer
from chatphase.sessions.catalog import delete_session, list_sessions, load_session, rename_session, resolve_session_path
from chatphase.sessions.store import SessionError, sessions_dir
from chatphase.sessions.writer import SessionWriter


def new_writer(**kw) -> SessionWriter:
    return SessionWriter.create(model=MODEL, settings=SETTINGS, **kw)


def test_recorded_turns_load_back_with_metrics():
    rec = new_writer()
    record_turns(rec, [("Hello there", ["Hi", "!", " How"]), ("Tell me more", ["Sure", "."])])
    rec.close()
    s = load_session(rec.id)
    assert s.id == rec.id and s.title == "Hello there" and s.model_name == "TestModel-1M"
    assert s.settings == SETTINGS and s.corrupt_lines == 0
    assert [(t.index, t.user, t.reply, t.status) for t in s.turns] == [
        (1, "Hello there", "Hi! How", "complete"),
        (2, "Tell me more", "Sure.", "complete"),
    ]
    assert s.turns[0].metrics == scripted_metrics(3) and s.turns[1].metrics == scripted_metrics(2)
    assert s.turns[0].started and s.turns[0].finished


def test_nothing_written_before_the_first_turn():
    rec = new_writer()
    rec.close()
    assert not rec.path.exists() and list_sessions() == []


def test_files_live_in_data_dir_and_are_private(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATPHASE_DATA_DIR", str(tmp_path / "d"))
    rec = new_writer()
    record_turns(rec, [("q", ["a"])])
    assert rec.path.parent == tmp_path / "d" / "sessions" == sessions_dir()
    assert oct(rec.path.stat().st_mode & 0o777) == oct(0o600)


def test_turn_in_flight_is_on_disk_as_partial(monkeypatch):
    monkeypatch.setattr(session_writer, "TEXT_FLUSH_S", 0.0)
    rec = new_writer()
    record_turns(rec, [("first", ["done"])])
    text = Streamed()
    rec.begin_turn("second", text=text)
    for piece in ("half ", "a reply"):
        text.reply += piece
        rec.stream()
    # no turn_end and no close(): what a SIGKILL leaves behind
    s = load_session(rec.id)
    assert [t.status for t in s.turns] == ["complete", "partial"]
    assert s.turns[1].reply == "half a reply" and s.turns[1].metrics is None
    assert list_sessions()[0].partial_turns == 1


def test_torn_last_line_is_skipped_and_resume_appends_cleanly():
    rec = new_writer()
    record_turns(rec, [("one", ["1"]), ("two", ["2"])])
    rec.close()
    with open(rec.path, "a", encoding="utf-8") as fh:
        fh.write('{"type": "turn_start", "turn": 3, "us')  # killed mid-write
    s = load_session(rec.id)
    assert len(s.turns) == 2 and s.corrupt_lines == 1
    rec2, loaded = SessionWriter.resume(rec.id)
    assert loaded.turns == s.turns
    record_turns(rec2, [("three", ["3"])])
    s = load_session(rec.id)
    assert [t.index for t in s.turns] == [1, 2, 3] and s.turns[2].status == "complete"
    assert s.corrupt_lines == 1  # the torn line stays alone on its line; nothing glued to it


@hsettings(max_examples=60, deadline=None)
@given(cut=st.integers(min_value=0, max_value=10_000))
def test_any_truncation_loads_a_prefix_of_the_turns(cut, tmp_path_factory):
    d = tmp_path_factory.mktemp("trunc")
    rec = SessionWriter.create(model=MODEL, settings=SETTINGS, directory=d)
    record_turns(rec, [("one", ["a", "b"]), ("twö ✓", ["ü", "nicode"]), ("three", ["c"])])
    rec.close()
    full = load_session(rec.id, d)
    data = rec.path.read_bytes()
    rec.path.write_bytes(data[: cut % (len(data) + 1)])
    try:
        s = load_session(rec.id, d)
    except SessionError:  # only when the header line itself is cut
        assert b"\n" not in data[: cut % (len(data) + 1)]
        return
    assert len(s.turns) <= len(full.turns)
    for got, want in zip(s.turns, full.turns, strict=False):
        assert got.index == want.index and got.user == want.user
        assert got.status == want.status or got.status == "partial"
        if got.status == "complete":
            assert got == want


def test_history_for_resume():
    rec = new_writer()
    record_turns(rec, [("one", ["1"]), ("two", ["2"])])
    rec.begin_turn("three")  # killed before any text: left out of the history
    rec.close()
    _, s = SessionWriter.resume("last")
    assert s.history() == [
        Message("system", "Be brief."),
        Message("user", "one"),
        Message("assistant", "1"),
        Message("user", "two"),
        Message("assistant", "2"),
    ]


def fixed_ids(monkeypatch, *ids):
    it = iter(ids)
    monkeypatch.setattr(session_writer, "new_session_id", lambda: next(it))


def test_list_rename_delete_and_id_resolution(monkeypatch):
    fixed_ids(monkeypatch, "20260101-000000-aaaa", "20260101-000000-bbbb")
    a, b = new_writer(title="alpha"), new_writer()
    record_turns(a, [("x", ["y"])])
    record_turns(b, [("What is prefill?", ["It is"]), ("and decode?", ["that"])])
    os.utime(a.path, (1, 1))  # a was used long ago
    listed = list_sessions()
    assert [(x.id, x.title, x.turns, x.model) for x in listed] == [
        (b.id, "What is prefill?", 2, "TestModel-1M"),
        (a.id, "alpha", 1, "TestModel-1M"),
    ]
    assert resolve_session_path("last") == b.path
    assert resolve_session_path("20260101-000000-b") == b.path
    rename_session(a.id, "  renamed   session ")
    assert load_session(a.id).title == "renamed session"
    with pytest.raises(SessionError, match="empty"):
        rename_session(a.id, "   ")
    gone = delete_session(a.id)
    assert gone.title == "renamed session" and not a.path.exists()
    with pytest.raises(SessionError, match="no session"):
        load_session(a.id)
    with pytest.raises(SessionError, match="not a session id"):
        load_session("../etc/passwd")


def test_ambiguous_prefix_and_empty_store(monkeypatch):
    with pytest.raises(SessionError, match="no saved sessions"):
        load_session("last")
    fixed_ids(monkeypatch, "20260101-000000-aaaa", "20260101-000000-aaab")
    for _ in range(2):
        record_turns(new_writer(), [("q", ["a"])])
    with pytest.raises(SessionError, match="ambiguous"):
        load_session("20260101-000000-aaa")


def test_file_is_one_json_object_per_line():
    rec = new_writer()
    record_turns(rec, [("q", ["a", "b"])])
    rec.set_model({"name": "Other"}, {"n_ctx": 1024})
    record_turns(rec, [("q2", ["c"])])
    kinds = [json.loads(line)["type"] for line in rec.path.read_text().splitlines()]
    assert kinds[0] == "session" and kinds.count("turn_start") == 2 and kinds.count("turn_end") == 2
    s = load_session(rec.id)
    assert [t.model for t in s.turns] == ["TestModel-1M", "Other"] and s.settings == {"n_ctx": 1024}


def test_write_errors_raise_or_go_to_on_error(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    rec = SessionWriter.create(model=MODEL, settings=SETTINGS, directory=blocker / "sessions")
    with pytest.raises(SessionError, match="cannot save the session"):
        rec.begin_turn("q")
    errors = []
    rec = SessionWriter.create(model=MODEL, settings=SETTINGS, directory=blocker / "sessions")
    rec.on_error = errors.append
    record_turns(rec, [("q", ["a", "b"]), ("q2", ["c"])])  # the chat goes on
    rec.close()
    assert len(errors) == 1 and "cannot save the session" in errors[0] and rec.failed == errors[0]


def test_replaced_and_interrupted_turns():
    rec = new_writer()
    record_turns(rec, [("one", ["1"]), ("two", ["2"])])
    rec.replace_turns([2])
    n = rec.begin_turn("two again", text=Streamed("par"))
    rec.begin_turn("three")  # the open turn is ended as interrupted (partial), its text kept
    rec.close()
    s = load_session(rec.id)
    assert [(t.index, t.status, t.replaced) for t in s.turns] == [
        (1, "complete", False),
        (2, "complete", True),
        (n, "partial", False),
        (4, "partial", False),
    ]
    assert s.turns[2].reply == "par" and s.turns[2].finished
    assert [m.content for m in s.history()] == ["Be brief.", "one", "1", "two again", "par"]


@hsettings(max_examples=40, deadline=None)
@given(user=st.text(min_size=1), pieces=st.lists(st.text(min_size=1), min_size=1, max_size=5))
def test_any_text_round_trips(tmp_path_factory, user, pieces):
    d = tmp_path_factory.mktemp("text")
    rec = SessionWriter.create(model=MODEL, settings=SETTINGS, directory=d)
    record_turns(rec, [(user, pieces)])
    rec.close()
    (t,) = load_session(rec.id, d).turns
    assert (t.user, t.reply, t.status) == (user, "".join(pieces), "complete")


def test_an_error_ends_the_turn_as_failed_with_the_metrics_it_has():
    rec = new_writer()
    rec.begin_turn("q", text=Streamed("cut "))
    rec.stream()  # a remote stream cut mid-reply: the engine still reports the partial reply's figures
    rec.finish_turn(
        "cut ",
        scripted_metrics(1, stop="error"),
        error="the connection was cut mid-reply; the partial reply is kept",
    )
    rec.begin_turn("too long", text=Streamed())
    rec.finish_turn("", None, error="the message does not fit n_ctx")  # failed before any text: no metrics
    rec.close()
    s = load_session(rec.id)
    assert [(t.status, t.reply, t.error) for t in s.turns] == [
        ("failed", "cut ", "the connection was cut mid-reply; the partial reply is kept"),
        ("failed", "", "the message does not fit n_ctx"),
    ]
    assert s.turns[0].metrics == scripted_metrics(1, stop="error") and s.history() == [Message("system", "Be brief.")]


def test_an_unsaved_chat_reads_its_open_turn_from_the_turns_text(monkeypatch):
    """In memory nothing needs to survive a kill: the open turn's text is read from the turn when the
    session is asked for, never copied into records as it streams."""
    monkeypatch.setattr(session_writer, "TEXT_FLUSH_S", 0.0)
    rec = SessionWriter.in_memory(model=MODEL, settings=SETTINGS)
    record_turns(rec, [("one", ["1"])])
    text = Streamed()
    rec.begin_turn("two", text=text)
    text.reply, text.thinking = "half", "hmm"
    rec.stream()
    assert not [r for r in rec.records if r["type"] in ("text", "thinking")]
    s = rec.session()
    assert [(t.reply, t.thinking, t.status) for t in s.turns] == [("1", "", "complete"), ("half", "hmm", "partial")]
    rec.close()  # the chat moves on (a new chat): the open turn stays, partial, as it was
    text.reply = "more"
    assert rec.session() == s


def test_a_full_disk_at_close_is_told_not_raised(monkeypatch):
    """Disk full: the buffered text cannot be flushed when the file is closed (at quit); that is a write
    error like any other (``on_error`` or SessionError), never a bare OSError, and the file is closed."""
    files: list[FullDisk] = []
    monkeypatch.setattr(session_writer, "open_append", lambda path: files.append(FullDisk()) or files[-1])
    errors: list[str] = []
    rec = new_writer()
    rec.on_error = errors.append
    rec.begin_turn("q", text=Streamed("partial reply"))
    rec.close()
    assert errors == [rec.failed] and "No space left on device" in errors[0] and files[0].closed
    monkeypatch.setattr(FullDisk, "full", False)  # the disk fills after the turn began
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # FullDisk has no file descriptor
    rec = new_writer()  # no on_error: the close raises the one-line SessionError
    rec.begin_turn("q", text=Streamed("partial reply"))
    monkeypatch.setattr(FullDisk, "full", True)
    with pytest.raises(SessionError, match="No space left on device"):
        rec.close()
    assert files[1].closed
