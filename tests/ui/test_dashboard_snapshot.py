"""Snapshot (pytest-textual-snapshot) of the dashboard with three turns of history.

Update after an intended visual change with ``pytest tests/ui/test_dashboard_snapshot.py --snapshot-update``
and look at the new SVG before committing it.
"""

from __future__ import annotations

from dashboard_support import TURNS, DashboardApp, loaded_model

from chatphase.ui.dashboard.dashboard import Dashboard


async def _three_turns(pilot) -> None:
    dash = pilot.app.query_one(Dashboard)
    dash.set_model(loaded_model())
    for number, metrics in enumerate(TURNS, start=1):
        dash.turn_finished(number, metrics)
    for rate in (38.0, 44.0, 47.5, 49.0, 48.2, 50.1, 46.0, 44.4):
        dash.decode_rate(rate)
    await pilot.pause(0.4)  # let the live-rate timer paint the sparkline


def test_dashboard_with_history_80x24(snap_compare):
    """80×24, dark theme. A reviewer should see: "decode 44.4 tok/s" with a green sparkline; the KV gauge at
    26 % with "KV 540/2,048 tok · 11.9 MiB/45.0 MiB · ~8 turns left at +180 tok/turn"; the Turns tab with three
    rows (TTFT 397.0 / 212.6 / 243.9 ms, cached 0 / 199 / 409), row 3 highlighted; below it "turn 3 · stop:
    length" and the time bar: a 1-cell tokenise step, an orange prefill, a red first-token step, a long green
    decode line."""
    assert snap_compare(DashboardApp(), terminal_size=(80, 24), run_before=_three_turns)


def test_dashboard_plots_light_theme(snap_compare):
    """100×30, light theme, Plots tab. A reviewer should see two scatter plots readable on a light
    background: TTFT vs prompt tokens (one • at 120 tokens/397 ms, two x for the cached-prefix turns) and
    decode tok/s vs KV tokens (points at 50.0, 40.1 and 44.4 tok/s for 200, 410 and 540 KV tokens)."""

    async def setup(pilot) -> None:
        pilot.app.theme = "textual-light"
        await _three_turns(pilot)
        pilot.app.query_one("#dash-tabs").active = "tab-plots"
        await pilot.pause()

    assert snap_compare(DashboardApp(), terminal_size=(100, 30), run_before=setup)
