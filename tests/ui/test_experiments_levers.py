"""The Experiments screen's Levers tab: a lever grid from the form, interleaved, with the table of measured
beside predicted figures and the two plots; refusals, save, the tab's own status line; a real tiny
synthetic model through the child-process job."""

from __future__ import annotations

import json

import pytest
from bench_support import CharTokenizer, ScriptedTokenEngine
from fake_engine import fake_model_info
from textual.app import App
from textual.widgets import DataTable, Input, Select, SelectionList, Static
from ui_support import GatedJob, wait_for

from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.grid.run import GridJob, GridProgress, GridRun
from chatphase.settings.schema import Settings
from chatphase.ui.experiments.levers import LeverPlot, LeversPane
from chatphase.ui.experiments.screen import ExperimentsScreen
from chatphase.units import DASH

#: scripted KV bytes per token by K type (K and V of a small model, in the ratio of llama.cpp's block sizes).
KV_BYTES = {"f16": 200_000, "q8_0": 153_125, "q4_0": 128_125}
PEAKS = MachinePeaks(10e9, "scripted copy", 3e11, "scripted matmul", threads=2)  # scripted runs stay under it


class ScriptedGridJob(GatedJob):
    """A :class:`~chatphase.bench.core.job.GridJob` stand-in: the real GridRun on scripted engines, in-process,
    with scripted peaks for every thread count; ``gate`` (when set up) holds it after ``stop_after`` runs."""

    PROGRESS = GridProgress
    last: ScriptedGridJob

    def __init__(self, info, config, plan):
        super().__init__()
        self.plan = plan
        self.configs = []

        def factory(i, cfg):  # a smaller K type: fewer KV bytes, and decode slows less with depth
            self.configs.append(cfg)
            kv = KV_BYTES[cfg.type_k]
            return ScriptedTokenEngine(kv_bytes_per_token=kv, decode_ms_per_depth=kv * 1e-7)

        self.run = GridRun(
            plan.points, plan.infos, config, plan.sweep, notes=plan.notes, engine_factory=factory,
            peaks={1: PEAKS, 2: PEAKS}, builder=PromptBuilder(CharTokenizer()),
        )  # fmt: skip


class LeversApp(App):
    def __init__(self, n_ctx=2048, flash_attn="auto", job_factory=ScriptedGridJob):
        super().__init__()
        settings = Settings().with_overrides(n_ctx=n_ctx, n_threads=2, flash_attn=flash_attn)
        self.screen_obj = ExperimentsScreen(fake_model_info(), settings, job_factory=job_factory)

    def on_mount(self):
        self.push_screen(self.screen_obj)


async def _levers_tab(pilot, screen, lever="type_k", values=None, lengths="16,64", depths="0,128", reps="2"):
    await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-grid")
    await pilot.pause()
    screen.query_one("#exp-lever", Select).value = lever
    await pilot.pause()
    fields = {
        "exp-grid-prompt_lengths": lengths,
        "exp-grid-depths": depths,
        "exp-grid-reps": reps,
        "exp-grid-gen_tokens": "8",
    }
    if values is not None:
        fields["exp-lvalues"] = values
    for id_, value in fields.items():
        screen.query_one(f"#{id_}", Input).value = value
    await pilot.pause()


def _options(models: SelectionList) -> set[str]:
    return {models.get_option_at_index(i).value for i in range(models.option_count)}


def _status(screen) -> str:
    return str(screen.query_one("#exp-status", Static).render())


