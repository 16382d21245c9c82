"""The request and the outcome of a batched run (:class:`~chatphase.engine.local.batched.BatchedEngine`).

Plain, picklable dataclasses without llama.cpp, so that the bench code and the UI can use them in a
process that never loads llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchRequest:
    """One batched run: ``prompts[j]`` is sequence j's prompt (token ids); ``gen_steps`` decode steps."""

    prompts: tuple[tuple[int, ...], ...]
    gen_steps: int


@dataclass(frozen=True)
class BatchOutcome:
    """What one batched run measured; every ``*_ns`` is ``time.perf_counter_ns()`` inside the engine.

    ``first_token_ns[j]``: sequence j's first token sampled (after the prefill chunk holding its last
    prompt token); ``t_decode_start_ns``: the first step starts; ``step_end_ns[i]``: step i ends (its
    ``llama_decode`` done, synchronised, the N next tokens sampled); ``decode_batch_tokens[i]``: the tokens
    in step i's ``llama_decode`` call (N). ``tokens[j]``/``texts[j]``: what sequence j wrote.
    ``kv_cache_tokens``: KV cells in use after the run (all sequences). ``stop_reason``: ``"length"``
    (all steps ran), ``"cancelled"`` or ``"error"`` (llama.cpp refused a batch; ``error`` says how).
    """

    n_seq: int
    prompt_tokens: int
    t_prefill_start_ns: int
    t_prefill_end_ns: int
    first_token_ns: tuple[int, ...]
    t_decode_start_ns: int
    step_end_ns: tuple[int, ...]
    decode_batch_tokens: tuple[int, ...]
    tokens: tuple[tuple[int, ...], ...]
    texts: tuple[str, ...]
    kv_cache_tokens: int
    kv_cache_bytes: int
    stop_reason: str
    error: str = ""
