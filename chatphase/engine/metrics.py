"""Per-turn phase metrics and their exact formulas (``docs/metrics.md``).

Everything here is pure: it takes timestamps and counts and returns numbers, so the formulas are
unit-tested with scripted timestamps. All timestamps are integers in nanoseconds on one monotonic clock
(`time.perf_counter_ns()`, which on Linux and macOS is the system-wide monotonic clock).

Definitions (shared by every engine, the dashboard, `ask --json` and `bench`):

- ``ttft_ms = t_first - t_submit``: templating + tokenisation + prefill + first sample.
- ``prefill_tokens_per_s = prefill_tokens / prefill_s``, with ``prefill_s`` the synchronised evaluation
  time of the tokens actually evaluated this turn (cached tokens excluded).
- ``decode_ms = t_last - t_first`` and ``decode_tokens_per_s = (decode_tokens - 1) / decode_s``: the
  TPOT definition of vLLM's serving benchmark and MLPerf Inference (the first token belongs to TTFT).
  Undefined (``None``) for fewer than 2 tokens.
- ``tpot_ms = decode_ms / (decode_tokens - 1)``, the mean time per output token after the first.
- ITL (inter-token latency) gaps ``t_i - t_{i-1}``; percentiles use linear interpolation between closest
  ranks (NumPy's default ``method="linear"``, as vLLM's benchmark reports them; computed with the standard
  library's ``statistics.quantiles(method="inclusive")``, the same method, so that neither the UI nor the
  engine process needs NumPy for it).
- ``kv_cache_bytes = kv_cache_tokens * kv_bytes_per_token``.
- Thinking (reasoning models; ``None`` when the reply had no thinking block): ``thinking_tokens`` are the
  generated tokens of the block (its markers included), ``thinking_ms = t_thinking_end - t_first``;
  ``answer_tokens = decode_tokens - thinking_tokens``; ``ttfa_ms = t_first_answer - t_submit`` (time to the
  first answer token; TTFT stays the first generated token); ``answer_tokens_per_s`` as decode's rate over
  the answer's tokens. A reply that ends inside the block is ``thinking_cut_short``.
- Speculative decoding (``spec_*``; ``None`` for plain decode, :func:`spec_figures`): a *step* is one
  evaluation of the target model during decode (one token, or the last sampled token and ``k`` drafted
  ones), lasting from the previous step's last token (the first token for the first step) to its own;
  steps partition ``decode_ms``. ``spec_acceptance = spec_accepted / spec_drafted``;
  ``spec_accepted_per_step`` the mean accepted draft tokens per drafted step; ``spec_tokens_per_step`` the
  generated tokens (after the first) per step; ``spec_verify_step_ms`` / ``spec_plain_step_ms`` the mean
  duration of drafted / undrafted steps; ``spec_speedup`` this turn's rate against its own plain steps at the
  same decode thread count (:class:`SpeedupTally`: per count, ``plain step ms × tokens / Σ step durations``
  over the counts that have a plain step), ``spec_plain_threads`` that count (the one with the most steps
  compared) and ``spec_plain_step_ms`` the mean plain step at it; ``spec_note`` one plain line when drafting
  did not pay (or ``auto`` stopped drafting). ``step_ms_p50`` / ``step_ms_p95`` as ITL's percentiles,
  over step durations (ITL stays per token, so several tokens of one step show gaps near zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from itertools import pairwise
from statistics import quantiles
from typing import Any, Literal

StopReason = Literal["stop", "length", "cancelled", "context_full", "error"]
STOP_REASONS: tuple[str, ...] = ("stop", "length", "cancelled", "context_full", "error")

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class TurnMetrics:
    """The measured phases of one chat turn (units in the field names; ``None`` = undefined).

    Counts are tokens; times are milliseconds; rates are tokens per second; sizes are bytes.
    ``prefill_tokens + cached_tokens == prompt_tokens`` holds for every prefill that ran to its end (one
    cancelled between chunks counts only the tokens it evaluated). The local engine fills every
    field it can define; a remote server (:mod:`chatphase.engine.remote.engine`) may leave counts, prefill and
    KV figures unknown, and unknown is ``None`` — never a guessed zero. ``decode_tokens_source`` says
    who counted a remote reply's tokens: ``usage`` (the server's usage), ``timings`` (llama-server's
    ``predicted_n``), ``tokenizer`` (the server's tokenizer over the reply text,
    :mod:`chatphase.engine.remote.tokens`); ``None`` for the local engine, which counts what it sampled.

    Threads (the local engine's thread policy, :mod:`chatphase.engine.threads.policy`): ``n_threads_prefill``
    the prompt's threads, ``n_threads_decode`` decode's at the end of the turn, ``decode_thread_changes``
    how often decode's changed mid-turn, ``threads_reason`` why, in words.

    Speculative decoding: the ``spec_*`` and ``step_ms_*`` fields (the module docstring); ``spec_mode`` is
    ``lookup``, ``auto`` or ``draft``, ``None`` for plain decode.

    ``ttft_predicted_ms``: the turn's one TTFT prediction (:mod:`chatphase.timing.ttft_prediction`; made when the
    message was counted, else when the prefill began), ``ttft_predicted_low_ms`` / ``ttft_predicted_high_ms`` its
    range, ``ttft_prediction_source`` from what (``this chat, 3 turns``, ``bench results FILE, 12 prefills``); a
    prediction withheld has ``ttft_predicted_ms = None``, its bounds (if any) as low / high and
    ``ttft_prediction_note`` why (``not enough turns yet (1)``); ``ttft_estimate_ms`` the fit's central TTFT for the
    turn, also where the prediction was withheld for its width alone (never shown; its error bounds later ranges);
    set by the chat.

    Overflow (:mod:`chatphase.engine.overflow`): ``overflow`` the policy that acted this turn (``drop-oldest``,
    ``shift``; ``None``: none did), ``overflow_dropped_messages`` / ``overflow_dropped_tokens`` what it left
    out, ``overflow_reprefill_tokens`` the kept history evaluated again (0 for a shift) and
    ``overflow_reprefill_ms`` its share of ``prefill_ms``; ``cache_miss_reason`` why the turn kept fewer of the
    KV cache's tokens than it held (``None``: no miss).

    Prefix restore: ``restored_tokens`` of the ``cached_tokens`` were restored from disk (a saved KV state)
    rather than kept in memory, in ``restore_ms`` (inside TTFT, before the prefill), reading ``restore_bytes``;
    ``None`` when nothing was restored.

    Exactness (:mod:`chatphase.engine.exactness`): ``logits_exact`` whether a cold run of the same prompt at the
    same settings computes this turn's logits bit for bit (``True``), or they can differ, so a greedy reply can
    part at a near-tie (``False``); ``logits_exact_reason`` why, one of :data:`chatphase.engine.exactness.REASONS`.
    ``None``: unknown (a remote server) or nothing generated.

    RPC devices (llama.cpp's RPC backend, ``--rpc``): ``remote_wait_prefill_ms`` / ``remote_wait_decode_ms`` the
    time the evaluating thread was blocked in the prefill (to the first token) and the decode (first token to
    last): waiting on the remote devices, the network's share of the phase, measured by the kernel's per-thread
    counters (:mod:`chatphase.engine.local.thread_clock`); ``None`` without RPC devices or where not measurable.
    """

    prompt_tokens: int | None
    cached_tokens: int | None
    prefill_tokens: int | None
    prefill_ms: float | None
    prefill_tokens_per_s: float | None
    ttft_ms: float | None
    decode_tokens: int | None
    decode_ms: float | None
    decode_tokens_per_s: float | None
    itl_ms_p50: float | None
    itl_ms_p95: float | None
    itl_ms_max: float | None
    kv_cache_tokens: int | None
    kv_bytes_per_token: int | None
    kv_cache_bytes: int | None
    kv_capacity_bytes: int | None
    stop_reason: StopReason
    tokenize_ms: float | None = 0.0
    tpot_ms: float | None = None
    dropped_messages: int = 0
    thinking_tokens: int | None = None
    thinking_ms: float | None = None
    thinking_cut_short: bool = False
    answer_tokens: int | None = None
    ttfa_ms: float | None = None
    answer_tokens_per_s: float | None = None
    decode_tokens_source: str | None = None
    n_threads_prefill: int | None = None
    n_threads_decode: int | None = None
    decode_thread_changes: int | None = None
    threads_reason: str | None = None
    spec_mode: str | None = None
    spec_drafted: int | None = None
    spec_accepted: int | None = None
    spec_acceptance: float | None = None
    spec_accepted_per_step: float | None = None
    spec_steps: int | None = None
    spec_tokens_per_step: float | None = None
    spec_verify_step_ms: float | None = None
    spec_plain_step_ms: float | None = None
    spec_speedup: float | None = None
    spec_plain_threads: int | None = None
    spec_note: str | None = None
    step_ms_p50: float | None = None
    step_ms_p95: float | None = None
    restored_tokens: int | None = None
    restore_ms: float | None = None
    restore_bytes: int | None = None
    ttft_predicted_ms: float | None = None
    ttft_prediction_source: str | None = None
    overflow: str | None = None
    overflow_dropped_messages: int = 0
    overflow_dropped_tokens: int | None = None
    overflow_reprefill_tokens: int | None = None
    overflow_reprefill_ms: float | None = None
    cache_miss_reason: str | None = None
    ttft_predicted_low_ms: float | None = None
    ttft_predicted_high_ms: float | None = None
    ttft_prediction_note: str | None = None
    ttft_estimate_ms: float | None = None
    logits_exact: bool | None = None
    logits_exact_reason: str | None = None
    remote_wait_prefill_ms: float | None = None
    remote_wait_decode_ms: float | None = None

    @property
    def thought(self) -> bool:
        """Whether the reply had a thinking block (its token count may still be unknown: a remote server
        that does not report it)."""
        return self.thinking_ms is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field, in declaration order."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TurnMetrics:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (forward compatible)."""
        if cls is not TurnMetrics:
            names = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in names})
        known = data if _FIELD_NAMES.issuperset(data) else {k: v for k, v in data.items() if k in _FIELD_NAMES}
        if not _REQUIRED.issubset(known):
            return cls(**known)  # the TypeError that names what is missing
        # the frozen __init__ sets its 60-odd fields one object.__setattr__ at a time: building the __dict__ at
        # once costs a fraction, and a history catch-up reads 100,000 of them (same fields, same values)
        m = object.__new__(cls)
        m.__dict__.update(_DEFAULTS)
        m.__dict__.update({name: make() for name, make in _FACTORIES.items() if name not in known})
        m.__dict__.update(known)
        return m


