"""When will the conversation fill the context? A pure forecast from the KV cache size after each turn.

The KV cache holds the whole conversation (prompt + replies), so it grows by roughly one exchange per turn.
The average growth per turn is ``kv_tokens_now / turns`` (the cache starts empty at a new chat; a turn that
shrinks it — regenerate, edit-resend, trimmed context — counts as the net change), and the turns left are
``floor((n_ctx - kv_tokens_now) / growth)``. Past that point the engine must drop old messages
(``PrefillStarted.dropped_messages``) or stop with ``context_full``.

``turns`` are the conversation's own turns that the cache holds, not the turns this engine ran: a resumed
chat (or one whose model was reloaded) prefills its earlier turns again in its first turn, and those tokens
are the earlier turns' growth, not that turn's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KvForecast:
    """KV cache use against ``n_ctx``.

    ``used_tokens`` cells in use after the last turn; ``n_ctx`` the context size (tokens);
    ``used_fraction`` in 0..1 (clamped); ``growth_tokens_per_turn`` mean net growth (``None`` before the
    first turn); ``turns_left`` whole turns that still fit at that growth (``None`` when growth is unknown
    or not positive, 0 when full).
    """

    used_tokens: int
    n_ctx: int
    used_fraction: float
    growth_tokens_per_turn: float | None
    turns_left: int | None


def forecast_kv(kv_tokens_after_turns: Sequence[int], n_ctx: int, turns_held: int | None = None) -> KvForecast:
    """Forecast from ``kv_cache_tokens`` after each turn of this chat (oldest first); ``turns_held``: how many
    of the conversation's turns the cache holds after the last one (default: one per entry, a chat whose
    cache started empty at its first turn; more after a resume's cold prefill of the earlier turns).

    Raises:
        ValueError: when ``n_ctx`` is not positive or a count is negative.
    """
    if n_ctx <= 0:
        raise ValueError(f"n_ctx must be positive (got {n_ctx})")
    if any(k < 0 for k in kv_tokens_after_turns):
        raise ValueError("KV token counts must be >= 0")
    if not kv_tokens_after_turns:
        return KvForecast(0, n_ctx, 0.0, None, None)
    used = int(kv_tokens_after_turns[-1])
    growth = used / max(1, turns_held if turns_held is not None else len(kv_tokens_after_turns))
    free = max(0, n_ctx - used)
    turns_left = math.floor(free / growth) if growth > 0 else None
    return KvForecast(used, n_ctx, min(1.0, used / n_ctx), growth, turns_left)