async def test_a_kv_type_grid_runs_interleaved_and_fills_table_plots_and_saves(tmp_path):
    app = LeversApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _levers_tab(pilot, screen, values="f16,q8_0,q4_0")
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert _status(screen) == "Done."
        job = ScriptedGridJob.last
        assert [c.type_k for c in job.configs] == ["f16", "q8_0", "q4_0"]
        assert all(c.flash_attn == "auto" for c in job.configs)
        table = screen.query_one("#exp-table", DataTable)
        assert table.row_count == 3 * 4  # 3 points × (2 prompt + 2 depth cells)
        rows = [[str(v) for v in table.get_row_at(i)] for i in range(table.row_count)]
        assert [r[0] for r in rows[::4]] == ["ctk=f16", "ctk=q8_0", "ctk=q4_0"]
        # decode predicted, with its ratio; TTFT not: the Q4_1 weights have no prefill bound (the summary says why)
        assert all(r[3] == DASH and r[9] != DASH and float(r[10]) > 0 for r in rows)
        summary = str(screen.query_one("#exp-summary", Static).render())
        assert "peaks at 2 thread(s): read 10.0 GB/s" in summary and "prefill: no bound for Q4_1 weights" in summary
        decode, ttft = screen.query_one("#exp-plot-lbytes", LeverPlot), screen.query_one("#exp-plot-lttft", LeverPlot)
        series = decode.series()
        assert [p for p, _ in series] == ["ctk=f16", "ctk=q8_0", "ctk=q4_0"]
        # a smaller K type: fewer bytes read per step at the same depth, and a faster decode there
        deepest = [max(pts) for _, pts in series]
        assert deepest[0][0] > deepest[1][0] > deepest[2][0] and deepest[0][1] < deepest[1][1] < deepest[2][1]
        # x: the bytes the roofline says each step read (MB), y: the measured decode rate
        cells = screen.result.cells
        assert sorted(series[0][1]) == sorted(
            (c.prediction.step_bytes / 1e6, c.cell.decode_tokens_per_s.mean) for c in cells if c.point == "ctk=f16"
        )
        assert [len(pts) for _, pts in ttft.series()] == [2, 2, 2]
        assert decode.legend_lines == 3 + 2  # a line per point, and a bandwidth bound per thread count in the peaks

        path = tmp_path / "levers.json"
        assert screen.query_one("#exp-path", Input).value.startswith("bench-grid-")
        screen.query_one("#exp-path", Input).value = str(path)
        await pilot.press("ctrl+s")
        data = json.loads(path.read_text())
        assert len(data["grid"]) == 12 and data["grid"][0]["prediction"]["decode_tokens_per_s"] > 0
        await pilot.press("ctrl+o")  # a lever grid draws no overlays
        await pilot.pause()
        assert screen.overlays == []


