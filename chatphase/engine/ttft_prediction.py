"""TTFT predicted before a turn is sent, from this machine's measured prefills. Pure Python, no model, no
import from chatphase (so that it can move to a bottom layer as it is).

The model, for ``n`` tokens evaluated on top of ``depth`` tokens already in the KV cache::

    ttft_ms = a + restore + p0 + b·n + c·Σ_chunks (start + u/2)

``a`` (ms) is the turn's cost outside the prefill and the restore (templating, tokenising, the first sample);
``p0`` (ms) a prefill's fixed cost (each call's graph, the threads' wake-up); ``b`` (ms per token) each
evaluated token's cost through the weights; the last term the attention's: the ``n`` tokens go to llama.cpp in
chunks of n_batch (``u`` tokens each, the first at ``depth``), and each chunk's call attends over the KV context
it sits on, ``start + u/2`` on average (:func:`chunk_context`), ``c`` ms per token of it. Per chunk, not per token ×
context (the attention's FLOPs): on the Intel kind a 17-token prompt at depth 1,500 spent ten times in attention
what its FLOPs priced from long prefills, and this shape's leave-one-out median error over 54 prefills was 3.3 %
against 37 % (docs/metrics.md). ``restore`` is what restoring a
saved prefix from the prefix store adds to the TTFT (:class:`RestoreTerm`): its read, ``r1·tokens``, and a fixed
part ``r0``, what it adds beyond its own measured time — the first prefill after a restore is slower than its
tokens explain (a 32-token prefill after a restore took 349 ms where the same at that depth took 13 ms, synthetic
tiny Llama, 2 Xeon vCPUs); 0 when nothing is restored.

The fit (:func:`fit`) takes every completed prefill of this model on this machine (:class:`PrefillPoint`: the
chat's turns, cancelled ones whose prefill finished included, earlier chats', bench sweeps' samples). Of the
points without a restore, ``a`` is the median of ``ttft − prefill``, and ``p0, b, c`` are weighted least squares
of the *prefill* time on
``[1, n, Σ_chunks (start + u/2)]``, each point weighted by ``1/prefill²`` so that the fit minimises relative error
(a 20-token turn counts as much as a 2,000-token one). ``p0`` is a free parameter only when the points span
sizes (the largest ``n`` at least :data:`SPAN` times the smallest), ``c`` only when they span attention
contexts (``depth + n/2``, the same ratio); otherwise ``p0 = 0`` and the attention is tied to the weights, ``c = k·b`` per token × context, with ``k`` the attention's
FLOPs per context token over the weights' per token (:func:`attention_ratio`, the model's shape). Of the
candidate sets of free parameters the points allow (at least one point more than parameters, every
coefficient ≥ 0), the one whose leave-one-out errors are smallest is kept. The points that restored fit the
restore's term on what their TTFT holds beyond ``a`` and the prefill the model predicts: ``r0 + r1·tokens`` by
relative least squares when three or more span sizes (2.5×), else ``r1`` from their measured restore times (through
the origin) and ``r0`` the median of the rest.

The range: each point's leave-one-out prediction (the fit without it: for least squares, the residual over
``1 − h``, ``h`` the point's leverage) gives a log-ratio ``ln(measured / predicted)``; their root mean square
``s`` is the fit's spread, and a new prediction's range is ``× e^(±t·s·√((1 + h₀)/(1 + P/N)))`` with ``t``
Student's 95 % quantile at ``N − P`` degrees of freedom (a 90 % two-sided interval) and ``h₀`` the leverage of the
new turn (wider away from the points), never narrower than ±:data:`MIN_HALF_WIDTH`; after a restore, the restore
term's own spread (over the restores, Student's t at its degrees of freedom) is added in quadrature.

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
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

#: the largest ``n`` (or ``depth + n/2``) must be this many times the smallest for ``p0`` (or ``c``) to be fitted.
SPAN = 2.5
#: prompt tokens per prefill chunk (``llama_decode`` call) where the caller does not say: the engine's default n_batch.
DEFAULT_CHUNK_TOKENS = 256
#: how far past the measured ``n`` and ``depth + n/2`` a prediction reaches (times the largest; see the docstring).
REACH = 2.0
#: a range reaching past ``÷ MAX_RATIO`` or ``× MAX_RATIO`` is no prediction (module docstring).
MAX_RATIO = 1.5
#: the narrowest range, ± this fraction (a prefill's time varies by a few % from run to run on a quiet machine).
MIN_HALF_WIDTH = 0.05
#: a leave-one-out prediction off by more than this factor counts as this factor (a point alone fixing a term).
_LOO_CAP = math.log(100.0)
#: Student's t, one-sided 95 %, by degrees of freedom (the largest tabulated ≤ the dof is used: conservative).
_T95 = (
    (1, 6.314), (2, 2.920), (3, 2.353), (4, 2.132), (5, 2.015), (6, 1.943), (7, 1.895), (8, 1.860), (9, 1.833),
    (10, 1.812), (12, 1.782), (15, 1.753), (20, 1.725), (30, 1.697), (60, 1.671), (120, 1.658),
)  # fmt: skip
_Z95 = 1.645


@dataclass(frozen=True)
class PrefillPoint:
    """One completed prefill: ``tokens`` evaluated on top of ``depth`` cached tokens (restored ones included)
    in ``prefill_ms``; the turn's ``ttft_ms``; ``restored_tokens`` of the depth read from the prefix store in
    ``restore_ms`` (inside ``ttft_ms``); ``origin`` where it was measured (``this chat``, ``earlier chats``,
    ``bench results NAME.json``)."""

    tokens: int
    depth: int
    prefill_ms: float
    ttft_ms: float
    restored_tokens: int = 0
    restore_ms: float = 0.0
    origin: str = "this chat"

    @property
    def outside_ms(self) -> float:
        """``ttft − prefill − restore``: the turn's time outside the prefill and the restore."""
        return self.ttft_ms - self.prefill_ms - self.restore_ms

    @property
    def context(self) -> float:
        """``depth + tokens/2``: the mean attention context of the evaluated tokens."""
        return self.depth + self.tokens / 2.0

    def usable(self) -> bool:
        """Whether the figures can be a prefill's: tokens evaluated, a positive prefill inside the TTFT."""
        return self.tokens > 0 and self.depth >= 0 and self.prefill_ms > 0 and self.outside_ms >= -0.5


