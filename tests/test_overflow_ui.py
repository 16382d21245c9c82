"""The transcript marks the turns the model no longer sees (FakeEngine: it drops the oldest messages itself)."""

from __future__ import annotations

from ui_support import idle, make_app, notifications, send, wait_for

from chatphase.settings.schema import Settings
from chatphase.ui.transcript.chat_log import ChatLog
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
        users = list(log.query_children(UserMessage))
        replies = list(log.query_children(ReplyView))
        n_out = sum(m.role == "user" for m in app.chat.conversation[: app.chat.history.left_out])
        assert 0 < n_out < len(users)
        assert [u.has_class("left-out") for u in users] == [i < n_out for i in range(len(users))]
        assert [r.has_class("left-out") for r in replies] == [i < n_out for i in range(len(replies))]
        assert "no longer sees" in str(users[0].tooltip)
        assert any("leaves out the oldest" in n for n in notifications(app))
        app.chat.new_chat()
        await pilot.pause()
        assert app.chat.history.left_out == 0
