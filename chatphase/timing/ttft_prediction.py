"""What is shown of the TTFT model (:mod:`chatphase.timing.ttft_model`): the one prediction of a turn, its range, or
why it is withheld and the bounds the points still give. Pure Python, no model, no numpy.

The range: from the fit's leave-one-out spread ``s`` (:attr:`~chatphase.timing.ttft_model.TtftModel.log_spread`),
a new prediction's range is ``× e^(±t·s·√((1 + h₀)/(1 + P/N)))`` with ``t`` Student's 95 % quantile at ``N − P``
degrees of freedom (:func:`chatphase.timing.stats.t95`; a 90 % two-sided interval) and ``h₀`` the leverage of the
new turn (wider away from the points), never narrower than ±:data:`MIN_HALF_WIDTH`; after a restore, the restore
term's own spread (over the restores, Student's t at its degrees of freedom) is added in quadrature. Nor is it
narrower than the estimates made before earlier turns ran have been wrong: once :data:`MIN_FORWARD_ERRORS` of the
points carry the TTFT estimated for them (:attr:`~chatphase.timing.ttft_model.PrefillPoint.predicted_ms`: this chat's
turns, earlier chats' through the history database), ``t·r`` with ``r`` the root mean square of their
``ln(measured / estimated)`` (the latest :data:`FORWARD_ERRORS`, Student's t at that many degrees of freedom). Those
errors were made forward in time, so they hold what the fit's residuals cannot: a machine that got slower or busier
since its points were measured (on the AMD kind the same 849-token file took 3.7 s, then 4.3 s and 5.1 s minutes
later, every miss of the range an under-prediction; ``benchmarks/results/ttft_prediction-2026-12-07-amd.md``). The
estimate of a prediction withheld for its width counts too (:attr:`TtftPrediction.estimate_ms`, never shown): else
a few bad misses would withhold every later prediction, and no later error could narrow the range again.

The prediction is withheld (:class:`Withheld`: at most a bound, never a number that may be several times off)
when the points are too few for the parameters (``N < P + 1``; ``N = 1`` always), for a restore with fewer than
two restores measured, when the range would reach past ÷1.5 or ×1.5 (:data:`MAX_RATIO`: so that a turn outside
the 90 % range is still within ½×–2× but for about one in 200), or when the turn is *far* beyond what was
measured: more than :data:`REACH` times the largest measured ``n`` or attention context ``depth + n/2``, or
(without a fitted ``p0``) under the smallest ``n`` ÷ :data:`REACH`. Two, because for points spread over a range
the prediction's own uncertainty (its leverage) at twice the range's end is already about twice what it is
inside, and grows in proportion to the distance beyond — on terms never checked there. A withheld prediction
carries bounds from the points without a restore (prefill time does not fall with more tokens or more depth): at
least the prefill of any point with no more tokens and no more depth, at most that of any with no fewer of both
(plus the largest outside cost; none after a restore, nor when the two cross), and the roofline's least TTFT
(:class:`TtftBound`).

During a prefill, :func:`remaining_ms` corrects the prediction by the chunks already done: the time predicted for
the rest, scaled by measured ÷ predicted for the part done.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from chatphase.timing.stats import t95
from chatphase.timing.ttft_model import (
    DEFAULT_CHUNK_TOKENS,
    PrefillPoint,
    TtftModel,
    fit,
    usable_points,
)

#: how far past the measured ``n`` and ``depth + n/2`` a prediction reaches (times the largest; see the docstring).
REACH = 2.0
#: a range reaching past ``÷ MAX_RATIO`` or ``× MAX_RATIO`` is no prediction (module docstring).
MAX_RATIO = 1.5
#: the narrowest range, ± this fraction (a prefill's time varies by a few % from run to run on a quiet machine).
MIN_HALF_WIDTH = 0.05
#: the latest estimates made before their turns ran whose errors bound the range from below (module docstring).
FORWARD_ERRORS = 16
#: such estimates measured before their errors count.
MIN_FORWARD_ERRORS = 3


WithheldWhy = Literal["turns", "uneven", "tokens_above", "tokens_below", "context", "restores"]


@dataclass(frozen=True)
class Withheld:
    """Why a prediction was withheld: ``turns`` too few points (``n_points``), ``uneven`` their range reaches
    past ÷1.5–×1.5, ``tokens_above``/``tokens_below`` the turn's tokens far from the measured (``limit``: the largest
    or smallest measured), ``context`` deeper than measured (``limit``: the deepest ``depth + n``), ``restores`` a
    restore when fewer than two were measured (``n_points``: the restores), ones that disagree too much, or, with
    ``limit`` (the largest measured), one far larger and no estimate of its read."""

    why: WithheldWhy
    n_points: int
    limit: int = 0


@dataclass(frozen=True)
class TtftPrediction:
    """The one TTFT prediction of a turn: ``tokens`` evaluated at ``depth`` (restored tokens included) after
    ``restore_tokens`` read from the prefix store.

    A prediction: ``ttft_ms`` within ``low_ms``–``high_ms`` (the range), with its parts ``a_ms``, ``restore_ms``
    and ``prefill_ms``, fitted on ``source``. Withheld (``withheld`` says why): ``ttft_ms`` is ``None`` and
    ``low_ms``/``high_ms`` are bounds where known (``None``: none); ``bound_source`` names a lower bound that
    came from the roofline. ``estimate_ms``: the fit's central TTFT, also where the prediction is withheld for its
    width alone (never shown; its error counts toward later ranges: module docstring); ``None`` without a fit."""

    tokens: int
    depth: int
    restore_tokens: int
    ttft_ms: float | None
    low_ms: float | None
    high_ms: float | None
    source: str | None
    withheld: Withheld | None = None
    a_ms: float = 0.0
    restore_ms: float = 0.0
    prefill_ms: float = 0.0
    model: TtftModel | None = field(default=None, repr=False, compare=False)
    bound_source: str | None = None
    estimate_ms: float | None = None


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


def predict(
    model: TtftModel | None,
    points: Sequence[PrefillPoint],
    tokens: int,
    depth: int,
    restore_tokens: int = 0,
    restore_estimate_ms: float | None = None,
    bound: TtftBound | None = None,
    forward_half: float = 0.0,
) -> TtftPrediction:
    """The prediction for ``tokens`` at ``depth`` after ``restore_tokens`` restored (``restore_estimate_ms``: the
    engine's own estimate of that restore's read, used for a restore larger than those measured), or why not
    (module docstring). ``points``: the points ``model`` was fitted on (for the bounds); ``forward_half``: the
    least half-width (log) the errors of earlier estimates give (:attr:`TtftPredictor.forward_half`)."""
    everything = usable_points(points)
    pts = [p for p in everything if not p.restored_tokens]
    why = _why_withheld(model, len(pts), tokens, depth)
    restore, restore_half = 0.0, 0.0
    estimate = None
    if why is None and model is not None and restore_tokens > 0:
        term = model.restore
        if term is None or term.n_points < 2:
            why = Withheld("restores", term.n_points if term is not None else 0)
        elif restore_tokens <= REACH * term.max_tokens or restore_estimate_ms is not None:
            near = restore_tokens <= REACH * term.max_tokens
            restore = term.ms(restore_tokens, None if near else restore_estimate_ms)
            restore_half = t95(term.dof) * term.log_spread
        else:
            why = Withheld("restores", term.n_points, term.max_tokens)
    if why is None and model is not None:
        prefill = model.prefill_ms(tokens, depth)
        value = estimate = model.a_ms + restore + prefill
        dof = len(pts) - model.n_params
        h0 = model.leverage(tokens, depth)
        prefill_half = t95(dof) * model.log_spread * math.sqrt((1.0 + h0) / (1.0 + model.n_params / len(pts)))
        half = max(math.hypot(prefill_half, restore_half), forward_half, math.log1p(MIN_HALF_WIDTH))
        if half <= math.log(MAX_RATIO):
            low, high = value * math.exp(-half), value * math.exp(half)
            return TtftPrediction(
                tokens, depth, restore_tokens, value, low, high, model.source, None, model.a_ms, restore, prefill,
                model, estimate_ms=value,
            )  # fmt: skip
        if restore_half > max(prefill_half, forward_half) and model.restore is not None:  # the restores disagree
            why = Withheld("restores", model.restore.n_points)
        else:  # the prefills disagree with the fit, or with what was predicted for them
            why = Withheld("turns" if dof < 8 and forward_half <= prefill_half else "uneven", len(pts))
    assert why is not None
    least, most = _bounds(everything, tokens, depth, restore_tokens)
    bound_source = None
    if bound is not None and (least is None or bound.ttft_ms(tokens) > least):
        least, bound_source = bound.ttft_ms(tokens), bound.source
    return TtftPrediction(
        tokens, depth, restore_tokens, None, least, most, None, why, bound_source=bound_source, estimate_ms=estimate
    )


def _why_withheld(model: TtftModel | None, n_points: int, tokens: int, depth: int) -> Withheld | None:
    if model is None or n_points < model.n_params + 1:
        return Withheld("turns", n_points)
    if tokens > REACH * model.max_tokens:
        return Withheld("tokens_above", n_points, model.max_tokens)
    if not model.free[0] and tokens * REACH < model.min_tokens:
        return Withheld("tokens_below", n_points, model.min_tokens)
    if depth + tokens / 2.0 > REACH * model.max_context:
        return Withheld("context", n_points, model.max_reach)
    return None


def _bounds(
    pts: Sequence[PrefillPoint], tokens: int, depth: int, restore_tokens: int
) -> tuple[float | None, float | None]:
    """Least and most TTFT the points without a restore allow (module docstring), ``None`` where none does."""
    pts = [p for p in pts if not p.restored_tokens]
    if not pts:
        return None, None
    outside = [max(p.outside_ms, 0.0) for p in pts]
    below = [p.prefill_ms for p in pts if p.tokens <= tokens and p.depth <= depth]
    above = [p.prefill_ms for p in pts if p.tokens >= tokens and p.depth >= depth]
    low = max(below) + min(outside) if below else None
    high = min(above) + max(outside) if above and not restore_tokens else None  # a restore's cost: unknown here
    if low is not None and high is not None and low > high:  # noise: the points contradict each other here
        return None, None
    return low, high


def remaining_ms(prediction: TtftPrediction | None, done: int, elapsed_ms: float) -> float | None:
    """Time left (ms) to the first token of the predicted prefill with ``done`` of its tokens evaluated in
    ``elapsed_ms`` (the restore is over by then): the prediction for the rest, scaled by measured ÷ predicted
    for the part done (no scaling before a chunk is done). Never negative; ``None`` without a prediction."""
    if prediction is None or prediction.ttft_ms is None or prediction.model is None:
        return None
    whole = prediction.a_ms + prediction.prefill_ms
    if done <= 0 or elapsed_ms <= 0:
        return max(whole - max(elapsed_ms, 0.0), 0.0)
    part = prediction.model.prefill_ms(done, prediction.depth)  # the fixed cost is spent with the first chunk
    rest = prediction.prefill_ms - part
    scale = elapsed_ms / part if part > 0 else 1.0
    return max(rest * scale + prediction.a_ms, 0.0)


class TtftPredictor:
    """A chat's TTFT predictions, fitted on ``prior`` (earlier chats', bench sweeps' points) and the chat's own
    turns (:meth:`add`); ``bound`` (the roofline's least TTFT) is a bound when the prediction is withheld. The
    errors of the estimates made for the points before they ran (:meth:`add`'s ``predicted_ms``, the prior's) bound
    the range of the next from below (module docstring).

    Args:
        k: :func:`attention_ratio` of the model.
        prior: points measured before this chat (the history database, bench sweeps).
        bound: the roofline's least TTFT, or ``None``.
        chunk: prompt tokens per prefill chunk (the engine's n_batch).
    """

    def __init__(
        self,
        k: float = 0.0,
        prior: Sequence[PrefillPoint] = (),
        bound: TtftBound | None = None,
        chunk: int = DEFAULT_CHUNK_TOKENS,
    ) -> None:
        self.k = k
        self.chunk = chunk
        self._prior: list[PrefillPoint] = list(prior)
        self.bound = bound
        self.points: list[PrefillPoint] = []
        self._fitted: tuple[int, TtftModel | None, list[PrefillPoint]] | None = None
        self._version = 0
        self._last: tuple[tuple[Any, ...], TtftPrediction] | None = None

    @property
    def prior(self) -> list[PrefillPoint]:
        """The points measured before this chat (setting them refits)."""
        return self._prior

    @prior.setter
    def prior(self, points: Sequence[PrefillPoint]) -> None:
        self._prior = list(points)
        self._version += 1

    def add(
        self,
        tokens: int | None,
        depth: int | None,
        prefill_ms: float | None,
        ttft_ms: float | None,
        restored_tokens: int | None = None,
        restore_ms: float | None = None,
        predicted_ms: float | None = None,
    ) -> None:
        """Count one completed prefill of this chat (skipped when a figure is unknown or nothing was evaluated);
        ``predicted_ms``: the TTFT estimated for it before it ran (:attr:`TtftPrediction.estimate_ms`), if any."""
        if tokens and prefill_ms and ttft_ms and depth is not None:
            restored = restored_tokens or 0
            restore = (restore_ms or 0.0) if restored else 0.0
            estimate = predicted_ms if predicted_ms and predicted_ms > 0 else None
            self.points.append(
                PrefillPoint(tokens, depth, prefill_ms, ttft_ms, restored, restore, predicted_ms=estimate)
            )
            self._version += 1

    def clear(self) -> None:
        """Forget the chat's turns (a new chat, another model); the prior stays."""
        self.points.clear()
        self._version += 1

    def _fit(self) -> tuple[TtftModel | None, list[PrefillPoint]]:
        if self._fitted is None or self._fitted[0] != self._version:
            pts = usable_points([*self.points, *self._prior])  # the chat's own first: its copy is kept
            self._fitted = (self._version, fit(pts, self.k, chunk=self.chunk), pts)
        return self._fitted[1], self._fitted[2]

    @property
    def model(self) -> TtftModel | None:
        """The fit over the prior and the chat's turns (``None``: fewer than two points)."""
        return self._fit()[0]

    @property
    def forward_half(self) -> float:
        """The least half-width (log) of a range: ``t·r`` over the errors of the latest estimates made before their
        turns ran (this chat's newest first, then the prior's, each turn once), 0 under :data:`MIN_FORWARD_ERRORS`
        of them (module docstring)."""
        newest_first = usable_points([*reversed(self.points), *self._prior])
        errors = [math.log(p.ttft_ms / p.predicted_ms) for p in newest_first if p.predicted_ms][:FORWARD_ERRORS]
        if len(errors) < MIN_FORWARD_ERRORS:
            return 0.0
        return t95(len(errors)) * math.sqrt(sum(e * e for e in errors) / len(errors))

    @property
    def n_points(self) -> int:
        """The usable points, the chat's and the prior's."""
        return len(self._fit()[1])

    def predict(
        self, tokens: int, depth: int, restore_tokens: int = 0, restore_estimate_ms: float | None = None
    ) -> TtftPrediction:
        """:func:`predict` on the current fit; the same object again for the same question on the same fit."""
        key = (self._version, tokens, depth, restore_tokens, restore_estimate_ms, self.bound)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        model, pts = self._fit()
        prediction = predict(
            model, pts, tokens, depth, restore_tokens, restore_estimate_ms, self.bound, self.forward_half
        )
        self._last = (key, prediction)
        return prediction
