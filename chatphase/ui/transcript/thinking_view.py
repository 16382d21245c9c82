"""A reasoning model's thinking in the chat screen: the streaming turn's thinking block, and the commands
that copy it and switch thinking on or off.

:class:`ThinkingDrawing` is the chat view's part for the thinking of the turn in flight: it mounts a
:class:`~chatphase.ui.transcript.thinking_block.ThinkingBlock` above the reply at the first thinking text (the
block reads the text from the turn), draws it at the view's tick, and collapses it when the answer starts
(``ThinkingEnded``) or the reply ends (the turn's final figures then replace the live ones). A model
without thinking never gets a block, so its chat looks as it always did.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.app import App

from chatphase.chat.controller import ChatController
from chatphase.chat.turn import Turn
from chatphase.engine.config import TRI_STATE
from chatphase.engine.events import ThinkingEnded
from chatphase.engine.metrics import TurnMetrics
from chatphase.ui.transcript.chat_log import ChatLog
from chatphase.ui.transcript.reply_view import ReplyView
from chatphase.ui.transcript.thinking_block import ThinkingBlock, metrics_title, thought_title


class ThinkingDrawing:
    """The thinking block of the turn in flight (see the module docstring); ``keep_open()`` tells whether a
    finished block stays expanded (the ``thinking_open`` setting, read when it finishes)."""

    def __init__(self, chat_log: ChatLog, keep_open: Callable[[], bool]) -> None:
        self.chat_log = chat_log
        self.keep_open = keep_open
        self.block: ThinkingBlock | None = None
        self.forced = False  # the engine closed the block (the thinking budget)

    def turn_started(self) -> None:
        self.block, self.forced = None, False

    def streamed(self, turn: Turn, text: str) -> None:
        """``text`` was added to the thinking of ``turn``, the turn in flight (mounts the block at the first)."""
        if not text or self.block is not None:
            return
        reply = self.chat_log.active_reply
        if reply is None:
            return
        self.block = ThinkingBlock(turn=turn)
        reply.add_above(self.block)  # one layout per turn, when the thinking starts
        reply.set_meta("thinking…", layout=False)

    def draw(self, turn: Turn) -> None:
        """Redraw the running count and the tail (at the view's tick)."""
        if self.block is not None:
            self.block.draw(turn.thinking_tokens, turn.thinking_s())

    def ended(self, event: ThinkingEnded) -> None:
        """The answer starts: collapse the block."""
        self.forced = event.forced
        if self.block is not None:
            self.block.finish(
                thought_title(event.thinking_tokens, event.thinking_ms, forced=event.forced), self.keep_open()
            )

    def finished(self, reply: ReplyView | None, thinking: str, metrics: TurnMetrics) -> None:
        """The turn is over: its final thinking text and figures (a block is mounted for thinking that
        only the final event holds)."""
        block, self.block = self.block, None
        if block is None and thinking and reply is not None:
            block = ThinkingBlock(thinking)
            reply.add_above(block)
        if block is not None:
            block.finish(metrics_title(metrics, self.forced), self.keep_open(), text=thinking)

    def abandoned(self, turn: Turn) -> None:
        """The turn ended without its result: the block keeps what streamed, with the figures so far."""
        block, self.block = self.block, None
        if block is not None:
            ms = turn.thinking_s() * 1000
            block.finish(
                thought_title(turn.thinking_tokens, ms, turn.thinking_ended is None, self.forced), self.keep_open()
            )


def copy_reply(app: App, chat: ChatController, with_thinking: bool = False, thinking_key: str = "") -> None:
    """Copy the last reply to the clipboard: the answer only, or (``with_thinking``) its thinking in
    ``<think>…</think>`` before it. ``thinking_key`` names the key that copies with the thinking, for the
    notice on a reply that is all thinking."""
    reply, thinking = chat.last_reply, chat.last_thinking if with_thinking else ""
    if not reply and not thinking:
        only = (
            chat.last_thinking
            and f" The last reply has only thinking: {thinking_key or 'copy with thinking'} copies it."
        )
        app.notify(f"There is no answer to copy.{only or ''}", severity="warning")
        return
    text = f"<think>\n{thinking}\n</think>" + (f"\n\n{reply}" if reply else "") if thinking else reply
    app.copy_to_clipboard(text)
    what = "the last reply with its thinking" if thinking else "the last reply"
    none = " (it has no thinking)" if with_thinking and not thinking else ""
    app.notify(f"Copied {what} ({len(text):,} characters){none}.")


def cycle_thinking(app: App, chat: ChatController) -> str:
    """Set thinking to the next of auto → on → off for the next turns (a copy of the chat's settings);
    returns the new value. The notice says what it does on this model."""
    mode = TRI_STATE[(TRI_STATE.index(chat.settings.thinking) + 1) % len(TRI_STATE)]
    chat.settings = chat.settings.with_overrides(thinking=mode)
    loaded = chat.loaded
    what = "as the model's template decides" if mode == "auto" else mode
    note = ""
    if loaded is not None and loaded.thinking_format is None:
        note = " This model does not think, so nothing changes for it."
    elif loaded is not None and mode != "auto" and not loaded.thinking_switch:
        note = " This model's template has no thinking switch (enable_thinking): it thinks as its template decides."
    app.notify(f"Thinking: {what}, from the next turn.{note}", title="Thinking")
    return mode
