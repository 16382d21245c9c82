"""The F4 sessions table fits its box: with long titles and model names, ID, Turns and "Last used" stay
whole on screen at 150 and 80 columns (Title and Model give way, cut with …), nothing scrolls sideways."""

from __future__ import annotations

import pytest
from session_support import scripted_metrics
from textual.geometry import Region
from textual.widgets import DataTable
from ui_support import make_app, wait_for

from chatphase.sessions.catalog import list_sessions
from chatphase.sessions.store import local_time
from chatphase.sessions.writer import SessionWriter
from chatphase.ui.screens.sessions import COLUMNS, SessionsScreen, clip, fit_columns

LONG_TITLE = "How do prefill and decode differ on a CPU with a small cache, and why does TTFT grow with the prompt?"
LONG_MODEL = "Qwen2.5-Coder-32B-Instruct-Q4_K_M-imatrix-calibrated-v2"


def screen_lines(widget) -> list[str]:
    width, height = widget.size
    return ["".join(seg.text for seg in strip) for strip in widget.render_lines(Region(0, 0, width, height))]


@pytest.mark.parametrize("size", [(150, 40), (80, 24)])
async def test_last_used_is_whole_at_every_width(size):
    for n in range(3):
        rec = SessionWriter.create(model={"name": LONG_MODEL}, settings={}, title=f"{LONG_TITLE} #{n}")
        rec.begin_turn("q")
        rec.finish_turn("a", scripted_metrics())
        rec.close()
    sessions = list_sessions()
    app, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        app.push_screen(SessionsScreen())
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await pilot.pause(0.2)
        table = app.screen.query_one(DataTable)
        assert table.row_count == 3 and table.virtual_size.width <= table.size.width  # no sideways scroll
        lines = screen_lines(table)
        assert "Last used" in lines[0]
        for s in sessions:
            row = next(line for line in lines if s.id in line)  # the whole id is on screen
            assert row.rstrip().endswith(local_time(s.last_used)), row
        assert any("…" in line for line in lines[1:])  # the long title gave way


def test_fit_columns_keeps_the_fixed_columns_and_shares_the_rest():
    rows = [("20261201-abcdef", "t" * 100, "m" * 50, "3", "2026-12-01 09:40")]
    natural = fit_columns(1000, rows)
    assert natural == [15, 100, 50, 5, 16]
    narrow = fit_columns(80, rows)
    assert narrow[0] == 15 and narrow[3:] == [5, 16] and sum(narrow) + 2 * len(COLUMNS) <= 80
    assert narrow[1] == narrow[2] or abs(narrow[1] - narrow[2]) <= 1  # the two share what is left
    assert clip("abcdef", 4) == "abc…" and clip("abc", 4) == "abc"
    partial = [("20261201-093915-abcd", "t" * 30, "m" * 30, "3 (1 partial)", "2026-12-01 09:40")]
    tight = fit_columns(66, partial)  # 80 columns: Title and Model at their least, then Turns gives way
    assert tight[0] == 20 and tight[4] == 16 and tight[1:3] == [6, 6] and 5 <= tight[3] < 13
    assert sum(tight) + 10 <= 66


async def test_a_resize_refits_the_columns_without_reading_the_sessions_again(monkeypatch):
    rec = SessionWriter.create(model={"name": LONG_MODEL}, settings={}, title=LONG_TITLE)
    rec.begin_turn("q")
    rec.finish_turn("a", scripted_metrics())
    rec.close()
    from chatphase.ui.screens import sessions as sessions_screen

    reads = []
    monkeypatch.setattr(sessions_screen, "list_sessions", lambda: reads.append(1) or list_sessions())
    app, _ = make_app()
    async with app.run_test(size=(150, 40)) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        app.push_screen(SessionsScreen())
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await pilot.pause(0.2)
        table = app.screen.query_one(DataTable)
        wide = table.columns[table.ordered_columns[1].key].width
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.2)
        assert table.row_count == 1 and table.ordered_columns[1].width < wide  # refitted to the new width
        assert len(reads) == 1  # one read from disk, at opening
