"""The chat view runs the widget work it must await by itself: an App entry point only calls the
controller. Checked on the two entry points that once forgot to await it (a model switch, and settings
that reload the model), each while a reply streams: the abandoned reply must be finished and marked
before the app handles the next key, not whenever the next engine message happens to arrive. And a
resume from the sessions list, which no longer waits between the new chat's clear and the restore."""

from __future__ import annotations

import threading

from fake_engine import FakeEngine, fake_model_info
from textual.widgets import DataTable
from ui_support import idle, make_app, send, wait_for, wait_thread

from chatphase.settings.schema import Settings
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.prompt_input import PromptInput
from chatphase.ui.screens.sessions import SessionsScreen
from chatphase.ui.screens.settings import SettingsChange
from chatphase.ui.transcript.notice import Notice
from chatphase.ui.transcript.reply_view import ReplyView
from chatphase.ui.transcript.user_message import UserMessage

WHY = "cancelled (engine replaced)"


class SlowToStop(FakeEngine):
    """Stops only once ``let_go`` is set, as a real engine finishes its current llama_decode first: until
    then its held turn and its watch send nothing, so no engine message reaches the app."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.let_go = threading.Event()

    def cancel(self) -> None:  # called on the app's thread: it must not block
        threading.Thread(target=self._cancel_when_let_go, daemon=True).start()

    def _cancel_when_let_go(self) -> None:
        if self.let_go.wait(10):
            super().cancel()

    def close(self) -> None:  # called in a worker thread
        self.let_go.wait(10)
        super().close()


def app_replacing_a_slow_engine() -> tuple[ChatPhaseApp, list[FakeEngine]]:
    """An app whose first engine holds its reply after 3 tokens and is slow to stop, and whose next
    engines take 30 s to load (they return at once when closed)."""
    engines: list[FakeEngine] = []

    def factory(info, settings):
        engines.append(
            SlowToStop(info, settings, hold="decode") if not engines else FakeEngine(info, settings, load_delay_s=30)
        )
        return engines[-1]

    return ChatPhaseApp(Settings(), fake_model_info(), factory), engines


async def replace_mid_reply(entry_point) -> None:
    app, engines = app_replacing_a_slow_engine()
    async with app.run_test(size=(130, 40)) as pilot:
        try:
            await wait_for(pilot, lambda: idle(app))
            await send(pilot, "hello")
            await wait_thread(pilot, engines[0].held)
            await wait_for(pilot, lambda: app.chat.turn is not None and app.chat.turn.reply)
            streamed = app.chat.turn.reply
            entry_point(app)
            await pilot.press("x")  # the next key: the reply is done with by now
            reply = app.query_one(ReplyView)
            assert (reply.finished, reply.meta, reply.text) == (True, WHY, streamed)
            assert app.query_one(PromptInput).text == "x" and len(engines) == 2 and not engines[1].closed
            assert app.chat.conversation[-1].content == streamed
        finally:
            engines[0].let_go.set()


async def test_a_model_switch_mid_reply_finishes_the_reply_before_the_next_key():
    await replace_mid_reply(lambda app: app.switch_model(fake_model_info(name="Other 1B")))


async def test_settings_that_reload_the_model_mid_reply_finish_the_reply_before_the_next_key():
    def apply(app) -> None:
        app.sessions.apply(SettingsChange(app.chat.settings.with_overrides(n_ctx=2048), ("n_ctx",)))

    await replace_mid_reply(apply)


async def test_resuming_a_session_from_the_list_shows_only_that_sessions_turns():
    """The new chat's clear takes the views there were, not the resumed session's, which are mounted
    before the clear is awaited."""
    app, _engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        for text in ("first question", "second question"):
            await send(pilot, text)
            await wait_for(pilot, lambda: app.chat.conversation[-1].role == "assistant" and idle(app))
        first = app.recording.writer.id
        app.action_new_chat()
        await send(pilot, "another chat")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        app.action_sessions()
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen) and bool(app.screen.query(DataTable)))
        table = app.screen.query_one(DataTable)
        await wait_for(pilot, lambda: table.row_count == 2)
        table.move_cursor(row=table.get_row_index(first))
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, SessionsScreen) and app.recording.writer.id == first)
        await pilot.press("x")
        log = [type(w).__name__ for w in app.chat_log.children if not isinstance(w, Notice)]
        assert log == ["UserMessage", "ReplyView", "UserMessage", "ReplyView"]
        assert [str(w.render()) for w in app.query(UserMessage)] == ["first question", "second question"]
        assert [m.content for m in app.chat.conversation[::2]] == ["first question", "second question"]
