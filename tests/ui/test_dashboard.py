"""The Dashboard in a tiny host app, fed scripted TurnMetrics: what it shows matches the metrics."""

from __future__ import annotations

import os

import pytest
from dashboard_support import TURNS, DashboardApp, loaded_model, scripted_turn
from rich.console import Console
from textual.widgets import Label, Sparkline, Static, TabbedContent

from chatphase.ui.dashboard.dashboard import Dashboard
from chatphase.ui.dashboard.history_table import COLUMNS, THINKING_COLUMNS, TurnHistoryTable, format_row
from chatphase.ui.dashboard.kv_forecast import KvGauge
from chatphase.ui.dashboard.live_rate import LiveRate
from chatphase.ui.dashboard.phase_plots import DecodeDepthPlot, TtftPlot
from chatphase.ui.dashboard.system_figures import REFRESH_S, SystemFigures
from chatphase.ui.dashboard.timeline import TurnTimeline, reply_segments, scale_cells, time_segments
from chatphase.ui.dashboard.turn_detail import TurnDetail


def text_of(widget: Static) -> str:
    """Plain text of a Static's content (a str or a Rich renderable)."""
    content = widget.content
    if isinstance(content, str):
        return content
    console = Console(width=100, record=True)
    console.print(content)
    return console.export_text()


@pytest.fixture
def app():
    return DashboardApp()


async def feed(app, pid: int = 0, gpu: bool = False) -> Dashboard:
    dash = app.query_one(Dashboard)
    dash.set_model(loaded_model(pid=pid, gpu=gpu))
    for number, metrics in enumerate(TURNS, start=1):
        dash.turn_finished(number, metrics)
    return dash


async def test_history_rows_match_scripted_metrics(app):
    async with app.run_test(size=(120, 50)) as pilot:
        await feed(app)
        await pilot.pause()
        table = app.query_one(TurnHistoryTable)
        assert table.row_count == 3
        for i, metrics in enumerate(TURNS):
            assert tuple(str(c) for c in table.get_row_at(i)) == format_row(i + 1, metrics)
        # spot values from the script: turn 1 cold TTFT 397 ms, turn 2's every-10th slow gap -> ITL p95 63 ms
        # (two figures to a cell, top over bottom)
        row2 = {k: str(v).split("\n") for (k, _), v in zip(COLUMNS, table.get_row_at(1), strict=True)}
        assert row2["ttft_itl_p95_ms"] == ["212.6", "63.0"] and row2["prompt_cached_tokens"] == ["260", "199"]
        assert row2["decode_kv_tokens"] == ["150", "410"]
        assert str(table.get_row_at(2)[-1]) == "length"
        assert table.cursor_row == 2  # newest last, and selected


async def test_selecting_a_row_shows_that_turns_metrics_and_timeline(app):
    async with app.run_test(size=(120, 50)) as pilot:
        dash = await feed(app)
        await pilot.pause()
        assert dash.selected_turn == 3
        app.query_one(TurnHistoryTable).focus()
        await pilot.press("up", "up")
        await pilot.pause()
        assert dash.selected_turn == 1
        detail = app.query_one(TurnDetail)
        assert text_of(detail.query_one("#detail-title", Label)) == "turn 1 · stop: end of reply"
        grid = text_of(detail.query_one("#detail-metrics", Static))
        assert "TTFT ms" in grid and "397.0" in grid and "1,580.0" in grid  # decode ms: 79 gaps x 20 ms
        explain = text_of(detail.query_one("#detail-explain", Static))
        assert explain.startswith("prefill: compute bound") and "\ndecode: per-token overhead bound" in explain
        timeline = detail.query_one(TurnTimeline)
        assert timeline.metrics is TURNS[0]
        rendered = timeline.render().plain
        assert "prefill 375.0 ms" in rendered and "decode 1.58 s" in rendered and "evaluated 120 tok" in rendered
        await pilot.press("down", "enter")
        await pilot.pause()
        assert dash.selected_turn == 2


