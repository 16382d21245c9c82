"""The request, the steps and the outcome of an interference run (:class:`~chatphase.engine.local.interference.InterferenceEngine`).

Plain, picklable dataclasses without llama.cpp (as :mod:`chatphase.engine.batching`), so that the bench code and the
UI can read them in a process that never loads llama.cpp. Lanes are sequences: lanes ``0 … N-1`` are the running
streams, lane ``N`` the newcomer. Every ``*_ns`` is ``time.perf_counter_ns()`` inside the engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InterferenceRequest:
    """N running streams (``prompts``) decode ``before_steps`` steps; then the ``newcomer``'s prompt arrives and is
    evaluated by ``chunk``: ``None`` = the whole prompt first (``n_batch`` pieces, the running streams paused), else
    ``chunk`` prompt tokens ride with the N decode tokens in each step's one ``llama_decode``; after the newcomer's
    first token, ``after_steps`` steps of all N + 1."""

    prompts: tuple[tuple[int, ...], ...]
    newcomer: tuple[int, ...]
    chunk: int | None
    before_steps: int
    after_steps: int


@dataclass(frozen=True)
class StepRecord:
    """One ``llama_decode`` (synchronised, its tokens sampled): ``t_start_ns`` before the call, ``t_end_ns`` after the
    samples; ``decoded``: the lanes that got a token at ``t_end_ns`` (the newcomer's first among them when the step
    held its last prompt token); ``decode_tokens``: the decode tokens in the batch; ``prompt_tokens``: the newcomer's
    prompt tokens in it (0: a plain decode step); ``sub_batches``: the physical batches llama.cpp ran it as
    (``⌈tokens / n_ubatch⌉``)."""

    index: int
    t_start_ns: int
    t_end_ns: int
    decoded: tuple[int, ...]
    decode_tokens: int
    prompt_tokens: int
    sub_batches: int = 1

    @property
    def tokens(self) -> int:
        """Tokens in the step's batch."""
        return self.decode_tokens + self.prompt_tokens


@dataclass(frozen=True)
class InterferenceOutcome:
    """What one interference run measured.

    ``token_ns[j]``: lane j's token times (a running stream's first comes from the prefill of the running prompts,
    the newcomer's from the step holding its last prompt token); ``t_start_ns``: the run's start (the running
    prompts' prefill); ``t_arrival_ns``: the newcomer arrives (the end of the last step before it, or of the
    running prompts' prefill); ``steps``: every step from the first decode on. ``stop_reason``: ``"length"``,
    ``"cancelled"`` or ``"error"`` (``error`` says how).
    """

    n_running: int
    newcomer_prompt_tokens: int
    chunk: int | None
    t_start_ns: int
    t_arrival_ns: int
    token_ns: tuple[tuple[int, ...], ...]
    steps: tuple[StepRecord, ...]
    stop_reason: str
    error: str = ""
