"""The side panel's figures fit it at every width class: beside the chat (120 columns and wider, where the
panel is 56 columns whatever the terminal) and below it (80×24, 100×30, Ctrl+B), nothing scrolls sideways,
nothing is cut, and the KV gauge's percentage and every history cell can be read on screen."""

from __future__ import annotations

import pytest
from dashboard_support import scripted_turn
from fake_engine import fake_model_info
from textual import events
from textual.containers import ScrollableContainer
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.widgets import Static
from ui_support import idle, make_app, screen_lines, send, wait_for

from chatphase.chat.settings_apply import apply_settings
from chatphase.ui.app import WIDE_COLUMNS
from chatphase.ui.dashboard.history_table import COLUMNS, THINKING_COLUMNS, TurnHistoryTable, format_row
from chatphase.ui.phases.panel import PhasePanel

SIZES = [(120, 40), (130, 40), (150, 40), (200, 50), (80, 24), (100, 30), (120, 24)]

#: turns with wide figures: four-digit counts and times, the longest stop reasons.
WIDE_TURNS = [
    scripted_turn(
        3_480, 2_900, 1_024, 4_504, prefill_tok_per_s=1_250.0, first_ms=900.0, itl_ms=123.4, stop_reason="cancelled"
    ),
    scripted_turn(4_000, 3_990, 96, 4_096, stop_reason="context_full"),
]
#: a reasoning model's turn with four-digit thinking figures (the table then shows thinking tokens).
WIDE_THINKING_TURN = scripted_turn(1_200, 1_100, 2_896, 4_096, thinking_tokens=2_500, itl_ms=21.7)
#: the sizes checked with a thinking turn too (one per width class).
THINKING_SIZES = [(120, 40), (80, 24), (100, 30)]


def lines_of(widget) -> list[str]:
    """The widget's text as it is drawn at its size (the parts a scroll container hides included)."""
    width, height = widget.size
    return ["".join(seg.text for seg in strip) for strip in widget.render_lines(Region(0, 0, width, height))]


async def chat(pilot, size, thinking: bool = False) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: idle(app))
    for n, text in enumerate(["What are prefill and decode?", "Thanks!"], start=1):
        await send(pilot, text)
        await wait_for(pilot, lambda n=n: len(app.chat.conversation) == 2 * n and idle(app))
    for number, metrics in enumerate(WIDE_TURNS + [WIDE_THINKING_TURN] * thinking, start=3):  # as on TurnFinished
        app.panel.turn_finished(number, metrics)
        app.dashboard.turn_finished(number, metrics)
    if size[0] < WIDE_COLUMNS:
        await pilot.press("ctrl+b")  # the panel below the chat
    # laid out: the history table has its place and its rows (a condition: the layout's time is the machine's)
    table = app.query_one(TurnHistoryTable)
    await wait_for(pilot, lambda: table.region.width > 0 and table.row_count == len(app.dashboard.turns))
    await pilot.pause()


