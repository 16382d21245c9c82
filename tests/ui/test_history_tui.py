"""The dashboard's *every session* plots: this model's turns from earlier sessions, read off the UI thread."""

from __future__ import annotations

import threading

from dashboard_support import TURNS, loaded_model
from textual.app import App, ComposeResult
from textual.widgets import Checkbox, TabbedContent

from chatphase.ui.dashboard.dashboard import Dashboard
from chatphase.ui.dashboard.phase_plots import DecodeDepthPlot, TtftPlot
from tests.history.test_history import metrics, write_session

ROWS = [
    {"prompt_tokens": 100, "cached_tokens": 0, "ttft_ms": 40.0, "decode_tokens_per_s": 30.0, "kv_cache_tokens": 120},
    {"prompt_tokens": 900, "cached_tokens": 800, "ttft_ms": 45.0, "decode_tokens_per_s": 25.0, "kv_cache_tokens": 950},
    {
        "prompt_tokens": None,
        "cached_tokens": None,
        "ttft_ms": 9.0,
        "decode_tokens_per_s": None,
        "kv_cache_tokens": None,
    },
]


class Source:
    """A history source that records the model asked for and the thread it ran on."""

    def __init__(self, rows=None, error: str | None = None) -> None:
        self.rows, self.error, self.calls = rows or [], error, []

    def __call__(self, model_name: str) -> list[dict]:
        self.calls.append((model_name, threading.current_thread() is threading.main_thread()))
        if self.error:
            raise RuntimeError(self.error)
        return self.rows


class HostApp(App):
    def __init__(self, source) -> None:
        super().__init__()
        self.source = source

    def compose(self) -> ComposeResult:
        yield Dashboard(history_source=self.source)


async def test_the_toggle_adds_earlier_turns_read_in_a_worker():
    source = Source(ROWS)
    app = HostApp(source)
    async with app.run_test(size=(120, 50)) as pilot:
        dash = app.query_one(Dashboard)
        dash.set_model(loaded_model())
        dash.turn_finished(1, TURNS[0])
        app.query_one(TabbedContent).active = "tab-plots"
        await pilot.pause()
        assert source.calls == [] and app.query_one(TtftPlot).history == []
        app.query_one(Checkbox).value = True
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert source.calls == [(loaded_model().info.name, False)]  # off the UI thread
        ttft = app.query_one(TtftPlot)
        assert ttft.history == [(100.0, 40.0), (100.0, 45.0)]  # at the tokens each turn evaluated
        assert "2 earlier" in ttft.title() and ttft.points["cold"] == [(120.0, TURNS[0].ttft_ms)]
        assert ttft.drawn_title() == ttft.title()  # 120 columns: the whole title
        await pilot.resize_terminal(60, 50)  # as narrow as the chat's side panel
        await pilot.pause()
        # plotext draws no title wider than the plot: the legend gives way, the count stays
        drawn = ttft.drawn_title()
        assert len(ttft.title()) > ttft.size.width >= len(drawn) and drawn == "TTFT vs prompt tokens · 2 earlier"
        await pilot.resize_terminal(120, 50)
        assert app.query_one(DecodeDepthPlot).history == [(120.0, 30.0), (950.0, 25.0)]
        app.query_one(Checkbox).value = False
        await pilot.pause()
        assert app.query_one(TtftPlot).history == [] and app.query_one(DecodeDepthPlot).history == []


async def test_a_history_that_cannot_be_read_is_a_notice():
    app = HostApp(Source(error="cannot open the history /x/history.db: disk I/O error"))
    async with app.run_test(size=(120, 50)) as pilot:
        app.query_one(Dashboard).set_model(loaded_model())
        app.query_one(Checkbox).value = True
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert [n.message for n in app._notifications] == [
            "history: cannot open the history /x/history.db: disk I/O error"
        ]


def test_earlier_turns_are_the_models_turns_outside_the_chats_own_session():
    from chatphase.ui.history_source import EarlierTurns

    own = write_session([("mine", "a", metrics(10, 5.0))])
    write_session([("earlier", "b", metrics(50, 15.0))])
    write_session([("other model", "c", metrics(70, 25.0))], model={"name": "Other-2M"})

    class Recording:
        writer = own

    rows = EarlierTurns(Recording())("TestModel-1M")  # type: ignore[arg-type]  # the writer is all it reads
    assert [(r["prompt_tokens"], r["ttft_ms"]) for r in rows] == [(50, 15.0)]
