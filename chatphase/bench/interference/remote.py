"""The interference experiment over ``--server``: K streams decode on a serving engine when a long prompt arrives.

Each stream is its own engine (own connection), as the parallel sweep's (:mod:`chatphase.bench.parallel.remote`, whose
method this follows): the K requests leave together (a barrier), token-id prompts, the end-of-sequence token ignored,
at most :func:`stream_cap` tokens each. When every stream has ``before`` tokens the newcomer's prompt is sent (the
*arrival*, on the client's clock); when it has its first token and ``after`` more, every stream is hung up. The
server batches as it does for anyone: llama-server puts the running slots' decode tokens first in a step and fills up
to its ``n_batch`` with prompt tokens (its own chunked-mixed policy), so the one policy here is the server's
(:data:`SERVER_POLICY`). Token times are the client's (network included); the newcomer's server ``timings``
(``prompt_ms``: its prefill on the server's clock) are kept where the server sends them.

What the server says of its batching (:func:`server_batching`): llama-server's ``/props`` (slots, context per slot) and
``/slots`` (each slot's context and whether it is busy); ``n_batch``, ``n_ubatch`` and ``kv_unified`` are not exposed
there, and the result says so.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Generator, Sequence

from chatphase.engine.base import Engine
from chatphase.engine.events import (
    EngineFailed,
    FirstToken,
    LoadedModel,
    SamplingParams,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.interference import InterferenceOutcome
from chatphase.errors import EngineError, UsageError

#: the policy of a remote run: the server's own batching (a local chunk is 1 token or more).
SERVER_POLICY = 0
#: the most tokens a running stream asks for (it is hung up once the newcomer is done).
MAX_STREAM_TOKENS = 4096
_BARRIER_TIMEOUT_S = 10.0
_POLL_S = 0.002


def stream_cap(slot_ctx: int | None, prompt_tokens: int) -> int:
    """Tokens a running stream asks for: as many as its slot holds (``MAX_STREAM_TOKENS`` at most)."""
    room = MAX_STREAM_TOKENS if not slot_ctx else int(slot_ctx) - prompt_tokens - 1
    return max(1, min(MAX_STREAM_TOKENS, room))


def fit_to_server(n_running: int, newcomer_tokens: int, after: int, loaded: LoadedModel) -> None:
    """Check that the server can hold K streams and the newcomer at once, and the newcomer's prompt in a slot.

    Raises:
        UsageError: one line naming what to change.
    """
    s = loaded.settings
    server = s.server or "the server"
    if s.total_slots is not None and s.total_slots < n_running + 1:
        raise UsageError(
            f"--interference {n_running}: {n_running} streams + the newcomer need {n_running + 1} slots; the server "
            f"at {server} has {s.total_slots} (start it with --parallel {n_running + 1})"
        )
    if s.n_ctx and newcomer_tokens + after + 1 > int(s.n_ctx):
        raise UsageError(
            f"the newcomer's {newcomer_tokens:,} prompt tokens + {after + 1} do not fit a slot of the server at "
            f"{server} ({int(s.n_ctx):,} tokens, its n_ctx per slot)"
        )


def server_batching(base_url: str | None, loaded: LoadedModel, timeout_s: float = 5.0) -> dict:
    """What the server says of its batching: ``total_slots`` and ``n_ctx_per_slot`` (``/props``), ``slots`` (``/slots``:
    how many it lists, each slot's ``n_ctx``), and ``not_exposed``: the settings it does not report."""
    import httpx

    found: dict = {
        "server": loaded.settings.server,
        "server_kind": loaded.settings.server_kind,
        "total_slots": loaded.settings.total_slots,
        "n_ctx_per_slot": loaded.settings.n_ctx,
        "not_exposed": ["n_batch", "n_ubatch", "kv_unified"],
    }
    if base_url:
        try:
            reply = httpx.get(f"{base_url.rstrip('/')}/slots", timeout=timeout_s, trust_env=False)
            slots = reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            slots = None
        if isinstance(slots, list):
            found["slots"] = len(slots)
            found["slot_n_ctx"] = sorted({s.get("n_ctx") for s in slots if isinstance(s, dict) and s.get("n_ctx")})
        else:
            found["slots"] = None  # /slots not served (llama-server --no-slots, or another server)
    return found


class RemoteInterference:
    """Runs one remote interference run on ``engines`` (K stream engines, then the newcomer's, all loaded)."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        self.engines = list(engines)
        self._cancel = threading.Event()
        self._ids = itertools.count(1)
        self.server_timings: dict | None = None

    def cancel(self) -> None:
        """Stop every stream now (thread-safe)."""
        self._cancel.set()
        for engine in self.engines:
            engine.cancel()

    def run(
        self, prompts: Sequence[Sequence[int]], newcomer: Sequence[int], before: int, after: int, cap: int
    ) -> InterferenceOutcome:
        """K streams, the newcomer at the arrival, then hang up (module docstring).

        Raises:
            EngineError: a stream or the newcomer failed (the first failure's message).
        """
        k = len(prompts)
        times: list[list[int]] = [[] for _ in range(k + 1)]
        failures: list[str] = []
        done = threading.Event()
        barrier = threading.Barrier(k)
        streams = [
            threading.Thread(
                target=self._stream,
                args=(self.engines[j], self._request(prompts[j], cap), times[j], failures, done, barrier),
                name=f"chatphase-stream-{j}",
                daemon=True,
            )
            for j in range(k)
        ]
        t_start = time.perf_counter_ns()
        for thread in streams:
            thread.start()
        arrival = 0
        try:
            while not self._cancel.is_set() and not failures and min(len(t) for t in times[:k]) < before + 1:
                if not any(thread.is_alive() for thread in streams):
                    break
                time.sleep(_POLL_S)
            if not self._cancel.is_set() and not failures:
                arrival = time.perf_counter_ns()
                newcomer_box: dict = {}
                self._stream(self.engines[k], self._request(newcomer, after + 1), times[k], failures, None, None,
                             newcomer_box)  # fmt: skip
                self.server_timings = newcomer_box.get("server_timings")
        finally:
            done.set()
            for engine in self.engines[:k]:
                engine.cancel()
            for thread in streams:
                thread.join(30)
        if failures and not self._cancel.is_set():
            raise EngineError(f"a stream failed during the interference run: {failures[0]}")
        return InterferenceOutcome(
            n_running=k,
            newcomer_prompt_tokens=len(newcomer),
            chunk=SERVER_POLICY,
            t_start_ns=t_start,
            t_arrival_ns=arrival,
            token_ns=tuple(tuple(t) for t in times),
            steps=(),
            stop_reason="cancelled" if self._cancel.is_set() else "length",
        )

    def _request(self, prompt: Sequence[int], max_tokens: int) -> TurnRequest:
        return TurnRequest(
            turn_id=next(self._ids),
            prompt_token_ids=tuple(prompt),
            reset_cache=True,
            ignore_eos=True,
            sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        )

    def _stream(self, engine, request, times, failures, done, barrier, box=None) -> None:
        """Record one request's token times (client clock) until it ends or ``done`` is set."""
        if barrier is not None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(_BARRIER_TIMEOUT_S)
        events = engine.run_turn(request)
        try:
            for event in events:
                if self._cancel.is_set() or (done is not None and done.is_set()):
                    engine.cancel()
                    break
                if isinstance(event, FirstToken):
                    times.append(event.t_ns)
                elif isinstance(event, TokensDecoded):
                    times.extend([event.t_ns] * event.n_tokens)
                elif isinstance(event, EngineFailed):
                    failures.append(event.message)
                elif isinstance(event, TurnFinished) and box is not None:
                    box["server_timings"] = event.server_timings
        finally:
            if isinstance(events, Generator):
                events.close()
