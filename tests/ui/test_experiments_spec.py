"""The Experiments screen's Speculative tab: decode modes as interleaved arms on both prompt kinds, the table
(tok/s, × off, acceptance, tokens per step, × own steps, same reply) filling as runs end, the verify-cost
plot, refusals, cancel keeping partial results, save; and the real model through the child-process job."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from fake_engine import fake_model_info
from textual.app import App
from textual.widgets import DataTable, Input, Static
from ui_support import GatedJob, wait_for

from chatphase.bench.spec.arms import PROMPTS, collect, format_rows, summary_rows
from chatphase.bench.spec.run import SpecProgress, SpecRun
from chatphase.engine.events import ModelLoaded, TurnFinished
from chatphase.settings.schema import Settings
from chatphase.ui.experiments.screen import ExperimentsScreen
from chatphase.ui.experiments.spec import VerifyCostPlot

#: scripted decode tok/s and spec figures by mode: lookup wins on grounded prompts, not on open ones.
RATES = {"off": {"grounded": 100.0, "open": 100.0}, "lookup": {"grounded": 160.0, "open": 95.0}}
COSTS = {k: 5.0 + 5.0 * k for k in range(1, 17)}


class ScriptedSpecEngine:
    """An engine stand-in: ``load`` succeeds; each turn answers with the prompt's first 20 characters (so every
    arm writes the same reply) and the mode's scripted figures."""

    calls: list[str] = []

    def __init__(self, info, config) -> None:
        self.spec = config.spec

    def load(self):
        yield ModelLoaded(None)

    def run_turn(self, req):
        prompt = req.messages[-1].content
        kind = next(k for k, p in PROMPTS if p == prompt)
        ScriptedSpecEngine.calls.append(self.spec)
        drafted = self.spec != "off"
        metrics = SimpleNamespace(
            decode_tokens_per_s=RATES.get(self.spec, RATES["lookup"])[kind],
            spec_acceptance=(0.7 if kind == "grounded" else 0.1) if drafted else None,
            spec_tokens_per_step=(2.5 if kind == "grounded" else 1.1) if drafted else None,
            spec_speedup=(1.5 if kind == "grounded" else 0.97) if drafted else None,
        )
        yield TurnFinished(req.turn_id, prompt[:20], metrics)

    def close(self) -> None:
        pass


class ScriptedSpecJob(GatedJob):
    """A :class:`~chatphase.bench.core.job.SpecJob` stand-in: the real SpecRun on scripted engines and costs,
    in-process; ``gate`` (when set up) holds it after ``stop_after`` runs."""

    PROGRESS = SpecProgress
    last: ScriptedSpecJob

    def __init__(self, info, config, plan):
        super().__init__()
        self.plan = plan
        self.run = SpecRun(info, config, plan, engine_factory=ScriptedSpecEngine, cost=lambda *a, **kw: COSTS)


class SpecApp(App):
    def __init__(self, job_factory=ScriptedSpecJob, settings=None):
        super().__init__()
        settings = settings or Settings().with_overrides(n_ctx=2048, n_threads=2)
        self.screen_obj = ExperimentsScreen(fake_model_info(), settings, job_factory=job_factory)

    def on_mount(self):
        self.push_screen(self.screen_obj)


async def _spec_tab(pilot, screen, modes="lookup", reps="2", gen="40"):
    await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-spec")
    await pilot.pause()
    for id_, value in {"exp-spec-specs": modes, "exp-spec-reps": reps, "exp-spec-max_tokens": gen}.items():
        screen.query_one(f"#{id_}", Input).value = value
    await pilot.pause()


def _status(screen) -> str:
    return str(screen.query_one("#exp-status", Static).render())


