"""The budget of a message before it is sent: its tokens, the context before and after, the TTFT predicted.

One line, shown live by the prompt box and by ``ask -f`` (``+3,412 tok · context 41 % → 63 % · TTFT ≈ 8.4 s
(this chat, 3 turns)``; before any measurement at most a bound, ``TTFT ≥ 400 ms (roofline)``), or, for a
message that would not fit, the refusal with the numbers. The counts are the model's own tokenizer's (:class:`~chatphase.engine.events.PromptCount`); the prediction is
:mod:`chatphase.engine.ttft_prediction`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatphase.engine.events import PromptCount
from chatphase.engine.ttft_prediction import TtftPredictor
from chatphase.units import fmt_duration_ms, fmt_int


@dataclass(frozen=True)
class Budget:
    """A counted draft: ``count``, and the TTFT predicted for it (``ttft_ms``, from ``source``; ``None``
    without a measurement to predict from), else the least TTFT the roofline allows (``ttft_bound_ms``, a
    bound, never shown as a prediction)."""

    count: PromptCount
    ttft_ms: float | None = None
    source: str | None = None
    ttft_bound_ms: float | None = None

    @property
    def fits(self) -> bool:
        return self.count.prompt_tokens is not None

    def line(self) -> str:
        """The one line (see the module docstring)."""
        c = self.count
        if c.prompt_tokens is None:
            return does_not_fit(c.too_long or "")
        now, after = _pct(c.kv_cache_tokens, c.n_ctx), _pct(c.prompt_tokens, c.n_ctx)
        parts = [f"+{fmt_int(c.new_tokens or 0)} tok", f"context {now} % → {after} %"]
        if c.restore_tokens:
            parts.insert(1, f"{fmt_int(c.restore_tokens)} restored from disk")
        if self.ttft_ms is not None:
            parts.append(f"TTFT ≈ {fmt_duration_ms(self.ttft_ms)} ({self.source})")
        elif self.ttft_bound_ms is not None:
            parts.append(f"TTFT ≥ {fmt_duration_ms(self.ttft_bound_ms)} ({self.source})")
        else:
            parts.append("TTFT: after the first turn")
        if c.dropped_messages:
            parts.append(f"leaves out the oldest {c.dropped_messages} messages")
        return " · ".join(parts)


def does_not_fit(why: str) -> str:
    """The line of a message that would not fit: ``Does not fit: {why}``."""
    return f"Does not fit: {why}"


def _pct(tokens: int, n_ctx: int) -> int:
    return round(100 * tokens / n_ctx) if n_ctx else 0


def budget_of(count: PromptCount, predictor: TtftPredictor) -> Budget:
    """The budget of ``count`` with ``predictor``'s TTFT for its new tokens at the cached depth (else its bound),
    plus the predicted restore of a prefix from disk when one would be restored."""
    model, bound = predictor.model, predictor.bound
    if count.new_tokens is None:
        return Budget(count)
    if model is None:
        return Budget(count) if bound is None else Budget(count, None, bound.source, bound.ttft_ms(count.new_tokens))
    depth = count.cached_tokens + count.restore_tokens  # a restore is done before the prefill starts
    return Budget(count, (count.restore_ms or 0.0) + model.ttft_ms(count.new_tokens, depth), model.source)
