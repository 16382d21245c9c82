"""Speculative decoding in the TUI (FakeEngine): the phase line shows the mode and its live figures."""

from __future__ import annotations

from textual.widgets import Label
from ui_support import idle, make_app, send, wait_for, wait_thread

from chatphase.engine.events import SpecLive


def stats(app) -> str:
    return str(app.query_one("#phase-stats", Label).render())


async def test_the_phase_line_shows_the_decode_mode_and_its_figures():
    live = SpecLive("lookup", steps=10, drafted=25, accepted=17, tokens=27, speedup=1.6)
    app, engines = make_app(hold="decode", hold_after_tokens=3, spec=live)
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello there")
        await wait_thread(pilot, engines[0].held)
        await wait_for(pilot, lambda: "3 tok" in stats(app))
        assert stats(app).startswith("lookup · 2.7 tok/step · 68 % accepted · ×1.6 · 3 tok")
        assert app.chat.turn.spec == live
        engines[0].release()
        await wait_for(pilot, lambda: idle(app))


async def test_plain_decode_shows_no_mode():
    app, engines = make_app(hold="decode", hold_after_tokens=3)
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello there")
        await wait_thread(pilot, engines[0].held)
        await wait_for(pilot, lambda: "3 tok" in stats(app))
        assert stats(app).startswith("3 tok")
        engines[0].release()
        await wait_for(pilot, lambda: idle(app))
