"""The history database (chatphase/history): taking over the session files, the crash and concurrency guarantees,
``chatphase logs`` and ``chatphase stats``, the schema's migrations."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest
from session_support import MODEL, SETTINGS, Streamed, record_turns, scripted_metrics

from chatphase.cli import main
from chatphase.engine.events import DeviceInfo, LoadedModel, LoadedSettings
from chatphase.engine.metrics import TurnMetrics, compute_turn_metrics
from chatphase.history import context as ctx_mod
from chatphase.history.db import SCHEMA_VERSION, HistoryError, HistoryUnwritable, connect, db_path, write_refusal
from chatphase.history.index import LiveIndex, catch_up
from chatphase.history.query import Filters, fts_query, group_stats, logs, parse_time
from chatphase.models.gguf_meta import ModelInfo
from chatphase.sessions.catalog import delete_session, rename_session
from chatphase.sessions.store import load_session_file, sessions_dir
from chatphase.sessions.writer import SessionWriter
from chatphase.timing.fits import linear_fit

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = {
    "model_hash": "0123456789abcdef",
    "backend": "llama.cpp",
    "backend_build": "llama-cpp-python 0.3.36",
    "engine": {"n_ctx": 512, "n_threads": 4, "type_k": "f16", "type_v": "f16", "flash_attn": "auto", "spec": "off"},
    "spec_mode": "off",
    "machine": "gpu-box",
    "cpu": "AMD EPYC 9454",
    "physical_cores": 48,
    "gpu": "NVIDIA H200",
    "chatphase_version": "9.9.9",
}


def metrics(prompt: int, ttft_ms: float, decode_tps: float = 50.0, cached: int = 0) -> TurnMetrics:
    """Metrics with TTFT ``ttft_ms`` at ``prompt`` tokens and a decode rate of ``decode_tps`` (10 tokens)."""
    t0 = 1_000_000_000
    step = round(1e9 / decode_tps)
    first = t0 + round(ttft_ms * 1e6)
    return compute_turn_metrics(
        t_submit_ns=t0,
        t_prefill_start_ns=t0,
        t_prefill_end_ns=first,
        token_times_ns=[first + i * step for i in range(10)],
        prompt_tokens=prompt,
        cached_tokens=cached,
        kv_cache_tokens=prompt + 10,
        kv_bytes_per_token=1000,
        kv_capacity_bytes=512_000,
        stop_reason="stop",
    )


def write_session(turns, model=MODEL, context=None) -> SessionWriter:
    """A session file of ``turns`` ``(user, reply, metrics)``, written by today's writer."""
    w = SessionWriter.create(model=model, settings=SETTINGS)
    if context is not None:
        w.set_context(context)
    for user, reply, m in turns:
        w.begin_turn(user, {"temperature": 0.0}, Streamed())
        w.finish_turn(reply, m)
    w.close()
    return w


def todays_sessions() -> list[Path]:
    """Sessions in today's format, as the writer leaves them: complete, failed, partial (killed mid-reply, a torn
    last line), taken back, renamed, a model change — and a file that is not a session."""
    a = SessionWriter.create(model=MODEL, settings=SETTINGS)
    record_turns(a, [("what is prefill", ["It is ", "the prompt."]), ("and decode?", ["One ", "token ", "at a time."])])
    a.replace_turns([2])
    a.begin_turn("and decode, again?", text=Streamed())
    a.finish_turn("", None, error="engine died")
    a.set_model({**MODEL, "name": "Other-2M"}, {**SETTINGS, "n_ctx": 1024})
    record_turns(a, [("on the other model", ["fine"])])
    a.close()
    rename_session(a.id, "renamed session")
    b = SessionWriter.create(model=MODEL, settings=SETTINGS)
    text = Streamed()
    b.begin_turn("a long story please", text=text)
    text.reply = "Once upon"
    b.close()  # the turn stays partial, as after a SIGKILL
    with open(b.path, "a", encoding="utf-8") as fh:
        fh.write('{"type":"text","turn":1,"te')  # the torn line a kill mid-write leaves
    (sessions_dir() / "junk.jsonl").write_text("not json\n")
    return [a.path, b.path]


