"""Narrow and tiny terminals: the TUI starts, streams and is resized at any size without an error (the
side panel is clipped for the frame Textual lays out before the breakpoint classes change, and the prompt
box keeps one cell of text), and comes back to its usual layout when the terminal grows. A TUI that ends
on an unhandled exception exits non-zero."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine, fake_model_info
from textual.app import App
from ui_support import idle, make_app, notifications, send, wait_for, wait_thread

from chatphase.cli import main
from chatphase.commands import chat as chat_command
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.prompt_input import PromptInput

#: sizes that crashed the prompt box (60 columns and fewer), down to nothing.
NARROW = [(60, 24), (58, 24), (55, 20), (50, 16), (40, 12), (20, 8), (8, 8), (5, 10), (4, 4), (1, 1)]


@pytest.mark.parametrize("size", NARROW, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_starts_at_narrow_sizes(size):
    app, _ = make_app()
    async with app.run_test(size=size) as pilot:  # an exception in the app is raised here
        await wait_for(pilot, lambda: idle(app))
        await pilot.pause(0.1)
        assert app.screen.has_class("-cramped")  # under 80 columns
        assert app.prompt.content_size.width >= 1


async def test_resized_narrow_during_a_reply_and_back():
    app, engines = make_app(replies=["word " * 200], token_delay_s=0.005, hold="decode", hold_after_tokens=20)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        wide_prompt = app.prompt.region
        await send(pilot, "Tell me about prefill.")
        await wait_thread(pilot, engines[0].held)  # mid-reply: 20 tokens on screen
        for size in [(55, 20), (20, 8), (1, 1), (61, 24), (40, 12)]:
            await pilot.resize_terminal(*size)
            await pilot.pause(0.05)
        engines[0].release()
        await pilot.resize_terminal(30, 10)  # and while it streams again
        await pilot.pause(0.1)
        await pilot.resize_terminal(120, 40)
        await wait_for(pilot, lambda: idle(app), timeout_s=15)
        await pilot.pause(0.1)
        assert app.screen.has_class("-wide")
        assert app.query_one("#side").region.width == 56
        assert app.prompt.region == wide_prompt


@pytest.fixture
def headless_chat(monkeypatch):
    """``chatphase chat`` on a FakeEngine, run headless at 80×24 by ``auto_pilot(pilot)``."""
    monkeypatch.setattr(chat_command, "model_info_for", lambda settings, **_: fake_model_info())
    monkeypatch.setattr(chat_command, "engine_for", lambda settings, info: FakeEngine(info, settings.engine))

    def use(auto_pilot):
        monkeypatch.setattr(
            ChatPhaseApp, "run", lambda self: App.run(self, headless=True, size=(80, 24), auto_pilot=auto_pilot)
        )
        return main(["chat", "--no-save"])

    return use


def test_quitting_exits_zero(headless_chat):
    async def quit_(pilot):
        await wait_for(pilot, lambda: idle(pilot.app))
        await pilot.press("ctrl+q")

    assert headless_chat(quit_) == 0


def test_the_exit_bound_is_cancelled_once_the_app_has_returned(headless_chat, monkeypatch):
    """In a terminal the app arms ``exit_within`` on unmount (ui/signals.py); ``chatphase chat`` cancels it
    once ``run()`` returns, so nothing ends the process later (here: the test run itself)."""
    apps = []
    monkeypatch.setattr(ChatPhaseApp, "is_headless", property(lambda self: apps.append(self) or False))

    async def quit_(pilot):
        await wait_for(pilot, lambda: idle(pilot.app))
        await pilot.press("ctrl+q")

    assert headless_chat(quit_) == 0
    timer = apps[0].exit_timer
    assert timer is not None and timer.finished.is_set()  # cancelled, not fired
    timer.join(5.0)
    assert not timer.is_alive()


def test_a_crash_in_the_tui_exits_non_zero(headless_chat, monkeypatch):
    def broken(self, y):
        raise ValueError("a widget bug")

    monkeypatch.setattr(PromptInput, "render_line", broken)

    async def wait(pilot):
        await pilot.pause(5)  # the first frame ends the app before this

    assert headless_chat(wait) == 1


async def test_at_80x24_nothing_covers_the_message_being_edited():
    """Ctrl+O puts the last message back in the prompt box: what says so is the box's own border, not a
    toast (Textual's toasts sit at the bottom right, above the footer: at 80×24 that is the box, over the
    very text being edited); sending the edit clears it."""
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "one")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        before = len(notifications(app))
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: app.prompt.text == "one")
        await pilot.pause(0.1)
        assert notifications(app)[before:] == []  # no toast
        assert app.prompt.border_title == PromptInput.EDITING_TITLE
        await pilot.press("end", *" more", "enter")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        assert app.prompt.border_title == "" and app.chat.conversation[0].content == "one more"


@pytest.mark.parametrize("width", [40, 60])
async def test_the_footer_palette_key_covers_the_last_column(width):
    """Where the keys overflow the footer, the palette key sits over them at the right. Textual's compact
    footer gives every key a one-cell margin on its right, the palette key too, so the key under that cell
    showed through: at 40 columns the footer read "^p palettee"."""
    from textual.widgets import Footer

    app, _engines = make_app()
    async with app.run_test(size=(width, 24)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        footer = app.query_one(Footer)
        await wait_for(pilot, lambda: footer.max_scroll_x > 0)  # the keys overflow: the case of the glitch
        await pilot.pause()
        last, _ = app.screen.get_widget_at(width - 1, 23)
        assert last.has_class("-command-palette") and "palette" in str(last.render())
