"""ChatPhaseApp: the chat TUI that shows prefill and decode as they happen.

The app keeps the conversation (a list of :class:`~chatphase.engine.events.Message`) and sends all of
it with every turn; the engine reuses the KV-cache prefix itself. Engines come from
``engine_factory(model_info)`` (an :class:`~chatphase.engine.host.EngineHost` in the CLI, a
:class:`~chatphase.engine.fake.FakeEngine` in tests); their blocking calls run in the thread workers
of :mod:`chatphase.ui.engine_link` and arrive as the messages of :mod:`chatphase.ui.messages`. Each
engine gets a new ``engine_id`` and each turn a new ``turn_id``, so late events of a replaced engine
or an abandoned turn are ignored. Decoded text is buffered and drawn at up to ``FLUSH_HZ``, within a
CPU budget (:mod:`chatphase.ui.redraw_budget`) so that drawing does not slow decode; the live figures,
the side panel and the dashboard's live rate are refreshed at ``PANEL_HZ`` without a layout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer

from chatphase.config import Settings
from chatphase.engine.base import Engine
from chatphase.engine.events import LoadedModel, Message, TurnRequest
from chatphase.models.gguf_meta import ModelInfo
from chatphase.ui import messages as msg
from chatphase.ui.actions import action_bindings
from chatphase.ui.chat_actions import ChatActions
from chatphase.ui.chat_log import FLUSH_HZ, ChatLog, ReplyView, UserMessage
from chatphase.ui.dashboard import DASHBOARD_CSS_PATH, Dashboard
from chatphase.ui.engine_link import EngineWorkers
from chatphase.ui.model_picker import ModelActions
from chatphase.ui.phase_indicator import PhaseIndicator
from chatphase.ui.phase_panel import PhasePanel
from chatphase.ui.prefill_drawing import PrefillDrawing
from chatphase.ui.prompt_input import PromptInput
from chatphase.ui.redraw_budget import RedrawBudget, spare_core, ui_cpu_share
from chatphase.ui.session_actions import SessionActions

#: side panel and dashboard live-rate refreshes per second during decode.
PANEL_HZ = 5
#: with no core to spare for the UI, the redraw tick (reply tail, live figures) runs at FLUSH_HZ / this.
NO_SPARE_CORE_STRIDE = 2
#: Markdown commits of a streaming reply happen at least this often (seconds), whatever the CPU budget;
#: between commits the reply's tail streams as plain text at ``FLUSH_HZ``.
COMMIT_MAX_INTERVAL_S = 2.0
#: terminal width (columns) from which the side panel sits beside the chat instead of below it.
WIDE_COLUMNS = 120


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker while ``sys.stderr`` is still the real one.

    While a Textual app runs, ``sys.stderr`` is a capture object whose ``fileno()`` is -1, and the
    tracker (started lazily by the first ``multiprocessing`` lock or event, e.g. in ``EngineHost``)
    passes that fd to its child: ``ValueError: bad value(s) in fds_to_keep``. Starting it before the
    app runs avoids that. POSIX only (elsewhere there is no tracker).
    """
    if os.name == "posix":
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()


