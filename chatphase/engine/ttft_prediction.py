"""TTFT predicted before a turn is sent, from this machine's measured prefill.

The model: ``ttft_ms = a + b·n + c·n·(depth + n/2)`` for ``n`` tokens evaluated on top of ``depth`` tokens
already in the KV cache. ``a`` (ms) is the turn's cost outside the prefill (tokenising, the first sampled
token), ``b`` (ms per token) the weights' cost of each evaluated token, and the last term the attention's:
token ``i`` of the ``n`` reads the ``depth + i`` tokens before it, ``n·(depth + n/2)`` reads in all. A chat's
few turns do not determine ``c`` on its own, so it is tied to ``b`` by the model's shape: ``c = b·k`` with
``k`` the attention FLOPs per context token over the weights' FLOPs per token
(``attention_flops_per_context_token / (2 × n_params)``, :mod:`chatphase.models.roofline`).

Fitted on the turns' measured figures, each part on its own: ``b`` by least squares of the *prefill* time
against ``x = n·(1 + k·(depth + n/2))``, and ``a`` the median of ``ttft_ms − prefill_ms``. A line fitted to
TTFT itself would need turns of very different sizes: a chat's first turns are all short, and a slope
through a few tokens' spread is noise. The prefill line goes through the origin (no tokens, no prefill)
unless the turns span sizes (the largest ``x`` at least :data:`SPAN_FOR_INTERCEPT` times the smallest, three
turns or more): then it has an intercept ``p0`` of its own, a prefill's fixed cost (each call's graph, the
threads' wake-up), which a line through the origin spreads over the tokens of short turns and so predicts
a long prompt high (SmolLM2-135M on 2 Zen 5 cores, three short turns then ~1,280 tokens: median error 14 %
through the origin, 8 % with the intercept, side by side; ``benchmarks/results/ttft_prediction-2026-12-04.md``). One turn is enough; with none, the prior (earlier chats' turns, or a bench sweep's
samples, :func:`prior_from_sweep`), else no prediction: at most a bound (:class:`TtftBound`).

During a prefill, :func:`remaining_ms` corrects the prediction by the chunks already done: the time
predicted for the rest, scaled by measured ÷ predicted for the part done. Pure Python, no model.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PrefillPoint:
    """One measured turn: ``tokens`` evaluated on top of ``depth`` cached tokens in ``prefill_ms``; its
    ``ttft_ms``."""

    tokens: int
    depth: int
    prefill_ms: float
    ttft_ms: float


@dataclass(frozen=True)
class TtftModel:
    """``ttft_ms = a_ms + prefill_once_ms + b_ms_per_token · n·(1 + k·(depth + n/2))``, fitted on
    ``n_points``; ``source`` says where the points came from (``this chat, 3 turns``, ``bench results
    notes.json``)."""

    a_ms: float
    b_ms_per_token: float
    k: float
    n_points: int
    source: str
    prefill_once_ms: float = 0.0

    def effective_tokens(self, n: float, depth: float) -> float:
        """``n·(1 + k·(depth + n/2))``: evaluated tokens, the attention's share counted in."""
        return n * (1.0 + self.k * (depth + n / 2.0))

    def prefill_ms(self, n: float, depth: float) -> float:
        """Predicted prefill time (ms) of ``n`` tokens evaluated at ``depth``."""
        return self.prefill_once_ms + self.b_ms_per_token * self.effective_tokens(n, depth)

    def ttft_ms(self, n: int, depth: int) -> float:
        """Predicted TTFT (ms) of ``n`` tokens evaluated at ``depth``."""
        return self.a_ms + self.prefill_ms(n, depth)

    @property
    def c_ms_per_token2(self) -> float:
        """``c`` of the module docstring (ms per token per context token)."""
        return self.b_ms_per_token * self.k


def attention_ratio(attention_flops_per_context_token: int, n_params: int | None) -> float:
    """``k``: attention FLOPs per context token ÷ the weights' FLOPs per token (``2 × n_params``); 0 when
    either is unknown (the depth term is left out)."""
    if not n_params or attention_flops_per_context_token <= 0:
        return 0.0
    return attention_flops_per_context_token / (2.0 * n_params)


#: how many times the smallest the largest turn's ``x`` must be for the prefill line to get an intercept.
SPAN_FOR_INTERCEPT = 2.5


