"""Exports round-trip: JSON -> equal Session, CSV -> equal metrics, Markdown table -> the same numbers."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from session_support import MODEL, SETTINGS, Streamed, record_turns, scripted_metrics

from chatphase.engine.metrics import TurnMetrics
from chatphase.errors import UsageError
from chatphase.sessions import writer as session_writer
from chatphase.sessions.catalog import load_session
from chatphase.sessions.export import (
    CSV_COLUMNS,
    MD_METRICS,
    export_session,
    format_from_path,
    rows_from_csv,
    session_from_json,
    write_export,
)
from chatphase.sessions.store import RecordedTurn, Session
from chatphase.sessions.writer import SessionWriter


@pytest.fixture
def saved(monkeypatch) -> Session:
    """Two finished turns (one with markdown and a pipe in it) and one partial turn."""
    monkeypatch.setattr(session_writer, "TEXT_FLUSH_S", 0.0)
    rec = SessionWriter.create(model=MODEL, settings=SETTINGS, title="Phases | test")
    record_turns(
        rec,
        [("Explain *prefill*", ["Prefill ", "reads the prompt."]), ("And decode?", ["One", " token", " at a time."])],
    )
    rec.begin_turn("Write a long story", text=Streamed("Once upon"))
    rec.stream()
    return load_session(rec.id)


def test_json_round_trip_is_exact(saved):
    back = session_from_json(export_session(saved, "json"))
    assert back == saved
    assert [t.status for t in back.turns] == ["complete", "complete", "partial"]


def test_json_rejects_other_documents():
    with pytest.raises(UsageError, match="not a chatphase session export"):
        session_from_json('{"turns": []}')
    with pytest.raises(UsageError, match="not a JSON file"):
        session_from_json("{nope")


def test_csv_one_row_per_turn_round_trips_metrics(saved):
    text = export_session(saved, "csv")
    header = text.splitlines()[0].split(",")
    assert tuple(header) == CSV_COLUMNS
    assert {"ttft_ms", "decode_tokens_per_s", "prefill_tokens_per_s", "kv_cache_bytes", "itl_ms_p95"} <= set(header)
    rows = rows_from_csv(text)
    assert [(r["turn"], r["status"], r["metrics"]) for r in rows] == [
        (t.index, t.status, t.metrics) for t in saved.turns
    ]
    assert rows[2]["metrics"] is None and rows[0]["model"] == "TestModel-1M"


finite = st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e12)
maybe = st.none() | finite


@hsettings(max_examples=80, deadline=None)
@given(
    st.builds(
        TurnMetrics,
        prompt_tokens=st.integers(0, 10**6),
        cached_tokens=st.integers(0, 10**6),
        prefill_tokens=st.integers(0, 10**6),
        prefill_ms=finite,
        prefill_tokens_per_s=maybe,
        ttft_ms=maybe,
        decode_tokens=st.integers(0, 10**6),
        decode_ms=finite,
        decode_tokens_per_s=maybe,
        itl_ms_p50=maybe,
        itl_ms_p95=maybe,
        itl_ms_max=maybe,
        kv_cache_tokens=st.integers(0, 10**6),
        kv_bytes_per_token=st.integers(0, 10**6),
        kv_cache_bytes=st.integers(0, 10**12),
        kv_capacity_bytes=st.integers(0, 10**12),
        stop_reason=st.sampled_from(["stop", "length", "cancelled", "context_full", "error"]),
        tokenize_ms=finite,
        tpot_ms=maybe,
        dropped_messages=st.integers(0, 100),
    )
)
def test_csv_round_trips_any_metrics(m):
    s = Session(
        "id-1",
        "t",
        "2026-01-01T00:00:00+00:00",
        MODEL,
        SETTINGS,
        turns=[RecordedTurn(1, 'q, "quoted"\nline', "a", "complete", "s", "f", m)],
    )
    (row,) = rows_from_csv(export_session(s, "csv"))
    assert row["metrics"] == m
    assert all(type(getattr(row["metrics"], f.name)) is type(getattr(m, f.name)) for f in dataclasses.fields(m))


def _md_tables(text: str) -> list[list[list[str]]]:
    """Every table in Markdown ``text`` as rows of cell texts (header row first), parsed by markdown-it."""
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    tables, row, cell_open = [], None, False
    for tok in tokens:
        if tok.type == "table_open":
            tables.append([])
        elif tok.type == "tr_open":
            row = []
        elif tok.type == "tr_close":
            tables[-1].append(row)
        elif tok.type == "inline" and row is not None and cell_open:
            row.append(tok.content)
        elif tok.type in ("th_open", "td_open"):
            cell_open = True
        elif tok.type in ("th_close", "td_close"):
            cell_open = False
    return tables


def test_markdown_has_transcript_and_a_parsable_metrics_table(saved):
    md = export_session(saved, "md")
    assert md.startswith("# Phases | test\n")
    assert "Explain *prefill*" in md and "Prefill reads the prompt." in md and "Once upon" in md
    assert "_partial turn:" in md and md.count("_partial turn:") == 1
    (table,) = _md_tables(md)
    assert table[0] == ["turn", "status", *MD_METRICS]
    assert [r[:2] for r in table[1:]] == [["1", "complete"], ["2", "complete"], ["3", "partial"]]
    for row, turn in zip(table[1:3], saved.turns[:2], strict=True):
        cells = dict(zip(table[0], row, strict=True))
        m = turn.metrics
        assert float(cells["ttft_ms"].replace(",", "")) == pytest.approx(m.ttft_ms, abs=0.005)
        assert float(cells["decode_tokens_per_s"].replace(",", "")) == pytest.approx(m.decode_tokens_per_s, abs=0.005)
        assert int(cells["prompt_tokens"].replace(",", "")) == m.prompt_tokens
        assert cells["stop_reason"] == m.stop_reason
    assert set(table[3][2:]) == {"—"}


def test_markdown_marks_failed_turns():
    s = Session("i", "t", "c", MODEL, {}, turns=[RecordedTurn(1, "q", "par", "failed", "s", "f", None, "engine died")])
    assert "_failed turn: engine died_" in export_session(s, "md")


def test_a_damaged_last_line_is_exported_as_damaged_not_interrupted():
    """A file whose last line (the last turn's end) cannot be read: that turn is said to be damaged, in its
    note and its status; a turn that was only interrupted (no end written) keeps the interrupted note; a
    torn line after a finished turn marks no turn. The header says how many lines could not be read."""
    rec = SessionWriter.create(model=MODEL, settings=SETTINGS)
    record_turns(rec, [("one", ["1"]), ("two", ["2"])])
    rec.close()
    lines = rec.path.read_text().splitlines(keepends=True)
    rec.path.write_text("".join(lines[:-1]) + lines[-1][:40] + "\x00garbage\n")  # turn 2's end, damaged
    s = load_session(rec.id)
    assert [(t.status, t.damaged_lines) for t in s.turns] == [("complete", 0), ("partial", 1)]
    md = export_session(s, "md")
    assert "_damaged turn: 1 line of the session file" in md and "_partial turn:" not in md
    assert "- Damaged: 1 line of the session file could not be read" in md
    (table,) = _md_tables(md)
    assert [r[:2] for r in table[1:]] == [["1", "complete"], ["2", "partial, damaged"]]
    assert session_from_json(export_session(s, "json")) == s

    rec = SessionWriter.create(model=MODEL, settings=SETTINGS)
    record_turns(rec, [("one", ["1"])])
    rec.begin_turn("two", text=Streamed("half"))
    rec.close()  # interrupted: no end record, every line readable
    with open(rec.path, "a", encoding="utf-8") as fh:
        fh.write('{"type": "turn_st')  # a torn line; the open turn 2 is damaged by it too
    s = load_session(rec.id)
    assert [(t.status, t.damaged_lines) for t in s.turns] == [("complete", 0), ("partial", 1)]
    rec = SessionWriter.create(model=MODEL, settings=SETTINGS)
    record_turns(rec, [("one", ["1"])])
    rec.begin_turn("two", text=Streamed("half"))
    rec.close()
    s = load_session(rec.id)
    assert "_partial turn: interrupted" in export_session(s, "md") and s.turns[1].damaged_lines == 0
    rec = SessionWriter.create(model=MODEL, settings=SETTINGS)
    record_turns(rec, [("one", ["1"])])
    rec.close()
    with open(rec.path, "a", encoding="utf-8") as fh:
        fh.write('{"type": "turn_st')  # after a finished turn: no turn is damaged by it
    s = load_session(rec.id)
    assert s.corrupt_lines == 1 and [(t.status, t.damaged_lines) for t in s.turns] == [("complete", 0)]


def test_write_export_and_format_detection(saved, tmp_path):
    out = write_export(saved, "csv", tmp_path / "sub" / "x.csv")
    assert rows_from_csv(out.read_text())[0]["metrics"] == scripted_metrics(2)
    assert format_from_path("a.MD") == "md" and format_from_path("a.markdown") == "md"
    assert format_from_path("a.json") == "json" and format_from_path("a.txt") is None
    with pytest.raises(UsageError, match="unknown export format"):
        export_session(saved, "xml")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="cannot write"):
        write_export(saved, "md", blocker / "x.md")


def test_markdown_folds_a_reasoning_models_thinking(tmp_path):
    from chatphase.sessions.export import to_markdown
    from chatphase.sessions.store import RecordedTurn, Session

    turn = RecordedTurn(1, "2+2?", "4.", "complete", "2026-12-01T00:00:00+00:00", thinking="I add them.")
    md = to_markdown(Session("s1", "sums", "2026-12-01T00:00:00+00:00", {}, {}, [turn]))
    assert "<details><summary>Thinking</summary>\n\nI add them.\n\n</details>\n\n4." in md