@pytest.mark.parametrize(
    "size, thinking",
    [(size, False) for size in SIZES] + [(size, True) for size in THINKING_SIZES],
    ids=[f"{w}x{h}" for w, h in SIZES] + [f"{w}x{h}-thinking" for w, h in THINKING_SIZES],
)
async def test_side_panel_figures_fit_at_every_width(size, thinking):
    app, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await chat(pilot, size, thinking)
        side = app.query_one("#side")
        assert side.display and side.region.right <= size[0]
        inside = side.content_region

        # nothing in the panel is wider than the room it is given: no sideways scrolling anywhere
        for widget in side.query("*"):
            if not widget.display or not widget.size.area:
                continue
            if isinstance(widget, (ScrollableContainer, ScrollView)):
                assert not widget.show_horizontal_scrollbar, widget
                assert widget.virtual_size.width <= widget.scrollable_content_region.width, widget
            assert inside.x <= widget.region.x and widget.region.right <= inside.right, widget
            if isinstance(widget, Static):  # a Rich grid short of room cuts a value with an ellipsis
                assert not any("…" in line for line in lines_of(widget)), (widget, lines_of(widget))

        # the KV gauge's percentage is on screen in full, inside the panel
        panel = app.query_one(PhasePanel)
        gauge = panel.query_one("#kv-gauge")
        panel.scroll_to_widget(gauge, animate=False)
        await pilot.pause()
        percentage = gauge.query_one("#percentage")
        assert gauge.percentage == 1.0  # the cache is full
        assert percentage.region.size == percentage.size  # nothing of it hidden
        assert inside.contains_region(percentage.region)
        assert [line.strip() for line in lines_of(percentage)] == ["100%"]

        # every cell of the turn history is drawn, headers included
        table = app.query_one(TurnHistoryTable)
        assert table.virtual_size.width <= table.scrollable_content_region.width
        assert table.max_scroll_x == 0 and not table.show_horizontal_scrollbar
        drawn = "\n".join(lines_of(table))
        assert table.thinking == thinking and table.columns_shown == (THINKING_COLUMNS if thinking else COLUMNS)
        for _, header in table.columns_shown:
            assert all(word in drawn for word in header.split("\n"))
        for number, metrics in list(app.dashboard.turns.items())[-3:]:  # the rows the table shows at once
            table.move_cursor(row=number - 1, animate=False)
            await pilot.pause()
            drawn = "\n".join(lines_of(table))
            for cell in format_row(number, metrics, table.thinking):
                assert all(line in drawn for line in cell.split("\n")), (cell, drawn)


@pytest.mark.parametrize("tab", ["tab-plots", "tab-system"])
async def test_typing_after_a_click_on_a_dashboard_tab_goes_to_the_prompt(tab):
    """A click on a tab gives it the focus; what the user types next (keys and a big paste) still lands in
    the prompt box, which takes the focus back, and Enter sends it."""
    app, engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await pilot.click(f"#dash-tabs Tab#--content-tab-{tab}")
        await pilot.pause(0.1)
        assert not app.prompt.has_focus
        await pilot.press("h", "i", "space")
        paste = "x" * 9000
        app.screen.focused.post_message(events.Paste(paste))
        await pilot.pause(0.1)
        assert app.prompt.has_focus and app.prompt.text == "hi " + paste
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        assert engines[0].requests[-1].messages[-1].content == "hi " + paste


def kv_text(app) -> str:
    return str(app.panel.query_one("#kv-figures", Static).render())


@pytest.mark.parametrize("how", ["restart", "n_ctx", "switch"])
async def test_a_fresh_engine_shows_an_empty_kv_cache(how):
    """F5 (restart), a settings change that restarts the engine, or a model switch: the new engine's cache
    is empty, so the gauge reads 0 of its n_ctx whatever the old one held (the conversation is kept)."""

    app, engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "What are prefill and decode?")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        assert not kv_text(app).startswith("0 /")
        if how == "restart":
            await pilot.press("f5")
        elif how == "n_ctx":  # as F9 applies it
            apply_settings(app.chat, app.chat.settings.with_overrides(n_ctx=2048), ["n_ctx"])
        else:
            app.switch_model(fake_model_info())
        await wait_for(pilot, lambda: len(engines) == 2 and idle(app))
        await pilot.pause(0.1)
        assert kv_text(app).startswith(f"0 / {engines[1].n_ctx:,} tok")
        assert app.panel.query_one("#kv-gauge").progress == 0
        assert len(app.chat.conversation) == 2


async def test_a_turn_whose_engine_died_shows_its_number_and_the_tables_figures():
    """The engine killed mid-reply: the panel showed the last live redraw's decode figures under a title
    cut to ``Turn`` (a live update lays nothing out, and the label was as wide as ``Turn``), while the
    table had the turn's figures so far. Now both show the same, and the KV line is left as it was."""
    app, engines = make_app(hold="decode")
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: engines[0].held.is_set())
        await pilot.pause(0.3)
        kv_before = kv_text(app)
        engines[0].kill()
        await wait_for(pilot, lambda: app.chat.engine is None and 1 in app.dashboard.turns, timeout_s=2.0)
        await pilot.pause(0.1)
        assert lines_of(app.panel.query_one("#turn-title"))[0].strip() == "Turn 1"
        m = app.dashboard.turns[1]
        assert app.panel.figures["decode"].startswith(f"{m.decode_tokens} tok · ")
        assert app.panel.figures["TTFT"].endswith("stop: error") and kv_text(app) == kv_before