#: computed once: reading a history of 100,000 turns asks for them 100,000 times
_FIELD_NAMES = frozenset(f.name for f in fields(TurnMetrics))
_REQUIRED = frozenset(f.name for f in fields(TurnMetrics) if f.default is MISSING)
_DEFAULTS = {f.name: f.default for f in fields(TurnMetrics) if f.default is not MISSING}
_FACTORIES = {f.name: f.default_factory for f in fields(TurnMetrics) if f.default_factory is not MISSING}


def ns_to_ms(ns: int) -> float:
    """Nanoseconds -> milliseconds (float)."""
    return ns / NS_PER_MS


def rate_per_s(count: int, duration_ns: int) -> float | None:
    """``count / seconds``; ``None`` when the duration is not positive or the count is zero."""
    if duration_ns <= 0 or count <= 0:
        return None
    return count * NS_PER_S / duration_ns


def decode_rates(decode_tokens: int | None, decode_ns: int) -> tuple[float | None, float | None]:
    """``(decode_tokens_per_s, tpot_ms)`` from the generated-token count and ``t_last - t_first`` in ns.

    TPOT definition of vLLM's serving benchmark and MLPerf: the first token belongs to TTFT, so the
    rate is ``(decode_tokens - 1) / decode_s`` and ``tpot_ms = decode_ms / (decode_tokens - 1)``. Both are
    ``None`` for an unknown count, fewer than 2 tokens, or a zero duration.
    """
    if decode_tokens is None or decode_tokens < 2 or decode_ns <= 0:
        return None, None
    return rate_per_s(decode_tokens - 1, decode_ns), ns_to_ms(decode_ns) / (decode_tokens - 1)