def attention_ratio(attention_flops_per_context_token: int, n_params: int | None) -> float:
    """``k``: attention FLOPs per context token ÷ the weights' FLOPs per token (``2 × n_params``); 0 when
    either is unknown (``c`` is then 0 unless fitted)."""
    if not n_params or attention_flops_per_context_token <= 0:
        return 0.0
    return attention_flops_per_context_token / (2.0 * n_params)


@dataclass(frozen=True)
class RestoreTerm:
    """What a restore adds to the TTFT: ``once_ms + ms_per_token · tokens`` (module docstring), fitted on
    ``n_points`` restores of up to ``max_tokens``; ``log_spread`` the rms of their ``ln(measured / predicted)``
    TTFT over ``dof`` degrees of freedom (infinite with none)."""

    once_ms: float
    ms_per_token: float
    max_tokens: int
    n_points: int
    log_spread: float
    dof: int

    def ms(self, tokens: int, read_ms: float | None = None) -> float:
        """The restore's predicted cost for ``tokens``; ``read_ms`` (the engine's estimate of the read) stands for
        the fitted read where given."""
        return self.once_ms + (self.ms_per_token * tokens if read_ms is None else read_ms)


#: the prefill's parameters that may be free: the fixed cost and the attention's cost (``b`` always is).
Free = tuple[bool, bool]


