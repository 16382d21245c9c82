"""The Experiments screen's Interference tab: the real run on a scripted engine fills the table, the summary and the
swim lanes; live lane updates repaint at a bounded rate, never once per update; the form's bad input is a notice."""

from __future__ import annotations

import asyncio
import threading

from bench_support import CharTokenizer
from fake_engine import fake_model_info
from textual.app import App
from textual.widgets import DataTable, Input, Static
from ui_support import wait_for, wait_thread

from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.interference.run import InterferenceProgress, InterferenceRun, LaneUpdate
from chatphase.engine.interference import StepRecord
from chatphase.settings.schema import Settings
from chatphase.ui.experiments.interference import REPAINT_HZ, TICK, SwimLanes
from chatphase.ui.experiments.screen import ExperimentsScreen
from tests.bench.test_bench_interference import PEAKS, ScriptedEngine


class ScriptedInterferenceJob:
    """An :class:`~chatphase.bench.core.job.ExperimentJob` stand-in: the real InterferenceRun on a scripted engine,
    in-process."""

    def __init__(self, info, config, plan):
        self.run = InterferenceRun(info, config, plan, engine_factory=lambda i, c: ScriptedEngine(), peaks=PEAKS,
                                   builder=PromptBuilder(CharTokenizer()))  # fmt: skip

    def events(self):
        yield from self.run

    def cancel(self):
        self.run.cancel()


class PausingInterferenceJob(ScriptedInterferenceJob):
    """The scripted job, holding still twice until :attr:`go` is set (a cancel sets it too): at the first lane
    update (measuring has begun) and after the warm-up runs (``warmups`` of them); :attr:`paused` is set at each."""

    last: PausingInterferenceJob
    warmups = 2  # whole and one chunk, one warm-up each

    def __init__(self, info, config, plan):
        super().__init__(info, config, plan)
        self.paused, self.go = threading.Event(), threading.Event()
        type(self).last = self

    def _hold(self) -> None:
        self.paused.set()
        self.go.wait(10)
        self.go.clear()

    def events(self):
        lanes = progress = 0
        for event in self.run:
            yield event  # handled by the screen before the next (call_from_thread waits)
            lanes += isinstance(event, LaneUpdate)
            progress += isinstance(event, InterferenceProgress)
            if (isinstance(event, LaneUpdate) and lanes == 1) or (
                isinstance(event, InterferenceProgress) and progress == self.warmups
            ):
                self._hold()

    def cancel(self):
        super().cancel()
        self.go.set()


class ExperimentsApp(App):
    def __init__(self, job_factory=ScriptedInterferenceJob):
        super().__init__()
        self.screen_obj = ExperimentsScreen(
            fake_model_info(), Settings().with_overrides(n_ctx=4096), job_factory=job_factory
        )

    def on_mount(self):
        self.push_screen(self.screen_obj)


async def _open_tab(pilot, screen, **values):
    await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-interference")
    await pilot.pause()
    for id_, value in values.items():
        screen.query_one(f"#{id_}", Input).value = value
    await pilot.pause()


async def test_a_run_fills_the_table_the_summary_and_the_swim_lanes():
    app = ExperimentsApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _open_tab(
            pilot,
            screen,
            **{
                "exp-interference-n_running": "2",
                "exp-interference-newcomer_tokens": "128",
                "exp-interference-chunks": "16,64",
            },
        )
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert str(screen.query_one("#exp-status", Static).render()) == "Done."
        table = screen.query_one("#exp-table", DataTable)
        assert [str(table.get_row_at(i)[0]) for i in range(table.row_count)] == ["whole", "chunk 64", "chunk 16"]
        assert "trade-off" in str(screen.query_one("#exp-summary", Static).render())
        whole = screen.query_one("#exp-lanes-whole", SwimLanes)
        chunked = screen.query_one("#exp-lanes-chunked", SwimLanes)
        assert chunked.title == "chunk 16 (the smallest)" and len(whole.lanes) == len(chunked.lanes) == 3
        drawn = whole.render().plain.splitlines()
        assert [line.split()[0] for line in drawn[1:4]] == ["stream", "stream", "newcomer"]
        assert "█" in drawn[3] and "░" in drawn[1] and TICK in drawn[1]  # the block, the stall under it, tokens


def _update(first: bool, index: int) -> LaneUpdate:
    step = StepRecord(index, index * 10_000_000, index * 10_000_000 + 9_000_000, (0, 1), 2, 0)
    return LaneUpdate(None, 0, 2, 0, (step,), first)


async def test_live_updates_repaint_at_a_bounded_rate(monkeypatch):
    app = ExperimentsApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _open_tab(pilot, screen)
        lanes = screen.query_one("#exp-lanes-whole", SwimLanes)
        repaints = []
        monkeypatch.setattr(lanes, "refresh", lambda *a, **k: repaints.append(1))
        screen.job_pane = screen.pane  # as while its run goes: the screen routes the updates to the tab
        for i in range(200):  # far faster than the view repaints
            screen.handle_event(_update(i == 0, i))
        assert repaints == []  # nothing repaints per update
        await asyncio.sleep(2.5 / REPAINT_HZ)
        assert 1 <= len(repaints) <= 3 and len(lanes.lanes[0]) == 200 and lanes.title == "live: whole"


async def test_a_bad_form_is_a_notice_and_starts_nothing():
    app = ExperimentsApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _open_tab(pilot, screen, **{"exp-interference-chunks": "16,x"})
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and "Chunks:" in str(screen.query_one("#exp-status", Static).render())
        await _open_tab(pilot, screen, **{"exp-interference-chunks": "300"})
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and "over n_batch" in str(screen.query_one("#exp-status", Static).render())


async def test_the_status_says_measuring_once_the_lanes_draw_and_a_cancel_before_any_counted_run_says_so():
    """Seen: 'Loading SmolLM2…' stayed while the lanes already drew, and Esc after the warm-up said 'Cancelled:
    partial results.' over an empty table."""
    app = ExperimentsApp(PausingInterferenceJob)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _open_tab(
            pilot,
            screen,
            **{
                "exp-interference-n_running": "2",
                "exp-interference-newcomer_tokens": "128",
                "exp-interference-chunks": "64",
            },
        )
        status = screen.query_one("#exp-status", Static)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: hasattr(PausingInterferenceJob, "last") and screen.job is not None)
        job = PausingInterferenceJob.last
        await wait_thread(pilot, job.paused)  # the first lane update was handled
        await pilot.pause()
        assert str(status.render()) == "[0/6] measuring whole warm-up 1…"
        job.paused.clear()
        job.go.set()
        await wait_thread(pilot, job.paused)  # the warm-ups ran: nothing counted yet
        await pilot.press("escape")
        await app.workers.wait_for_complete()
        await wait_for(pilot, lambda: screen.job is None)
        table = screen.query_one("#exp-table", DataTable)
        assert table.row_count == 0 and str(status.render()) == "Cancelled: nothing was measured yet."
