"""The transcript marks the turns the model no longer sees (FakeEngine: it drops the oldest messages itself)."""

from __future__ import annotations

from ui_support import idle, make_app, notifications, send, wait_for

from chatphase.settings.schema import Settings
from chatphase.ui.transcript.chat_log import ChatLog
from chatphase.ui.transcript.folded_turn import USER_BORDER, USER_BORDER_LEFT_OUT
from chatphase.ui.transcript.reply_view import ReplyView
from chatphase.ui.transcript.user_message import UserMessage


async def test_turns_left_out_of_the_context_are_marked_until_a_new_chat():
    app, _engines = make_app(Settings().with_overrides(n_ctx=40), replies=["ok"])
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        for i in range(4):
            await send(pilot, f"message number {i} with words")
            await wait_for(pilot, lambda n=2 * (i + 1): len(app.chat.conversation) == n and idle(app))
        log = app.query_one(ChatLog)
        replies = list(log.query_children(ReplyView))
        n_out = sum(m.role == "user" for m in app.chat.conversation[: app.chat.history.left_out])
        assert 0 < n_out < len(log.user_texts())
        assert [r.has_class("left-out") for r in replies] == [i < n_out for i in range(len(replies))]
        assert "no longer sees" in str(replies[0].tooltip)
        # an old turn is one widget: its reply draws the message, with the dashed bar of a left-out turn
        old = [r for r in replies if r.user is not None]
        assert old and [r.turn_drawing(r.user).bar for r in old] == [
            USER_BORDER_LEFT_OUT if r.has_class("left-out") else USER_BORDER for r in old
        ]
        users = list(log.query_children(UserMessage))  # the newest message is still a widget of its own
        assert users and not any(u.has_class("left-out") for u in users)
        assert any("leaves out the oldest" in n for n in notifications(app))
        app.chat.new_chat()
        await pilot.pause()
        assert app.chat.history.left_out == 0


async def test_the_settings_screen_sets_the_overflow_policy_without_a_reload():
    from textual.widgets import Select

    from chatphase.ui.screens.settings import SettingsScreen

    app, engines = make_app(replies=["ok"])
    async with app.run_test(size=(130, 45)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await pilot.press("f9")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen) and app.screen.query("#set-overflow"))
        screen = app.screen
        assert screen.query_one("#set-overflow", Select).value == "drop-oldest"
        screen.query_one("#set-overflow", Select).value = "shift"
        await pilot.pause()
        assert not str(screen.query_one("#settings-reload").render()).strip()  # the next turn takes it
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.chat.settings.overflow == "shift" and len(engines) == 1
        await send(pilot, "hi")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        assert engines[0].requests[-1].overflow == "shift"