def _table(screen) -> list[list[str]]:
    table = screen.query_one("#exp-table", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def test_collect_reads_ratios_only_against_off_runs_of_the_same_prompt():
    """A partial run: the lookup run whose off twin never ran has a rate but no ratio; an arm that wrote
    another reply is marked."""
    from chatphase.bench.spec.arms import SpecSample

    samples = [
        SpecSample("off", "grounded", 0, 0, 100.0, None, None, None, "a"),
        SpecSample("lookup", "grounded", 0, 0, 150.0, 0.6, 2.0, 1.4, "a"),
        SpecSample("lookup", "open", 0, 2, 90.0, 0.1, 1.1, 0.9, "b"),
        SpecSample("auto", "grounded", 0, 0, 120.0, 0.6, 2.0, 1.2, "x"),
    ]
    rows = {(r["spec"], r["kind"]): r for r in summary_rows(collect(samples))}
    assert rows["lookup", "grounded"]["ratio_to_off"] == 1.5
    assert rows["lookup", "open"]["ratio_to_off"] is None and rows["lookup", "open"]["decode_tokens_per_s"] == 90
    assert rows["lookup", "grounded"]["identical"] and not rows["auto", "grounded"]["identical"]
    text = format_rows(list(rows.values()))
    assert "\nlookup           open         90.0      -     10%     1.10   0.90   yes\n" in text


async def test_modes_run_interleaved_fill_table_and_plot_and_save(tmp_path):
    ScriptedSpecEngine.calls = []
    app = SpecApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _spec_tab(pilot, screen, modes="lookup,auto")
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert _status(screen) == "Done."
        # off first, the order rotating per rep: 3 arms × 3 prompts × 2 reps
        calls = ScriptedSpecEngine.calls
        assert len(calls) == 18 and calls[:3] == ["off", "lookup", "auto"] and calls[9:12] == ["lookup", "auto", "off"]
        rows = {(r[0], r[1]): r for r in _table(screen)}
        assert rows["off", "grounded"][2:] == ["100.0", "1.00", "-", "-", "-", "yes"]
        assert rows["lookup", "grounded"][2:] == ["160.0", "1.60", "70%", "2.50", "1.50", "yes"]
        assert rows["lookup", "open"][2:4] == ["95.0", "0.95"]
        plot = screen.query_one(VerifyCostPlot)
        assert plot.costs == COSTS and plot.series_count() == 1
        summary = str(screen.query_one("#exp-summary", Static).render())
        assert "identical to off for every arm" in summary and "k=4 2.50×" in summary and "k=16 8.50×" in summary
        path = screen.query_one("#exp-path", Input)
        assert path.value.startswith("bench-spec-")
        path.value = str(tmp_path / "spec.json")
        await pilot.press("ctrl+s")
        await pilot.pause()
        saved = json.loads((tmp_path / "spec.json").read_text())
        assert saved["verify_step_ms"]["16"] == 85.0 and len(saved["rows"]) == 6
        assert saved["plan"]["specs"] == ["off", "lookup", "auto"]


async def test_the_table_fills_while_running_and_cancel_keeps_the_runs_so_far():
    ScriptedSpecJob.stop_after = 4
    try:
        app = SpecApp()
        async with app.run_test(size=(120, 40)) as pilot:
            screen = app.screen_obj
            await _spec_tab(pilot, screen, modes="lookup")
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: len(screen.progress) == 4)
            assert _status(screen).startswith("[4/12] lookup · grounded prompt 2/3 · rep 1")
            assert {r[0] for r in _table(screen)} == {"off", "lookup"}
            await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-sweep")  # the other tab keeps its own line
            await pilot.pause()
            assert not _status(screen).startswith("[4/12]")
            await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-spec")
            await pilot.pause()
            await pilot.press("escape")
            ScriptedSpecJob.last.gate.set()
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert _status(screen) == "Cancelled: partial results."
            assert screen.result.cancelled and screen.result.costs_ms == {}
            assert {r["runs"] for r in screen.result.rows} == {2}
            assert "cancelled before it" in str(screen.query_one("#exp-summary", Static).render())
    finally:
        ScriptedSpecJob.stop_after = None


async def test_bad_modes_and_a_streaming_reply_are_refused():
    busy = [True]
    app = SpecApp()
    app.screen_obj.is_busy = lambda: busy[0]
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _spec_tab(pilot, screen, modes="lookup")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and screen.result is None
        busy[0] = False
        await _spec_tab(pilot, screen, modes="lookup,fast")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and "fast" in _status(screen)
        await _spec_tab(pilot, screen, modes="lookup", reps="two")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and _status(screen).startswith("Reps")


