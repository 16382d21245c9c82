"""The context-overflow policies and the cache-miss reasons: their names, the fitting numbers and the one decision
of a miss's reason. The words for them are :mod:`chatphase.chat.overflow`'s (the engine hands over names and
numbers, typed; the chat and the UI say them).

Overflow (the conversation no longer fits ``n_ctx`` with room for the reply):

- ``stop``: the turn is refused with the numbers; nothing is dropped.
- ``drop-oldest``: the oldest exchanges leave the prompt (the system prompt stays) and what follows them is
  evaluated again (a re-prefill from the first dropped token).
- ``shift``: the same exchanges leave llama.cpp's KV cache in place (``llama_memory_seq_rm`` +
  ``llama_memory_seq_add``, :mod:`chatphase.engine.local.kv_shift`): nothing is evaluated again.

Dropping is sticky: the controller sends the count of messages already left out
(:attr:`~chatphase.engine.events.TurnRequest.first_message`), so the next turn's prompt starts where the cache
does. When it must drop, the engine drops down to :func:`low_water` — a quarter of ``n_ctx`` below the
budget — so the next few turns append to the cache instead of dropping (and re-prefilling) once per turn.
A fresh engine's first turn fits from message 0 again (``first_message=0``) but counts as an overflow only what
it leaves out beyond the conversation's count (:attr:`~chatphase.engine.events.TurnRequest.left_out_before`).

Cache-miss reasons (:attr:`~chatphase.engine.metrics.TurnMetrics.cache_miss_reason`): a turn of a conversation
with earlier messages *misses* when it keeps fewer of the KV cache's tokens than the cache held when it began, or
starts on an empty cache. :func:`miss_reason` decides why, in the engine, from what the engine saw
(overflow, a memory that cannot drop a tail) and what the controller knows (:data:`HISTORY_CHANGES`).
"""

from __future__ import annotations

OVERFLOW_POLICIES: tuple[str, ...] = ("drop-oldest", "shift", "stop")
#: drop-oldest works on every model and server the engine templates for, and what the model sees is
#: exactly the turns the transcript does not mark; its cost (one re-prefill every few turns) is shown.
DEFAULT_OVERFLOW = "drop-oldest"

#: what the controller knows changed since the engine's last turn (``TurnRequest.history_change``).
HISTORY_CHANGES: tuple[str, ...] = ("edited", "regenerated", "restarted", "model_switch", "resumed", "restored")

#: the changes after which the engine starts on an empty cache: a restore from disk may then hold the whole
#: conversation (no miss) or less of it (``restored``); other reasons (an overflow, an edit) stand as they are.
EMPTIED_BY_CHANGE: tuple[str, ...] = ("resumed", "restarted", "model_switch")

#: every cache-miss reason :func:`miss_reason` and :func:`restore_miss` can give
#: (:attr:`~chatphase.engine.metrics.TurnMetrics.cache_miss_reason`).
CACHE_MISS_REASONS: tuple[str, ...] = (
    "edited",
    "regenerated",
    "template",
    "overflow_drop",
    "overflow_shift",
    "restarted",
    "model_switch",
    "resumed",
    "restored",
    "swa",
    "recurrent",
)


def reply_room(max_tokens: int, n_ctx: int) -> int:
    """Tokens kept free for the reply when fitting a prompt: ``max_tokens``, at most a quarter of ``n_ctx`` (so
    a large ``max_tokens`` does not push most of the conversation out)."""
    return min(max_tokens, n_ctx // 4)


def low_water(budget: int, n_ctx: int) -> int:
    """The prompt length a drop goes down to: a quarter of ``n_ctx`` under ``budget`` (at least half the
    budget), so the next turns fit without dropping again."""
    return max(budget // 2, budget - n_ctx // 4)


def miss_reason(
    *,
    cache_before: int,
    reused: int,
    history: bool,
    overflow: str | None,
    trim_failed: str | None,
    change: str | None,
) -> str | None:
    """Why a turn missed the KV cache, or ``None`` when it did not.

    Args:
        cache_before: tokens the cache held when the turn began; reused: tokens of it the prompt kept.
        history: the conversation has messages before the newest one (without, nothing of it can be missed:
            the first turn of a new chat on a cache that holds the last one).
        overflow: the policy that dropped messages this turn (``drop-oldest`` / ``shift``), else ``None``.
        trim_failed: ``swa`` / ``recurrent`` when the cache could not be trimmed and was cleared, else ``None``.
        change: the controller's :data:`HISTORY_CHANGES` value for this turn, else ``None``.

    Order: what this turn did to the cache first (an overflow, a cache cleared for want of a trim), then what
    the controller knows, then the template (nothing else changed, so the rendering of an earlier turn did).
    """
    if not history or 0 < cache_before <= reused:  # nothing of the conversation was lost (a new chat's first turn)
        return None
    if overflow is not None:
        return "overflow_shift" if overflow == "shift" else "overflow_drop"
    if trim_failed is not None:
        return trim_failed
    if change is not None:
        return change
    return "template" if cache_before else None


def restore_miss(text: bytes | None, restored_text_bytes: int, earlier: str, newest: str) -> str | None:
    """The miss reason of a turn whose cache was restored from disk (after a resume, a restart): ``None`` when
    the restored prefix holds the conversation up to the end of the message before the newest one (only the
    template's glue between the two is left to evaluate), else ``"restored"``.

    Args:
        text: the turn's templated prompt (UTF-8), ``None`` for a prompt given as token ids (taken as a miss).
        restored_text_bytes: bytes of ``text`` the cache holds after the restore (its recorded text).
        earlier: the text of the message before the newest; newest: the newest message's text.
    """
    if text is None:
        return "restored"
    newest_at = text.rfind(newest.encode("utf-8"))
    earlier_bytes = earlier.encode("utf-8")
    at = text.rfind(earlier_bytes, 0, newest_at if newest_at >= 0 else len(text))
    return None if at >= 0 and at + len(earlier_bytes) <= restored_text_bytes else "restored"
