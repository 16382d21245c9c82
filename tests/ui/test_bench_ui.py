"""The Experiments screen with a scripted in-process job: run, live plot, table, save, load + overlay, errors;
both tabs (prompt length & depth, parallel), and the form's layout at 80 columns."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import threading

import pytest
from bench_support import CharTokenizer, ScriptedBatchEngine, ScriptedTokenEngine
from fake_engine import fake_model_info
from rich.text import Text
from textual.app import App
from textual.widgets import DataTable, Input, ProgressBar, Static
from ui_support import wait_for

from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.parallel.run import ParallelRun
from chatphase.bench.parallel.sweep import ParallelPlan
from chatphase.bench.sweep.loop import SweepProgress
from chatphase.bench.sweep.run import SweepRun
from chatphase.engine.config import EngineConfig
from chatphase.settings.schema import Settings
from chatphase.ui.experiments.plot import BenchPlot, ParallelPlot, y_axis
from chatphase.ui.experiments.screen import ExperimentsScreen


class ScriptedJob:
    """A :class:`~chatphase.bench.core.job.job_for` stand-in: the real SweepRun on a scripted engine, in-process
    (a scripted batched engine and scripted machine peaks for the parallel sweep)."""

    def __init__(self, info, settings, plan):
        parallel = isinstance(plan, ParallelPlan)
        self.run = (ParallelRun if parallel else SweepRun)(
            info,
            settings,
            plan,
            engine_factory=lambda i, s: ScriptedBatchEngine() if parallel else ScriptedTokenEngine(),
            roofline=parallel,
            peaks=MachinePeaks(20e9, "scripted copy", 100e9, "scripted matmul") if parallel else None,
            builder=PromptBuilder(CharTokenizer()),
        )

    def events(self):
        yield from self.run

    def cancel(self):
        self.run.cancel()


class ExperimentsApp(App):
    def __init__(self, n_ctx=2048):
        super().__init__()
        self.screen_obj = ExperimentsScreen(
            fake_model_info(), Settings().with_overrides(n_ctx=n_ctx), job_factory=ScriptedJob
        )

    def on_mount(self):
        self.push_screen(self.screen_obj)


async def _fill(pilot, screen, lengths="16,64,128", depths="0,256", reps="2", gen="8"):
    for id_, value in (
        ("exp-sweep-prompt_lengths", lengths),
        ("exp-sweep-depths", depths),
        ("exp-sweep-reps", reps),
        ("exp-sweep-gen_tokens", gen),
    ):
        screen.query_one(f"#{id_}", Input).value = value
    await pilot.pause()


async def test_run_fills_table_plots_and_saves_then_overlays(tmp_path):
    app = ExperimentsApp()
    async with app.run_test(size=(150, 48)) as pilot:
        screen = app.screen_obj
        bar = screen.query_one("#exp-progress", ProgressBar)
        assert bar.total is not None and not bar.visible  # idle: no animated indeterminate bar
        await _fill(pilot, screen)
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert bar.visible and str(screen.query_one("#exp-status", Static).render()) == "Done."
        assert screen.query_one("#exp-progress", ProgressBar).progress == 15  # 5 cells × (1 warm-up + 2 reps)
        table = screen.query_one("#exp-table", DataTable)
        assert table.row_count == 5
        assert [str(table.get_row_at(i)[4]) for i in range(3)] == ["21.0 ± 0.0", "69.0 ± 0.0", "133.0 ± 0.0"]
        assert "fit: TTFT ms = 5.0 + 1.000 × prompt_tokens" in str(screen.query_one("#exp-summary", Static).render())
        ttft, decode = screen.query_one("#exp-plot-ttft", BenchPlot), screen.query_one("#exp-plot-decode", BenchPlot)
        assert ttft.series_count() == decode.series_count() == 1
        app.save_screenshot(str(tmp_path / "experiments.svg"))

        path = tmp_path / "run.json"
        screen.query_one("#exp-path", Input).value = str(path)
        await pilot.press("ctrl+s")
        assert path.exists()
        await pilot.press("ctrl+o")  # load the same file back as an overlay
        await pilot.pause()
        assert len(screen.overlays) == 1 and ttft.series_count() == 2
        await pilot.click("#exp-clear")
        assert ttft.series_count() == 1


async def test_live_points_appear_while_running():
    app = ExperimentsApp()
    async with app.run_test(size=(150, 48)) as pilot:
        screen = app.screen_obj
        await _fill(pilot, screen, depths="")
        plot = screen.query_one("#exp-plot-ttft", BenchPlot)
        plot.start_live("x")
        from chatphase.bench.core.results import Sample

        plot.add_sample(Sample("prompt", 16, 0, 0, False, 21.0, 1.0, 2.0, 3.0, 16, 0, 8, 0, "length"))
        plot.add_sample(Sample("prompt", 16, 0, 0, True, 99.0, 1.0, 2.0, 3.0, 16, 0, 8, 0, "length"))  # warm-up
        plot.add_sample(Sample("depth", 20, 16, 0, False, 9.0, 1.0, 2.0, 3.0, 4, 16, 8, 0, "length"))  # other plot
        assert plot.live == [(16.0, 21.0)]


async def test_bad_form_gives_a_notice_and_starts_nothing():
    app = ExperimentsApp(n_ctx=256)
    async with app.run_test(size=(150, 48)) as pilot:
        screen = app.screen_obj
        await _fill(pilot, screen, lengths="16,abc")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None
        assert "Prompt lengths: expected comma-separated" in str(screen.query_one("#exp-status", Static).render())
        await _fill(pilot, screen, lengths="300")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and "below n_ctx 256" in str(screen.query_one("#exp-status", Static).render())
        screen.query_one("#exp-path", Input).value = "/nonexistent/x.json"
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert screen.overlays == []


async def test_escape_cancels_a_run_then_closes():
    app = ExperimentsApp()
    async with app.run_test(size=(150, 48)) as pilot:
        screen = app.screen_obj
        await _fill(pilot, screen)
        screen.action_run()
        screen.action_cancel_or_close()  # cancels: the run ends with partial results
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert screen.job is None and screen.result is not None
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is not screen


def test_ui_module_does_not_import_llama_cpp():
    code = "import sys, chatphase.ui.experiments.screen; assert 'llama_cpp' not in sys.modules, 'llama_cpp imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _other_result(path):
    """A second scripted run (half the prefill cost, slower decode) saved as JSON, to overlay."""
    from chatphase.bench.core.results import save_result
    from chatphase.bench.sweep.loop import SweepPlan

    plan = SweepPlan(prompt_lengths=(16, 64, 128), depths=(0, 256, 512), gen_tokens=8, reps=2, warmup=0)
    engine = ScriptedTokenEngine(prefill_ms_per_token=0.5, decode_ms=14.0)
    res = list(
        SweepRun(
            fake_model_info(),
            EngineConfig(n_ctx=2048),
            plan,
            engine_factory=lambda i, s: engine,
            roofline=False,
            builder=PromptBuilder(CharTokenizer()),
        )
    )[-1].result
    res.label = "other settings"
    save_result(res, path)


def test_snapshot_after_a_run_with_an_overlay(snap_compare, tmp_path):
    """On the "Prompt length & depth" tab (the "Parallel" tab beside it), after a scripted sweep (3 prompt
    lengths, 3 depths, 2 reps): Run/Cancel beside the progress bar, 100 % and "Done."; the left plot
    rises linearly (TTFT = 5 ms + 1 ms/token), the right falls with depth; a second series "other settings"
    (loaded from JSON) is overlaid in another colour — lower TTFT, lower decode rate — and both are named in
    the legends; the table shows mean ± sd per cell, the fit line under it; the footer lists Run,
    Cancel/Close, Save, Load."""
    path = tmp_path / "other.json"
    _other_result(path)

    async def run_before(pilot):
        screen = pilot.app.screen_obj
        for inp in screen.query(Input):
            inp.cursor_blink = False
        await _fill(pilot, screen, lengths="16,64,128", depths="0,256,512")
        await pilot.press("ctrl+r")
        await pilot.app.workers.wait_for_complete()
        screen.query_one("#exp-path", Input).value = str(path)
        await pilot.press("ctrl+o")
        screen.query_one("#exp-path", Input).value = "other.json"  # tmp_path differs per run
        screen.query_one("#exp-table", DataTable).focus()
        pilot.app.clear_notifications()
        await pilot.pause(0.3)

    assert snap_compare(ExperimentsApp(), terminal_size=(120, 40), run_before=run_before)


async def test_ctrl_t_and_the_palette_open_experiments_in_the_chat_app():
    from ui_support import make_app, wait_for

    app, _ = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        assert "Experiments: Open" in {c.title for c in app.get_system_commands(app.screen)}
        await pilot.press("ctrl+t")  # with the prompt box focused, as a user would (F6/F7 belong to TextArea)
        await wait_for(pilot, lambda: isinstance(app.screen, ExperimentsScreen))
        assert app.screen.model_info == app.chat.model_info and app.screen.settings is app.chat.settings
        await pilot.press("escape")  # nothing running: closes
        await wait_for(pilot, lambda: not isinstance(app.screen, ExperimentsScreen))


async def test_ctrl_t_inside_experiments_keeps_one_screen_and_one_sweep(monkeypatch):
    from ui_support import make_app, wait_for

    monkeypatch.setattr("chatphase.ui.experiments.panes.job_for", ScriptedJob)
    app, _ = make_app()

    def open_screens():
        return [s for s in app.screen_stack if isinstance(s, ExperimentsScreen)]

    async with app.run_test(size=(130, 40)) as pilot:
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: isinstance(app.screen, ExperimentsScreen))
        first = app.screen
        await pilot.press("ctrl+t")  # inside it: nothing new
        await pilot.pause()
        assert open_screens() == [first] and app.screen is first
        command = next(c for c in app.get_system_commands(app.screen) if c.title == "Experiments: Open")
        await command.callback()  # the palette's command, from the screen
        await pilot.pause()
        assert open_screens() == [first] and app.screen is first


async def test_run_refuses_while_the_chat_reply_streams(monkeypatch):
    from ui_support import make_app, notifications, send, wait_for, wait_thread

    monkeypatch.setattr("chatphase.ui.experiments.panes.job_for", ScriptedJob)
    app, engines = make_app(hold="decode", hold_after_tokens=2)
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: app.chat.ready)
        await send(pilot, "hello")
        await wait_thread(pilot, engines[0].held)
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: isinstance(app.screen, ExperimentsScreen))
        screen = app.screen
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and not screen.query_one("#exp-run").disabled
        assert "Not running the sweep: wait for the reply or stop it (press Ctrl+C)." in notifications(app)
        await pilot.press("ctrl+c")  # stops the reply from this screen
        await wait_for(pilot, lambda: app.chat.turn is None)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.result is not None)


async def _parallel_tab(pilot, screen, n_seqs="1,2,4", length="16", reps="2", gen="8"):
    await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-parallel")
    await pilot.pause()
    for id_, value in (
        ("exp-parallel-n_seqs", n_seqs),
        ("exp-parallel-prompt_lengths", length),
        ("exp-parallel-reps", reps),
        ("exp-parallel-gen_tokens", gen),
    ):
        screen.query_one(f"#{id_}", Input).value = value
    await pilot.pause()


async def test_parallel_sweep_plots_live_then_fills_table_saves_and_overlays(tmp_path):
    app = ExperimentsApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _parallel_tab(pilot, screen)
        assert screen.pane.kind == "parallel" and screen.query_one("#exp-path", Input).value.startswith(
            "bench-parallel-"
        )
        plot = screen.query_one("#exp-plot-parallel", ParallelPlot)
        seen: list[int] = []
        original = plot.add_sample
        plot.add_sample = lambda s: (original(s), seen.append(len(plot.live)))  # the live series as it grows
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert seen == [0, 1, 2, 2, 3, 4, 4, 5, 6]  # warm-ups are not plotted
        assert str(screen.query_one("#exp-status", Static).render()) == "Done."
        assert screen.query_one("#exp-progress", ProgressBar).progress == 9  # 3 N × (1 warm-up + 2 reps)
        table = screen.query_one("#exp-table", DataTable)
        assert [str(c.label) for c in table.columns.values()][:6] == [
            "prompt tok",
            "N",
            "reps",
            "step ms",
            "per-seq tok/s",
            "aggregate tok/s",
        ]
        assert [str(table.get_row_at(i)[5]) for i in range(3)] == [
            "90.9 ± 0.0",
            "166.7 ± 0.0",
            "285.7 ± 0.0",
        ]  # 1000 N / (10 + N)
        summary = str(screen.query_one("#exp-summary", Static).render())
        assert "the step's arithmetic: no bound for Q4_1 weights" in summary and "N=4: a step reads" in summary
        assert plot.series_count() == 1 and plot.live == []
        path = tmp_path / "parallel.json"
        screen.query_one("#exp-path", Input).value = str(path)
        await pilot.press("ctrl+s")
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert plot.series_count() == 2  # overlaid on the parallel plot...
        assert screen.query_one("#exp-plot-ttft", BenchPlot).series_count() == 0  # ...and on no other
        await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-sweep")
        await pilot.pause()
        assert (
            screen.result is None
            and table.row_count == 0
            and "TTFT ms" in [str(c.label) for c in table.columns.values()]
        )


async def test_parallel_form_errors_are_notices():
    app = ExperimentsApp(n_ctx=512)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        cases = (
            ("0", "16", "N must be 1 to 256"),
            ("8", "60", "n_ctx 512 holds 7 such"),
            ("2,x", "16", "Sequences (N): expected"),
        )
        for n_seqs, length, message in cases:
            await _parallel_tab(pilot, screen, n_seqs=n_seqs, length=length, gen="8")
            await pilot.press("ctrl+r")
            await pilot.pause()
            assert screen.job is None and message in str(screen.query_one("#exp-status", Static).render())


@pytest.mark.parametrize(
    ("tab", "fields"), [("sweep", 4), ("parallel", 4), ("grid", 6), ("spec", 3), ("interference", 5)]
)
async def test_at_80x24_every_tab_fits_its_labels_and_the_screen(tab, fields):
    """At 80×24 every field's label is shown whole, with a gap before the next field ("Prompt lengthsDepths"),
    and the whole screen fits without scrolling (the file row at the bottom is not cut); a table wider than
    the screen scrolls sideways (the Levers table's columns)."""
    from textual.containers import VerticalScroll
    from textual.widgets import Label

    app = ExperimentsApp()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen_obj
        await pilot.click(f"#exp-tabs Tab#--content-tab-exp-tab-{tab}")
        await pilot.pause()
        labels = [lbl for lbl in screen.pane.query(".exp-field Label").results(Label)]
        assert len(labels) == fields
        for lbl in labels:
            assert lbl.region.width >= len(str(lbl.render())), str(lbl.render())
        for left, right in itertools.pairwise(labels):
            assert left.region.right < right.region.x, (str(left.render()), str(right.render()))
        for field in screen.pane.query(".exp-field Input").results(Input):
            assert field.content_region.width >= len(field.value), field.value  # the default values show whole
        box = screen.query_one("#exp-box", VerticalScroll)
        assert box.max_scroll_y == 0, "the screen scrolls at 80×24"
        table = screen.query_one("#exp-table", DataTable)
        assert table.virtual_size.width <= table.size.width or table.show_horizontal_scrollbar


class GatedJob(ScriptedJob):
    """A scripted job that waits at ``gate`` after its ``stop_after``-th progress event."""

    stop_after = 3

    def __init__(self, info, settings, plan):
        super().__init__(info, settings, plan)
        self.gate = threading.Event()
        GatedJob.last = self

    def events(self):
        seen = 0
        for event in self.run:
            yield event
            seen += isinstance(event, SweepProgress)
            if seen == self.stop_after:
                self.gate.wait(10)


async def test_at_120x40_the_table_fills_while_running_and_each_tab_keeps_its_status():
    """The cells measured so far are rows while the sweep runs (not only after it ends or is cancelled),
    and the Parallel tab never shows the sweep tab's status."""
    app = ExperimentsApp()
    app.screen_obj.job_factory = GatedJob
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _fill(pilot, screen, depths="")
        await pilot.press("ctrl+r")
        table = screen.query_one("#exp-table", DataTable)
        await wait_for(pilot, lambda: table.row_count == 1)  # warm-up, rep 1, rep 2 of the first cell
        assert screen.job is not None and str(table.get_row_at(0)[1]) == "16"
        GatedJob.last.gate.set()
        screen.action_cancel()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "Cancelled" in str(screen.query_one("#exp-status", Static).render())
        await _parallel_tab(pilot, screen)
        assert str(screen.query_one("#exp-status", Static).render()) == "Set the sweep and press Run (Ctrl+R)."
        await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-sweep")
        await pilot.pause()
        assert "Cancelled" in str(screen.query_one("#exp-status", Static).render())


async def test_at_120x40_the_parallel_table_fits_and_save_says_where(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = ExperimentsApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _parallel_tab(pilot, screen)
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        table = screen.query_one("#exp-table", DataTable)
        assert table.row_count == 3 and table.virtual_size.width <= table.size.width  # every column whole
        await pilot.press("ctrl+s")
        await pilot.pause()
        saved = next(n.message for n in app._notifications if n.message.startswith("Saved"))
        assert saved == f"Saved {tmp_path / screen.query_one('#exp-path', Input).value}"


@pytest.mark.parametrize("top", [27.1, 444.4, 0.37, 1.0, 2000.0])
@pytest.mark.parametrize("rows", [5, 12, 30])
def test_y_ticks_are_even_and_leave_the_legend_rows_free(top, rows):
    ticks = y_axis(top, rows, legend_lines=2)
    steps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
    assert ticks[0] == 0 and len(steps) == 1 and 2 <= len(ticks) <= 8
    data_rows_free = rows * (1 - top / ticks[-1])  # rows above the highest point
    assert data_rows_free >= min(3, rows // 2) - 1e-9


async def test_plots_draw_even_y_ticks():
    """The tick labels drawn are the even ones (plotext alone labels data rows: 27.1, 23.7, 20.3, 13.4)."""
    app = ExperimentsApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _fill(pilot, screen)
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        for plot in screen.query(BenchPlot):
            drawn = Text.from_ansi(plot.plt.build()).plain if plot.render() else ""
            labels = [float(m) for m in re.findall(r"^ *([\d.]+) *┤", drawn, flags=re.M)]
            steps = {round(b - a, 6) for a, b in itertools.pairwise(sorted(labels))}
            assert len(labels) >= 3 and len(steps) == 1 and min(labels) == 0, drawn


@pytest.mark.parametrize(
    ("tab", "overlays"),
    [("sweep", True), ("parallel", True), ("grid", False), ("spec", False), ("interference", False)],
)
async def test_only_the_tabs_that_draw_overlays_offer_load_and_clear(tab, overlays):
    """docs/levers.md: the Levers and Speculative tabs draw no overlays of loaded files, so they show no overlay
    buttons and no Load key in the footer."""
    from textual.widgets import Button

    app = ExperimentsApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await pilot.click(f"#exp-tabs Tab#--content-tab-exp-tab-{tab}")
        await pilot.pause()
        for id_ in ("exp-load", "exp-clear"):
            button = screen.query_one(f"#{id_}", Button)
            assert (button.display and button.visible) == overlays, id_
        footer_actions = {b.action for b in screen.active_bindings.values() for b in [b.binding]}
        assert ("load" in footer_actions) == overlays
        assert "save" in footer_actions


async def test_each_tab_has_its_own_file_name_and_progress_and_save_never_overwrites_silently(tmp_path):
    """A saved sweep is never replaced by another tab's result: the file name (and the progress bar) belong to
    the tab, and Save on an existing file asks first (Ctrl+S again replaces it)."""
    app = ExperimentsApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        path_box, bar = screen.query_one("#exp-path", Input), screen.query_one("#exp-progress", ProgressBar)
        await _fill(pilot, screen, depths="")
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        mine = tmp_path / "mine.json"
        path_box.value = str(mine)
        await pilot.press("ctrl+s")
        await pilot.pause()
        sweep_text = mine.read_text()
        assert '"results"' in sweep_text and bar.visible and bar.progress == 9

        await _parallel_tab(pilot, screen)
        assert path_box.value.startswith("bench-parallel-")  # the tab's own name, not the sweep's file
        assert not bar.visible  # nor the sweep's progress: this tab has not run
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert bar.visible and bar.progress == 9
        path_box.value = str(mine)  # the user picks the sweep's file by hand
        app.clear_notifications()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert mine.read_text() == sweep_text  # asked, not overwritten
        assert any("exists" in str(n.message) and "Ctrl+S again" in str(n.message) for n in app._notifications)

        await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-sweep")
        await pilot.pause()
        assert path_box.value == str(mine) and bar.progress == 9  # the sweep's own name and progress again
        await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-parallel")
        await pilot.pause()
        assert path_box.value == str(mine)  # the name typed on this tab is kept
        await pilot.press("ctrl+s")  # asks again: the question was for before the tab changed
        await pilot.pause()
        assert mine.read_text() == sweep_text
        await pilot.press("ctrl+s")  # the second press replaces it
        await pilot.pause()
        assert '"parallel"' in mine.read_text() and mine.read_text() != sweep_text