#: a slow path as the engine words it (this machine's: a long line).
SLOW_PATH = (
    "AMX off: llama.cpp's extra buffer types are off on this AMX CPU — this llama.cpp build's AMX kernels crash "
    "(SIGSEGV in the probe); prefill runs without the AMX kernels; --extra-bufts on overrides"
)


def _row(lines: list[str], label: str) -> list[str]:
    """The lines of a grid row: the one starting with ``label`` and those that continue it (no label)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(label + " "))
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] != " "), len(lines))
    return [line.rstrip() for line in lines[start:end]]


async def test_at_140_columns_the_model_panels_slow_path_row_is_on_screen_whole():
    """Seen: at 140×40 the model's slow path (a few lines long, under the format, threads and memory rows) was cut
    off by the panel's height. It is one line now, under the engine row, its whole text in the System tab."""
    from dataclasses import replace

    app, _ = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        loaded = app.chat.loaded
        settings = replace(loaded.settings, threads_policy="auto")
        app.panel.set_model(replace(loaded, settings=settings, slow_paths=(SLOW_PATH,), chat_format="ChatML"))
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        await pilot.pause()
        figures = app.query_one("#model-figures", Static)
        row = _row(lines_of(figures), "slow")
        shown = screen_lines(app)
        assert all(any(line in s for s in shown) for line in row), (row, shown)
        assert any("AMX off" in line for line in row)


@pytest.mark.parametrize("size", [(80, 24), (100, 30)], ids=["80x24", "100x30"])
async def test_the_dashboard_below_the_chat_follows_the_terminal_width_not_the_panels_resize_events(size):
    """Seen under load at 80×24 and 100×30: the side panel, laid out 56 wide beside the chat in the first frame
    and shown below it by Ctrl+B later, processed that first frame's Resize but got none at its new width, so it
    kept the class that hides the dashboard (the turn history had no place on screen). Whether the dashboard
    shows follows the terminal's width: a stale Resize of the panel (posted here) changes nothing."""
    app, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await pilot.press("ctrl+b")
        side = app.query_one("#side")
        await wait_for(pilot, lambda: side.region.width == size[0] and app.dashboard.region.width >= 50)
        side.post_message(events.Resize(Size(56, size[1] - 1), Size(56, size[1] - 1), Size(*size)))
        handled: list[bool] = []
        side.call_later(handled.append, True)  # queued behind the Resize: it has been handled once this runs
        await wait_for(pilot, lambda: bool(handled))
        await pilot.pause()
        assert app.dashboard.display and app.dashboard.region.width >= 50
        assert app.query_one(TurnHistoryTable).region.width >= 45


async def test_at_60x20_the_turn_block_below_the_chat_shows_its_values():
    """Seen: at 60×20 with Ctrl+B the phase panel got 9 columns beside the dashboard: the Turn block's labels
    without values. Under 80 columns the phase panel has the side alone."""
    app, _ = make_app()
    async with app.run_test(size=(60, 20)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        await pilot.press("ctrl+b")
        # laid out: the side alone (a condition, not a fixed pause: the layout's time depends on the machine)
        await wait_for(pilot, lambda: app.query_one("#side").region.right <= 60 and app.panel.region.width >= 55)
        await pilot.pause()
        shown = "\n".join(screen_lines(app))
        m = app.dashboard.turns[1]
        for label, value in [
            ("TTFT", f"{m.ttft_ms:.1f} ms · stop: end of reply"),
            ("prompt", f"{m.prompt_tokens} tok (0 cached)"),
            ("decode", f"{m.decode_tokens} tok"),
            ("ITL p50/p95", f"{m.itl_ms_p50:.1f} ms / {m.itl_ms_p95:.1f} ms"),
        ]:
            assert any(line.strip().startswith(label) and value in line for line in shown.splitlines()), (label, shown)
        assert app.query_one("#side").region.right <= 60 and app.panel.region.width >= 55  # the side, alone
        await pilot.resize_terminal(100, 30)  # room again: the dashboard beside the panel
        await wait_for(pilot, lambda: app.dashboard.region.width >= 50 and app.panel.region.width >= 25)