def db_turns(conn) -> dict[tuple[str, int], tuple]:
    rows = conn.execute("SELECT session_id, turn, user, reply, status, replaced, error, metrics FROM turns").fetchall()
    return {(r[0], r[1]): r[2:] for r in rows}


def test_sessions_on_disk_are_taken_over_once_with_nothing_lost():
    paths = todays_sessions()
    conn = connect()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    first = catch_up(conn)
    assert first.indexed == 3  # two sessions and the file that is not one (remembered, not read again)
    got = db_turns(conn)
    want = {}
    for p in paths:
        s = load_session_file(p)
        for t in s.turns:
            m = json.dumps(t.metrics.to_dict()) if t.metrics else None
            want[(s.id, t.index)] = (t.user, t.reply, t.status, int(t.replaced), t.error, m)
    assert got == want and len(got) == 5
    assert {v[2] for v in got.values()} == {"complete", "failed", "partial"}
    assert catch_up(conn).indexed == 0  # once
    assert conn.execute("SELECT title FROM sessions WHERE id = ?", (paths[0].stem,)).fetchone() == ("renamed session",)
    models = conn.execute(
        "SELECT turn, model_name, n_ctx FROM turn_log WHERE session_id = ? ORDER BY turn", (paths[0].stem,)
    )
    assert [r[1:] for r in models] == [("TestModel-1M", 512)] * 3 + [("Other-2M", 1024)]


def test_a_catch_up_in_batches_takes_every_file_and_a_refused_batch_leaves_the_rest_stale(monkeypatch):
    from chatphase.history import index

    monkeypatch.setattr(index, "CATCH_UP_BATCH_FILES", 2)
    for i in range(5):
        write_session([(f"q{i}", f"a{i}", metrics(10 + i, 5.0))])
    conn = connect()
    real = index.index_file
    calls = []

    def failing_third(c, path):
        calls.append(path)
        if len(calls) == 3:
            raise sqlite3.OperationalError("disk I/O error")
        return real(c, path)

    monkeypatch.setattr(index, "index_file", failing_third)
    with pytest.raises(HistoryError):
        catch_up(conn)
    # the first batch (two files) landed; the refused one left nothing behind (its first file rolled back too)
    assert conn.execute("SELECT count(*) FROM turns").fetchone()[0] == 2
    assert not conn.in_transaction
    monkeypatch.setattr(index, "index_file", real)
    assert catch_up(conn).indexed == 3
    assert {r[0] for r in conn.execute("SELECT user FROM turns")} == {f"q{i}" for i in range(5)}


def test_a_changed_or_deleted_session_is_caught_up():
    w = write_session([("one", "1", metrics(10, 5.0))])
    conn = connect()
    catch_up(conn)
    w2 = SessionWriter.continuing(load_session_file(w.path))
    w2.begin_turn("two", text=Streamed())
    w2.finish_turn("2", metrics(20, 9.0))
    w2.close()
    assert catch_up(conn).indexed == 1
    assert [r[0] for r in conn.execute("SELECT user FROM turns ORDER BY turn")] == ["one", "two"]
    first_row = conn.execute("SELECT id FROM turns WHERE turn = 1").fetchone()
    w3 = SessionWriter.continuing(load_session_file(w.path))
    w3.replace_turns([2])  # taken back: only that turn's row is written again
    w3.close()
    assert catch_up(conn).indexed == 1
    assert conn.execute("SELECT turn, replaced FROM turns ORDER BY turn").fetchall() == [(1, 0), (2, 1)]
    assert conn.execute("SELECT id FROM turns WHERE turn = 1").fetchone() == first_row
    assert conn.execute("SELECT count(*) FROM turns_fts WHERE turns_fts MATCH 'two'").fetchone() == (1,)
    delete_session(w.id)
    assert catch_up(conn).removed == 1
    assert conn.execute("SELECT count(*) FROM turns").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM turns_fts WHERE turns_fts MATCH 'two'").fetchone() == (0,)


def test_every_turn_metric_is_stored_so_new_fields_need_no_migration():
    write_session([("q", "a", metrics(10, 5.0))])
    conn = connect()
    catch_up(conn)
    (stored,) = conn.execute("SELECT metrics FROM turns").fetchone()
    assert set(json.loads(stored)) == {f.name for f in fields(TurnMetrics)}
    (ttft,) = conn.execute("SELECT json_extract(metrics, '$.ttft_ms') FROM turns").fetchone()
    assert ttft == pytest.approx(5.0)