async def test_timeline_bar_is_to_scale(app):
    async with app.run_test(size=(108, 50)) as pilot:
        await feed(app)
        await pilot.pause()
        timeline = app.query_one(TurnTimeline)
        width = timeline.size.width - timeline.LABEL_WIDTH
        bar = timeline.render().plain.splitlines()[0][timeline.LABEL_WIDTH :]
        cells = scale_cells([ms for _, ms in time_segments(TURNS[2])], width)
        assert len(bar) == width == sum(cells)
        assert [bar.count(g) for g in "░█▓━"] == cells
        prompt_bar = timeline.render().plain.splitlines()
        prompt_line = next(line for line in prompt_bar if line.startswith("prompt"))[timeline.LABEL_WIDTH :]
        assert prompt_line.count("▒") == scale_cells([409, 71], width)[0]


def test_scale_cells():
    assert scale_cells([1, 1, 2], 8) == [2, 2, 4]
    assert scale_cells([0.001, 999, 0, 1], 10) == [1, 8, 0, 1]  # a tiny non-zero segment stays visible
    assert scale_cells([0, 0], 10) == [0, 0]
    assert sum(scale_cells([3, 7, 11], 37)) == 37


async def test_kv_gauge_and_forecast(app):
    async with app.run_test(size=(120, 50)) as pilot:
        await feed(app)
        await pilot.pause()
        text = text_of(app.query_one(KvGauge).query_one("#kv-text", Label))
        # 540 of 2,048 tokens x 23,040 B; growth 540/3 = 180 tok/turn; (2048-540)/180 = 8.4 turns
        assert text == "KV 540/2,048 tok · 11.9 MiB/45.0 MiB · ~8 turns left at +180 tok/turn"
        bar = app.query_one("#kv-bar")
        assert bar.total == 2048 and bar.progress == 540


async def test_plots_accumulate_points(app):
    async with app.run_test(size=(120, 50)) as pilot:
        await feed(app)
        await pilot.pause()
        ttft = app.query_one(TtftPlot).points
        assert ttft["cold"] == [(120.0, TURNS[0].ttft_ms)]
        assert ttft["cached prefix"] == [(260.0, TURNS[1].ttft_ms), (480.0, TURNS[2].ttft_ms)]
        depth = app.query_one(DecodeDepthPlot).points["decode"]
        assert depth == [(float(m.kv_cache_tokens), m.decode_tokens_per_s) for m in TURNS]
        app.query_one(Dashboard).turn_finished(4, scripted_turn(500, 500, 1, 541))  # one token: no rate
        assert len(app.query_one(DecodeDepthPlot).points["decode"]) == 3


async def test_live_rate_keeps_the_last_history_samples(app):
    async with app.run_test(size=(100, 40)) as pilot:
        dash = app.query_one(Dashboard)
        spark = app.query_one("#live-rate-sparkline", Sparkline)
        for v in range(1, 501):
            dash.decode_rate(float(v))
        dash.decode_rate(float("inf"))  # ignored
        dash.decode_rate(-1.0)  # ignored
        await pilot.pause()
        assert spark.data == [float(v) for v in range(381, 501)]  # the last HISTORY samples
        assert text_of(app.query_one(LiveRate).query_one("#live-rate-label", Label)) == "decode 500.0 tok/s"
        label = app.query_one(LiveRate).query_one("#live-rate-label", Label)
        done = scripted_turn(480, 470, 90, 570, itl_ms=25.0)
        dash.turn_finished(1, done)  # the turn's own figure, as in its table row, not the last live sample
        await pilot.pause()
        assert text_of(label) == f"decode {done.decode_tokens_per_s:.1f} tok/s" != "decode 500.0 tok/s"
        dash.turn_finished(2, scripted_turn(500, 500, 1, 541))  # one token: no rate, and no stale one
        await pilot.pause()
        assert text_of(label) == "decode – tok/s"


async def test_regenerated_turn_updates_its_row(app):
    async with app.run_test(size=(120, 50)) as pilot:
        dash = await feed(app)
        again = scripted_turn(480, 470, 90, 570, itl_ms=25.0)
        dash.turn_finished(3, again)
        await pilot.pause()
        table = app.query_one(TurnHistoryTable)
        assert table.row_count == 3
        assert tuple(str(c) for c in table.get_row_at(2)) == format_row(3, again)


#: a reasoning model's turn: 312 of 420 generated tokens in the thinking block.
THINKING_TURN = scripted_turn(600, 539, 420, 1_020, thinking_tokens=312, itl_ms=13.2)


