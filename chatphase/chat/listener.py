"""What the chat controller tells its listeners: one typed interface for the TUI, the session
recording and ``ask``.

Every method is a no-op here; a listener overrides what it shows or keeps. Calls come on the
controller's thread (the UI thread in the TUI), in the order things happened; engine events are passed
as the engine's own event objects (:mod:`chatphase.engine.events`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from chatphase.chat.overflow import miss_text, overflow_text
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
from chatphase.models.gguf_meta import ModelInfo
from chatphase.units import fmt_count

if TYPE_CHECKING:
    from chatphase.sessions.store import Session
    from chatphase.settings.schema import Settings

NoticeKind = Literal["reuse", "dropped", "context_full", "turn_error", "model", "spec", "cache_miss", "prefix"]
Severity = Literal["information", "warning", "error"]


@dataclass(frozen=True)
class Notice:
    """A plain-language note for the user: ``kind`` says what it is about (a view may add its own key
    hints per kind), ``title`` a short heading, ``text`` one or two sentences."""

    kind: NoticeKind
    title: str
    text: str
    severity: Severity = "information"

    @classmethod
    def dropped(cls, n_messages: int) -> Notice:
        return cls(
            "dropped",
            "Context trimmed",
            f"The context is full: the prompt leaves out the oldest {fmt_count(n_messages, 'message')} "
            "(the system prompt is kept).",
            "warning",
        )

    @classmethod
    def back_in_context(cls, n_messages: int) -> Notice:
        """A fresh fit (a restart, a model switch, a resume at a larger n_ctx) kept more of the conversation."""
        return cls(
            "dropped",
            "Context",
            f"{fmt_count(n_messages, 'earlier message')} {'is' if n_messages == 1 else 'are'} back in the context.",
        )

    @classmethod
    def context_full(cls) -> Notice:
        return cls(
            "context_full",
            "Context full",
            "The reply filled the context (n_ctx). Start a new chat or raise n_ctx.",
            "warning",
        )

    @classmethod
    def reuse(cls, title: str, ev: PrefillStarted) -> Notice:
        miss = f" ({miss_text(ev)})" if ev.cache_miss_reason else ""
        return cls(
            "reuse",
            title,
            f"{ev.cached_tokens:,} of {ev.prompt_tokens:,} prompt tokens reused from the KV cache{miss}"
            + (f" ({ev.restored_tokens:,} restored from disk in {ev.restore_ms:,.0f} ms)" if ev.restored_tokens else "")
            + "; "
            f"{ev.prefill_tokens:,} to evaluate.",
        )

    @classmethod
    def miss(cls, ev: PrefillStarted) -> Notice:
        """A turn that kept less of the KV cache than it held, with the reason (no reuse note said why)."""
        return cls(
            "cache_miss",
            "Cache miss",
            f"{ev.cached_tokens:,} of {ev.prompt_tokens:,} prompt tokens reused from the KV cache: {miss_text(ev)}.",
        )

    @classmethod
    def overflow(cls, ev: PrefillStarted) -> Notice:
        """An overflow this turn: what it left out and its cost (:mod:`chatphase.chat.overflow`)."""
        return cls("dropped", "Context full", overflow_text(ev), "warning")


def thinking_ignored(settings: Settings, loaded: LoadedModel) -> Notice | None:
    """The notice for thinking settings (``thinking`` on/off, ``think_budget``) that the loaded model
    cannot take: it has no thinking markers. ``None`` when they apply, or for a remote server (whose
    thinking shows only in its replies)."""
    asked = [
        name
        for name, set_ in (
            ("thinking", settings.thinking != "auto"),
            ("think_budget", settings.sampling.think_budget is not None),
        )
        if set_
    ]
    if not asked or loaded.thinking_format is not None or loaded.settings.remote:
        return None
    return Notice(
        "model",
        "No thinking block",
        f"{loaded.info.name} does not think (no thinking markers): {' and '.join(asked)} {'has' if len(asked) == 1 else 'have'} no effect.",
        "warning",
    )


class ChatListener:
    """Told by :class:`~chatphase.chat.controller.ChatController` what happened (see the module docstring)."""

    # -- the engine --------------------------------------------------------------------------------
    def engine_loading(self, model: ModelInfo) -> None:
        """A new engine starts and loads ``model`` (at start, restart and model switch)."""

    def engine_ready(self, loaded: LoadedModel) -> None:
        """The engine has loaded its model and takes turns."""

    def engine_stopped(self, message: str) -> None:
        """The engine is gone (a crash, a failed load or start); restarting it is the way on."""

    # -- a turn ------------------------------------------------------------------------------------
    def turn_started(self, turn: Turn) -> None:
        """A turn was sent to the engine (for ``send``/``resend`` its user message was just added)."""

    def prefill_started(self, turn: Turn, event: PrefillStarted) -> None:
        """Templating and tokenisation are done; prefill of ``event.prefill_tokens`` starts."""

    def prefill_progress(self, turn: Turn, event: PrefillProgress) -> None:
        """More of the prompt evaluated."""

    def first_token(self, turn: Turn, event: FirstToken) -> None:
        """The first generated token: TTFT is known, decode begins."""

    def tokens_decoded(self, turn: Turn, event: TokensDecoded) -> None:
        """More generated tokens (``event.text`` answer, ``event.thinking`` thinking text)."""

    def thinking_ended(self, turn: Turn, event: ThinkingEnded) -> None:
        """A reasoning model's thinking block closed; the answer follows."""

    def turn_finished(self, turn: Turn, event: TurnFinished) -> None:
        """The turn is over; its reply is the conversation's last message."""

    def turn_failed(self, turn: Turn, message: str) -> None:
        """The turn produced no reply (refused, or the engine failed before any text): its user message
        (``turn.user``) left the conversation, to be given back to the user."""

    def turn_abandoned(self, turn: Turn, why: str) -> None:
        """The turn ended without its result (the engine died or was replaced mid-reply): the text so
        far (``turn.reply``) is kept as its reply, marked with ``why``."""

    # -- the conversation --------------------------------------------------------------------------
    def history_rewound(self, removed: tuple[Message, ...]) -> None:
        """Regenerate or edit took the newest messages back (``removed``, oldest first)."""

    def chat_cleared(self) -> None:
        """A new chat: the conversation and its turns are forgotten."""

    def history_restored(self, session: Session) -> None:
        """A saved session's conversation is the chat's now (its turns shown, the KV cache empty)."""

    def notice(self, notice: Notice) -> None:
        """Something to tell the user."""

    def history_left_out(self, n_turns: int) -> None:
        """The model no longer sees the conversation's ``n_turns`` oldest turns (an overflow dropped or shifted
        them; 0: it sees every turn again, after a new chat or a fresh engine)."""
