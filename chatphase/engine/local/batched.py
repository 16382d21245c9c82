"""BatchedEngine: N sequences in one llama.cpp context, prefilled together, then decoded together.

The method is llama.cpp's ``llama-batched-bench`` (tools/batched-bench/batched-bench.cpp in the llama.cpp
that llama-cpp-python vendors), so that its figures compare one to one:

- the KV cache is cleared (``llama_memory_clear``), then all N prompts go into one batch, each token
  tagged with its sequence id (``llama_batch_init``, one ``seq_id`` per token), evaluated in ``n_batch``
  chunks: that is PP (prompt tokens per sequence) and S_PP = N × PP / prefill time;
- then ``gen_steps`` steps (TG), each **one** ``llama_decode`` of N tokens, one per sequence at its own
  position, synchronised: S_TG = N × TG / decode time, the time from the first step's start to the last
  step's end. llama-batched-bench feeds random tokens; here each step also samples the N next tokens
  (greedy: the argmax of each sequence's logits, one NumPy call on llama.cpp's logits of the step), so
  the sequences write real text. Each sequence writes ``gen_steps + 1`` tokens: the first comes from the
  prefill's logits, one more per step; its KV cache then holds ``prompt + gen_steps`` cells.

Loading is :class:`~chatphase.engine.local.llama.LlamaEngine`'s own (this class extends it), so its settings,
log capture and the Intel AMX safety (llama.cpp's extra buffer types off on AMX CPUs, whose batched
evaluation crashes) apply here unchanged; ``config.n_seq_max`` must be at least the largest N. llama.cpp's
KV cache stays non-unified (its default, and llama-batched-bench's): each sequence has its own stream of
``n_ctx / n_seq_max`` cells. A batched run leaves the cache empty for chat turns (its single-sequence
state is reset).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import llama_cpp as lc
import numpy as np

from chatphase.engine.batching import BatchOutcome, BatchRequest
from chatphase.engine.events import LoadedModel
from chatphase.engine.local.llama import LlamaEngine
from chatphase.engine.local.llama_params import batch_positions
from chatphase.engine.metrics import StopReason


class BatchedEngine(LlamaEngine):
    """A :class:`LlamaEngine` that can also run :class:`BatchRequest` s (see the module docstring).

    Args: as :class:`LlamaEngine`; ``config.n_seq_max`` bounds the sequences of one request.
    """

    _batch: lc.llama_batch | None = None  # while loaded

    def _load(self) -> LoadedModel:
        loaded = super()._load()
        ctx = self._loaded_kv().ptr
        self._n_seq_max: int = lc.llama_n_seq_max(ctx)
        self._n_ctx_seq: int = lc.llama_n_ctx_seq(ctx)
        self._n_vocab: int = lc.llama_vocab_n_tokens(self._vocab.ptr)
        self._batch = lc.llama_batch_init(max(self._loaded_kv().n_batch, self._n_seq_max), 0, 1)
        return loaded

    def close(self) -> None:
        """Free the batch, the context and the model. Idempotent."""
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        super().close()

    @property
    def n_ctx_seq(self) -> int:
        """KV cells each sequence may use (llama.cpp's ``n_ctx_seq``)."""
        return self._n_ctx_seq

    def run_batch(self, request: BatchRequest) -> BatchOutcome:
        """Prefill the N prompts together, then decode ``gen_steps`` steps of N tokens (blocking).

        :meth:`cancel` stops it at the next prefill chunk or step (``stop_reason="cancelled"``).

        Raises:
            RuntimeError: when the model is not loaded.
            ValueError: no prompts, an empty prompt, more sequences than ``n_seq_max`` or ``n_batch``, or a prompt plus
                ``gen_steps`` that does not fit a sequence's ``n_ctx_seq`` cells.
        """
        kv = self._loaded_kv()
        prompts, steps = request.prompts, request.gen_steps
        n = len(prompts)
        if not 1 <= n <= min(self._n_seq_max, kv.n_batch):
            raise ValueError(
                f"{n} sequences: this context takes 1 to {min(self._n_seq_max, kv.n_batch)} (n_seq_max, n_batch)"
            )
        if steps < 0 or any(not p or len(p) + steps > self._n_ctx_seq for p in prompts):
            raise ValueError(f"each prompt (>= 1 token) + {steps} steps must fit {self._n_ctx_seq} cells a sequence")
        kv.clear(data=False)  # as llama-batched-bench, before each run
        out = _Run(n, steps)
        out.t_prefill_start = time.perf_counter_ns()
        try:
            if self._prefill(prompts, out) and steps:
                self._decode_steps(prompts, out)
        finally:
            self.cancel_done()
        return out.outcome(self, prompts)

    def sequence_lengths(self) -> list[int]:
        """Tokens each sequence holds in the KV cache, by llama.cpp's own count (its last position + 1)."""
        mem = self._loaded_kv().mem
        return [lc.llama_memory_seq_pos_max(mem, j) + 1 for j in range(self._n_seq_max)]

    def _prefill(self, prompts: Sequence[Sequence[int]], run: _Run) -> bool:
        """All prompts in ``n_batch`` chunks; samples each sequence's first token after its chunk."""
        flat = [(tok, pos, j, pos == len(p) - 1) for j, p in enumerate(prompts) for pos, tok in enumerate(p)]
        b, kv = self._loaded_batch(), self._loaded_kv()
        ctx, n_batch = kv.ptr, kv.n_batch
        positions = batch_positions(b)
        for start in range(0, len(flat), n_batch):
            if self._cancel.is_set():
                run.stop = "cancelled"
                break
            chunk = flat[start : start + n_batch]
            outputs = []
            for i, (tok, pos, seq, last) in enumerate(chunk):
                b.token[i], positions[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = tok, pos, 1, seq, last
                if last:
                    outputs.append(seq)
            b.n_tokens = len(chunk)
            rc = lc.llama_decode(ctx, b)
            if rc != 0:
                run.fail(f"llama.cpp could not evaluate a prefill chunk of {len(chunk)} tokens (llama_decode {rc})")
                break
            lc.llama_synchronize(ctx)
            run.cells += len(chunk)
            if outputs:
                picked = self._argmax(len(outputs))
                t = time.perf_counter_ns()
                for seq, tok in zip(outputs, picked, strict=True):
                    run.tokens[seq].append(tok)
                    run.first_ns[seq] = t
        run.t_prefill_end = time.perf_counter_ns()
        return run.stop == "length"

    def _decode_steps(self, prompts: Sequence[Sequence[int]], run: _Run) -> None:
        """``run.steps`` steps; each one ``llama_decode`` of one token per sequence, then N samples."""
        b, ctx, n = self._loaded_batch(), self._loaded_kv().ptr, run.n
        token, pos = b.token, batch_positions(b)
        for j, p in enumerate(prompts):
            pos[j], b.n_seq_id[j], b.seq_id[j][0], b.logits[j] = len(p) - 1, 1, j, 1
        b.n_tokens = n
        decode, sync, argmax, perf_ns, cancel = (
            lc.llama_decode,
            lc.llama_synchronize,
            self._argmax,
            time.perf_counter_ns,
            self._cancel,
        )
        last = [toks[-1] for toks in run.tokens]
        ends, sizes, seqs = run.step_end, run.batch_sizes, range(n)
        run.t_decode_start = perf_ns()
        for _ in range(run.steps):
            if cancel.is_set():
                run.stop = "cancelled"
                break
            for j in seqs:
                token[j] = last[j]
                pos[j] += 1
            rc = decode(ctx, b)
            if rc != 0:
                run.fail(f"llama.cpp could not evaluate a step of {n} tokens (llama_decode {rc})")
                break
            sync(ctx)
            last = argmax(n)
            ends.append(perf_ns())
            sizes.append(n)
            run.cells += n
            for toks, tok in zip(run.tokens, last, strict=True):
                toks.append(tok)

    def _loaded_batch(self) -> lc.llama_batch:
        if self._batch is None:  # run_batch checked the context: closed from another thread since
            raise RuntimeError("the model is not loaded")
        return self._batch

    def _argmax(self, rows: int) -> list[int]:
        """The greedy token of each of the last decode's ``rows`` outputs (in batch order)."""
        logits = np.ctypeslib.as_array(lc.llama_get_logits(self._loaded_kv().ptr), shape=(rows, self._n_vocab))
        picked: list[int] = logits.argmax(axis=1).tolist()
        return picked


class _Run:
    """The mutable record of one run while it goes (turned into a :class:`BatchOutcome` at the end)."""

    def __init__(self, n: int, steps: int) -> None:
        self.n, self.steps = n, steps
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.first_ns = [0] * n
        self.step_end: list[int] = []
        self.batch_sizes: list[int] = []
        self.t_prefill_start = self.t_prefill_end = self.t_decode_start = 0
        self.stop: StopReason = "length"
        self.error = ""
        self.cells = 0  # KV cells written: prompt tokens evaluated + one per sequence per step

    def fail(self, message: str) -> None:
        self.stop, self.error = "error", message

    def outcome(self, engine: BatchedEngine, prompts: Sequence[Sequence[int]]) -> BatchOutcome:
        texts = tuple(b"".join(engine.piece(t) for t in toks).decode("utf-8", "replace") for toks in self.tokens)
        return BatchOutcome(
            n_seq=self.n,
            prompt_tokens=sum(len(p) for p in prompts),
            t_prefill_start_ns=self.t_prefill_start,
            t_prefill_end_ns=self.t_prefill_end,
            first_token_ns=tuple(self.first_ns),
            t_decode_start_ns=self.t_decode_start or self.t_prefill_end,
            step_end_ns=tuple(self.step_end),
            decode_batch_tokens=tuple(self.batch_sizes),
            tokens=tuple(tuple(t) for t in self.tokens),
            texts=texts,
            kv_cache_tokens=self.cells,
            kv_cache_bytes=self.cells * engine._kv_per_token,
            stop_reason=self.stop,
            error=self.error,
        )
