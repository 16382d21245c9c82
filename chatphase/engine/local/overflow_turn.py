"""What an overflow did in one turn of :class:`~chatphase.engine.local.llama.LlamaEngine`, and the sliding-window check.

The engine fills an :class:`Overflow` while it fits the prompt (``_overflow_cut``) and after it keeps the cache's
prefix; its figures go into ``PrefillStarted`` and the turn's ``TurnMetrics`` (``overflow_*``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import llama_cpp as lc

from chatphase.engine.metrics import TurnMetrics


@dataclass
class Overflow:
    """``policy`` (``drop-oldest`` / ``shift``) dropped ``dropped_messages`` more messages (``dropped_tokens`` of
    prompt) this turn; ``cache_before`` tokens were cached then; ``kept_bytes`` where the kept history ends in the
    new prompt's text (``None``: not located); ``shifted`` whether the cache was shifted in place (in
    ``shift_ms``); ``reprefill`` the kept history's tokens evaluated again."""

    policy: str
    dropped_messages: int
    dropped_tokens: int = 0
    cache_before: int = 0
    kept_bytes: int | None = None
    shifted: bool = False
    shift_ms: float = 0.0
    reprefill: int = 0

    def fields(self) -> dict[str, Any]:
        """``PrefillStarted``'s overflow fields."""
        return {
            "overflow": self.policy,
            "overflow_dropped_messages": self.dropped_messages,
            "overflow_dropped_tokens": self.dropped_tokens,
            "overflow_reprefill_tokens": self.reprefill,
        }

    def metrics_fields(self, m: TurnMetrics) -> dict[str, Any]:
        """``TurnMetrics``' overflow fields; the re-prefill's time is its tokens' share of ``prefill_ms``."""
        share = self.reprefill / m.prefill_tokens if m.prefill_tokens else 0.0
        return self.fields() | {"overflow_reprefill_ms": (m.prefill_ms or 0.0) * share}


def swa_trim_refusal(mem: lc.llama_memory_t, model: lc.llama_model_p | None, keep: int) -> str | None:
    """``"swa"`` when a sliding-window cache no longer holds the cells that tokens after ``keep`` would attend
    to (its oldest position is past ``keep - n_swa``, llama-server's test), else ``None``. With llama.cpp's
    default full-size SWA cache (``swa_full``) nothing is evicted and this never refuses."""
    n_swa = lc.llama_model_n_swa(model) if model else 0
    if n_swa <= 0:
        return None
    pos_min = lc.llama_memory_seq_pos_min(mem, 0)
    return "swa" if pos_min > max(0, keep - n_swa) else None