def itl_stats_ms(token_times_ns: Sequence[int]) -> tuple[float | None, float | None, float | None]:
    """Inter-token latency p50, p95 and max in ms from the sampling times of the generated tokens.

    ``token_times_ns`` is ``[t_first, t_2, ..., t_last]``. Gaps are ``t_i - t_{i-1}``; percentiles use
    linear interpolation between closest ranks (NumPy's default; ``statistics.quantiles`` "inclusive").
    Returns ``(None, None, None)`` for fewer than 2 tokens.
    """
    return gap_stats_ms([b - a for a, b in pairwise(token_times_ns)])


def gap_stats_ms(gaps_ns: Sequence[int]) -> tuple[float | None, float | None, float | None]:
    """p50, p95 and max in ms of inter-token gaps (ns), as :func:`itl_stats_ms` (gaps may be pooled from
    several streams); ``(None, None, None)`` when there is none."""
    p50, p95, top = gap_percentiles_ms(gaps_ns, (50, 95, 100))
    return p50, p95, top


def gap_percentiles_ms(gaps_ns: Sequence[int], percents: Sequence[int]) -> tuple[float | None, ...]:
    """The ``percents`` (whole numbers 1–100; 100 = the max) of inter-token gaps (ns) in ms, as
    :func:`itl_stats_ms` computes them (linear interpolation between closest ranks); all ``None`` when there is
    no gap."""
    if not gaps_ns:
        return tuple(None for _ in percents)
    gaps = [g / NS_PER_MS for g in gaps_ns]
    if len(gaps) == 1:
        return tuple(gaps[0] for _ in percents)
    cuts = quantiles(gaps, n=100, method="inclusive")  # cuts[k - 1] is the k-th percentile
    return tuple(max(gaps) if p >= 100 else cuts[p - 1] for p in percents)


