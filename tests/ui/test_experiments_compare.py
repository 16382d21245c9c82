"""The Experiments screen's Side by side tab: the real comparison on scripted engines fills both columns on one time
axis, the ratios table and the summary; a bad form is a notice; a snapshot at 80x24."""

from __future__ import annotations

import pytest
from fake_engine import fake_model_info
from textual.app import App
from textual.widgets import DataTable, Input, Static, TextArea
from ui_support import shot, wait_for

from chatphase.bench.compare.run import CompareRun
from chatphase.settings.schema import Settings
from chatphase.ui.experiments.compare import BLOCK, PhaseColumn
from chatphase.ui.experiments.screen import ExperimentsScreen
from tests.bench.test_compare import fakes


class ScriptedCompareJob:
    """An :class:`~chatphase.bench.core.job.ExperimentJob` stand-in: the real CompareRun on scripted engines, in-process
    (side B prefills and decodes twice as slowly)."""

    def __init__(self, info, config, plan):
        factory, _ = fakes()
        self.run = CompareRun(info, Settings(engine=config), plan, engine_factory=factory)

    def events(self):
        yield from self.run

    def cancel(self):
        self.run.cancel()


class ExperimentsApp(App):
    def __init__(self):
        super().__init__()
        self.screen_obj = ExperimentsScreen(fake_model_info(), Settings(), job_factory=ScriptedCompareJob)

    def on_mount(self):
        self.push_screen(self.screen_obj)


async def _open_tab(pilot):
    await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-compare")
    await pilot.pause()


async def test_a_run_draws_both_sides_on_one_time_axis_and_the_ratios():
    app = ExperimentsApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _open_tab(pilot)
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert str(screen.query_one("#exp-status", Static).render()) == "Done."
        table = screen.query_one("#exp-table", DataTable)
        assert table.row_count == 3  # the three default turns
        assert [str(c) for c in table.get_row_at(0)][5] == "0.50×"  # decode B/A: B is twice as slow
        a, b = (screen.query_one(f"#exp-cside-{s}", PhaseColumn) for s in "ab")
        assert a.scale_ms == b.scale_ms  # one time axis
        bars_a = [line.count(BLOCK) for line in a.render().plain.splitlines()[1:4]]
        bars_b = [line.count(BLOCK) for line in b.render().plain.splitlines()[1:4]]
        assert all(x < y for x, y in zip(bars_a, bars_b, strict=True))  # B's turns are the longer bars
        summary = str(screen.query_one("#exp-summary", Static).render())
        assert "never at once" in summary and "type_k: A 'f16', B 'q8_0'" in summary


async def test_a_bad_form_is_a_notice_and_starts_nothing():
    app = ExperimentsApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _open_tab(pilot)
        screen.query_one("#exp-compare-b", Input).value = "colour=red"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and "no setting is called" in str(screen.query_one("#exp-status", Static).render())
        screen.query_one("#exp-compare-b", Input).value = "type_k=q8_0"
        screen.query_one("#exp-cturns", TextArea).text = "\n\n"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and "Turns:" in str(screen.query_one("#exp-status", Static).render())


def test_the_tab_at_80x24(snap_compare):
    async def run_it(pilot):
        await _open_tab(pilot)
        await pilot.press("ctrl+r")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    assert snap_compare(ExperimentsApp(), terminal_size=(80, 24), run_before=run_it)


@pytest.mark.model
async def test_the_real_default_model_against_a_q8_0_kv_cache(default_model_info):
    """The tab's real job (a child process, two engines) on the default model: both columns fill, B's KV bytes are
    smaller; with ``CHATPHASE_SCREENSHOTS=1`` it saves ``screenshots/compare.svg``."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # before Textual's test harness takes the fds a child's start needs
    settings = Settings().with_overrides(n_ctx=1024)

    class RealApp(App):
        def on_mount(self):
            self.push_screen(ExperimentsScreen(default_model_info, settings))

    app = RealApp()
    async with app.run_test(size=(120, 40)) as pilot:
        await _open_tab(pilot)
        screen = app.screen
        screen.query_one("#exp-compare-gen_tokens", Input).value = "12"
        screen.query_one("#exp-cturns", TextArea).text = "Name three colours.\n\nWhich one is the warmest?"
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.job is None, 240)
        result = screen.results.get("compare")
        assert result is not None, str(screen.query_one("#exp-status", Static).render())
        assert [(t.turn, t.side) for t in result.turns] == [(0, "A"), (0, "B"), (1, "B"), (1, "A")]
        assert all(r["kv_cache_bytes"] < 0.9 for r in result.ratios())
        await pilot.pause(0.3)
        shot(app, "compare")