async def test_a_turn_with_thinking_switches_the_history_to_thinking_tokens_and_splits_its_timeline(app):
    async with app.run_test(size=(120, 50)) as pilot:
        dash = await feed(app)
        table = app.query_one(TurnHistoryTable)
        assert not table.thinking and [str(c) for c in table.get_row_at(0)][4] == "80\n200"  # decode over KV
        dash.turn_finished(4, THINKING_TURN)
        await pilot.pause()
        assert table.thinking and [c.key.value for c in table.columns.values()] == [k for k, _ in THINKING_COLUMNS]
        assert [str(c) for c in table.get_row_at(0)] == list(format_row(1, TURNS[0], thinking=True))
        assert str(table.get_row_at(3)[4]) == "420\n312" and table.cursor_row == 3  # decode over thinking tokens
        assert str(table.get_row_at(0)[4]) == "80\n–"  # a turn without thinking
        m = THINKING_TURN
        segments = time_segments(m)
        assert [k for k, _ in segments] == ["tokenize", "prefill", "first", "thinking", "answer"]
        assert dict(segments)["thinking"] == m.thinking_ms and dict(segments)["answer"] == pytest.approx(108 * 13.2)
        assert reply_segments(m) == [("thinking", 312.0), ("answer", 108.0)] and reply_segments(TURNS[0]) == []
        lines = app.query_one(TurnTimeline).render().plain.splitlines()
        reply = next(line for line in lines if line.startswith("reply"))[TurnTimeline.LABEL_WIDTH :]
        assert (reply.count("┅"), reply.count("━")) == tuple(scale_cells([312, 108], len(reply)))
        ttft = app.query_one(TtftPlot)
        assert ttft.points["first answer"] == [(600.0, m.ttfa_ms)] and "+ TTFA" in ttft.title()
        dash.reset()
        await pilot.pause()
        assert not table.thinking and [c.key.value for c in table.columns.values()] == [k for k, _ in COLUMNS]


async def test_reset_clears_history_but_keeps_model(app):
    async with app.run_test(size=(120, 50)) as pilot:
        dash = await feed(app)
        dash.decode_rate(42.0)
        dash.reset()
        await pilot.pause()
        assert app.query_one(TurnHistoryTable).row_count == 0
        assert app.query_one(TtftPlot).points == {"cold": [], "cached prefix": [], "first answer": []}
        assert text_of(app.query_one("#kv-text", Label)) == "KV 0/2,048 tok · 0 B/45.0 MiB"
        assert text_of(app.query_one("#detail-title", Label)) == "no turn selected"
        assert dash.model is not None and not dash.turns
        dash.turn_finished(1, TURNS[0])
        assert app.query_one(TurnHistoryTable).row_count == 1


async def test_system_figures_for_a_live_process(app):
    async with app.run_test(size=(120, 50)) as pilot:
        await feed(app, pid=os.getpid())
        await pilot.pause()
        text = text_of(app.query_one(SystemFigures))
        assert f"engine pid {os.getpid()} · RSS " in text
        assert "memory available " in text
        assert "model load 412 ms · threads 2 decode / 2 batch" in text
        assert "GPU offload off (CPU-only build)" in text


async def test_system_figures_sample_only_while_on_screen(app):
    """The System tab's figures are sampled by their timer only while shown; showing them samples at once."""
    async with app.run_test(size=(120, 50)) as pilot:
        await feed(app, pid=os.getpid())
        await pilot.pause()
        figures = app.query_one(SystemFigures)
        assert app.query_one("#dash-tabs", TabbedContent).active == "tab-turns"
        sampler = figures.sampler
        calls = []
        sample = sampler.sample

        def counted():
            calls.append(1)
            return sample()

        sampler.sample = counted
        await pilot.pause(REFRESH_S + 0.5)  # longer than the sampling timer's period
        assert calls == [] and not figures.is_on_screen

        app.query_one("#dash-tabs", TabbedContent).active = "tab-system"
        waited = 0.0
        while not calls and waited < 1.5:
            await pilot.pause(0.05)
            waited += 0.05
        assert calls and figures.is_on_screen
        assert f"engine pid {os.getpid()} · RSS " in text_of(figures)


