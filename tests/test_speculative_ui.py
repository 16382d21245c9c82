"""Speculative decoding in the TUI (FakeEngine): the phase line shows the mode and its live figures."""

from __future__ import annotations

from textual.widgets import Label
from ui_support import idle, make_app, send, wait_for, wait_thread

from chatphase.engine.events import SpecLive


def stats(app) -> str:
    return str(app.query_one("#phase-stats", Label).render())


async def phase_line_mid_decode(spec: SpecLive | None) -> tuple[str, SpecLive | None]:
    """The phase line's figures and the turn's spec figures after 3 tokens of a reply."""
    app, engines = make_app(hold="decode", hold_after_tokens=3, spec=spec)
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello there")
        await wait_thread(pilot, engines[0].held)
        await wait_for(pilot, lambda: "3 tok" in stats(app))
        shown, live = stats(app), app.chat.turn.spec
        engines[0].release()
        await wait_for(pilot, lambda: idle(app))
    return shown, live


async def test_the_phase_line_shows_the_decode_mode_and_its_figures():
    live = SpecLive("lookup", steps=10, drafted=25, accepted=17, tokens=27, speedup=1.6)
    shown, turn_spec = await phase_line_mid_decode(live)
    assert shown.startswith("lookup · 2.7 tok/step · 68 % accepted · ×1.6 · 3 tok") and turn_spec == live


async def test_plain_decode_shows_no_mode():
    shown, turn_spec = await phase_line_mid_decode(None)
    assert shown.startswith("3 tok") and turn_spec is None
