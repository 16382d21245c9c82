"""Every word said about a turn's exactness and how flash attention resolved: the turn detail's row, ``ask``'s
metrics line, the system figures' ``flash attn`` value.

The engine decides and hands over names (:mod:`chatphase.engine.exactness`, ``TurnMetrics.logits_exact`` and
``logits_exact_reason``; ``LoadedSettings.flash_attn_enabled``); only this module words them.
"""

from __future__ import annotations

from chatphase.engine import exactness as ex
from chatphase.engine.events import LoadedSettings
from chatphase.engine.metrics import TurnMetrics
from chatphase.units import fmt_value

#: why a turn's logits are a cold run's, in words.
EXACT_WORDS: dict[str, str] = {
    ex.FLASH_ATTN_OFF: "flash attention off",
    ex.COLD_PREFILL: "cold prefill",
    ex.EXACT_RESTORE: "exact restore",
    ex.SAME_BATCHES: "KV cache kept in a cold run's batches",
}

#: why they can differ from a cold run's, in words.
INEXACT_WORDS: dict[str, str] = {
    ex.RESTORED_LAST_TOKEN: "restored",
    ex.CACHE_REUSE: "KV cache reused",
    ex.KV_SHIFT: "KV cache shifted",
    ex.SPECULATIVE: "speculative",
}


def logits_words(m: TurnMetrics, flash_attn_enabled: bool | None = None) -> str | None:
    """``exact (cold prefill)``, ``batch-dependent (restored, flash attention on)``, ``shifted (KV cache
    shifted)``: whether a cold run of the turn's prompt would compute its logits, and why; ``None`` when the turn
    says nothing (a remote server's, or one that generated nothing). ``flash_attn_enabled``: how the loaded model's
    flash attention resolved, said beside a batch-dependent turn's reason (``None``: not said)."""
    why = m.logits_exact_reason or ""
    if m.logits_exact is None:
        return None
    if m.logits_exact:
        return f"exact ({EXACT_WORDS.get(why, why)})"
    if why == ex.KV_SHIFT:
        return f"shifted ({INEXACT_WORDS[why]})"
    fa = "" if flash_attn_enabled is None else f", flash attention {'on' if flash_attn_enabled else 'off'}"
    return f"batch-dependent ({INEXACT_WORDS.get(why, why)}{fa})"


def logits_pairs(m: TurnMetrics) -> list[tuple[str, str]]:
    """The turn detail's row (none when the turn says nothing)."""
    words = logits_words(m)
    return [] if words is None else [("logits", words)]


def flash_attn_text(s: LoadedSettings) -> str:
    """The ``flash_attn`` setting and, for ``auto``, what llama.cpp chose: ``auto (on)``, ``off``; ``auto`` when the
    log did not say."""
    if s.flash_attn == "auto" and s.flash_attn_enabled is not None:
        return f"auto ({'on' if s.flash_attn_enabled else 'off'})"
    return fmt_value(s.flash_attn)