def test_a_database_newer_than_this_chatphase_is_refused(tmp_path):
    path = tmp_path / "h.db"
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(HistoryError, match="reads up to"):
        connect(path)
    (tmp_path / "bad.db").write_text("this is not a database, just text that is long enough" * 20)
    with pytest.raises(HistoryError, match="cannot use the history"):
        connect(tmp_path / "bad.db")


def test_the_context_record_is_written_before_the_turn_and_read_into_columns():
    w = write_session([("q", "a", metrics(10, 5.0))], context=CONTEXT)
    recs = [json.loads(line)["type"] for line in w.path.read_text().splitlines()]
    assert recs == ["session", "context", "turn_start", "turn_end"]
    conn = connect()
    catch_up(conn)
    row = conn.execute(
        "SELECT model_name, model_hash, model_quantization, backend, backend_build, n_ctx, n_threads, type_k, "
        "flash_attn, spec, machine, cpu, physical_cores, gpu, chatphase_version FROM turn_log"
    ).fetchone()
    assert row == (
        "TestModel-1M",
        "0123456789abcdef",
        "Q4_1",
        "llama.cpp",
        "llama-cpp-python 0.3.36",
        512,
        4,
        "f16",
        "auto",
        "off",
        "gpu-box",
        "AMD EPYC 9454",
        48,
        "NVIDIA H200",
        "9.9.9",
    )


def test_set_context_writes_a_record_only_when_it_changes():
    w = SessionWriter.create(model=MODEL, settings=SETTINGS)
    for ctx in (CONTEXT, CONTEXT, {**CONTEXT, "machine": "laptop"}):
        w.set_context(ctx)
        w.begin_turn("q", text=Streamed())
        w.finish_turn("a", scripted_metrics())
    w.close()
    kinds = [json.loads(line)["type"] for line in w.path.read_text().splitlines()]
    assert kinds.count("context") == 2 and kinds.index("context") == 1


def test_live_context_names_the_model_backend_and_machine(tmp_path, monkeypatch):
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    monkeypatch.setattr(ctx_mod, "machine_facts", lambda: {"machine": "box", "cpu": "Xeon", "gpu": None})
    info = ModelInfo(str(model_file), "m", "llama", 100, 2564, 2, "Q8_0", 512, 64, True)
    loaded = LoadedModel(
        info,
        LoadedSettings(n_ctx=512, n_threads=3, type_k="q8_0", type_v="f16", flash_attn="on", spec="lookup"),
        load_ms=1.0,
        kv_bytes_per_token=64,
        kv_capacity_bytes=512 * 64,
        spec_mode="lookup",
        devices=(DeviceInfo("CPU", "cpu", "cpu", 0, 0), DeviceInfo("CUDA0", "NVIDIA H200", "gpu", 1, 2)),
    )
    c = ctx_mod.live_context(loaded)
    assert c["model_hash"] == ctx_mod.model_hash(model_file) and len(c["model_hash"]) == 16
    assert c["engine"]["type_k"] == "q8_0" and c["spec_mode"] == "lookup" and c["devices"] == "NVIDIA H200"
    assert c["backend"] == "llama.cpp" and c["backend_build"].startswith("llama-cpp-python")
    assert (c["machine"], c["cpu"]) == ("box", "Xeon")
    model_file.write_bytes(b"GGUF" + bytes(range(256)) * 11)  # another file: another hash
    assert ctx_mod.model_hash(model_file) != c["model_hash"]
    remote = LoadedModel(
        info, LoadedSettings(backend="remote", server="http://gpu:8080", remote_model="qwen"), 1.0, None, None
    )
    r = ctx_mod.live_context(remote)
    assert (r["backend"], r["server"], r["remote_model"], r["model_hash"]) == (
        "remote",
        "http://gpu:8080",
        "qwen",
        None,
    )


