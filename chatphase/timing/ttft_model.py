"""The TTFT model: a prefill's time fitted from this machine's measured prefills (:func:`fit`). Pure Python, no
model, no numpy (the chat's UI process does not load it); what is shown from it (the range, the bounds, a
withheld prediction) is :mod:`chatphase.timing.ttft_prediction`.

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

The fit's spread: each point's leave-one-out prediction (the fit without it: for least squares, the residual over
``1 − h``, ``h`` the point's leverage) gives a log-ratio ``ln(measured / predicted)``; their root mean square
``s`` is the fit's spread (:attr:`TtftModel.log_spread`), and a new turn's leverage ``h₀``
(:meth:`TtftModel.leverage`) says how far it lies from the points. The restore's term has its own spread, over the
restores.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

#: the largest ``n`` (or ``depth + n/2``) must be this many times the smallest for ``p0`` (or ``c``) to be fitted.
SPAN = 2.5
#: prompt tokens per prefill chunk (``llama_decode`` call) where the caller does not say: the engine's default n_batch.
DEFAULT_CHUNK_TOKENS = 256
#: a leave-one-out prediction off by more than this factor counts as this factor (a point alone fixing a term).
_LOO_CAP = math.log(100.0)


@dataclass(frozen=True)
class PrefillPoint:
    """One completed prefill: ``tokens`` evaluated on top of ``depth`` cached tokens (restored ones included)
    in ``prefill_ms``; the turn's ``ttft_ms``; ``restored_tokens`` of the depth read from the prefix store in
    ``restore_ms`` (inside ``ttft_ms``); ``origin`` where it was measured (``this chat``, ``earlier chats``,
    ``bench results NAME.json``); ``predicted_ms`` the TTFT the fit estimated for it before it ran (``None``: none;
    not part of the fit, its error bounds later ranges: :mod:`chatphase.timing.ttft_prediction`)."""

    tokens: int
    depth: int
    prefill_ms: float
    ttft_ms: float
    restored_tokens: int = 0
    restore_ms: float = 0.0
    origin: str = "this chat"
    predicted_ms: float | None = None

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