class ChatPhaseApp(ChatActions, EngineWorkers, SessionActions, ModelActions, PrefillDrawing, App[None]):
    """The chat TUI.

    Args:
        settings: sampling, system prompt and theme (engine settings are the factory's business).
        model_info: the validated model to start with.
        engine_factory: ``ModelInfo -> Engine``; called to start, restart or switch engines.
    """

    CSS_PATH = [Path(__file__).with_name("app.tcss"), DASHBOARD_CSS_PATH]  # absolute: subclasses elsewhere work
    TITLE = "chatphase"
    BINDINGS = action_bindings()
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE_COLUMNS, "-wide")]

    def __init__(self, settings: Settings, model_info: ModelInfo, engine_factory: Callable[[ModelInfo], Engine]):
        super().__init__()
        _start_resource_tracker()
        self.settings = settings
        self.model_info = model_info
        self.engine_factory = engine_factory
        self.conversation: list[Message] = []
        self.engine: Engine | None = None
        self.engine_id = 0
        self.loaded: LoadedModel | None = None
        self.busy = False  # an engine worker is running
        self.turn_id = 0
        self.active_turn: int | None = None
        self.decoding = False
        self._reuse_note: str | None = None
        self._ticks = 0
        self._flush_budget = RedrawBudget(ui_cpu_share(None), COMMIT_MAX_INTERVAL_S)
        self._tick_stride = 1
        self._prefill = None  # the running turn's prefill (PrefillDrawing)
        self._blink: bool | None = None  # the prompt's cursor_blink while a turn has it off

    # -- layout --------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield ChatLog(id="chat-log")
                yield PhaseIndicator(id="phase")
                yield PromptInput(id="prompt")
            with Vertical(id="side"):
                yield PhasePanel(id="phase-panel")
                yield Dashboard(kv_usage=False, id="dashboard")  # the phase panel shows the live KV gauge
        yield Footer(compact=True)

    def on_mount(self) -> None:
        if self.settings.theme in self.available_themes:
            self.theme = self.settings.theme
        else:
            self.notify(f"Unknown theme {self.settings.theme!r}; using {self.theme}", severity="warning")
        self.sub_title = self.model_info.name
        self.chat_log = self.query_one(ChatLog)
        self.indicator = self.query_one(PhaseIndicator)
        self.panel = self.query_one(PhasePanel)
        self.prompt = self.query_one(PromptInput)
        self._dashboard = self.query_one(Dashboard)
        self._tick_timer = self.set_interval(1 / FLUSH_HZ, self._tick)
        self.start_engine()
        self.prompt.focus()

    @property
    def dashboard(self) -> Dashboard:
        """The dashboard widget (history, timeline, plots, system figures)."""
        return self._dashboard

    # -- engine lifecycle ------------------------------------------------------------------------
    def start_engine(self) -> None:
        """Create an engine with the factory and load the model in a worker."""
        self.engine_id += 1
        self.loaded = None
        self.indicator.show_loading(self.model_info.name)
        try:
            self.engine = self.engine_factory(self.model_info)
        except Exception as exc:  # a factory failure is shown, never a traceback
            self.engine = None
            self._engine_down(f"cannot start the engine: {exc}")
            return
        self.busy = True
        self.load_engine(self.engine, self.engine_id)

    def _retire_engine(self) -> None:
        """Cancel and close the current engine in the background (its late events are ignored)."""
        engine, self.engine = self.engine, None
        self._abandon_turn()
        if engine is not None:
            engine.cancel()
            self.run_worker(engine.close, thread=True, group="close", exit_on_error=False)

    def switch_model(self, info: ModelInfo) -> None:
        """Close the current engine and start ``engine_factory(info)``; the conversation is kept."""
        self._retire_engine()
        self.model_info = info
        self.sub_title = info.name
        self.chat_log.add_notice(f"Switched model to {info.name}")
        self.start_engine()

    def _engine_down(self, message: str) -> None:
        """The engine is gone: release it, say so in the indicator, the log and a notice."""
        self._retire_engine()
        self.loaded = None
        self.indicator.failed(message, fatal=True)
        self.chat_log.add_notice(f"Engine stopped: {message}. Press F5 (Engine: Restart).", "error")
        self.notify(message, title="Engine stopped", severity="error")

    def _shutdown_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.cancel()
            engine.close()

    async def action_quit(self) -> None:
        """Quit at once, also mid-generation: cancel and close the engine, then exit."""
        self._shutdown_engine()
        self.exit()

    def on_unmount(self) -> None:
        self._shutdown_engine()

    # -- turns -----------------------------------------------------------------------------------
    def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        self.send(message.text)

    def send(self, text: str) -> bool:
        """Add ``text`` as a user message and start a turn; returns ``False`` (and says why) if it can't."""
        if self.loaded is None or self.engine is None or self.busy:
            self._restore_prompt(text)
            why = (
                "wait for the reply or press Esc to stop it"
                if self.active_turn
                else ("the model is still loading" if self.engine is not None else "the engine is stopped: press F5")
            )
            self.notify(f"Not sent: {why}.", severity="warning")
            return False
        self.conversation.append(Message("user", text))
        self.chat_log.add_user(text)
        self._start_turn()
        return True

    def _start_turn(self) -> None:
        assert self.engine is not None
        self.turn_id += 1
        self.active_turn, self.busy, self.decoding = self.turn_id, True, False
        if self._blink is None:  # a blink is a frame: none while the engine runs (restored in on_worker_ended)
            self._blink, self.prompt.cursor_blink = self.prompt.cursor_blink, False
        self.indicator.submitted()
        system = [Message("system", self.settings.system_prompt)] if self.settings.system_prompt else []
        request = TurnRequest(self.turn_id, messages=tuple(system + self.conversation), sampling=self.settings.sampling)
        engine, engine_id = self.engine, self.engine_id
        if self._tick_stride == 1:  # a core to spare: the repaint runs beside the engine's prefill
            self.chat_log.start_reply(self.turn_id)
            self._send_turn(engine, engine_id, request)
        else:
            # No spare core: paint first, then send. The new messages' layouts and repaint would otherwise
            # run during prefill and, with the engine's threads on every core, delay the first token by at
            # least their cost; done first, they delay it by their cost and leave prefill undisturbed.
            self.chat_log.start_reply(self.turn_id, on_shown=lambda: self._send_turn(engine, engine_id, request))

    def _send_turn(self, engine: Engine, engine_id: int, request: TurnRequest) -> None:
        """Start the turn's worker unless the engine was replaced meanwhile (its turn is then abandoned)."""
        if engine is self.engine and engine_id == self.engine_id and self._alive():
            self.run_engine_turn(engine, engine_id, request)

    def _restore_prompt(self, text: str) -> None:
        prompt = self.prompt
        if not prompt.text.strip():
            prompt.set_text(text)

    def _alive(self) -> bool:
        """False once the app is shutting down (its widgets are being removed)."""
        return self.is_running and not (self._exit or self._closing or self._closed)

    def _current(self, turn_id: int | None) -> bool:
        return turn_id is not None and turn_id == self.active_turn and self._alive()

    def _reply(self) -> ReplyView | None:
        return self.chat_log.active_reply

    def on_engine_ready(self, message: msg.EngineReady) -> None:
        if message.engine_id != self.engine_id or not self._alive():
            return
        self.loaded = message.event.model
        threads = self.loaded.settings.get("n_threads")
        self._flush_budget = RedrawBudget(ui_cpu_share(threads), COMMIT_MAX_INTERVAL_S)
        stride = 1 if spare_core(threads) else NO_SPARE_CORE_STRIDE
        if stride != self._tick_stride:  # a timer wake-up takes a core from the engine too: no idle ticks
            self._tick_stride = stride
            self._tick_timer.stop()
            self._tick_timer = self.set_interval(stride / FLUSH_HZ, self._tick)
        self.panel.set_model(self.loaded)
        self.indicator.show_ready(self.loaded)
        self.dashboard.set_model(self.loaded)

    def on_worker_ended(self, message: msg.WorkerEnded) -> None:
        if message.kind == "turn" and self._blink is not None:
            self.prompt.cursor_blink, self._blink = self._blink, None
        if message.engine_id == self.engine_id:
            self.busy = False
            if message.kind == "turn" and self.active_turn is not None:  # ended without TurnFinished
                self._abandon_turn()

    def on_first_token_arrived(self, message: msg.FirstTokenArrived) -> None:
        ev = message.event
        if not self._current(ev.turn_id):
            return
        self.decoding = True
        self._draw_prefill()
        self._prefill = None
        self.indicator.first_token(ev)
        self.panel.first_token(ev.ttft_ms)
        reply = self._reply()
        if reply is not None:
            reply.set_meta("decoding…", layout=False)  # replaces "prefill…": one line either way
            reply.feed(ev.text)

    def on_text_decoded(self, message: msg.TextDecoded) -> None:
        ev = message.event
        if self._current(ev.turn_id):
            self.indicator.decoded(ev)
            reply = self._reply()
            if reply is not None:
                reply.feed(ev.text)

    async def _tick(self) -> None:
        """Bounded-rate redraw: buffered reply text, the live decode figures, the panel and dashboard."""
        if not self._alive():
            return
        self._ticks += 1
        if await self.chat_log.flush(commit=self._flush_budget.due()):
            self._flush_budget.mark()
        self._draw_prefill(time.monotonic())
        indicator = self.indicator
        indicator.render_live()
        if self.decoding and self._ticks % max(1, FLUSH_HZ // PANEL_HZ) == 0:
            rate = indicator.live_decode_rate()
            self.panel.decode_live(indicator._decode_tokens, rate)
            if rate is not None:
                self.dashboard.decode_rate(rate)

    async def on_turn_done(self, message: msg.TurnDone) -> None:
        ev = message.event
        if not self._current(ev.turn_id):
            return
        self.active_turn, self.decoding = None, False
        reply = self._reply()
        if reply is not None:
            await reply.finish(ev.reply, ev.metrics)
        self.conversation.append(Message("assistant", ev.reply))
        self.indicator.finished(ev.metrics)
        self.panel.turn_finished(ev.turn_id, ev.metrics)
        self.dashboard.turn_finished(ev.turn_id, ev.metrics)
        if ev.metrics.stop_reason == "context_full":
            self.notify(
                "The reply filled the context (n_ctx). Start a new chat (Ctrl+N) or raise --n-ctx.",
                title="Context full",
                severity="warning",
            )

    async def on_engine_error(self, message: msg.EngineError) -> None:
        ev = message.event
        if message.engine_id != self.engine_id or not self._alive():
            return
        if (ev.turn_id is not None and self._current(ev.turn_id)) or (ev.fatal and self.active_turn is not None):
            reply = self._reply()
            if ev.fatal and reply is not None and reply.text:  # a crash mid-reply: keep what streamed
                self._abandon_turn("engine stopped: partial reply kept")
            else:
                await self._fail_turn()
        if ev.fatal:
            self._engine_down(ev.message)
        else:
            self.notify(ev.message, title="Not sent", severity="error")
            self.indicator.failed(ev.message, fatal=False)

    async def _fail_turn(self) -> None:
        """Undo a turn that produced no reply: drop its views and user message, give the text back."""
        self.active_turn, self.decoding = None, False
        log = self.chat_log
        await log.remove_last(ReplyView)
        await log.remove_last(UserMessage)
        if self.conversation and self.conversation[-1].role == "user":
            self._restore_prompt(self.conversation.pop().content)

    def _abandon_turn(self, why: str = "abandoned (engine replaced)") -> None:
        """Stop following the active turn; keep what streamed so far as its reply, marked with ``why``."""
        if self.active_turn is None:
            return
        self.active_turn, self.decoding = None, False
        reply = self._reply()
        if reply is not None:
            self.conversation.append(Message("assistant", reply.text))
            self.run_worker(reply.finish(reply.text, None), group="ui")
            reply.set_meta(why)
