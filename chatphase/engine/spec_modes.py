"""Speculative decoding modes: the ``--spec`` setting's values, parsed once (no llama.cpp here).

``off`` plain decode, one token a step; ``lookup`` n-gram drafts from the conversation so far;
``draft:MODEL`` a second, small GGUF of the same vocabulary drafts greedily (``MODEL`` as ``--model``
takes it: a path, a file in the models directory, ``default`` for the bundled model); ``auto`` lookup
with the draft length (0 = none) whose steps made the most tokens per ms on this turn, measured, so no drafts
when they do not pay (:mod:`chatphase.engine.local.speculative`).
"""

from __future__ import annotations

from dataclasses import dataclass

from chatphase.errors import UsageError

SPEC_MODES = ("off", "lookup", "auto", "draft:MODEL")
#: the start of a load note that says a draft model cannot pay (the TUI shows those in the chat).
SPEC_WARNING = "speculative decoding will not pay:"


@dataclass(frozen=True)
class SpecMode:
    """A parsed ``--spec`` value: ``kind`` one of ``off``, ``lookup``, ``auto``, ``draft``; ``draft`` the
    draft model's spec (``draft`` kind only)."""

    kind: str
    draft: str | None = None

    @property
    def label(self) -> str:
        """The short name shown on screen and in metrics (``lookup``, ``draft``)."""
        return self.kind


def parse_spec(text: str | None) -> SpecMode:
    """``off|lookup|auto|draft:MODEL`` (case-insensitive keyword) as a :class:`SpecMode`; ``None``/empty is off.

    Raises:
        UsageError: anything else, or ``draft:`` without a model.
    """
    value = (text or "off").strip()
    low = value.lower()
    if low in ("off", "lookup", "auto"):
        return SpecMode(low)
    if low.startswith("draft:"):
        model = value[len("draft:") :].strip()
        if not model:
            raise UsageError("--spec draft:MODEL needs a model (a GGUF path, a models-directory name, or default)")
        return SpecMode("draft", model)
    raise UsageError(f"spec must be one of {', '.join(SPEC_MODES)} (got {text!r})")


def spec_figures_text(mode: str, tokens_per_step: float | None, acceptance: float | None, speedup: float | None) -> str:
    """``lookup · 2.7 tok/step · 68 % accepted · ×1.6``: the mode, generated tokens per target step, the
    share of draft tokens accepted and the speed-up against this turn's plain steps (each once known)."""
    parts = [mode]
    if tokens_per_step is not None:
        parts.append(f"{tokens_per_step:.1f} tok/step")
    if acceptance is not None:
        parts.append(f"{acceptance * 100:.0f} % accepted")
    if speedup is not None:
        parts.append(f"×{speedup:.1f}")
    return " · ".join(parts)
