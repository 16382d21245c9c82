"""The chat TUI on the real default model (EngineHost child process, greedy, short replies).

Checks what a user sees against the engine's own numbers, and that regenerate and edit-and-resend reuse
the KV cache up to the change. With ``CHATPHASE_SCREENSHOTS=1`` it also saves SVG screenshots of the
real conversation to ``screenshots/`` (``chat-finished.svg``, ``token-view.svg``, ``chat-narrow.svg``)
for the README.
"""

from __future__ import annotations

import os

from ui_support import idle, send, shot, wait_for

from chatphase.engine.process.host import EngineHost
from chatphase.engine.tokens import TurnTokens
from chatphase.settings.schema import Settings
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.screens.tokens import TokenScreen
from chatphase.ui.transcript.reply_view import ReplyView
from chatphase.units import fmt_int

TIMEOUT_S = 120  # a loaded 2-core machine can be slow; each wait ends as soon as the turn does


def real_app(info, **overrides):
    settings = Settings().with_overrides(n_ctx=1024, temperature=0.0, seed=0, **overrides)
    return ChatPhaseApp(settings, info, lambda model_info, current: EngineHost(model_info, current.engine))


async def test_real_model_turns_regenerate_and_edit_reuse_the_kv_cache(default_model_info):
    # prompts the 135M model answers sensibly when greedy (the screenshot is the README's first picture)
    app = real_app(default_model_info, max_tokens=24)
    async with app.run_test(size=(140, 42)) as pilot:
        app.prompt.cursor_blink = False
        await wait_for(pilot, lambda: idle(app), TIMEOUT_S)
        await send(pilot, "What is 2+2?")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app), TIMEOUT_S)
        await send(pilot, "Name three primary colors.")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 4 and idle(app), TIMEOUT_S)
        first, second = app.dashboard.turns[1], app.dashboard.turns[2]
        assert second.cached_tokens >= first.prompt_tokens  # turn 1's prompt is a prefix of turn 2's
        assert second.prefill_tokens + second.cached_tokens == second.prompt_tokens
        # what the screen shows is the engine's figures
        assert app.query(ReplyView).last().text == app.chat.conversation[-1].content
        assert (
            app.panel.figures["prompt"]
            == f"{fmt_int(second.prompt_tokens)} tok ({fmt_int(second.cached_tokens)} cached)"
        )
        await pilot.pause(0.3)
        shot(app, "chat-finished")
        await pilot.press("f12")  # the token view of the last turn: its cached prefix and what was prefilled
        await wait_for(pilot, lambda: isinstance(app.screen, TokenScreen), TIMEOUT_S)
        await pilot.pause(0.3)
        assert app.screen.tokens.view_counts() == TurnTokens.metric_counts(second)
        shot(app, "token-view")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, TokenScreen), TIMEOUT_S)

        reply = app.chat.conversation[-1].content
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: 3 in app.dashboard.turns and idle(app), TIMEOUT_S)
        regen = app.dashboard.turns[3]
        assert regen.prompt_tokens == second.prompt_tokens
        assert regen.cached_tokens == regen.prompt_tokens - 1  # only the last prompt token is re-evaluated
        assert app.chat.conversation[-1].content == reply  # greedy: the same reply again
        meta = str(app.query(ReplyView).last().query_one(".reply-meta").render())
        assert f"{fmt_int(regen.cached_tokens)} cached" in meta

        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: app.prompt.text == "Name three primary colors.")
        await pilot.press("end", *" Be brief.", "enter")
        await wait_for(pilot, lambda: 4 in app.dashboard.turns and idle(app), TIMEOUT_S)
        edited = app.dashboard.turns[4]
        assert edited.cached_tokens >= first.prompt_tokens
        assert edited.prefill_tokens < edited.prompt_tokens
        assert app.chat.conversation[2].content == "Name three primary colors. Be brief."
        await pilot.press("ctrl+q")


async def test_real_model_narrow_screen(default_model_info):
    app = real_app(default_model_info, max_tokens=8)
    async with app.run_test(size=(80, 24)) as pilot:
        app.prompt.cursor_blink = False
        await wait_for(pilot, lambda: idle(app), TIMEOUT_S)
        await send(pilot, "Say hello in French.")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app), TIMEOUT_S)
        await pilot.pause(0.3)
        shot(app, "chat-narrow")
        assert app.query_one("#phase-stats").render() is not None
        assert not app.query_one("#side").display


async def test_a_killed_idle_engine_process_is_noticed_at_once(default_model_info):
    """The engine child killed while the chat is idle: the screen says so without a send (the controller
    watches the process's sentinel), and F5 brings a new engine."""
    import signal

    app = real_app(default_model_info, max_tokens=8)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app), TIMEOUT_S)
        os.kill(app.chat.loaded.pid, signal.SIGKILL)
        await wait_for(pilot, lambda: app.chat.engine is None, timeout_s=5.0)
        badge = str(app.query_one("#phase-badge").render()).strip()
        assert badge == "ENGINE STOPPED" and "SIGKILL" in str(app.query_one("#phase-stats").render())
        await pilot.press("f5")
        await wait_for(pilot, lambda: idle(app), TIMEOUT_S)