@dataclass(frozen=True)
class TtftModel:
    """The fitted model (module docstring): ``ttft_ms = a_ms + restore + p0_ms + b·n + c·Σ chunk context`` (:func:`chunk_context`; ``c = k·b`` per token × context when tied).

    ``free``: whether ``p0`` and ``c`` were fitted (else ``p0 = 0``, ``c = k·b``); ``n_points`` the points the prefill
    was fitted on (those without a restore), ``source`` where all the points came from (``this chat, 3 turns``);
    ``log_spread`` the leave-one-out spread ``s``; ``max_tokens``, ``min_tokens``, ``max_context`` (``depth + n/2``)
    and ``max_reach`` (``depth + n``) the measured range; ``restore`` the restore's term (``None``: no restore
    measured)."""

    a_ms: float
    p0_ms: float
    b_ms_per_token: float
    c_ms_per_token2: float
    k: float
    free: Free
    n_points: int
    source: str
    log_spread: float
    min_tokens: int
    max_tokens: int
    max_context: float
    max_reach: int
    restore: RestoreTerm | None = None
    #: the inverse of the weighted normal matrix over the free columns (scaled), for a new turn's leverage
    inverse: tuple[tuple[float, ...], ...] = field(default=(), repr=False)
    scales: tuple[float, ...] = field(default=(), repr=False)
    #: prompt tokens per prefill chunk (the attention term's unit: :func:`chunk_context`)
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS

    @property
    def n_params(self) -> int:
        """The prefill's free parameters: ``b``, and ``p0`` and ``c`` where fitted."""
        return 1 + sum(self.free)

    def prefill_ms(self, n: float, depth: float) -> float:
        """Predicted prefill time (ms) of ``n`` tokens evaluated at ``depth``."""
        return _prefill(self.p0_ms, self.b_ms_per_token, self.c_ms_per_token2, self.free, self.k, self.chunk_tokens,
                        n, depth)  # fmt: skip

    def ttft_ms(self, n: int, depth: int, restore_ms: float = 0.0) -> float:
        """Predicted TTFT (ms) of ``n`` tokens evaluated at ``depth`` after a restore of ``restore_ms``."""
        return self.a_ms + restore_ms + self.prefill_ms(n, depth)

    def leverage(self, n: int, depth: int) -> float:
        """``h₀``: the new turn's leverage on the weighted fit (0 at the points' centre, growing beyond them)."""
        y = self.prefill_ms(n, depth)
        if y <= 0 or not self.inverse:
            return 0.0
        u = [v / s / y for v, s in zip(_row(n, depth, self.free, self.k, self.chunk_tokens), self.scales, strict=True)]
        return max(_quad(self.inverse, u), 0.0)


def chunk_context(n: float, depth: float, chunk: int) -> float:
    """``Σ (start + u/2)`` over the chunks of ``chunk`` tokens that evaluate ``n`` tokens on top of ``depth``:
    the KV context each ``llama_decode`` call attends over, summed (tokens)."""
    total, done = 0.0, 0.0
    while done < n:
        u = min(float(chunk), n - done)
        total += depth + done + u / 2.0
        done += u
    return total


def _row(n: float, depth: float, free: Free, k: float, chunk: int) -> list[float]:
    """The design row of a prefill over the free columns: ``[1?, n (·(1 + k·ctx) when c is tied), chunk context?]``."""
    ctx = depth + n / 2.0
    once, attention = free
    return [1.0] * once + [n if attention else n * (1.0 + k * ctx)] + [chunk_context(n, depth, chunk)] * attention


def _quad(m: Sequence[Sequence[float]], u: Sequence[float]) -> float:
    return sum(u[i] * m[i][j] * u[j] for i in range(len(u)) for j in range(len(u)))


def _inverse(m: list[list[float]]) -> list[list[float]] | None:
    """The inverse of a small symmetric matrix (Gauss-Jordan, partial pivoting); ``None`` when singular. Not
    numpy's: the chat's UI process does not load numpy, and its import would cost start-up more than a 3×3 solve."""
    size = len(m)
    a = [row[:] + [1.0 if i == j else 0.0 for j in range(size)] for i, row in enumerate(m)]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        lead = a[col][col]
        a[col] = [v / lead for v in a[col]]
        for r in range(size):
            if r != col and a[r][col] != 0.0:
                f = a[r][col]
                a[r] = [v - f * w for v, w in zip(a[r], a[col], strict=True)]
    return [row[size:] for row in a]


