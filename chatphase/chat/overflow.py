"""What the chat says about an overflow and a cache miss: the notice's words and the figures' one format.

The engine decides (:mod:`chatphase.engine.overflow`); this module words it for the notice, the turn detail and
the transcript's marks, so the TUI and ``ask`` say the same thing.
"""

from __future__ import annotations

from chatphase.engine.events import LoadedModel, Message, PrefillStarted
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.overflow import miss_words, overflow_cost
from chatphase.units import fmt_count


def overflow_text(ev: PrefillStarted | TurnMetrics) -> str:
    """One sentence: what this turn's overflow left out and what it cost."""
    what = fmt_count(ev.overflow_dropped_messages, "message")
    tokens = f" ({ev.overflow_dropped_tokens:,} tok)" if ev.overflow_dropped_tokens is not None else ""
    how = "shifted out of the KV cache" if ev.overflow == "shift" else "dropped from the prompt"
    ms = ev.overflow_reprefill_ms if isinstance(ev, TurnMetrics) else None
    return (
        f"The conversation outgrew n_ctx ({ev.overflow}): the oldest {what}{tokens} {how}, the system prompt kept; "
        f"{overflow_cost(ev.overflow, ev.overflow_reprefill_tokens, ms)}."
    )


def miss_text(ev: PrefillStarted) -> str:
    """``cache miss: <reason in words>`` ("" for a turn that did not miss)."""
    return f"cache miss: {miss_words(ev.cache_miss_reason)}" if ev.cache_miss_reason else ""


#: what llama-server does instead of chatphase's overflow policies (the engine sends it the whole conversation).
REMOTE_SHIFT = (
    "a remote server keeps its own context: chatphase cannot shift its KV cache (llama-server shifts only when "
    "started with --context-shift, off by default since 2025-08; others refuse or truncate)"
)


def shift_refusal(overflow: str, loaded: LoadedModel) -> str | None:
    """Why ``overflow=shift`` cannot work with the loaded engine (one line), or ``None``."""
    if overflow != "shift":
        return None
    if loaded.settings.remote:
        return REMOTE_SHIFT
    if loaded.kv_shift_refusal:
        return f"{loaded.info.name} cannot shift its KV cache: {loaded.kv_shift_refusal}; an overflow will be refused"
    return None


def unseen_exchanges(messages: list[Message], left_out: int) -> int:
    """How many of the conversation's user messages (its turns, oldest first) lie in its ``left_out`` oldest
    messages, which the model no longer sees."""
    return sum(m.role == "user" for m in messages[:left_out])