def compute_turn_metrics(
    *,
    t_submit_ns: int,
    t_prefill_start_ns: int | None,
    t_prefill_end_ns: int | None,
    token_times_ns: Sequence[int],
    prompt_tokens: int | None,
    cached_tokens: int | None,
    kv_cache_tokens: int | None,
    kv_bytes_per_token: int | None,
    kv_capacity_bytes: int | None,
    stop_reason: StopReason,
    dropped_messages: int = 0,
    evaluated_tokens: int | None = None,
    thinking_tokens: int | None = None,
    t_thinking_end_ns: int | None = None,
    spec: dict[str, Any] | None = None,
    prefill_ns: int | None = None,
    decode_count: tuple[int | None, str | None] | None = None,
    thinking_block: bool = False,
    t_first_answer_ns: int | None = None,
) -> TurnMetrics:
    """Build a :class:`TurnMetrics` from raw timestamps (ns) and counts (tokens), for every engine.

    The local engine passes its own clock and counts; a remote server's turn
    (:func:`chatphase.engine.remote.wire.remote_turn_metrics`) passes the arrival times of the stream's
    chunks with the server's counts, ``None`` for what the server does not report.

    Args:
        t_submit_ns: the turn's submit time.
        t_prefill_start_ns / t_prefill_end_ns: start of the first prompt chunk and the synchronised end
            of the last one (equal when nothing was evaluated); ``None``: not measured here (a server's).
        token_times_ns: sampling time of each generated token, the end-of-generation token excluded; or,
            with ``decode_count``, the arrival times of the chunks that carried generated text.
        prompt_tokens: tokens of the whole templated prompt; cached_tokens: reused from the KV cache
            (``None``: unknown).
        kv_cache_tokens: KV cells in use after the turn; kv_bytes_per_token: from :mod:`chatphase.models.kv`.
        evaluated_tokens: prompt tokens actually evaluated, when fewer than ``prompt_tokens - cached_tokens``
            (a prefill cancelled between chunks), or when that difference is unknown (a server's
            ``prompt_n``); ``prefill_tokens`` and its rate then count only these.
        thinking_tokens: generated tokens of the thinking block (the first ones), ``None`` without one;
        t_thinking_end_ns: when the block closed (after its closing marker, sampled or forced); ``None``
            when the reply ended inside it (thinking cut short).
        spec: the speculative-decoding fields (:func:`spec_figures`, :func:`spec_counts`), ``None`` for
            plain decode.
        prefill_ns: the prefill's duration measured elsewhere (a server's own clock), where there are no
            prefill timestamps.
        decode_count: ``(tokens, who counted them)`` when ``token_times_ns`` are chunks, which are not
            tokens: the server's count (``None``: unknown) and ``decode_tokens_source``. ``None``: one
            token per time.
        thinking_block: the reply had a thinking block whose token count is unknown (``thinking_tokens``
            ``None``: a server that does not report it).
        t_first_answer_ns: when the first answer token arrived; by default the time of the token after
            the thinking block's (with ``decode_count``, unknown unless given).

    Raises:
        ValueError: on inconsistent counts or timestamps out of order, or an unknown stop reason.
    """
    if prompt_tokens is not None and cached_tokens is not None and not 0 <= cached_tokens <= prompt_tokens:
        raise ValueError(f"cached_tokens={cached_tokens} outside 0..prompt_tokens={prompt_tokens}")
    if t_prefill_start_ns is not None and t_prefill_end_ns is not None:
        if t_prefill_end_ns < t_prefill_start_ns or t_prefill_start_ns < t_submit_ns:
            raise ValueError("timestamps out of order: need t_submit <= t_prefill_start <= t_prefill_end")
        prefill_ns = t_prefill_end_ns - t_prefill_start_ns
    if any(b < a for a, b in pairwise(token_times_ns)) or (token_times_ns and token_times_ns[0] < t_submit_ns):
        raise ValueError("token times must be non-decreasing and after the submit time")
    if stop_reason not in STOP_REASONS:
        raise ValueError(f"unknown stop_reason {stop_reason!r}")

    prefill_tokens = prompt_tokens - cached_tokens if prompt_tokens is not None and cached_tokens is not None else None
    if evaluated_tokens is not None:
        if evaluated_tokens < 0 or (prefill_tokens is not None and evaluated_tokens > prefill_tokens):
            raise ValueError(f"evaluated_tokens={evaluated_tokens} outside 0..{prefill_tokens}")
        prefill_tokens = evaluated_tokens
    times = token_times_ns
    decode_tokens, source = (len(times), None) if decode_count is None else decode_count
    ttft_ms = ns_to_ms(times[0] - t_submit_ns) if times else None
    decode_ns = times[-1] - times[0] if times else 0
    decode_tps, tpot_ms = decode_rates(decode_tokens, decode_ns)
    p50, p95, pmax = itl_stats_ms(times)
    if thinking_tokens is not None or thinking_block:
        if decode_count is None:
            t_first_answer_ns = _local_first_answer(times, thinking_tokens, t_thinking_end_ns, t_first_answer_ns)
        thinking = _thinking_figures(t_submit_ns, times, decode_tokens, thinking_tokens, t_thinking_end_ns)
        thinking |= _answer_figures(t_submit_ns, times, thinking.get("answer_tokens"), t_first_answer_ns)
    else:
        thinking = {}
    return TurnMetrics(
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        prefill_tokens=prefill_tokens,
        prefill_ms=ns_to_ms(prefill_ns) if prefill_ns is not None else None,
        prefill_tokens_per_s=(
            rate_per_s(prefill_tokens, prefill_ns) if prefill_tokens is not None and prefill_ns is not None else None
        ),
        ttft_ms=ttft_ms,
        decode_tokens=decode_tokens,
        decode_ms=ns_to_ms(decode_ns),
        decode_tokens_per_s=decode_tps,
        itl_ms_p50=p50,
        itl_ms_p95=p95,
        itl_ms_max=pmax,
        kv_cache_tokens=kv_cache_tokens,
        kv_bytes_per_token=kv_bytes_per_token,
        kv_cache_bytes=(
            kv_cache_tokens * kv_bytes_per_token
            if kv_cache_tokens is not None and kv_bytes_per_token is not None
            else None
        ),
        kv_capacity_bytes=kv_capacity_bytes,
        stop_reason=stop_reason,
        tokenize_ms=ns_to_ms(t_prefill_start_ns - t_submit_ns) if t_prefill_start_ns is not None else None,
        tpot_ms=tpot_ms,
        dropped_messages=dropped_messages,
        decode_tokens_source=source,
        **thinking,
        **(spec or {}),
    )


