"""InterferenceEngine: N sequences decoding in one context when a new sequence's prompt arrives.

The local half of ``chatphase bench --interference`` (:mod:`chatphase.bench.interference`). One context holds the N
running sequences and the newcomer (``config.n_seq_max`` ≥ N + 1). A run (:meth:`InterferenceEngine.iter_interference`):

1. the KV cache is cleared; the N running prompts are prefilled together (:class:`BatchedEngine`'s prefill), each
   sequence sampling its first token;
2. ``before_steps`` decode steps of N tokens (one ``llama_decode`` each, as the parallel sweep's);
3. the newcomer arrives. **Whole prompt first**: its prompt runs alone in ``n_batch`` pieces, the running streams
   paused (their next token waits for the whole prompt). **Chunked-mixed, chunk C**: each step is one
   ``llama_decode`` of the N decode tokens first, then the next C prompt tokens (llama-server's order); only the
   decode tokens and the prompt's last token ask for logits, so a step samples N tokens (N + 1 with the last chunk);
4. ``after_steps`` decode steps of all N + 1.

A step is timed from just before its ``llama_decode`` to after ``llama_synchronize`` and its greedy samples.

Two llama.cpp facts shape the measurement (``docs/metrics.md``, "Prefill meets decode"):

- the KV cache is **unified** (``kv_unified``; the engine config's ``kv_unified`` must be on): with a per-sequence
  cache llama.cpp splits a mixed batch into equal per-sequence pieces (``split_equal``), so only one prompt token would
  ride with the decode tokens per physical batch and a chunk would run as C sub-batches;
- a batch above ``n_ubatch`` tokens runs as ``⌈tokens / n_ubatch⌉`` physical batches (``split_simple``): each step
  records that count (:attr:`~chatphase.engine.interference.StepRecord.sub_batches`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import llama_cpp as lc

from chatphase.engine.events import LoadedModel
from chatphase.engine.interference import InterferenceOutcome, InterferenceRequest, StepRecord
from chatphase.engine.local.batched import BatchedEngine, _Run
from chatphase.engine.local.llama_params import batch_positions


class InterferenceEngine(BatchedEngine):
    """A :class:`BatchedEngine` that also runs :class:`InterferenceRequest` s (module docstring)."""

    def _load(self) -> LoadedModel:
        loaded = super()._load()
        self._n_ubatch: int = lc.llama_n_ubatch(self._loaded_kv().ptr)
        return loaded

    def check_request(self, request: InterferenceRequest) -> None:
        """Raise ``ValueError`` when ``request`` does not fit this context (the plan checks it first, in words)."""
        n = len(request.prompts)
        chunk = request.chunk or 0
        kv = self._loaded_kv()
        if n < 1 or n + 1 > self._n_seq_max or n + max(chunk, 1) > kv.n_batch:
            raise ValueError(f"{n} running + 1 newcomer with chunk {chunk}: over n_seq_max or n_batch")
        if not request.newcomer or any(not p for p in request.prompts):
            raise ValueError("every prompt needs at least one token")
        need = sum(len(p) for p in request.prompts) + len(request.newcomer)
        need += (n + 1) * (request.before_steps + request.after_steps + 2)
        if need > kv.n_ctx:
            raise ValueError(f"the run needs {need} KV cells; the context has {kv.n_ctx}")

    def iter_interference(self, request: InterferenceRequest) -> Iterator[StepRecord | InterferenceOutcome]:
        """Run ``request`` (blocking): yields each :class:`StepRecord` as it ends, then the outcome.

        :meth:`cancel` stops it at the next step (``stop_reason="cancelled"``).

        Raises:
            RuntimeError: the model is not loaded. ValueError: as :meth:`check_request`.
        """
        kv = self._loaded_kv()
        self.check_request(request)
        kv.clear(data=False)
        n = len(request.prompts)
        run = _Run(n, 0)
        run.t_prefill_start = time.perf_counter_ns()
        state = _State(request, run)
        try:
            if self._prefill(request.prompts, run):
                for j in range(n):
                    state.times[j].append(run.first_ns[j])
                state.start()
                state.arrival = run.t_prefill_end
                yield from self._steps(state)
        finally:
            self.cancel_done()
        yield InterferenceOutcome(
            n_running=n,
            newcomer_prompt_tokens=len(request.newcomer),
            chunk=request.chunk,
            t_start_ns=run.t_prefill_start,
            t_arrival_ns=state.arrival,
            token_ns=tuple(tuple(t) for t in state.times),
            steps=tuple(state.steps),
            stop_reason=run.stop,
            error=run.error,
        )

    def _steps(self, state: _State) -> Iterator[StepRecord]:
        """The decode steps, the newcomer's prompt by the policy, then the steps after it (module docstring)."""
        request, n = state.request, len(state.request.prompts)
        running = list(range(n))
        for _ in range(request.before_steps):
            if not (step := self._step(state, running, 0)):
                return
            state.arrival = step.t_end_ns
            yield step
        piece = request.chunk or self._loaded_kv().n_batch
        while state.fed < len(request.newcomer):
            if not (step := self._step(state, running if request.chunk else [], piece)):
                return
            yield step
        everyone = [*running, n]
        for _ in range(request.after_steps):
            if not (step := self._step(state, everyone, 0)):
                return
            yield step

    def _step(self, state: _State, decoding: list[int], prompt_piece: int) -> StepRecord | None:
        """One ``llama_decode``: a token for each lane of ``decoding`` first, then up to ``prompt_piece`` of the
        newcomer's prompt tokens; synchronised and sampled. ``None`` (the run's stop reason set) when cancelled or
        refused."""
        run, b, ctx = state.run, self._loaded_batch(), self._loaded_kv().ptr
        if self._cancel.is_set():
            run.stop = "cancelled"
            return None
        token, pos = b.token, batch_positions(b)
        newcomer, n = state.request.newcomer, len(state.request.prompts)
        i = 0
        for j in decoding:
            token[i], pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = state.last[j], state.next_pos[j], 1, j, 1
            i += 1
        take = newcomer[state.fed : state.fed + prompt_piece]
        for k, tok in enumerate(take):
            at = state.fed + k
            token[i], pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = tok, at, 1, n, at == len(newcomer) - 1
            i += 1
        b.n_tokens = i
        t0 = time.perf_counter_ns()
        rc = lc.llama_decode(ctx, b)
        if rc != 0:
            run.fail(f"llama.cpp could not evaluate a step of {i} tokens (llama_decode {rc})")
            return None
        lc.llama_synchronize(ctx)
        finished = bool(take) and state.fed + len(take) == len(newcomer)
        outputs = [*decoding, n] if finished else list(decoding)
        picked = self._argmax(len(outputs)) if outputs else []
        t1 = time.perf_counter_ns()
        for j, tok in zip(outputs, picked, strict=True):
            state.last[j] = tok
            state.times[j].append(t1)
            state.next_pos[j] += 1
        state.fed += len(take)
        if finished:
            state.next_pos[n] = len(newcomer)  # where its first token goes
        step = StepRecord(
            index=len(state.steps),
            t_start_ns=t0,
            t_end_ns=t1,
            decoded=tuple(outputs),
            decode_tokens=len(decoding),
            prompt_tokens=len(take),
            sub_batches=-(-i // self._n_ubatch),
        )
        state.steps.append(step)
        return step


class _State:
    """The mutable record of one interference run while it goes."""

    def __init__(self, request: InterferenceRequest, run: _Run) -> None:
        n = len(request.prompts)
        self.request, self.run = request, run
        self.times: list[list[int]] = [[] for _ in range(n + 1)]
        self.steps: list[StepRecord] = []
        self.arrival = 0
        self.fed = 0  # newcomer prompt tokens evaluated
        # the token each lane feeds next and its position (a running lane's first token sits after its prompt)
        self.last = [0] * (n + 1)
        self.next_pos = [len(p) for p in request.prompts] + [0]

    def start(self) -> None:
        """After the running prompts' prefill: each running lane feeds its first token next."""
        self.last = [toks[-1] for toks in self.run.tokens] + [0]