def test_logs_filters_and_text_search():
    write_session([("explain the KV cache", "It holds keys and values.", metrics(100, 50.0))], context=CONTEXT)
    write_session(
        [("tell me a joke", "No.", metrics(30, 20.0))],
        model={**MODEL, "name": "Other-2M"},
        context={**CONTEXT, "machine": "laptop", "backend": "remote", "server": "http://gpu:8080"},
    )
    conn = connect()
    catch_up(conn)

    def users(**kw):
        return sorted(r["user"] for r in logs(conn, Filters(**kw)))

    assert users() == ["explain the KV cache", "tell me a joke"]
    assert users(model="other") == ["tell me a joke"]
    assert users(model="0123") == ["explain the KV cache", "tell me a joke"]  # hash prefix
    assert users(machine="LAPTOP") == ["tell me a joke"]
    assert users(backend="gpu:8080") == ["tell me a joke"]
    assert users(text="keys") == ["explain the KV cache"]  # in the reply
    assert users(text='cache" OR "joke') == []  # quotes are literal, not FTS syntax
    assert users(since="1h") == users() and users(until="2000-01-01") == []
    assert users(session=logs(conn, Filters())[0]["session_id"][:-1]) != []


def test_times_and_search_words_are_read_or_refused_in_one_line():
    from datetime import datetime, timezone

    now = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc)
    assert parse_time("2h", "--since", now) == "2026-12-04T10:00:00+00:00"
    assert parse_time("2026-12-01T09:30+01:00", "--since", now) == "2026-12-01T08:30:00+00:00"
    assert fts_query('a "b') == '"a" """b"'