def fit(points: Sequence[PrefillPoint], k: float, source: str, intercept: bool = True) -> TtftModel | None:
    """Fit ``a``, ``p0``, ``b`` to ``points`` (see the module docstring; ``intercept=False``: ``p0 = 0``, the
    line through the origin, for comparison); ``None`` without a usable point."""
    pts = [p for p in points if p.tokens > 0 and p.prefill_ms > 0 and p.ttft_ms >= p.prefill_ms]
    if not pts:
        return None
    xs = [p.tokens * (1.0 + k * (p.depth + p.tokens / 2.0)) for p in pts]
    ys = [p.prefill_ms for p in pts]
    a = statistics.median(p.ttft_ms - p.prefill_ms for p in pts)
    if intercept and len(pts) >= 3 and max(xs) >= SPAN_FOR_INTERCEPT * min(xs):
        line = statistics.linear_regression(xs, ys)
        if 0.0 <= line.intercept < min(ys) and line.slope > 0.0:  # else the spread is noise: through the origin
            return TtftModel(a, line.slope, k, len(pts), source, line.intercept)
    b = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return TtftModel(a, b, k, len(pts), source)


def remaining_ms(model: TtftModel, n: int, depth: int, done: int, elapsed_ms: float) -> float:
    """Time left (ms) to the first token of a prefill of ``n`` tokens at ``depth`` with ``done`` of them
    evaluated in ``elapsed_ms``: the prediction for the rest, scaled by measured ÷ predicted for the part
    done (no scaling before a chunk is done). Never negative."""
    whole = model.ttft_ms(n, depth)
    if done <= 0 or elapsed_ms <= 0:
        return max(whole - max(elapsed_ms, 0.0), 0.0)
    part = model.prefill_ms(done, depth)  # the fixed cost is spent with the first chunk
    rest = whole - model.a_ms - part
    scale = elapsed_ms / part if part > 0 else 1.0
    return max(rest * scale + model.a_ms, 0.0)


@dataclass(frozen=True)
class TtftBound:
    """A least TTFT, not a prediction: the prefill's weight-matmul FLOPs (``flops_of(n)``) at this machine's
    measured peak ``flops_per_s``; ``source`` names it (``roofline``). Shown as ``TTFT ≥ …``, never ``≈``."""

    flops_per_s: float
    flops_per_token: float
    flops_once: float
    source: str = "roofline"

    def ttft_ms(self, n: int) -> float:
        """The least TTFT (ms) of ``n`` evaluated tokens: ``(flops_per_token × n + flops_once) / flops_per_s``."""
        return 1000.0 * (self.flops_per_token * n + self.flops_once) / self.flops_per_s


class TtftPredictor:
    """A chat's TTFT predictions: the turns it measured (:meth:`add`), else ``prior``; without either only
    ``bound`` (a least TTFT, :class:`TtftBound`) may be said.

    Args:
        k: :func:`attention_ratio` of the model.
        prior: the model before this chat has a turn (earlier chats' turns or a bench sweep's fit), or ``None``.
        bound: the roofline's least TTFT, or ``None``.
    """

    def __init__(self, k: float = 0.0, prior: TtftModel | None = None, bound: TtftBound | None = None) -> None:
        self.k = k
        self.prior = prior
        self.bound = bound
        self.points: list[PrefillPoint] = []
        self._model: TtftModel | None = None

    def add(self, tokens: int | None, depth: int | None, prefill_ms: float | None, ttft_ms: float | None) -> None:
        """Count one finished turn (skipped when a figure is unknown or nothing was evaluated)."""
        if tokens and prefill_ms and ttft_ms and depth is not None:
            self.points.append(PrefillPoint(tokens, depth, prefill_ms, ttft_ms))
            turns = len(self.points)
            self._model = fit(self.points, self.k, f"this chat, {turns} turn{'s' if turns != 1 else ''}")

    def clear(self) -> None:
        """Forget the chat's turns (a new chat, another model); the prior stays."""
        self.points.clear()
        self._model = None

    @property
    def model(self) -> TtftModel | None:
        """The chat's own fit when it has a turn, else the prior."""
        return self._model or self.prior

    def predict_ms(self, tokens: int, depth: int) -> float | None:
        """Predicted TTFT (ms), ``None`` without a model."""
        model = self.model
        return None if model is None else model.ttft_ms(tokens, depth)


def prior_from_sweep(samples: Iterable[dict[str, Any]], k: float, source: str) -> TtftModel | None:
    """A prior from a bench sweep's JSON ``samples`` (``prompt_tokens``, ``depth``, ``ttft_ms``,
    ``prefill_tokens_per_s``, ``warmup``; ``prefill_tokens`` and ``cached_tokens`` where the engine reported
    them); ``None`` when none is usable."""
    points = []
    for s in samples:
        if s.get("warmup") or not s.get("ttft_ms") or not s.get("prefill_tokens_per_s"):
            continue
        tokens = s.get("prefill_tokens") or s.get("prompt_tokens")
        depth = s.get("cached_tokens") if s.get("cached_tokens") is not None else s.get("depth", 0)
        if tokens:
            prefill_ms = 1000.0 * tokens / s["prefill_tokens_per_s"]
            points.append(PrefillPoint(int(tokens), int(depth or 0), prefill_ms, float(s["ttft_ms"])))
    return fit(points, k, source)