@dataclass(frozen=True)
class _Line:
    """A weighted least-squares fit: coefficients (in the design's units), the scaled inverse, leverages."""

    coef: list[float]
    inverse: list[list[float]]
    scales: list[float]
    leverages: list[float]
    relative_residuals: list[float]


def _relative_fit(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> _Line | None:
    """Minimise ``Σ ((row·θ − y)/y)²``; ``None`` when the columns are not independent."""
    width = len(rows[0])
    scales = [max(abs(r[j]) for r in rows) or 1.0 for j in range(width)]
    us = [[r[j] / scales[j] / y for j in range(width)] for r, y in zip(rows, ys, strict=True)]
    normal = [[sum(u[i] * u[j] for u in us) for j in range(width)] for i in range(width)]
    inv = _inverse(normal)
    if inv is None:
        return None
    rhs = [sum(u[i] for u in us) for i in range(width)]
    theta = [sum(inv[i][j] * rhs[j] for j in range(width)) for i in range(width)]
    coef = [t / s for t, s in zip(theta, scales, strict=True)]
    leverages = [_quad(inv, u) for u in us]
    residuals = [1.0 - sum(t * v for t, v in zip(theta, u, strict=True)) for u in us]
    return _Line(coef, inv, scales, leverages, residuals)


def t95(dof: int) -> float:
    """Student's t one-sided 95 % quantile at ``dof`` degrees of freedom (the table's row at or under ``dof``:
    conservative between rows; the normal's 1.645 from 1,000 on); infinite under 1."""
    if dof < 1:
        return math.inf
    if dof >= 1000:
        return _Z95
    return next(t for d, t in reversed(_T95) if dof >= d)


#: a prefill's predicted time (ms) by ``(n, depth)``.
_Prefill = Callable[[float, float], float]


def _fit_restore(restores: Sequence[PrefillPoint], a: float, prefill: _Prefill) -> RestoreTerm | None:
    """The restore's term from the points that restored (module docstring); ``None`` without one."""
    if not restores:
        return None
    sizes = [float(p.restored_tokens) for p in restores]
    added = [p.ttft_ms - a - prefill(p.tokens, p.depth) for p in restores]  # all the TTFT the restore added
    n, once, per_token, params = len(restores), 0.0, 0.0, 1
    line = None
    if n >= 3 and max(sizes) >= SPAN * min(sizes) and min(added) > 0:
        line = _relative_fit([[1.0, t] for t in sizes], added)
    if line is not None and line.coef[0] >= 0 and line.coef[1] >= 0:
        once, per_token, params = line.coef[0], line.coef[1], 2
    else:  # the read by its own measured time, the rest a fixed part
        reads = _relative_fit([[t] for t in sizes], [max(p.restore_ms, 1e-6) for p in restores])
        per_token = reads.coef[0] if reads is not None and reads.coef[0] > 0 else 0.0
        once = max(statistics.median(y - per_token * t for y, t in zip(added, sizes, strict=True)), 0.0)
    spread = math.inf
    if n > params:
        errs = [math.log(p.ttft_ms / max(a + once + per_token * t + prefill(p.tokens, p.depth), 1e-6))
                for p, t in zip(restores, sizes, strict=True)]  # fmt: skip
        spread = math.sqrt(sum(e * e for e in errs) / (n - params))
    return RestoreTerm(once, per_token, max(p.restored_tokens for p in restores), n, spread, n - params)


def source_of(points: Sequence[PrefillPoint]) -> str:
    """``this chat, 3 turns``; ``this chat + earlier chats, 45 turns``; ``bench results x.json, 12 prefills``."""
    origins = list(dict.fromkeys(p.origin for p in points))
    noun = "turn" if all(not o.startswith("bench") for o in origins) else "prefill"
    n = len(points)
    return f"{' + '.join(origins)}, {n} {noun}{'' if n == 1 else 's'}"


def usable_points(points: Iterable[PrefillPoint]) -> list[PrefillPoint]:
    """The points that can be fitted, each measurement once (the same turn read from two sources counts once)."""
    seen: set[tuple[int, int, float, float]] = set()
    out = []
    for p in points:
        key = (p.tokens, p.depth, round(p.prefill_ms, 3), round(p.ttft_ms, 3))
        if p.usable() and key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _candidates(pts: Sequence[PrefillPoint]) -> list[Free]:
    sizes = [p.tokens for p in pts]
    contexts = [p.context for p in pts]
    spans_n = max(sizes) >= SPAN * min(sizes)
    spans_ctx = max(contexts) >= SPAN * min(contexts)
    wanted = [(True, True), (True, False), (False, True), (False, False)]
    return [f for f in wanted if (spans_n or not f[0]) and (spans_ctx or not f[1]) and len(pts) >= 2 + sum(f)]


def _prefill(p0: float, b: float, c: float, free: Free, k: float, chunk: int, n: float, depth: float) -> float:
    """A prefill's time (ms) under the fitted terms: with ``c`` free, ``c`` ms per token of :func:`chunk_context`;
    tied, ``c = k·b`` per token × context (the attention's FLOPs)."""
    if free[1]:
        return p0 + b * n + c * chunk_context(n, depth, chunk)
    return p0 + b * n + c * n * (depth + n / 2.0)


def fit(
    points: Iterable[PrefillPoint], k: float, source: str | None = None, chunk: int = DEFAULT_CHUNK_TOKENS
) -> TtftModel | None:
    """The model fitted to ``points`` (module docstring); ``k`` the shape's attention ratio (:func:`attention_ratio`);
    ``source`` names the points (default :func:`source_of`). ``None`` with fewer than two usable points without a
    restore, or when no set of parameters fits them with every coefficient ≥ 0."""
    everything = usable_points(points)
    pts = [p for p in everything if not p.restored_tokens]  # a restore slows the prefill after it: its own term
    if len(pts) < 2:
        return None
    a = statistics.median(max(p.outside_ms, 0.0) for p in pts)
    ys = [p.prefill_ms for p in pts]
    best: tuple[float, Free, _Line] | None = None
    for free in _candidates(pts):
        line = _relative_fit([_row(p.tokens, p.depth, free, k, chunk) for p in pts], ys)
        if line is None or any(c < 0 for c in line.coef) or line.coef[1 if free[0] else 0] <= 0:
            continue
        spread = _loo_spread(pts, line, a)
        if best is None or spread < best[0] - 1e-12:
            best = (spread, free, line)
    if best is None:
        return None
    spread, free, line = best
    coef = list(line.coef)
    p0 = coef.pop(0) if free[0] else 0.0
    b = coef.pop(0)
    c = coef.pop(0) if free[1] else b * k

    def prefill(n: float, depth: float) -> float:
        return _prefill(p0, b, c, free, k, chunk, n, depth)

    restore = _fit_restore([p for p in everything if p.restored_tokens], a, prefill)
    return TtftModel(
        a, p0, b, c, k, free, len(pts), source or source_of(everything), spread,
        min(p.tokens for p in pts), max(p.tokens for p in pts), max(p.context for p in pts),
        max(p.depth + p.tokens for p in pts), restore,
        tuple(tuple(r) for r in line.inverse), tuple(line.scales), chunk,
    )  # fmt: skip


def _loo_spread(pts: Sequence[PrefillPoint], line: _Line, a: float) -> float:
    """Root mean square of the points' leave-one-out ``ln(measured TTFT / predicted TTFT)``."""
    total = 0.0
    for p, h, r in zip(pts, line.leverages, line.relative_residuals, strict=True):
        if h >= 1.0 - 1e-9:
            total += _LOO_CAP**2
            continue
        prefill = p.prefill_ms * (1.0 - r / (1.0 - h))  # the fit without this point, at this point
        predicted = a + prefill
        err = _LOO_CAP if predicted <= 0 else min(abs(math.log(p.ttft_ms / predicted)), _LOO_CAP)
        total += err * err
    return math.sqrt(total / len(pts))


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
    came from the roofline."""

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
) -> TtftPrediction:
    """The prediction for ``tokens`` at ``depth`` after ``restore_tokens`` restored (``restore_estimate_ms``: the
    engine's own estimate of that restore's read, used for a restore larger than those measured), or why not
    (module docstring). ``points``: the points ``model`` was fitted on (for the bounds)."""
    everything = usable_points(points)
    pts = [p for p in everything if not p.restored_tokens]
    why = _why_withheld(model, len(pts), tokens, depth)
    restore, restore_half = 0.0, 0.0
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
        value = model.a_ms + restore + prefill
        dof = len(pts) - model.n_params
        h0 = model.leverage(tokens, depth)
        prefill_half = t95(dof) * model.log_spread * math.sqrt((1.0 + h0) / (1.0 + model.n_params / len(pts)))
        half = max(math.hypot(prefill_half, restore_half), math.log1p(MIN_HALF_WIDTH))
        if half <= math.log(MAX_RATIO):
            low, high = value * math.exp(-half), value * math.exp(half)
            return TtftPrediction(
                tokens, depth, restore_tokens, value, low, high, model.source, None, model.a_ms, restore, prefill,
                model,
            )  # fmt: skip
        if restore_half > prefill_half and model.restore is not None:  # the restores are what disagree
            why = Withheld("restores", model.restore.n_points)
        else:
            why = Withheld("turns" if dof < 8 else "uneven", len(pts))
    assert why is not None
    least, most = _bounds(everything, tokens, depth, restore_tokens)
    bound_source = None
    if bound is not None and (least is None or bound.ttft_ms(tokens) > least):
        least, bound_source = bound.ttft_ms(tokens), bound.source
    return TtftPrediction(tokens, depth, restore_tokens, None, least, most, None, why, bound_source=bound_source)


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
    turns (:meth:`add`); ``bound`` (the roofline's least TTFT) is a bound when the prediction is withheld.

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
    ) -> None:
        """Count one completed prefill of this chat (skipped when a figure is unknown or nothing was evaluated)."""
        if tokens and prefill_ms and ttft_ms and depth is not None:
            restored = restored_tokens or 0
            self.points.append(
                PrefillPoint(tokens, depth, prefill_ms, ttft_ms, restored, (restore_ms or 0.0) if restored else 0.0)
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
        prediction = predict(model, pts, tokens, depth, restore_tokens, restore_estimate_ms, self.bound)
        self._last = (key, prediction)
        return prediction


def points_from_sweep(samples: Iterable[dict[str, Any]], origin: str) -> list[PrefillPoint]:
    """The points of a bench sweep's JSON ``samples`` (``prompt_tokens``, ``depth``, ``ttft_ms``,
    ``prefill_tokens_per_s``, ``warmup``; ``prefill_tokens`` and ``cached_tokens`` where the engine reported
    them); warm-ups and samples without a TTFT or a prefill rate are left out."""
    points = []
    for s in samples:
        if s.get("warmup") or not s.get("ttft_ms") or not s.get("prefill_tokens_per_s"):
            continue
        tokens = s.get("prefill_tokens") or s.get("prompt_tokens")
        depth = s.get("cached_tokens") if s.get("cached_tokens") is not None else s.get("depth", 0)
        if tokens:
            prefill_ms = 1000.0 * tokens / s["prefill_tokens_per_s"]
            points.append(PrefillPoint(int(tokens), int(depth or 0), prefill_ms, float(s["ttft_ms"]), origin=origin))
    return points
