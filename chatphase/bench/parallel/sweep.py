"""The parallel-decode sweep: N sequences decoded together, for each N of a list (llama-batched-bench's method).

Why (docs/bench-parallel.md): a decode step reads every weight once whatever the number of sequences it
advances, so while memory bandwidth bounds the step, N sequences cost barely more than one and the
aggregate tokens/s grows almost N-fold, until the arithmetic (2 × parameters FLOPs per token) catches up.

For each prompt length ``L`` and each ``N`` (a cell): ``warmup`` uncounted runs, then ``reps`` runs, each one
:class:`~chatphase.engine.local.batched.BatchRequest` of N distinct prompts of exactly ``L`` tokens
(:meth:`~chatphase.bench.core.prompts.PromptBuilder.tokens` variants) and ``gen_tokens`` decode steps, the KV cache
cleared first. Step accounting (:func:`batch_sample`), as llama-batched-bench's S_PP and S_TG:

- ``prefill_tokens_per_s`` = N × L / prefill time (all prompts in one batch, ``n_batch`` chunks);
- ``step_ms`` = decode time / steps, the decode time running from the first step's start to the last
  step's end (a step: one ``llama_decode`` of N tokens, synchronised, and N greedy samples);
- ``aggregate_decode_tokens_per_s`` = N × steps / decode time (S_TG); ``decode_tokens_per_s`` = steps /
  decode time, per sequence (S_TG / N);
- ``ttft_ms`` per sequence: from the batch's start to its first token (after the chunk holding its last
  prompt token); ITL p50/p95 over the step times.

A runner (:class:`LocalBatches` here, :class:`~chatphase.bench.parallel.remote.RemoteStreams` for a server)
measures one repetition; :class:`ParallelSweep` drives it and ends with :class:`ParallelDone`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from chatphase.bench.core.contract import check_repetitions
from chatphase.bench.core.experiment import count_list, gen_field, plan_field, reps_field, warmup_field
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.parallel.records import PARALLEL_STAT_METRICS, ParallelCell, ParallelSample
from chatphase.bench.sweep.loop import SweepProgress
from chatphase.engine.batching import BatchOutcome, BatchRequest
from chatphase.engine.config import MAX_SEQUENCES
from chatphase.engine.metrics import itl_stats_ms, ns_to_ms, rate_per_s
from chatphase.errors import EngineError, UsageError
from chatphase.models.roofline import step_bytes, step_flops
from chatphase.timing.stats import group_cells, summarize_metrics

DEFAULT_N_SEQS = (1, 2, 4, 8)
DEFAULT_PARALLEL_PROMPT_LENGTHS = (128,)


@dataclass(frozen=True)
class ParallelPlan:
    """What to measure: ``n_seqs`` (the N values), ``prompt_lengths`` (tokens per sequence), ``gen_tokens``
    decode steps per run, ``reps`` counted and ``warmup`` uncounted runs per cell."""

    FORM = ("n_seqs", "prompt_lengths", "reps", "gen_tokens")

    n_seqs: tuple[int, ...] = plan_field(
        DEFAULT_N_SEQS, flag="--parallel", metavar="N,N,...", parse=count_list, label="Sequences (N)",
        help="instead: decode N sequences together for each N, e.g. 1,2,4,8,16 (each its own prompt of "
        "--prompt-lengths tokens; over --server N concurrent streams)",
    )  # fmt: skip
    prompt_lengths: tuple[int, ...] = plan_field(
        DEFAULT_PARALLEL_PROMPT_LENGTHS, flag="--prompt-lengths", metavar="N,N,...", parse=count_list,
        label="Prompt tokens", help="prompt lengths in tokens",
    )  # fmt: skip
    gen_tokens: int = gen_field(label="Gen steps")
    reps: int = reps_field()
    warmup: int = warmup_field()

    def validate(self, n_ctx: int | None, n_batch: int | None = None) -> ParallelPlan:
        """Check the plan before any work (``n_ctx=None`` skips the context check: a server's comes later);
        returns ``self``.

        Raises:
            UsageError: zero reps, negative warm-up, ``gen_tokens < 1``, no N or no prompt length, an N
                below 1 or above llama.cpp's limit or above ``n_batch`` (a step is one batch of N tokens),
                or N sequences of prompt + generation over ``n_ctx`` (saying how many would fit).
        """
        check_repetitions(self.reps, self.warmup, self.gen_tokens, "step")
        if not self.n_seqs:
            raise UsageError("nothing to measure: give --parallel N,N,... (sequences decoded together)")
        if not self.prompt_lengths:
            raise UsageError("the parallel sweep needs a prompt length: give --prompt-lengths N")
        for n in self.n_seqs:
            if not 1 <= n <= MAX_SEQUENCES:
                raise UsageError(f"--parallel: N must be 1 to {MAX_SEQUENCES} sequences (got {n})")
        for length in self.prompt_lengths:
            if length < 1:
                raise UsageError(f"prompt lengths must be at least 1 token (got {length})")
        if n_batch is not None and max(self.n_seqs) > n_batch:
            raise UsageError(
                f"--parallel {max(self.n_seqs)}: a step is one batch of N tokens, over n_batch {n_batch} "
                f"(raise --n-batch to {max(self.n_seqs)})"
            )
        if n_ctx is not None:
            check_fits(max(self.n_seqs), max(self.prompt_lengths) + self.gen_tokens, n_ctx, "n_ctx", "--n-ctx")
        return self

    def cells(self) -> list[tuple[int, int]]:
        """``(prompt_tokens, n_seq)`` of every cell, duplicates dropped, in the order given."""
        return [(length, n) for length in dict.fromkeys(self.prompt_lengths) for n in dict.fromkeys(self.n_seqs)]

    @property
    def total_runs(self) -> int:
        """Runs the sweep performs, warm-ups included."""
        return len(self.cells()) * (self.reps + self.warmup)

    def to_dict(self) -> dict:
        """JSON-ready dict (``sweep`` = ``"parallel"``)."""
        return {
            "sweep": "parallel",
            "n_seqs": list(self.n_seqs),
            "prompt_lengths": list(self.prompt_lengths),
            "gen_tokens": self.gen_tokens,
            "reps": self.reps,
            "warmup": self.warmup,
        }


def check_fits(n_seq: int, tokens_per_seq: int, n_ctx: int, what: str, fix: str) -> None:
    """Raise :class:`UsageError` when ``n_seq`` × ``tokens_per_seq`` exceeds ``n_ctx``, saying what fits."""
    need = n_seq * tokens_per_seq
    if need <= n_ctx:
        return
    fits = n_ctx // tokens_per_seq
    room = (
        f"{what} {n_ctx:,} holds {fits} such sequence{'s' if fits != 1 else ''}"
        if fits
        else f"not even one fits {what} {n_ctx:,}"
    )
    raise UsageError(
        f"--parallel {n_seq}: {n_seq} sequence{'s' if n_seq != 1 else ''} × {tokens_per_seq:,} tokens (prompt + generated) = {need:,} "
        f"tokens; {room} — lower N or the lengths, or raise {fix} to {need:,}"
    )


class BatchRunner(Protocol):
    """Measures one repetition of N sequences (:class:`LocalBatches`, or remote streams)."""

    def run(self, prompts: Sequence[Sequence[int]], gen_steps: int) -> ParallelSample: ...

    def cancel(self) -> None: ...


class LocalBatches:
    """A :class:`~chatphase.engine.local.batched.BatchedEngine` (or anything with ``run_batch``) as a runner.

    Raises (from :meth:`run`): EngineError when llama.cpp refuses a batch.
    """

    def __init__(self, engine) -> None:
        self.engine = engine

    def run(self, prompts: Sequence[Sequence[int]], gen_steps: int) -> ParallelSample:
        out = self.engine.run_batch(BatchRequest(tuple(tuple(p) for p in prompts), gen_steps))
        if out.stop_reason == "error":
            raise EngineError(f"engine failed during the parallel sweep: {out.error}")
        return batch_sample(out, len(prompts[0]), gen_steps)

    def cancel(self) -> None:
        self.engine.cancel()


def batch_sample(
    out: BatchOutcome, prompt_tokens: int, gen_tokens: int, rep: int = 0, warmup: bool = False
) -> ParallelSample:
    """The step accounting of one local run (module docstring); undefined figures are ``None``."""
    steps = len(out.step_end_ns)
    decode_ns = out.step_end_ns[-1] - out.t_decode_start_ns if steps else 0
    per_seq = rate_per_s(steps, decode_ns)
    p50, p95, _ = itl_stats_ms((out.t_decode_start_ns, *out.step_end_ns))
    return ParallelSample(
        prompt_tokens=prompt_tokens,
        n_seq=out.n_seq,
        gen_tokens=gen_tokens,
        rep=rep,
        warmup=warmup,
        step_ms=ns_to_ms(decode_ns) / steps if steps and decode_ns > 0 else None,
        decode_tokens_per_s=per_seq,
        aggregate_decode_tokens_per_s=None if per_seq is None else per_seq * out.n_seq,
        prefill_tokens_per_s=rate_per_s(out.prompt_tokens, out.t_prefill_end_ns - out.t_prefill_start_ns),
        ttft_ms=tuple(ns_to_ms(t - out.t_prefill_start_ns) for t in out.first_token_ns if t),
        itl_ms_p50=p50,
        itl_ms_p95=p95,
        decode_tokens=sum(len(t) for t in out.tokens),
        kv_cache_bytes=out.kv_cache_bytes,
        stop_reason=out.stop_reason,
    )


@dataclass(frozen=True)
class ParallelProgress(SweepProgress):
    """A :class:`SweepProgress` of the parallel sweep: ``sample`` is a :class:`ParallelSample`."""

    sample: ParallelSample  # type: ignore[assignment]  # the parallel sweep's own sample

    def line(self) -> tuple[str, str]:
        """The run as ``(label, figures)`` (:func:`~chatphase.bench.parallel.report.parallel_progress`)."""
        from chatphase.bench.parallel.report import parallel_progress

        return parallel_progress(self.sample)


@dataclass(frozen=True)
class ParallelDone:
    """The sweep is over: cells from the counted samples (those measured so far when ``cancelled``)."""

    cells: tuple[ParallelCell, ...]
    samples: tuple[ParallelSample, ...]
    cancelled: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class ModelFacts:
    """What the step's bytes and FLOPs are made of (``None`` = unknown, e.g. on a remote server)."""

    weight_bytes: int | None
    n_params: int | None
    kv_bytes_per_token: int | None


class ParallelSweep:
    """Run a validated :class:`ParallelPlan` through ``runner``; iterate to drive it (yields
    :class:`ParallelProgress` with a :class:`ParallelSample`, then one :class:`ParallelDone`).

    Args:
        runner: measures one repetition; builder: prompts on the model's vocabulary; facts: for step
            bytes/FLOPs; notes: added to :class:`ParallelDone` (e.g. N values a server cannot run).
    """

    def __init__(
        self,
        runner: BatchRunner,
        builder: PromptBuilder,
        plan: ParallelPlan,
        facts: ModelFacts,
        notes: Sequence[str] = (),
    ) -> None:
        self.runner, self.builder, self.plan, self.facts = runner, builder, plan, facts
        self.notes = tuple(notes)
        self._cancel = threading.Event()

    def cancel(self) -> None:
        """Stop during (through the runner) or after the current repetition. Thread-safe."""
        self._cancel.set()
        self.runner.cancel()

    def __iter__(self) -> Iterator[ParallelProgress | ParallelDone]:
        plan, samples, done = self.plan, [], 0
        for length, n in plan.cells():
            prompts = [self.builder.tokens(length, variant=j) for j in range(n)]
            for i in range(plan.warmup + plan.reps):
                if self._cancel.is_set():
                    break
                warm = i < plan.warmup
                sample = self.runner.run(prompts, plan.gen_tokens)
                if sample.stop_reason == "cancelled":
                    self._cancel.set()
                    break
                sample = replace(sample, rep=i if warm else i - plan.warmup, warmup=warm)
                samples.append(sample)
                done += 1
                yield ParallelProgress(done, plan.total_runs, sample)
            if self._cancel.is_set():
                break
        counted = [s for s in samples if not s.warmup]
        yield ParallelDone(aggregate_parallel(counted, self.facts), tuple(samples), self._cancel.is_set(), self.notes)


def aggregate_parallel(samples: Sequence[ParallelSample], facts: ModelFacts) -> tuple[ParallelCell, ...]:
    """Summarise counted samples per ``(prompt_tokens, n_seq)`` cell, in first-seen order.

    ``ttft_ms`` pools every sequence of every repetition; ``kv_cache_bytes`` is the largest seen;
    ``step_bytes`` / ``step_flops`` follow :func:`~chatphase.models.roofline.step_bytes` at the mean decode
    context ``prompt_tokens + gen_tokens / 2`` and :func:`~chatphase.models.roofline.step_flops` of N tokens.
    """
    groups = group_cells(samples, lambda s: (s.prompt_tokens, s.n_seq))
    cells = []
    for (length, n), group in groups.items():
        gen = group[0].gen_tokens
        weights, per_token = facts.weight_bytes, facts.kv_bytes_per_token
        kv = [s.kv_cache_bytes for s in group if s.kv_cache_bytes is not None]
        cells.append(
            ParallelCell(
                prompt_tokens=length,
                n_seq=n,
                gen_tokens=gen,
                reps=len(group),
                **summarize_metrics(group, PARALLEL_STAT_METRICS),
                kv_cache_bytes=max(kv) if kv else None,
                step_bytes=round(step_bytes(weights, per_token, length + gen / 2, n))
                if weights is not None and per_token is not None
                else None,
                step_flops=None if facts.n_params is None else step_flops(facts.n_params, n),
            )
        )
    return tuple(cells)