async def test_system_figures_gpu_offload(app):
    async with app.run_test(size=(120, 50)) as pilot:
        await feed(app, gpu=True)
        await pilot.pause()
        text = text_of(app.query_one(SystemFigures))
        assert "GPU offload on (30/30 layers + output)" in text
        assert "engine process: not reported by this engine" in text


async def test_narrow_terminal_keeps_everything_reachable(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(app)
        await pilot.pause()
        assert app.query_one(TurnHistoryTable).region.height >= 3
        assert app.query_one("#kv-text").region.right <= 80
        app.query_one("#dash-tabs").active = "tab-plots"
        await pilot.pause()
        assert app.query_one(TtftPlot).region.height >= 8


def test_forecast_text_states():
    from chatphase.timing.forecast import forecast_kv
    from chatphase.ui.dashboard.kv_forecast import forecast_text

    cap = 2048 * 23_040
    assert forecast_text(forecast_kv([], 2048), 23_040, cap) == "KV 0/2,048 tok · 0 B/45.0 MiB"
    assert forecast_text(forecast_kv([0, 0], 2048), 23_040, cap).endswith("· not growing")
    full = forecast_kv([1900, 2048], 2048)
    assert forecast_text(full, 23_040, cap).endswith(  # the default policy, drop-oldest
        "· the next turn may not fit: the oldest messages will then be dropped and what follows them read again"
    )
    # what the chosen policy will do, not always a drop
    assert forecast_text(full, 23_040, cap, overflow="shift").endswith(
        "· the next turn may not fit: the oldest messages will then be shifted out of the KV cache"
    )
    assert forecast_text(full, 23_040, cap, overflow="stop").endswith(
        "· the next turn may not fit: it will then be refused (overflow policy stop: nothing is dropped)"
    )
    assert (
        forecast_text(forecast_kv([1000], 2048), 23_040, cap, usage=False)
        == "KV forecast: ~1 turn left at +1,000 tok/turn"
    )
    assert forecast_text(forecast_kv([], 2048), 23_040, cap, usage=False) == "KV forecast: after the first turn"
    assert forecast_text(forecast_kv([1000], 2048), 23_040, cap).endswith("· ~1 turn left at +1,000 tok/turn")


async def test_history_table_keeps_no_lines_of_earlier_updates(app):
    # DataTable caches rendered lines by its update count; each new row made every cached line unreachable,
    # and its LRU caches (1,000 lines) kept them: the UI grew by about 100 KiB a turn over a chat's first turns
    async with app.run_test(size=(120, 50)) as pilot:
        dash = app.query_one(Dashboard)
        dash.set_model(loaded_model())
        table = app.query_one(TurnHistoryTable)
        for number in range(1, 41):
            dash.turn_finished(number, TURNS[number % len(TURNS)])
            await pilot.pause()
        lines = table.virtual_size.height
        assert table.row_count == 40
        assert len(table._line_cache) <= lines and len(table._row_render_cache) <= table.row_count + 1


async def test_a_turn_cancelled_in_its_prefill_shows_a_dash_for_the_phases_that_did_not_happen(app):
    """No first token: the first token and decode did not happen, so the legend says ``–``, not ``0.0 ms``."""
    cancelled = scripted_turn(600, 0, 0, 300, stop_reason="cancelled")
    assert cancelled.ttft_ms is None and cancelled.decode_ms == 0.0  # as the engine reports it
    async with app.run_test(size=(120, 50)) as pilot:
        dash = await feed(app)
        dash.turn_finished(4, cancelled)
        await pilot.pause()
        timeline = app.query_one(TurnTimeline)
        assert timeline.metrics is cancelled
        legend = timeline.render().plain.splitlines()[1]
        assert "1st token –" in legend and "decode –" in legend and "prefill 1.88 s" in legend
        assert "0.0 ms" not in legend


async def test_the_chat_apps_forecast_follows_the_overflow_policy_in_use():
    """The dashboard asks the chat for its policy at each update: a change of policy changes the forecast's words."""
    from ui_support import make_app

    from chatphase.settings.schema import Settings

    app, _ = make_app(Settings().with_overrides(overflow="stop"))
    async with app.run_test(size=(140, 42)):
        dash = app.query_one(Dashboard)
        assert dash.overflow_policy() == "stop"
        app.chat.settings = app.chat.settings.with_overrides(overflow="shift")
        assert dash.overflow_policy() == "shift"
