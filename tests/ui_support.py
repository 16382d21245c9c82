"""Helpers for the TUI tests: a ChatPhaseApp wired to FakeEngines, and polling waits."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from fake_engine import FakeEngine, fake_model_info

from chatphase.chat.turn import Turn
from chatphase.engine.events import TokensDecoded, TurnRequest
from chatphase.settings.schema import Settings
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.transcript.chat_log import ChatLog
from chatphase.ui.transcript.reply_view import ReplyView


def make_app(settings: Settings | None = None, **engine_kwargs) -> tuple[ChatPhaseApp, list[FakeEngine]]:
    """A ChatPhaseApp whose factory builds ``FakeEngine(info, current settings' engine part, **engine_kwargs)``; engines are
    collected in the returned list (newest last). ``engine_kwargs`` apply to the first engine only when
    given as ``first_only=True``."""
    settings = settings or Settings()
    first_only = engine_kwargs.pop("first_only", False)
    engines: list[FakeEngine] = []

    def factory(info, current):
        kwargs = engine_kwargs if not (first_only and engines) else {}
        engine = FakeEngine(info, current.engine, **kwargs)
        engines.append(engine)
        return engine

    app = ChatPhaseApp(settings, fake_model_info(), factory)
    record_notifications(app)
    return app, engines


def streaming_reply(log: ChatLog) -> tuple[ReplyView, Callable[[str], None]]:
    """A reply view that a turn streams into, as the chat view starts one, and the function that adds
    decoded text to that turn (as the controller does with each ``TokensDecoded``)."""
    turn = Turn(1, 1, "send", "q", 0, TurnRequest(1))

    def feed(text: str) -> None:
        turn.decoded(TokensDecoded(1, text, 1, turn.decode_tokens + 1, 0))

    return log.start_reply(turn), feed


#: where the README's screenshots live (written by the tests when ``CHATPHASE_SCREENSHOTS`` is set; docs/screenshots is a
#: link to it, so the documentation site shows the same files)
SHOTS = Path(__file__).resolve().parent.parent / "screenshots"


def shot(app, name: str) -> None:
    """Save ``screenshots/{name}.svg`` when ``CHATPHASE_SCREENSHOTS`` is set."""
    if os.environ.get("CHATPHASE_SCREENSHOTS"):
        SHOTS.mkdir(exist_ok=True)
        app.save_screenshot(str(SHOTS / f"{name}.svg"))


def screen_lines(app) -> list[str]:
    """The screen's text as drawn, one string a row (what is hidden, scrolled or cut off is not in it)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True, legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True))  # as App.export_screenshot draws it
    return console.export_text().splitlines()


def idle(app) -> bool:
    """The model is loaded and no turn runs."""
    return app.chat.loaded is not None and not app.chat.busy and app.chat.active_turn is None


async def settle(pilot) -> None:
    """Still screens for snapshots (no cursor blink, no live-rate samples), then wait until idle."""
    pilot.app.prompt.cursor_blink = False
    pilot.app.dashboard.decode_rate = lambda tokens_per_s: None
    await wait_for(pilot, lambda: idle(pilot.app))


async def wait_for(pilot, condition, timeout_s: float = 5.0, step_s: float = 0.02) -> None:
    """Let the app run until ``condition()`` is true; fail after ``timeout_s``."""
    waited = 0.0
    while not condition():
        if waited >= timeout_s:
            raise AssertionError(f"condition not met after {timeout_s} s")
        await pilot.pause(step_s)
        waited += step_s


async def wait_thread(pilot, event, timeout_s: float = 5.0) -> None:
    """Wait for a ``threading.Event`` set by an engine thread, letting the app run meanwhile."""
    await wait_for(pilot, event.is_set, timeout_s)


async def send(pilot, text: str) -> None:
    """Type ``text`` into the prompt box (as a paste, newlines kept) and press Enter."""
    from chatphase.ui.prompt_input import PromptInput

    prompt = pilot.app.query_one(PromptInput)
    prompt.set_text(text)
    await pilot.press("enter")


_NOTIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def record_notifications(app) -> None:
    """Keep every notification ``app`` raises (screens and widgets notify through ``app.notify``)."""
    seen = _NOTIFIED.setdefault(app, [])
    notify = app.notify

    def recording(message, *args, **kwargs):
        seen.append(str(message))
        return notify(message, *args, **kwargs)

    app.notify = recording


def notifications(app) -> list[str]:
    """Texts of the notifications the app has raised (see :func:`record_notifications`)."""
    return _NOTIFIED.get(app, [])


class GatedJob:
    """A benchmark job stand-in for the Experiments screen: iterates ``self.run`` (set by the subclass: a real
    run on scripted engines) in-process; once ``stop_after`` events of ``PROGRESS`` have passed it waits on
    ``gate`` (up to 10 s), so that a test sees the screen mid-run. ``last``: the latest job of the class."""

    PROGRESS: type = object
    stop_after: int | None = None

    def __init__(self) -> None:
        self.gate = threading.Event()
        type(self).last = self

    def events(self):
        seen = 0
        for event in self.run:
            yield event
            seen += isinstance(event, self.PROGRESS)
            if seen == self.stop_after:
                self.gate.wait(10)

    def cancel(self):
        self.run.cancel()
