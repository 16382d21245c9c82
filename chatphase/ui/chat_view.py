"""ChatView: the chat controller's listener that draws the chat screen.

It maps what the controller tells it onto the widgets: the chat log (user messages, the streaming
reply, notices), the phase indicator, the side panel and the dashboard. Nothing here decides what an
event means; that is :class:`~chatphase.chat.controller.ChatController`'s.

Rates: decoded text accumulates in the turn (:class:`~chatphase.chat.turn.Turn`, which the reply view
reads) and is drawn by :meth:`ChatView.tick` at up to ``FLUSH_HZ``, within a CPU budget
(:mod:`chatphase.ui.redraw_budget`) so that drawing does not slow decode; the live figures and the
dashboard's live rate every ``PANEL_S`` without a layout. With no core to spare, every wake-up and
every frame of the UI takes a core from the engine's threads, so the tick runs every
``NO_SPARE_CORE_TICK_S``, the panel every ``NO_SPARE_CORE_PANEL_S``, and a short prefill is not drawn
at all (:mod:`chatphase.ui.phases.prefill_drawing`).

A reasoning model's thinking streams into its own block above the reply, drawn by the same tick
(:class:`~chatphase.ui.transcript.thinking_view.ThinkingDrawing`); the phase line and the panel show the thinking
phase's figures while it lasts.

Widget work that must be awaited (removing or finishing views) is queued by the listener methods and
run by the view itself, in order, as the app's next callback (``App.call_next``): queued while the app
handles a message (an engine event, a key), right after it, before the app handles another; queued from
elsewhere (a screen's result), after the message the app handles then. So the app's entry points only
call the controller.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

from textual.app import App
from typing_extensions import override

from chatphase.chat.attachments import split_message
from chatphase.chat.controller import ChatController
from chatphase.chat.listener import ChatListener, Notice
from chatphase.chat.turn import Turn
from chatphase.engine.events import (
    FirstToken,
    LoadedModel,
    Message,
    PrefillProgress,
    PrefillStarted,
    ThinkingEnded,
    TokensDecoded,
    TurnFinished,
)
from chatphase.engine.fit_hints import for_tui
from chatphase.engine.memory_plan import LAYERS_NOTE
from chatphase.engine.spec_modes import SPEC_WARNING
from chatphase.engine.text import inert
from chatphase.engine.tokens import TurnTokens
from chatphase.models.gguf_meta import ModelInfo
from chatphase.sessions.store import Session
from chatphase.ui.dashboard.dashboard import Dashboard
from chatphase.ui.draft_budget import DraftBudget
from chatphase.ui.engine_link import TextualDispatcher
from chatphase.ui.phases.indicator import PhaseIndicator
from chatphase.ui.phases.panel import PhasePanel
from chatphase.ui.phases.prefill_drawing import PrefillDrawing
from chatphase.ui.prompt_input import PromptInput
from chatphase.ui.redraw_budget import RedrawBudget, spare_core, ui_cpu_share
from chatphase.ui.transcript.chat_log import ChatLog
from chatphase.ui.transcript.reply_view import FLUSH_HZ, ReplyView, metrics_line
from chatphase.ui.transcript.thinking_block import ThinkingBlock, metrics_title
from chatphase.ui.transcript.thinking_view import ThinkingDrawing
from chatphase.ui.transcript.user_message import UserMessage
from chatphase.units import fmt_count

#: the redraw tick's interval (reply tail, live figures; seconds) with a core to spare for the UI / with none.
TICK_S = 1 / FLUSH_HZ
NO_SPARE_CORE_TICK_S = 0.25
#: how often the side panel and the dashboard's live rate are redrawn during decode (seconds): with a
#: core to spare / with none (the phase line above the prompt shows the live rate at every tick).
PANEL_S = 0.2
NO_SPARE_CORE_PANEL_S = 1.0
#: a streaming reply whose text stopped for this long (seconds) is drawn as paused: its partial block goes to
#: the Markdown (:meth:`~chatphase.ui.transcript.reply_view.ReplyView.flush`).
STALL_S = 0.5
#: Markdown commits of a streaming reply happen at least this often (seconds), whatever the CPU budget;
#: between commits the reply's tail streams as plain text at ``FLUSH_HZ``.
COMMIT_MAX_INTERVAL_S = 2.0


def _stall_flushes(tick_s: float) -> int:
    """Ticks of ``tick_s`` seconds without new text that make ``STALL_S``."""
    return max(1, round(STALL_S / tick_s))


class ChatView(ChatListener):
    """Draws ``chat`` on ``app``'s widgets (see the module docstring). ``keys``: action id -> the keys
    that run it (:func:`~chatphase.ui.actions.key_labels`), for the hints in notices."""

    def __init__(self, app: App, chat: ChatController, dispatcher: TextualDispatcher, keys: Mapping[str, str]) -> None:
        self.app = app
        self.keys = keys
        self.chat = chat
        self.dispatcher = dispatcher
        self.chat_log = app.query_one(ChatLog)
        self.indicator = app.query_one(PhaseIndicator)
        self.panel = app.query_one(PhasePanel)
        self.dashboard = app.query_one(Dashboard)
        self.prompt = app.query_one(PromptInput)
        self.prefill = PrefillDrawing(self.indicator, self.panel)
        self.thinking = ThinkingDrawing(self.chat_log, lambda: self.chat.settings.thinking_open)
        self.tick_s = TICK_S
        #: each finished turn's tokens by its number (the token view), this chat's alone
        self.turn_tokens: dict[int, TurnTokens] = {}
        self.panel_s = PANEL_S  # seconds between the panel's live redraws
        self._ticks = 0
        #: when streamed text may be committed as Markdown (replaced per engine; tests may set their own)
        self.flush_budget = RedrawBudget(ui_cpu_share(None), COMMIT_MAX_INTERVAL_S)
        self._ops: list[Callable[[], Awaitable[object]]] = []  # widget work to await, oldest first
        self._running_ops = False
        self._held_notices: list[Notice] = []  # shown once the prefill they belong to is drawn
        self._blink: bool | None = None  # the prompt's cursor_blink while a turn has it off
        self.chat_log.stall_flushes = _stall_flushes(TICK_S)
        self._timer = app.set_interval(TICK_S, self.tick, pause=True)  # runs only while a turn does

    def _await(self, op: Callable[[], Awaitable[object]]) -> None:
        """Queue ``op`` (widget work to await) behind the queued ones; the queue runs as the app's next
        callback (see the module docstring)."""
        self._ops.append(op)
        if not self._running_ops:
            self._running_ops = True
            self.app.call_next(self._run_ops)

    async def _run_ops(self) -> None:
        try:
            while self._ops:
                await self._ops.pop(0)()
        finally:
            self._running_ops = False

    # -- the engine --------------------------------------------------------------------------------
    @override
    def engine_loading(self, model: ModelInfo) -> None:
        self.indicator.show_loading(model.name)
        self.app.sub_title = inert(model.name)

    @override
    def engine_ready(self, loaded: LoadedModel) -> None:
        self._engine_threads(loaded.settings.n_threads)
        self.panel.set_model(loaded)
        self.indicator.show_ready(loaded)
        self.dashboard.set_model(loaded)
        for note in loaded.notes:
            # a model without its own template: say which format it gets; a draft model that cannot pay; the layers
            # n_gpu_layers auto chose on a GPU, and why
            if note.startswith(("chat format:", SPEC_WARNING, LAYERS_NOTE)):
                self.chat_log.add_notice(note)
        for line in loaded.slow_paths:  # correct but far slower than the user may expect: say so at load
            self.chat_log.add_notice(f"slow path: {line}")

    def _engine_threads(self, threads: int | None) -> None:
        """Fit the redraw rates to the engine's decode threads (``None``: as many as cores): with no core
        to spare, the UI draws less, paints a new turn before it is sent, and lets a short prefill be."""
        self.flush_budget = RedrawBudget(ui_cpu_share(threads), COMMIT_MAX_INTERVAL_S)
        spare = spare_core(threads)
        self.dispatcher.paint_first = not spare
        self.prefill.spare_core(spare)
        tick_s = TICK_S if spare else NO_SPARE_CORE_TICK_S
        self.panel_s = PANEL_S if spare else NO_SPARE_CORE_PANEL_S
        self.chat_log.stall_flushes = _stall_flushes(tick_s)
        # the engine batches token events to the redraw interval: more deliveries would only wake the UI
        self.chat.events_every_ms = 1000 * tick_s
        if tick_s != self.tick_s:  # a timer wake-up takes a core from the engine too: no idle ticks
            self.tick_s = tick_s
            running = self.chat.turn is not None
            self._timer.stop()
            self._timer = self.app.set_interval(tick_s, self.tick, pause=not running)

    @override
    def engine_stopped(self, message: str) -> None:
        self._turn_over()
        self.indicator.failed(message, self.keys["engine.restart"])
        self.chat_log.add_notice(
            f"Engine stopped: {message}. Press {self.keys['engine.restart']} (Engine: Restart).", "error"
        )
        self.app.notify(message, title="Engine stopped", severity="error")

    # -- a turn ------------------------------------------------------------------------------------
    @override
    def turn_started(self, turn: Turn) -> None:
        if turn.kind != "regenerate":
            self.chat_log.add_user(turn.user)
        if self._blink is None:  # a blink is a frame: none while the engine runs
            self._blink, self.prompt.cursor_blink = self.prompt.cursor_blink, False
        self.indicator.submitted()
        self.thinking.turn_started()
        loaded = self.chat.loaded
        synthetic = loaded is not None and getattr(loaded.info, "synthetic", False)
        self.chat_log.start_reply(turn, on_shown=self.dispatcher.release_turn, synthetic=synthetic)
        self._timer.resume()

    @override
    def prefill_started(self, turn: Turn, event: PrefillStarted) -> None:
        self.prefill.began(turn.number, event, turn.ttft_left_ms)  # drawn by the tick

    @override
    def prefill_progress(self, turn: Turn, event: PrefillProgress) -> None:
        self.prefill.advanced(event)

    @override
    def first_token(self, turn: Turn, event: FirstToken) -> None:
        self._draw_prefill()
        self.prefill.clear()
        self.indicator.first_token(thinking=turn.thinking_now)
        self._draw_live(turn)
        self.panel.first_token(event.ttft_ms)
        reply = self.chat_log.active_reply
        if reply is not None:
            reply.set_meta("decoding…", layout=False)  # replaces "prefill…": one line either way
        self.thinking.streamed(turn, event.thinking)

    @override
    def tokens_decoded(self, turn: Turn, event: TokensDecoded) -> None:
        reply = self.chat_log.active_reply
        if reply is not None and event.drafted_spans:
            reply.add_drafted(event.drafted_spans, turn.reply_chars - len(event.text))
        self.thinking.streamed(turn, event.thinking)

    def toggle_draft_tint(self) -> bool:
        """Tint accepted draft tokens in streaming replies, or stop (with a notice); returns whether they are."""
        log = self.chat_log
        log.tint_drafts = not log.tint_drafts
        reply = log.active_reply
        if reply is not None:
            reply.tint = log.tint_drafts
            reply.draw_tail()
        self.app.notify("draft tokens tinted" if log.tint_drafts else "draft tokens not tinted", timeout=2)
        return log.tint_drafts

    @override
    def thinking_ended(self, turn: Turn, event: ThinkingEnded) -> None:
        self.thinking.ended(event)
        reply = self.chat_log.active_reply
        if reply is not None:
            reply.set_meta("decoding…", layout=False)

    @override
    def turn_finished(self, turn: Turn, event: TurnFinished) -> None:
        self._turn_over()
        reply = self.chat_log.active_reply
        self.thinking.finished(reply, event.thinking, event.metrics)
        if reply is not None:
            self._await(lambda: reply.finish(event.reply, event.metrics))
        self.indicator.finished(event.metrics)
        self.panel.turn_finished(turn.number, event.metrics)
        self.dashboard.turn_finished(turn.number, event.metrics, turn.position + 1)
        if event.tokens is not None:
            self.turn_tokens[turn.number] = event.tokens
        else:
            self.turn_tokens.pop(turn.number, None)
        if event.metrics.n_threads_decode is not None:  # the thread policy's choice: likely the next turn's too
            self._engine_threads(event.metrics.n_threads_decode)

    @override
    def turn_failed(self, turn: Turn, message: str) -> None:
        self._turn_over()
        self._remove_last(ReplyView)
        if turn.kind != "regenerate":
            self._remove_last(UserMessage)
        if not self.prompt.text.strip():  # given back to fix: its files beside the box again, not inline
            own, files = split_message(turn.user)
            self.app.query_one(DraftBudget).put_back(files)
            self.prompt.set_text(own)

    @override
    def turn_abandoned(self, turn: Turn, why: str) -> None:
        self._turn_over()
        self.thinking.abandoned(turn)
        if (metrics := turn.metrics_so_far()) is not None:  # the figures it had, as the session keeps them
            self.panel.turn_finished(turn.number, metrics, kv=False)  # not the last live redraw's
            self.dashboard.turn_finished(turn.number, metrics, turn.position + 1)
        reply = self.chat_log.active_reply
        if reply is not None:

            async def finish() -> None:
                await reply.finish(turn.reply, None)
                reply.set_meta(why)

            self._await(finish)

    def _turn_over(self) -> None:
        self._timer.pause()  # idle: no wake-ups (the turn's last text is drawn by its finish)
        self.prefill.clear()
        self._show_held_notices()
        if self._blink is not None:
            self.prompt.cursor_blink, self._blink = self._blink, None

    # -- the conversation --------------------------------------------------------------------------
    @override
    def history_rewound(self, removed: tuple[Message, ...]) -> None:
        for message in reversed(removed):
            self._remove_last(ReplyView if message.role == "assistant" else UserMessage)

    def _remove_last(self, cls: type) -> None:
        removal = self.chat_log.remove_last(cls)  # chosen now, before a new turn mounts its views
        if removal is not None:
            self._await(lambda: removal)

    @override
    def history_left_out(self, n_turns: int) -> None:
        self.chat_log.mark_left_out(n_turns)

    @override
    def chat_cleared(self) -> None:
        self._turn_over()
        removal = self.chat_log.clear_log()  # what is there now: a restored session's views come after
        self._await(lambda: removal)
        self.panel.reset()
        self.dashboard.reset()
        self.turn_tokens.clear()
        if self.chat.loaded is not None:
            self.indicator.show_ready(self.chat.loaded)

    @override
    def history_restored(self, session: Session) -> None:
        log = self.chat_log
        shown = [t for t in session.turns if t.in_conversation]  # the others were taken back or failed
        for held, t in enumerate(shown, 1):
            log.add_user(t.user)
            view = log.add_reply(t.reply)
            meta = metrics_line(t.metrics) if t.metrics else f"{t.status} turn (no metrics)"
            self.app.call_after_refresh(view.set_meta, meta)
            if t.thinking:
                title = metrics_title(t.metrics, t.thinking_budget_reached)
                block = ThinkingBlock(t.thinking, title=title, open=self.chat.settings.thinking_open)
                self.app.call_after_refresh(view.add_above, block)
            if t.metrics is not None:
                self.dashboard.turn_finished(t.index, t.metrics, held)
        out = len(session.turns) - len(shown)  # ``chatphase sessions`` counts every turn run: say the difference
        more = f"; {out} more regenerated, edited or failed" if out else ""
        log.add_notice(
            f"Resumed session {session.id} “{session.title}” ({fmt_count(len(shown), 'turn')}{more}). "
            "The KV cache starts empty: the next turn restores the conversation's saved prefix from disk where "
            "that is quicker, else prefills the whole conversation (cold prefill)."
        )
        self.app.sub_title = inert(f"{self.chat.model_info.name} · {session.title}")

    @override
    def notice(self, notice: Notice) -> None:
        if notice.kind in ("reuse", "dropped", "cache_miss", "prefix") and self.prefill.waiting:
            self._held_notices.append(notice)  # drawn with its prefill (none while the prefill is quiet)
            return
        self._show(notice)

    def _show(self, notice: Notice) -> None:
        if notice.kind in ("model", "spec", "prefix"):
            self.chat_log.add_notice(notice.text)
            return
        if notice.kind == "dropped":  # an overflow stays in the transcript, beside the turns it marks
            self.chat_log.add_notice(notice.text)
        text = notice.text
        if notice.kind == "context_full":
            text = text.replace("Start a new chat", f"Start a new chat ({self.keys['chat.new']})")
        if notice.kind == "turn_error":  # a refusal's hint in the TUI's words (F9), not the command line's flags
            text = for_tui(text, self.keys["settings.edit"])
            self.indicator.failed(text)
        self.app.notify(text, title=notice.title, severity=notice.severity)

    def _show_held_notices(self) -> None:
        held, self._held_notices = self._held_notices, []
        for notice in held:
            self._show(notice)

    # -- the redraw tick ---------------------------------------------------------------------------
    def _draw_prefill(self, now: float | None = None) -> None:
        if self.prefill.draw(now):
            self._show_held_notices()

    async def tick(self) -> None:
        """Bounded-rate redraw: buffered reply text, the live prefill and decode figures, the panel."""
        if not self.app.is_running:
            return
        self._ticks += 1
        if await self.chat_log.flush(commit=self.flush_budget.due()):
            self.flush_budget.mark()
        self._draw_prefill(time.monotonic())
        turn = self.chat.turn
        if turn is None or not turn.decoding:
            return
        rate = self._draw_live(turn)
        if self._ticks % max(1, round(self.panel_s / self.tick_s)) == 0:
            # In the frame after this tick's: Textual draws every widget whose container overlaps the box
            # around a frame's changes, so the side panel and the reply's tail in one frame draw the screen.
            self.app.call_after_refresh(self._draw_panel, turn, rate)

    def _draw_panel(self, turn: Turn, rate: float | None) -> None:
        """The side panel's live decode figures and the dashboard's live rate."""
        if turn is not self.chat.turn:  # the turn ended meanwhile: the panel has its final figures
            return
        thought = turn.thinking_tokens or turn.thinking_ended is not None
        thinking = (turn.thinking_tokens, turn.thinking_s(), turn.thinking_ended is not None) if thought else None
        self.panel.decode_live(turn.decode_tokens, rate, thinking)
        if rate is not None:
            self.dashboard.decode_rate(rate)

    def _draw_live(self, turn: Turn) -> float | None:
        """The phase line's live figures (thinking or decode) and the thinking block; returns the decode rate."""
        rate = turn.live_decode_rate()
        if turn.thinking_now:
            self.indicator.thinking_live(turn.thinking_tokens, turn.thinking_s(), turn.ttft_ms)
            self.thinking.draw(turn)
        else:
            self.indicator.decode_live(turn.decode_tokens, rate, turn.ttft_ms, turn.spec)
        return rate
