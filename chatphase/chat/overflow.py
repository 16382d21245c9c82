"""Every word said about an overflow and a cache miss: the notice, the miss reasons, the cost line, the turn
detail's rows, the KV forecast's warning.

The engine decides and hands over names and numbers (:mod:`chatphase.engine.overflow`, the
:class:`~chatphase.engine.metrics.TurnMetrics` fields); only this module words them, for the notice, the turn
detail, the transcript's marks and the dashboard, so the TUI and ``ask`` say the same thing.
"""

from __future__ import annotations

from chatphase.engine.events import LoadedModel, Message, PrefillStarted
from chatphase.engine.metrics import TurnMetrics
from chatphase.units import fmt_count

#: what the chosen overflow policy will do when the next turn does not fit (the KV forecast's words).
OVERFLOW_AHEAD: dict[str, str] = {
    "drop-oldest": "the oldest messages will then be dropped and what follows them read again",
    "shift": "the oldest messages will then be shifted out of the KV cache",
    "stop": "it will then be refused (overflow policy stop: nothing is dropped)",
}

#: every cache-miss reason (:data:`chatphase.engine.overflow.CACHE_MISS_REASONS`) in the words a notice uses.
MISS_REASONS: dict[str, str] = {
    "edited": "the last message was edited",
    "regenerated": "the reply was regenerated",
    "template": "the template renders an earlier turn differently (e.g. thinking left out of the history)",
    "overflow_drop": "the oldest messages were dropped to fit n_ctx",
    "overflow_shift": "the oldest messages were shifted out of the KV cache",
    "restarted": "the engine was restarted",
    "model_switch": "the model was switched",
    "resumed": "a saved session was resumed (its KV cache was not kept)",
    "restored": "the KV cache restored from disk holds less of the conversation",
    "swa": "the sliding-window KV cache no longer holds the window the kept prefix needs",
    "recurrent": "this model's memory cannot drop a tail (recurrent or hybrid)",
}


def miss_words(reason: str | None) -> str:
    """A miss reason in words (the reason itself when unknown)."""
    return MISS_REASONS.get(reason or "", reason or "")


def overflow_cost(policy: str | None, reprefill_tokens: int | None, reprefill_ms: float | None = None) -> str:
    """``re-prefill 2,310 tok · 5.1 s`` or ``KV shift · 0 tok re-prefilled`` (the time once the turn is over)."""
    if policy == "shift" and not reprefill_tokens:
        return "KV shift · 0 tok re-prefilled"
    cost = f"re-prefill {reprefill_tokens or 0:,} tok"
    return cost + (f" · {reprefill_ms / 1000:.1f} s" if reprefill_ms is not None else "")


def overflow_pairs(m: TurnMetrics) -> list[tuple[str, str]]:
    """The turn detail's rows for an overflow and a cache miss (none when the turn had neither)."""
    out = []
    if m.overflow is not None:
        n = m.overflow_dropped_messages
        tokens = f", {m.overflow_dropped_tokens:,} tok" if m.overflow_dropped_tokens is not None else ""
        out.append(("overflow", f"{m.overflow}: {n} message{'s' if n != 1 else ''}{tokens}"))
        out.append(("overflow cost", overflow_cost(m.overflow, m.overflow_reprefill_tokens, m.overflow_reprefill_ms)))
    if m.cache_miss_reason:
        out.append(("cache miss", m.cache_miss_reason))
    return out


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
