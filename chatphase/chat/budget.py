"""The budget of a message before it is sent: its tokens, the context before and after, the TTFT predicted.

One line, shown live by the prompt box and by ``ask -f`` (``+3,412 tok · context 41 % → 63 % · TTFT ≈ 8.4 s
(7.9–9.1 s; this chat, 3 turns)``; when the prediction is withheld, at most a bound and why: ``TTFT ≥ 2.1 s (not
enough turns yet: 1)``, ``TTFT ≥ 400 ms (roofline)``, ``TTFT: not enough turns yet (0)``), or, for a message that
would not fit, the refusal with the numbers. The counts are the model's own tokenizer's
(:class:`~chatphase.engine.events.PromptCount`); the prediction is :mod:`chatphase.timing.ttft_prediction`'s, the
same object the turn then carries (:meth:`~chatphase.chat.controller.ChatController.count`). The words of a
prediction (:func:`ttft_text`, :func:`withheld_text`) are said here for every view.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chatphase.engine.events import PromptCount
from chatphase.engine.metrics import TurnMetrics
from chatphase.timing.ttft_prediction import TtftPrediction, TtftPredictor, Withheld
from chatphase.units import fmt_count, fmt_duration_ms, fmt_int


@dataclass(frozen=True)
class Budget:
    """A counted draft: ``count``, and the TTFT predicted for it (``prediction``; ``None`` when it does not fit)."""

    count: PromptCount
    prediction: TtftPrediction | None = None

    @property
    def fits(self) -> bool:
        return self.count.prompt_tokens is not None

    @property
    def ttft_ms(self) -> float | None:
        """The TTFT predicted (``None``: withheld, or the message does not fit)."""
        return None if self.prediction is None else self.prediction.ttft_ms

    def line(self) -> str:
        """The one line (see the module docstring)."""
        c = self.count
        if c.prompt_tokens is None:
            return does_not_fit(c.too_long or "")
        now, after = _pct(c.kv_cache_tokens, c.n_ctx), _pct(c.prompt_tokens, c.n_ctx)
        parts = [f"+{fmt_int(c.new_tokens or 0)} tok", f"context {now} % → {after} %"]
        if c.restore_tokens:
            parts.insert(1, f"{fmt_int(c.restore_tokens)} restored from disk")
        if self.prediction is not None:
            parts.append(ttft_text(self.prediction))
        if c.dropped_messages:
            parts.append(f"leaves out the oldest {c.dropped_messages} messages")
        return " · ".join(parts)


def duration_range(low_ms: float, high_ms: float) -> str:
    """``7.9–9.1 s``, ``850 ms–1.2 s``: a range of durations, the unit said once when both share it."""
    low, high = fmt_duration_ms(low_ms), fmt_duration_ms(high_ms)
    low_value, _, low_unit = low.rpartition(" ")
    if high.endswith(" " + low_unit) and low_unit in ("ms", "s") and high.count(" ") == 1:
        return f"{low_value}–{high}"
    return f"{low}–{high}"


def withheld_text(why: Withheld, nested: bool = False) -> str:
    """Why no TTFT is predicted, in words: ``not enough turns yet (1)``, ``beyond the prompts measured (up to
    64 tok)``; ``nested`` (inside brackets already): ``not enough turns yet: 1``."""
    head, detail = _why_words(why)
    if detail is None:
        return head
    return f"{head}: {detail}" if nested else f"{head} ({detail})"


def _why_words(why: Withheld) -> tuple[str, str | None]:
    if why.why == "turns":
        return "not enough turns yet", str(why.n_points)
    if why.why == "uneven":
        return f"the {fmt_count(why.n_points, 'measured prefill')} disagree too much", None
    if why.why == "tokens_above":
        return "beyond the prompts measured", f"up to {fmt_int(why.limit)} tok"
    if why.why == "tokens_below":
        return "shorter than the prompts measured", f"from {fmt_int(why.limit)} tok"
    if why.why == "context":
        return "deeper than the context measured", f"up to {fmt_int(why.limit)} tok"
    if why.n_points < 2:
        return "not enough restores yet", str(why.n_points)
    if why.limit:
        return "beyond the restores measured", f"up to {fmt_int(why.limit)} tok"
    return f"the {fmt_count(why.n_points, 'measured restore')} disagree too much", None


def bound_text(p: TtftPrediction) -> str:
    """A withheld prediction's bounds: ``≥ 2.1 s``, ``≤ 28 s``, ``≥ 2.1 s, ≤ 28 s``; ``""`` without one."""
    said = [f"≥ {fmt_duration_ms(p.low_ms)}"] if p.low_ms is not None else []
    said += [f"≤ {fmt_duration_ms(p.high_ms)}"] if p.high_ms is not None else []
    return ", ".join(said)


def ttft_text(p: TtftPrediction) -> str:
    """The budget line's words for ``p`` (module docstring)."""
    if p.ttft_ms is not None and p.low_ms is not None and p.high_ms is not None:
        return f"TTFT ≈ {fmt_duration_ms(p.ttft_ms)} ({duration_range(p.low_ms, p.high_ms)}; {p.source})"
    bounds = bound_text(p)
    if p.withheld is None:
        return f"TTFT {bounds}" if bounds else "TTFT: –"
    if p.withheld.n_points == 0 and p.bound_source is not None:
        return f"TTFT {bounds} ({p.bound_source})"  # nothing measured: the roofline's least TTFT alone
    if not bounds:
        return f"TTFT: {withheld_text(p.withheld)}"
    return f"TTFT {bounds} ({withheld_text(p.withheld, nested=True)})"


def does_not_fit(why: str) -> str:
    """The line of a message that would not fit: ``Does not fit: {why}``."""
    return f"Does not fit: {why}"


def _pct(tokens: int, n_ctx: int) -> int:
    return round(100 * tokens / n_ctx) if n_ctx else 0


def prediction_of(count: PromptCount, predictor: TtftPredictor) -> TtftPrediction | None:
    """The TTFT predicted for ``count``'s new tokens at the depth the cache will hold when they are evaluated
    (a restore from disk is done before the prefill starts), after the restore it says; ``None`` when it does
    not fit."""
    if count.new_tokens is None:
        return None
    depth = count.cached_tokens + count.restore_tokens
    return predictor.predict(count.new_tokens, depth, count.restore_tokens, count.restore_ms)


def budget_of(count: PromptCount, predictor: TtftPredictor) -> Budget:
    """The budget of ``count`` with ``predictor``'s prediction (:func:`prediction_of`)."""
    return Budget(count, prediction_of(count, predictor))


def with_prediction(m: TurnMetrics, p: TtftPrediction) -> TurnMetrics:
    """``m`` with ``p`` in its ``ttft_predicted_*`` fields, ``ttft_prediction_source`` and ``ttft_prediction_note``
    (withheld: why, in words)."""
    return replace(
        m,
        ttft_predicted_ms=p.ttft_ms,
        ttft_predicted_low_ms=p.low_ms,
        ttft_predicted_high_ms=p.high_ms,
        ttft_prediction_source=p.source if p.ttft_ms is not None else p.bound_source,
        ttft_prediction_note=None if p.withheld is None else withheld_text(p.withheld),
        ttft_estimate_ms=p.estimate_ms,
    )
