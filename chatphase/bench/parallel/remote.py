"""The parallel-decode sweep on a serving engine: N concurrent streams to one server (``bench --server``).

llama-server with ``--parallel N`` slots (or vLLM's continuous batching) decodes the streams it holds in
one batch per step, the same experiment as :mod:`chatphase.bench.parallel.sweep` on a server. Each stream is
its own :class:`~chatphase.engine.remote.engine.RemoteEngine` (own httpx client and connection) run in its own
thread of a pool of exactly N; the N requests leave together (a barrier), each a token-id prompt of
``L`` tokens with ``max_tokens = gen + 1`` (the first token, then ``gen`` decode steps, as locally) and
the end-of-sequence token ignored. :meth:`RemoteStreams.cancel` shuts every stream's socket (the server
stops generating when its client goes away); the pool is then joined, so no thread outlives the run.

Measured on the client's clock (network included), with the server's token counts
(:mod:`chatphase.engine.remote.wire`): per stream TTFT, ITL and decode tok/s; ``step_ms`` is the mean
TPOT of the streams; ``aggregate_decode_tokens_per_s`` = Σ (decode tokens − 1) over the streams / (last
token of any stream − first token of any stream); ``prefill_tokens_per_s`` = N × L / (the last stream's
first token − submit). A count the server does not report leaves the figures built on it ``None``.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import pairwise

from chatphase.bench.parallel.records import ParallelSample
from chatphase.bench.parallel.sweep import ParallelPlan
from chatphase.engine.base import Engine
from chatphase.engine.events import (
    EngineFailed,
    FirstToken,
    LoadedModel,
    PrefillStarted,
    SamplingParams,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.metrics import TurnMetrics, gap_stats_ms, rate_per_s
from chatphase.errors import EngineError, UsageError

_BARRIER_TIMEOUT_S = 10.0


def fit_plan_to_server(plan: ParallelPlan, loaded: LoadedModel) -> tuple[ParallelPlan, tuple[str, ...]]:
    """The plan a server can run, and what was dropped in words (checked after connecting, before any run).

    A server that reports ``total_slots`` (llama-server's ``/props``) runs at most that many streams at
    once: larger N are dropped with a note. Its per-slot ``n_ctx`` must hold prompt + ``gen + 1`` tokens.

    Raises:
        UsageError: when one stream does not fit a slot's context.
    """
    s = loaded.settings
    slot_ctx, slots = s.n_ctx, s.total_slots
    need = max(plan.prompt_lengths) + plan.gen_tokens + 1
    if slot_ctx and need > int(slot_ctx):
        raise UsageError(
            f"one stream needs {need:,} tokens (prompt + generated) but a slot of the server at "
            f"{s.server or 'the server'} holds {int(slot_ctx):,} (its n_ctx per slot) — lower the lengths or "
            "give the server a larger context"
        )
    if not slots or max(plan.n_seqs) <= slots:
        return plan, ()
    allowed = tuple(n for n in plan.n_seqs if n <= slots)
    dropped = ", ".join(str(n) for n in plan.n_seqs if n > slots)
    note = (
        f"the server at {s.server or 'the server'} has {slots} slot{'s' if slots != 1 else ''}: N = {dropped} "
        f"would wait for free slots, so only N = {', '.join(map(str, allowed))} run (start it with --parallel N)"
    )
    return replace(plan, n_seqs=allowed), (note,)


@dataclass(frozen=True)
class _Stream:
    """One stream's clock and the server's metrics (``failed``: its one-line error)."""

    t_submit_ns: int
    times_ns: tuple[int, ...]
    metrics: TurnMetrics | None
    failed: str | None


class RemoteStreams:
    """A :class:`~chatphase.bench.parallel.sweep.BatchRunner` of concurrent streams, one per loaded engine.

    Args:
        engines: loaded engines, at least as many as the largest N (a run of N uses the first N).
    """

    def __init__(self, engines: Sequence[Engine]) -> None:
        self.engines = list(engines)
        self._cancel = threading.Event()
        self._ids = itertools.count(1)

    def cancel(self) -> None:
        """Stop every stream now (thread-safe)."""
        self._cancel.set()
        for engine in self.engines:
            engine.cancel()

    def run(self, prompts: Sequence[Sequence[int]], gen_steps: int) -> ParallelSample:
        """Run ``len(prompts)`` streams at once and account for them (module docstring).

        Raises:
            EngineError: when a stream fails (the first failure's message).
        """
        n = len(prompts)
        barrier = threading.Barrier(n)
        requests = [
            TurnRequest(
                turn_id=next(self._ids),
                prompt_token_ids=tuple(p),
                reset_cache=True,
                ignore_eos=True,
                sampling=SamplingParams(max_tokens=gen_steps + 1, temperature=0.0),
            )
            for p in prompts
        ]
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="chatphase-stream") as pool:
            futures = [pool.submit(self._stream, e, r, barrier) for e, r in zip(self.engines, requests, strict=False)]
            streams = [f.result() for f in futures]
        if self._cancel.is_set():
            return stream_sample(streams, len(prompts[0]), gen_steps, stop_reason="cancelled")
        failed = next((s.failed for s in streams if s.failed), None)
        if failed:
            raise EngineError(f"a stream failed during the parallel sweep: {failed}")
        return stream_sample(streams, len(prompts[0]), gen_steps)

    def _stream(self, engine: Engine, request: TurnRequest, barrier: threading.Barrier) -> _Stream:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(_BARRIER_TIMEOUT_S)
        t_submit, times, metrics, failed = 0, [], None, None
        if self._cancel.is_set():
            return _Stream(0, (), None, None)
        events = engine.run_turn(request)
        try:
            for event in events:
                if self._cancel.is_set():  # also when cancel() came before this turn began
                    engine.cancel()
                    break
                if isinstance(event, PrefillStarted):
                    t_submit = event.t_ns
                elif isinstance(event, (FirstToken, TokensDecoded)):
                    times.append(event.t_ns)
                elif isinstance(event, EngineFailed):
                    failed = failed or event.message
                elif isinstance(event, TurnFinished):
                    metrics = event.metrics
        finally:
            if isinstance(events, Generator):  # end the stream now, not when the generator is collected
                events.close()
        return _Stream(t_submit, tuple(times), metrics, failed)


def stream_sample(
    streams: Sequence[_Stream], prompt_tokens: int, gen_tokens: int, stop_reason: str = "length"
) -> ParallelSample:
    """The accounting of one remote repetition (module docstring); unknown figures are ``None``."""
    done = [s for s in streams if s.metrics is not None and s.times_ns]
    metrics = [m for s in done if (m := s.metrics) is not None]
    counts = [c for m in metrics if (c := m.decode_tokens) is not None]
    known = len(done) == len(streams) and len(counts) == len(metrics)
    span_ns = max(s.times_ns[-1] for s in done) - min(s.times_ns[0] for s in done) if done else 0
    p50, p95, _ = gap_stats_ms([b - a for s in done for a, b in pairwise(s.times_ns)])
    first_ns = max((s.times_ns[0] for s in done), default=0)
    submit_ns = min((s.t_submit_ns for s in done), default=0)
    return ParallelSample(
        prompt_tokens=prompt_tokens,
        n_seq=len(streams),
        gen_tokens=gen_tokens,
        rep=0,
        warmup=False,
        step_ms=_mean([m.tpot_ms for m in metrics]) if known else None,
        decode_tokens_per_s=_mean([m.decode_tokens_per_s for m in metrics]) if known else None,
        aggregate_decode_tokens_per_s=rate_per_s(sum(c - 1 for c in counts), span_ns) if known else None,
        prefill_tokens_per_s=rate_per_s(prompt_tokens * len(streams), first_ns - submit_ns) if done else None,
        ttft_ms=tuple(m.ttft_ms for m in metrics if m.ttft_ms is not None),
        itl_ms_p50=p50,
        itl_ms_p95=p95,
        decode_tokens=sum(counts) if known else None,
        kv_cache_bytes=None,
        stop_reason=stop_reason,
    )


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None