@pytest.mark.parametrize(
    "argv",
    [
        ["logs", "--since", "yesterday"],
        ["logs", "-n", "0"],
        ["logs", "-q", "   "],
        ["logs", "--json", "--csv"],
        ["stats", "--by", "colour"],
        ["stats", "--by", "model,model"],
        ["stats", "--plot", "out.pdf"],
        ["stats", "--until", "13/12"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors (the one-line parser) exit here
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and err


def test_logs_command_prints_table_json_and_csv_inert(capsys):
    write_session([("hi \x1b[2J there", "reply \x1b]0;x\x07", metrics(64, 12.5))], context=CONTEXT)
    assert main(["logs"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "12.5" in out and "TestModel-1M" in out
    assert main(["logs", "--json"]) == 0
    out = capsys.readouterr().out
    (row,) = json.loads(out)
    assert row["ttft_ms"] == pytest.approx(12.5) and row["metrics"]["prompt_tokens"] == 64 and "\x1b" not in out
    assert main(["logs", "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("started,finished,session_id,turn") and "\x1b" not in lines[1]
    assert main(["logs", "--model", "nothing-like-it"]) == 0
    assert "no recorded turns match" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["logs"], ["stats"], ["logs", "--json"]])
def test_a_history_that_cannot_be_written_shows_what_it_holds_and_says_so_once(capsys, monkeypatch, argv):
    """A read-only history.db (chmod 444, chattr +i; faked with ``PRAGMA query_only``, as root writes through a chmod):
    the turns it holds, and one line on stderr that new turns are not being indexed — not exit 1 with no rows."""
    from chatphase.commands import history_options

    write_session([("the first question", "a", metrics(100, 70.0))])
    assert main(["logs"]) == 0  # indexed
    capsys.readouterr()
    write_session([("the second question", "b", metrics(200, 120.0))])  # after the database went read-only

    def read_only(*args, **kwargs):
        conn = connect(*args, **kwargs)
        conn.execute("PRAGMA query_only=ON")
        return conn

    monkeypatch.setattr(history_options, "connect", read_only)
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "attempt to write a readonly database" in err
    assert err.rstrip().endswith(f"showing the turns {db_path()} already holds (new turns are not being indexed)")
    if argv[0] == "stats":
        assert out.splitlines()[1].split()[:2] == ["TestModel-1M", "1"]
    else:
        assert "the first question" in out and "the second question" not in out


def test_a_history_that_cannot_even_be_opened_for_writing_is_read_from_its_file(capsys, monkeypatch):
    """In a read-only folder without its ``-shm`` file, SQLite cannot open a WAL database for writing at all (the
    first PRAGMA is refused): the file is read as it is (``immutable``), and the same one line says so."""
    from chatphase.commands import history_options

    write_session([("the first question", "a", metrics(100, 70.0))])
    assert main(["logs"]) == 0
    capsys.readouterr()

    def refused():
        raise HistoryUnwritable("cannot update the history: attempt to write a readonly database", read_only=True)

    monkeypatch.setattr(history_options, "connect", refused)
    assert main(["logs"]) == 0
    out, err = capsys.readouterr()
    assert "the first question" in out and err.count("\n") == 1 and "new turns are not being indexed" in err


def test_a_write_refusal_is_told_apart_from_a_damaged_database():
    readonly = sqlite3.OperationalError("attempt to write a readonly database")
    readonly.sqlite_errorcode = 8  # SQLITE_READONLY (Python 3.10's errors carry no code: the words decide)
    error = write_refusal(readonly, "x")
    assert isinstance(error, HistoryUnwritable) and error.read_only
    full = write_refusal(sqlite3.OperationalError("database or disk is full"), "x")
    assert isinstance(full, HistoryUnwritable) and not full.read_only
    assert not isinstance(
        write_refusal(sqlite3.DatabaseError("database disk image is malformed"), "x"), HistoryUnwritable
    )


def test_stats_medians_and_the_prompt_length_fit(capsys):
    # TTFT = 20 ms + 0.5 ms per prompt token evaluated; a cached turn evaluates prompt - cached tokens
    write_session([(f"q{n}", "a", metrics(n, 20 + 0.5 * n, decode_tps=100 - n / 10)) for n in (100, 200, 400)])
    write_session([("cached", "a", metrics(1000, 20 + 0.5 * 200, cached=800))], context=CONTEXT)
    conn = connect()
    catch_up(conn)
    (g,) = group_stats(conn, Filters())
    assert g.turns == 4 and g.median_ttft_ms == pytest.approx((20 + 0.5 * 200 + 20 + 0.5 * 200) / 2)
    assert g.ttft_fit.intercept == pytest.approx(20, abs=1e-6) and g.ttft_fit.slope == pytest.approx(0.5)
    assert g.ttft_fit.r2 == pytest.approx(1.0)
    assert g.decode_fit is not None and g.decode_fit.slope < 0
    two = group_stats(conn, Filters(), ("model", "version"))
    assert sorted(x.group for x in two) == ["TestModel-1M · chatphase 9.9.9", "TestModel-1M · unknown version"]
    assert main(["stats", "--json"]) == 0
    (j,) = json.loads(capsys.readouterr().out)
    assert j["ttft_ms_vs_prompt_tokens_evaluated"]["slope"] == pytest.approx(0.5)
    assert main(["stats"]) == 0
    row = capsys.readouterr().out.splitlines()[1]  # decode t/s = 110 − 0.1 per token of depth: a minus, not + -
    assert " − " in row and "+ -" not in row and " + 0.5×n" in row


def test_stats_fits_no_line_through_two_prompt_sizes_and_no_negative_fixed_cost(capsys):
    """Two prompt sizes lie on a line whatever the law (the issue's ``TTFT = -1,237.8 + 51.7×n (r² 1.00)``): the
    table says how many sizes there are and that three are needed; with a third, the free line's fixed cost is
    negative, so the line goes through the origin and says so."""
    write_session([(f"q{n}", "a", metrics(n, ttft)) for n, ttft in ((30, 313.2), (50, 1347.2), (50, 1347.2))])
    assert main(["stats"]) == 0
    out = capsys.readouterr().out
    row = out.splitlines()[1]
    assert "2 prompt sizes (3 needed)" in row and "2 depths (3 needed)" in row and "r²" not in row
    assert main(["stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["ttft_ms_vs_prompt_tokens_evaluated"] is None
    write_session([("q40", "a", metrics(40, 700.0))])
    assert main(["stats"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "0.0 + 22.9×n (r² 0.66, through 0)" in lines[1] and "-1," not in lines[1]
    assert any(line.startswith("(through 0: the free line's fixed cost a came out negative") for line in lines)
    assert main(["stats", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)[0]["ttft_ms_vs_prompt_tokens_evaluated"]
    assert fit["intercept"] == 0 and fit["through_origin"] is True and fit["slope"] == pytest.approx(172_116 / 7_500)


def test_stats_plot_draws_two_versions_as_two_lines(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    write_session([(f"q{n}", "a", metrics(n, 20 + 0.5 * n)) for n in (100, 200, 400)], context=CONTEXT)
    write_session(
        [(f"q{n}", "a", metrics(n, 30 + 0.9 * n)) for n in (100, 200, 400)],
        context={**CONTEXT, "chatphase_version": "10.0.0"},
    )
    write_session([("q", "a", metrics(150, 99))], context={**CONTEXT, "chatphase_version": "11.0.0"})
    out = tmp_path / "h.svg"
    assert main(["stats", "--by", "version", "--plot", str(out)]) == 0
    text = capsys.readouterr().out
    assert "chatphase 9.9.9" in text and "chatphase 10.0.0" in text
    svg = out.read_text()
    assert svg.count("0.5 ms/token") == 1 and svg.count("0.9 ms/token") == 1
    assert "chatphase 11.0.0 (1 turn)" in svg and "(1 turns)" not in svg and "(3 turns)" in svg


CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from session_support import MODEL, SETTINGS, Streamed, record_turns
    from chatphase.history.index import LiveIndex
    from chatphase.sessions.writer import SessionWriter, TEXT_FLUSH_S

    mode, n = sys.argv[2], int(sys.argv[3])
    index = LiveIndex()
    w = SessionWriter.create(model=MODEL, settings=SETTINGS)
    for i in range(n):
        record_turns(w, [(f"{mode} turn {i}", ["a", "b"])])
        index.update(w.path)
    index.wait(60)
    if mode == "kill":
        text = Streamed()
        w.begin_turn("the turn in flight", text=text)
        text.reply = "half a rep"
        time.sleep(TEXT_FLUSH_S + 0.05)
        w.stream()
        print(w.id, flush=True)
        time.sleep(600)
    w.close()
    index.close()
    print(w.id, flush=True)
    """
)


def child(tmp_path: Path, mode: str, n: int) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, str(script), str(ROOT / "tests"), mode, str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_sigkill_mid_reply_keeps_the_partial_turn(tmp_path):
    proc = child(tmp_path, "kill", 2)
    try:
        sid = proc.stdout.readline().strip()
        assert sid, proc.stderr.read()
        conn = connect()
        assert [r[0] for r in conn.execute("SELECT status FROM turns ORDER BY turn")] == ["complete"] * 2  # live
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    catch_up(conn)
    rows = conn.execute("SELECT turn, status, user, reply FROM turns WHERE session_id = ? ORDER BY turn", (sid,))
    assert list(rows)[-1] == (3, "partial", "the turn in flight", "half a rep")


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    procs = [child(tmp_path / str(i), f"p{i}", 25) for i in range(2) if (tmp_path / str(i)).mkdir() is None]
    ids = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        ids.append(out.strip())
    conn = connect()
    counts = dict(conn.execute("SELECT session_id, count(*) FROM turns GROUP BY session_id").fetchall())
    assert counts == {ids[0]: 25, ids[1]: 25}  # the live index wrote all of them
    assert catch_up(conn).indexed == 0  # and nothing was left for the catch-up
    assert db_path().is_file()


def test_live_index_indexes_the_file_of_each_ended_turn():
    from chat_support import make_chat

    from chatphase.chat.recording import SessionRecording

    chat, _engines, _calls = make_chat(replies=["one", "two"])
    recording = SessionRecording(chat)
    chat.add_listener(recording)
    chat.start_engine()
    chat.dispatcher.drain()
    for text in ("first", "second"):
        chat.send(text)
        chat.dispatcher.drain()
    assert isinstance(recording.history, LiveIndex) and recording.history.wait(30)
    conn = connect()
    rows = conn.execute("SELECT user, reply, status, backend, chatphase_version FROM turn_log ORDER BY turn").fetchall()
    assert [r[:3] for r in rows] == [("first", "one", "complete"), ("second", "two", "complete")]
    assert rows[0][3] == "llama.cpp" and rows[0][4] is not None  # the context record of engine_ready
    recording.close()


def test_a_later_schema_step_migrates_an_existing_database_keeping_its_rows(monkeypatch):
    from chatphase.history import db

    write_session([("kept", "a", metrics(10, 5.0))])
    conn = connect()
    catch_up(conn)
    conn.close()
    step = "ALTER TABLE turns ADD COLUMN restore_ms REAL;\nUPDATE turns SET restore_ms = json_extract(metrics, '$.ttft_ms');"
    monkeypatch.setattr(db, "MIGRATIONS", (*db.MIGRATIONS, step))
    monkeypatch.setattr(db, "SCHEMA_VERSION", len(db.MIGRATIONS))
    conn = connect()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    assert conn.execute("SELECT user, restore_ms FROM turns").fetchall() == [("kept", pytest.approx(5.0))]
    assert catch_up(conn).indexed == 0


def test_a_file_s_turns_reach_the_text_index_as_one_segment():
    """The turns of a file go into ``turns`` in one statement: SQLite gives each INSERT that fires a trigger its own
    savepoint, at which FTS5 writes a segment out, so a row at a time left a segment a turn to merge (the
    first catch-up's largest cost). The search still finds every turn."""
    write_session([(f"question {i} dragon", f"answer {i}", metrics(10 + i, 5.0)) for i in range(40)])
    conn = connect()
    conn.execute("INSERT INTO turns_fts(turns_fts, rank) VALUES ('automerge', 0)")  # keep what was written apart
    catch_up(conn)
    assert conn.execute("SELECT count(DISTINCT segid) FROM turns_fts_idx").fetchone()[0] == 1
    assert len(logs(conn, Filters(text="dragon"), limit=100)) == 40
    conn.execute("INSERT INTO turns_fts(turns_fts) VALUES ('integrity-check')")


def test_stats_lines_from_the_columns_sums_match_the_points_and_the_plot_gets_its_points():
    """Two contexts of one model (two versions) make one group: its sums are both contexts', its distinct prompt
    sizes counted over both; the points come only when asked (the plot's)."""
    write_session([(f"q{n}", "a", metrics(n, 20 + 0.5 * n + (n % 7), decode_tps=100 - n / 10)) for n in (10, 20, 40)])
    write_session(
        [(f"q{n}", "a", metrics(n, 20 + 0.5 * n - (n % 5), decode_tps=90 - n / 20)) for n in (20, 40, 80)],
        context=CONTEXT,
    )
    conn = connect()
    catch_up(conn)
    (bare,) = group_stats(conn, Filters())
    (g,) = group_stats(conn, Filters(), points=True)
    assert bare.points_ttft == [] and bare.ttft_fit == g.ttft_fit and g.distinct_x() == bare.distinct_x()
    xs, ys = zip(*g.points_ttft, strict=True)
    assert g.distinct_x()[0] == len(set(xs)) == 4 and g.turns == len(xs) == 6
    free = linear_fit(xs, ys)
    assert g.ttft_fit.slope == pytest.approx(free.slope) and g.ttft_fit.intercept == pytest.approx(free.intercept)
    assert g.ttft_fit.r2 == pytest.approx(free.r2)


def test_a_parallel_catch_up_stores_what_a_serial_one_does_and_reads_here_when_workers_cannot_start(
    monkeypatch, caplog
):
    """Files read in worker processes (spawned) reach the database as the catch-up of this process writes them;
    where the processes cannot start, the files are read here, and nothing is lost either way."""
    from chatphase.history import index

    todays_sessions()
    for i in range(4):
        write_session([(f"q{i}", f"a{i}", metrics(10 + i, 5.0))], context=CONTEXT if i % 2 else None)
    serial = connect()
    catch_up(serial)
    want = db_turns(serial)
    contexts = serial.execute("SELECT key FROM contexts ORDER BY id").fetchall()
    serial.close()
    monkeypatch.setattr(index, "PARALLEL_MIN_FILES", 2)
    monkeypatch.setattr(index, "_workers", lambda files: 2)
    for broken in (False, True):
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db_path()}{suffix}").unlink(missing_ok=True)
        if broken:

            def cannot_start(*args, **kwargs):
                raise OSError("no semaphores here")

            monkeypatch.setattr("concurrent.futures.ProcessPoolExecutor", cannot_start)
        conn = connect()
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="chatphase.history.index"):
            done = catch_up(conn, parallel=True)
        assert ("reading here" in caplog.text) == broken
        assert done.indexed == len(list(sessions_dir().glob("*.jsonl"))) and db_turns(conn) == want
        assert conn.execute("SELECT key FROM contexts ORDER BY id").fetchall() == contexts
        conn.close()