class SpeedupTally:
    """Speculative decoding's speed-up, like with like: steps are grouped by the decode thread count they ran
    at, and each group's tokens are priced at that group's own mean plain step. A plain step measured at 1
    thread says nothing about a drafted step at 2 (``--threads auto`` changes the count mid-turn), so a group
    without a plain step is left out of the figure.

    ``speedup = Σ_n plain_ms(n) × tokens(n) / Σ_n duration(n)`` over the counts ``n`` with a plain step."""

    def __init__(self) -> None:
        self._groups: dict[int, list[int]] = {}  # threads -> [plain ns, plain steps, ns, tokens, steps]

    def add(self, threads: int, duration_ns: int, tokens: int, plain: bool) -> None:
        g = self._groups.setdefault(threads, [0, 0, 0, 0, 0])
        if plain:
            g[0] += duration_ns
            g[1] += 1
        g[2] += duration_ns
        g[3] += tokens
        g[4] += 1

    def speedup(self) -> float | None:
        """``None`` until some thread count has a plain step and a positive duration."""
        saved = total = 0.0
        for plain_ns, plain_n, ns, tokens, _ in self._groups.values():
            if plain_n:
                saved += plain_ns / plain_n * tokens
                total += ns
        return saved / total if total > 0 else None

    def baseline(self) -> tuple[int | None, float | None]:
        """``(threads, plain step ms)`` of the compared count with the most steps; ``(None, None)`` when none."""
        compared = [(g[4], n) for n, g in self._groups.items() if g[1]]
        if not compared:
            return None, None
        n = max(compared)[1]
        g = self._groups[n]
        return n, ns_to_ms(g[0]) / g[1]


