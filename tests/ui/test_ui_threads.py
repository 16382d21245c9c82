"""The thread policy on screen: the system figures, the phase panel's threads row and the turn detail."""

from __future__ import annotations

from dataclasses import replace

from dashboard_support import TURNS, DashboardApp, loaded_model
from textual.app import App, ComposeResult
from textual.geometry import Region

from chatphase.ui.dashboard.dashboard import Dashboard
from chatphase.ui.dashboard.system_figures import SystemFigures, system_lines, threads_lines
from chatphase.ui.dashboard.turn_detail import TurnDetail, metric_pairs
from chatphase.ui.phases.panel import PhasePanel, threads_text

REASON = "2 → 1: one core busy elsewhere (other load 1.00 cores)"
AUTO = replace(loaded_model(), settings=replace(loaded_model().settings, threads_policy="auto"))
TURN = replace(TURNS[0], n_threads_prefill=1, n_threads_decode=1, decode_thread_changes=0, threads_reason=REASON)


def text_of(widget) -> str:
    return str(widget.render())


def test_threads_figure_before_and_after_a_turn():
    assert threads_lines(AUTO) == ("threads auto, up to 2 (the cores this machine gives the engine)", None)
    assert threads_lines(AUTO, TURN) == ("threads 1 decode / 1 prefill, auto", f"threads: {REASON}")
    # an engine without a thread policy (a remote server, an older engine): the settings' counts
    assert threads_lines(loaded_model()) == ("threads 2 decode / 2 batch", None)
    assert threads_lines(loaded_model(), TURNS[0]) == ("threads 2 decode / 2 batch", None)
    lines = system_lines(AUTO, None, TURN)
    assert "model load 412 ms · threads 1 decode / 1 prefill, auto" in lines
    assert f"threads: {REASON}" in lines


def test_turn_detail_lists_threads_only_when_known():
    names = [name for name, _ in metric_pairs(TURN)]
    assert ("threads prefill/decode", "1/1") in metric_pairs(TURN)
    assert "threads prefill/decode" not in [name for name, _ in metric_pairs(TURNS[0])]
    assert len(names) == len(metric_pairs(TURNS[0])) + 1


async def test_dashboard_shows_the_last_turns_threads_and_why():
    app = DashboardApp()
    async with app.run_test(size=(120, 50)) as pilot:
        dash = app.query_one(Dashboard)
        dash.set_model(AUTO)
        await pilot.pause()
        dash.turn_finished(1, TURN)
        await pilot.pause()
        figures = app.query_one(SystemFigures)
        figures.sample_now()
        assert f"threads: {REASON}" in text_of(figures)
        detail = app.query_one(TurnDetail)
        assert f"threads: {REASON}" in text_of(detail.query_one("#detail-explain"))


class PanelApp(App):
    def compose(self) -> ComposeResult:
        yield PhasePanel()


async def test_phase_panel_threads_row():
    app = PanelApp()
    async with app.run_test(size=(160, 40)) as pilot:  # wide enough that no row wraps
        panel = app.query_one(PhasePanel)
        panel.set_model(AUTO)
        await pilot.pause()
        assert "threads auto, up to 2 cores" in _lines(panel.query_one("#model-figures"))
        panel.turn_finished(1, TURN)
        await pilot.pause()
        assert f"threads 1 decode / 1 prefill · {REASON}" in _lines(panel.query_one("#model-figures"))
        changed = replace(
            TURN, n_threads_decode=2, decode_thread_changes=2, threads_reason=f"{REASON}; 1 → 2 at …; 2 → 1 at …"
        )
        assert threads_text(changed) == f"2 decode / 1 prefill · {REASON} · then 2 changes during decode"
        panel.set_model(loaded_model())  # no thread policy: no threads row
        await pilot.pause()
        assert "\nthreads " not in _lines(panel.query_one("#model-figures"))


def _lines(widget) -> str:
    """The widget's text as drawn, one line per row, runs of spaces collapsed."""
    width, height = widget.size
    rows = ["".join(seg.text for seg in strip) for strip in widget.render_lines(Region(0, 0, width, height))]
    return "\n".join(" ".join(row.split()) for row in rows)