@pytest.mark.model
async def test_lookup_against_off_on_the_default_model_in_a_child_process():
    """The real job (llama.cpp in a child process, the default model): one rep of 24-token replies; every arm
    measured on both kinds, and the verify-cost sweep for k = 1…16."""
    from multiprocessing import resource_tracker

    from chatphase.bench.spec.run import SpecJob
    from chatphase.models.gguf_meta import read_model_info
    from chatphase.models.resolve import resolve_model

    resource_tracker.ensure_running()
    settings = Settings().with_overrides(n_ctx=2048, n_threads=2)
    info = read_model_info(resolve_model(settings.model, settings.models_dir))
    app = SpecApp(job_factory=lambda i, config, plan: SpecJob(info, config, plan), settings=settings)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await _spec_tab(pilot, screen, modes="lookup", reps="1", gen="24")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.job is None, timeout_s=120)
        assert _status(screen) == "Done.", _status(screen)
        rows = {(r["spec"], r["kind"]): r for r in screen.result.rows}
        assert set(rows) == {(s, k) for s in ("off", "lookup") for k in ("grounded", "open")}
        assert all(r["decode_tokens_per_s"] > 0 for r in rows.values())
        assert rows["lookup", "grounded"]["acceptance"] is not None
        assert sorted(screen.result.costs_ms) == list(range(1, 17))


def test_snapshot_of_a_spec_comparison(snap_compare):
    """On the Speculative tab after a scripted off/lookup/auto run (2 reps): the form lists the modes, reps
    and reply tokens; the plot has the gray "k single steps" line rising 10 ms per k and the blue "one step
    of k" line (5 + 5k ms) under it, both from 10 ms at k = 1, x ticks at k = 1, 4, 8, 12, 16; the table has a row per mode and prompt kind (lookup and auto
    1.60× on grounded, 0.95× on open); the summary says the replies are identical and what a step of k
    costs in single steps."""

    async def run_before(pilot):
        screen = pilot.app.screen_obj
        await _spec_tab(pilot, screen, modes="lookup,auto")
        for inp in screen.query(Input):
            inp.cursor_blink = False
        await pilot.press("ctrl+r")
        await pilot.app.workers.wait_for_complete()
        screen.query_one("#exp-table", DataTable).focus()
        pilot.app.clear_notifications()
        await pilot.pause(0.3)

    assert snap_compare(SpecApp(), terminal_size=(120, 40), run_before=run_before)


class _CancellingSpecRun(SpecRun):
    """The real SpecRun on scripted engines and costs; cancels itself after ``stop_after`` runs (as a first
    Ctrl+C does) when set."""

    stop_after: int | None = None

    def __init__(self, info, config, plan):
        super().__init__(info, config, plan, engine_factory=ScriptedSpecEngine, cost=lambda *a, **kw: COSTS)

    def __iter__(self):
        for event in super().__iter__():
            if isinstance(event, SpecProgress) and event.done_runs == self.stop_after:
                self.cancel()
            yield event


def _bench_spec(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    import dataclasses

    from chatphase.bench.experiments import EXPERIMENTS
    from chatphase.cli import main

    def make_run(info, config, plan, roofline, log_path, **options):
        return _CancellingSpecRun(info, config, plan)

    monkeypatch.setitem(EXPERIMENTS, "spec", dataclasses.replace(EXPERIMENTS["spec"], make_run=make_run))
    monkeypatch.setattr("chatphase.models.resolve.resolve_model", lambda model, models_dir: model)
    monkeypatch.setattr("chatphase.models.gguf_meta.read_model_info", lambda path: fake_model_info())
    rc = main(["bench", "--spec", "lookup", "--reps", "1", "--model", "/scripted/model.gguf", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_bench_spec_runs_through_the_driver_with_its_progress_lines(monkeypatch, capsys):
    _CancellingSpecRun.stop_after = None
    rc, out, err = _bench_spec(monkeypatch, capsys, "--format", "csv")
    total = 2 * len(PROMPTS)
    assert rc == 0 and out.startswith("spec,kind,") and "\nlookup,grounded," in out
    assert f"chatphase bench: [1/{total}] off · grounded prompt 1/{len(PROMPTS)} · rep 1: 100.0 tok/s" in err
    assert f"[{total}/{total}] lookup · open prompt" in err and "Traceback" not in err


def test_bench_spec_cancelled_writes_the_runs_so_far_and_exits_130(monkeypatch, capsys):
    """The first Ctrl+C cancels after the current run (here the run cancels itself after 3): the table of the
    runs so far, no verify cost, exit 130 — as for every experiment."""
    _CancellingSpecRun.stop_after = 3
    rc, out, err = _bench_spec(monkeypatch, capsys)
    assert rc == 130 and "cancelled; the results above are partial" in err
    assert "(not measured: cancelled)" in out and "CANCELLED: partial results" in out
    assert "lookup" in out and "Traceback" not in err