async def test_the_table_fills_while_running_and_the_tab_keeps_its_own_status():
    ScriptedGridJob.stop_after = 5  # warm-up round (2 points × 2 cells) + the first counted run
    app = LeversApp()
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            screen = app.screen_obj
            await _levers_tab(pilot, screen, lever="n_threads", values="1,2", lengths="16", depths="0")
            await pilot.press("ctrl+r")
            table = screen.query_one("#exp-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 1)
            row = [str(v) for v in table.get_row_at(0)]
            assert row[0] == "t=1" and row[3] == DASH  # measured so far; predictions come with the result
            await pilot.press("ctrl+r")  # one run at a time
            await pilot.pause()
            await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-sweep")
            await pilot.pause()
            assert _status(screen) == "Set the sweep and press Run (Ctrl+R)."
            ScriptedGridJob.last.gate.set()
            screen.action_cancel()
            await app.workers.wait_for_complete()
            await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-grid")
            await pilot.pause()
            assert "Cancelled" in _status(screen)
            assert table.row_count >= 1 and screen.result.cancelled
    finally:
        ScriptedGridJob.stop_after = None


async def test_bad_values_are_notices_and_a_refused_v_type_is_left_out():
    app = LeversApp(flash_attn="off")
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _levers_tab(pilot, screen, lever="type_k", values="f16,q9_9")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and _status(screen).startswith("--cache-type-k 'q9_9': choose from f")
        await _levers_tab(pilot, screen, lever="n_ubatch", values="64,0")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and _status(screen) == "--n-ubatch 0: must be at least 1"
        await _levers_tab(pilot, screen, lever="type_v", values="q8_0")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and "a quantised V cache needs --flash-attn on or auto" in _status(screen)
        await _levers_tab(pilot, screen, lever="model")
        assert screen.query_one("#exp-lvalues", Input).disabled
        screen.query_one("#exp-lmodels", SelectionList).deselect_all()
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and _status(screen) == "Models: pick at least one in the list"
        # f16 and q8_0 V with flash attention off: q8_0 is left out with a note, f16 runs
        await _levers_tab(pilot, screen, lever="type_v", values="f16,q8_0", lengths="16", depths="")
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert [c.type_v for c in ScriptedGridJob.last.configs] == ["f16"]
        assert "note: left out ctv=q8_0" in str(screen.query_one("#exp-summary", Static).render())


async def test_run_refuses_while_the_chat_reply_streams():
    busy = [True]
    app = LeversApp()
    app.screen_obj.is_busy = lambda: busy[0]
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _levers_tab(pilot, screen, lengths="16", depths="")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and screen.result is None
        busy[0] = False
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert screen.result is not None


@pytest.mark.model
async def test_a_model_grid_on_a_tiny_synthetic_model_in_a_child_process(tmp_path):
    """The real job (llama.cpp in a child process) on a tiny synthetic model picked from the model list,
    twice (its Q4_0 and Q8_0 files): the decode plot's x is the bytes each step read."""
    from multiprocessing import resource_tracker

    from chatphase.models.synth import plan, write_synthetic
    from chatphase.models.synth_shapes import SHAPES

    resource_tracker.ensure_running()  # as the chat app's dispatcher does before any screen (engine_link.py)
    paths = [write_synthetic(plan(SHAPES["tiny-llama"], q), tmp_path / f"tiny-{q}.gguf") for q in ("Q4_0", "Q8_0")]

    def job(info, config, plan):  # the real child-process job, without measuring the machine's peaks
        return GridJob(plan.points, plan.infos, config, plan.sweep, plan.notes, roofline=False)

    app = LeversApp(n_ctx=256, job_factory=job)
    app.screen_obj.settings = Settings().with_overrides(n_ctx=256, n_threads=1, models_dir=str(tmp_path))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _levers_tab(pilot, screen, lever="model", lengths="32", depths="64", reps="1")
        models = screen.query_one("#exp-lmodels", SelectionList)
        pane = screen.query_one(LeversPane)
        pane.settings = screen.settings
        pane._find_models()
        await wait_for(pilot, lambda: {str(p) for p in paths} <= _options(models), timeout_s=10)
        models.deselect_all()
        for p in paths:
            models.select(str(p))
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.job is None, timeout_s=120)
        assert _status(screen) == "Done.", _status(screen)
        cells = screen.result.cells
        assert {c.point for c in cells} == {"model=tiny-Q4_0.gguf", "model=tiny-Q8_0.gguf"}
        assert all(c.synthetic and c.cell.decode_tokens_per_s.mean > 0 for c in cells)
        table = screen.query_one("#exp-table", DataTable)
        assert "(synthetic)" in str(table.get_row_at(0)[0])
        series = dict(screen.query_one("#exp-plot-lbytes", LeverPlot).series())
        assert max(series["model=tiny-Q8_0.gguf"])[0] > max(series["model=tiny-Q4_0.gguf"])[0]


def test_snapshot_of_a_kv_type_grid(snap_compare):
    """On the Levers tab after a scripted K-type grid (f16, q8_0, q4_0; prompts 16, 64, 128; depths 0, 256,
    512; 2 reps): the lever picker says "K cache type" and the values field its list; the left plot has
    two gray bandwidth-bound curves (10 GB/s at 1 and 2 threads) falling with MB read per step, and each K
    type's cells as coloured points near them, q4_0's furthest left (fewest bytes); the right plot rises
    with prompt tokens (the three K types overlap); the table lists each cell's measured figures beside
    the roofline's ("pred") and their ratio ("×"), with KV bytes per token — TTFT's and prefill's as dashes, as
    the scripted model's Q4_1 weights have no prefill bound; the footnotes say so and name the peaks;
    the file row has Save only (the tab draws no overlays)."""

    async def run_before(pilot):
        screen = pilot.app.screen_obj
        await _levers_tab(pilot, screen, values="f16,q8_0,q4_0", lengths="16,64,128", depths="0,256,512")
        for inp in screen.query(Input):
            inp.cursor_blink = False
        await pilot.press("ctrl+r")
        await pilot.app.workers.wait_for_complete()
        screen.query_one("#exp-table", DataTable).focus()
        pilot.app.clear_notifications()
        await pilot.pause(0.3)

    assert snap_compare(LeversApp(), terminal_size=(120, 40), run_before=run_before)