def spec_figures(
    mode: str,
    t_first_ns: int,
    step_end_ns: Sequence[int],
    step_tokens: Sequence[int],
    step_drafted: Sequence[int],
    step_accepted: Sequence[int],
    step_plain: Sequence[bool],
    step_threads: Sequence[int] | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """The speculative-decoding fields of :class:`TurnMetrics` (the module docstring's definitions).

    Per step ``i``: ``step_end_ns[i]`` the time of its last generated token, ``step_tokens[i]`` the tokens it
    generated (>= 1), ``step_drafted[i]`` / ``step_accepted[i]`` its draft tokens and how many were accepted,
    ``step_plain[i]`` whether it was a plain one-token step (a step that evaluated a forced closing marker is
    neither plain nor drafted), ``step_threads[i]`` the decode threads it ran at (``None``: all at one count).
    ``t_first_ns`` the first generated token's time (where the first step starts); ``note`` goes to
    ``spec_note``.

    Raises:
        ValueError: lists of different lengths, more accepted than drafted, or step ends out of order.
    """
    n = len(step_end_ns)
    threads = step_threads if step_threads is not None else [0] * n
    if not n == len(step_tokens) == len(step_drafted) == len(step_accepted) == len(step_plain) == len(threads):
        raise ValueError("one entry per step in each list")
    if any(a > d or a < 0 for a, d in zip(step_accepted, step_drafted, strict=True)):
        raise ValueError("a step cannot accept more draft tokens than it drafted")
    ends = [t_first_ns, *step_end_ns]
    durations = [b - a for a, b in pairwise(ends)]
    if any(d < 0 for d in durations):
        raise ValueError("step ends must be non-decreasing, from the first token on")
    drafted, accepted, tokens = sum(step_drafted), sum(step_accepted), sum(step_tokens)
    verify = [d for d, k in zip(durations, step_drafted, strict=True) if k > 0]
    tally = SpeedupTally()
    for d, t, p, th in zip(durations, step_tokens, step_plain, threads, strict=True):
        tally.add(th, d, t, p)
    plain_threads, plain_ms = tally.baseline()
    p50, p95, _ = gap_stats_ms(durations)
    return {
        **spec_counts(mode, drafted, accepted),
        "spec_accepted_per_step": accepted / len(verify) if verify else None,
        "spec_steps": n,
        "spec_tokens_per_step": tokens / n if n else None,
        "spec_verify_step_ms": ns_to_ms(sum(verify)) / len(verify) if verify else None,
        "spec_plain_step_ms": plain_ms,
        "spec_speedup": tally.speedup(),
        "spec_plain_threads": plain_threads if step_threads is not None else None,
        "spec_note": note,
        "step_ms_p50": p50,
        "step_ms_p95": p95,
    }


def spec_counts(mode: str, drafted: int, accepted: int) -> dict[str, Any]:
    """``spec_mode``, ``spec_drafted``, ``spec_accepted`` and ``spec_acceptance = accepted / drafted``
    (``None`` when nothing was drafted): all a server that drafts reports; the rest of :func:`spec_figures`
    stays unknown."""
    return {
        "spec_mode": mode,
        "spec_drafted": drafted,
        "spec_accepted": accepted,
        "spec_acceptance": accepted / drafted if drafted else None,
    }


def _local_first_answer(
    times: Sequence[int], thinking_tokens: int | None, t_end_ns: int | None, given: int | None
) -> int | None:
    """The first answer token's time when every time is one token: the one after the thinking block's.

    Raises:
        ValueError: more thinking tokens than generated ones, or an end before the block's last token.
    """
    n = len(times)
    if thinking_tokens is None:
        return given
    if not 0 <= thinking_tokens <= n:
        raise ValueError(f"thinking_tokens={thinking_tokens} outside 0..decode_tokens={n}")
    if t_end_ns is not None and n and thinking_tokens and t_end_ns < times[thinking_tokens - 1]:
        raise ValueError("the thinking block cannot end before its last token")
    if given is not None:
        return given
    return times[thinking_tokens] if thinking_tokens < n else None


def _thinking_figures(
    t_submit_ns: int,
    times: Sequence[int],
    decode_tokens: int | None,
    thinking_tokens: int | None,
    t_end_ns: int | None,
) -> dict[str, Any]:
    """The thinking fields of :class:`TurnMetrics` but the answer's timing (the module docstring):
    ``thinking_ms`` from the first generated token to the block's end (the last token when cut short),
    ``answer_tokens = decode_tokens - thinking_tokens`` (``None`` when either is unknown)."""
    end = t_end_ns if t_end_ns is not None else (times[-1] if times else t_submit_ns)
    answer = decode_tokens - thinking_tokens if decode_tokens is not None and thinking_tokens is not None else None
    return {
        "thinking_tokens": thinking_tokens,
        "thinking_ms": ns_to_ms(end - times[0]) if times else 0.0,
        "thinking_cut_short": t_end_ns is None,
        "answer_tokens": answer,
    }


def _answer_figures(
    t_submit_ns: int, times: Sequence[int], answer_tokens: int | None, t_first_answer_ns: int | None
) -> dict[str, Any]:
    """``ttfa_ms = t_first_answer - t_submit`` and ``answer_tokens_per_s``, decode's rate over the answer:
    ``(answer_tokens - 1) / (t_last - t_first_answer)``; ``None`` where the first answer time is unknown."""
    if t_first_answer_ns is None:
        return {"ttfa_ms": None, "answer_tokens_per_s": None}
    rate = decode_rates(answer_tokens, times[-1] - t_first_answer_ns)[0] if answer_tokens and times else None
    return {"ttfa_ms": ns_to_ms(t_first_answer_ns - t_submit_ns), "answer_tokens_per_s": rate}
