"""The sweep's measuring loop over prompt lengths and context depths, through an engine (llama-bench's method).

For each prompt length ``L`` (a ``"prompt"`` cell): ``warmup`` uncounted runs, then ``reps`` runs, each
one turn ``TurnRequest(prompt_token_ids=<exactly L tokens>, reset_cache=True, ignore_eos=True,
sampling=SamplingParams(max_tokens=gen, temperature=0))`` — the KV cache is cleared before every
repetition, so each one is a cold prefill of ``L`` tokens followed by ``gen`` decoded tokens.

For each depth ``D`` (a ``"depth"`` cell): a priming turn with ``D`` tokens (``reset_cache=True``,
``max_tokens=1``) fills the cache, then the measured turn sends those ``D`` tokens extended by
``extend_tokens`` more; the engine reuses the cached prefix, evaluates only the extension and decodes
``gen`` tokens at depth ``D``. Depth 0 is a single cold turn of ``extend_tokens`` tokens.

Metrics are read from ``TurnFinished.metrics`` (``docs/metrics.md``), so ``bench`` and the chat dashboard
measure the same way. :class:`Sweep` is an iterator of :class:`SweepProgress` events ending in one
:class:`SweepDone`; :meth:`Sweep.cancel` may be called from another thread.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from chatphase.bench.core.contract import check_repetitions
from chatphase.bench.core.experiment import count_list, gen_field, plan_field, reps_field, warmup_field
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.core.results import STAT_METRICS, CellKind, CellResult, Sample
from chatphase.engine.base import Engine
from chatphase.engine.events import (
    EngineFailed,
    SamplingParams,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.metrics import TurnMetrics
from chatphase.errors import EngineError, UsageError
from chatphase.timing.stats import group_cells, summarize_metrics

DEFAULT_PROMPT_LENGTHS = (64, 256, 1024)
DEFAULT_DEPTHS = (0, 1024)


@dataclass(frozen=True)
class SweepPlan:
    """What to measure: prompt lengths and depths (tokens), ``gen_tokens`` decoded per run, ``reps``
    counted runs and ``warmup`` uncounted runs per cell, ``extend_tokens`` evaluated on top of a depth."""

    #: the form's order of the knobs
    FORM = ("prompt_lengths", "depths", "reps", "gen_tokens")

    prompt_lengths: tuple[int, ...] = plan_field(
        DEFAULT_PROMPT_LENGTHS, flag="--prompt-lengths", metavar="N,N,...", parse=count_list, label="Prompt lengths",
        help="prompt lengths in tokens ('none' to skip)",
    )  # fmt: skip
    depths: tuple[int, ...] = plan_field(
        DEFAULT_DEPTHS, flag="--depths", metavar="N,N,...", parse=count_list, label="Depths",
        help="KV cache depths in tokens for decode speed ('none' to skip)",
    )  # fmt: skip
    gen_tokens: int = gen_field()
    reps: int = reps_field()
    warmup: int = warmup_field()
    extend_tokens: int = 4

    def validate(self, n_ctx: int | None, n_batch: int | None = None) -> SweepPlan:
        """Check the plan against the context size before any work; returns ``self``. (``n_batch`` does not
        bound it: a prompt is evaluated in batches; ``n_ctx=None`` skips the context checks.)

        Raises:
            UsageError: zero reps, negative warm-up, ``gen_tokens < 1``, nothing to measure, or a prompt
                (or depth) that does not leave room for ``gen_tokens`` in ``n_ctx``.
        """
        check_repetitions(self.reps, self.warmup, self.gen_tokens)
        if not self.prompt_lengths and not self.depths:
            raise UsageError("nothing to measure: give --prompt-lengths and/or --depths")
        n_ctx = n_ctx if n_ctx is not None else sys.maxsize
        for n in self.prompt_lengths:
            if n < 1:
                raise UsageError(f"prompt lengths must be at least 1 token (got {n})")
            if n >= n_ctx:
                raise UsageError(f"prompt length {n} must be below n_ctx {n_ctx} (raise --n-ctx)")
            if n + self.gen_tokens > n_ctx:
                raise UsageError(f"prompt length {n} + {self.gen_tokens} generated tokens exceed n_ctx {n_ctx}")
        for d in self.depths:
            if d < 0:
                raise UsageError(f"depths must be 0 or more tokens (got {d})")
            if d + self.extend_tokens + self.gen_tokens > n_ctx:
                raise UsageError(
                    f"depth {d} + {self.extend_tokens} prompt + {self.gen_tokens} generated tokens exceed n_ctx {n_ctx}"
                )
        return self

    def cells(self) -> list[tuple[CellKind, int, int]]:
        """``(kind, prompt_tokens, depth)`` of every cell, prompt cells first, duplicates dropped."""
        out: list[tuple[CellKind, int, int]] = []
        for n in dict.fromkeys(self.prompt_lengths):
            out.append(("prompt", n, 0))
        for d in dict.fromkeys(self.depths):
            out.append(("depth", d + self.extend_tokens, d))
        return out

    @property
    def total_runs(self) -> int:
        """Runs the sweep performs (warm-ups included); one depth run counts once."""
        return len(self.cells()) * (self.reps + self.warmup)

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {
            "prompt_lengths": list(self.prompt_lengths),
            "depths": list(self.depths),
            "gen_tokens": self.gen_tokens,
            "reps": self.reps,
            "warmup": self.warmup,
            "extend_tokens": self.extend_tokens,
        }


@dataclass(frozen=True)
class SweepProgress:
    """``done_runs`` of ``total_runs`` finished; ``sample`` is the run just measured (``warmup`` flagged): a
    :class:`Sample` (the parallel sweep's :class:`~chatphase.bench.parallel.sweep.ParallelProgress` holds its own)."""

    done_runs: int
    total_runs: int
    sample: Sample

    @property
    def counted(self) -> bool:
        """Not a warm-up."""
        return not self.sample.warmup

    def line(self) -> tuple[str, str]:
        """The run as ``(label, figures)`` (:func:`~chatphase.bench.core.report.sample_progress`)."""
        from chatphase.bench.core.report import sample_progress

        return sample_progress(self.sample)


@dataclass(frozen=True)
class SweepDone:
    """The sweep is over: cells summarised from the counted samples; ``cancelled`` when stopped early
    (cells then hold the repetitions measured so far)."""

    cells: tuple[CellResult, ...]
    samples: tuple[Sample, ...]
    cancelled: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)


SweepEvent = SweepProgress | SweepDone


class Sweep:
    """Run a :class:`SweepPlan` on a loaded engine; iterate to drive it.

    Args:
        engine: a loaded :class:`~chatphase.engine.base.Engine` (``LlamaEngine`` for ``bench``).
        builder: prompt builder with the same model's tokenizer.
        plan: a validated plan.

    Iterating raises :class:`~chatphase.errors.EngineError` when the engine reports a failure.
    """

    def __init__(self, engine: Engine, builder: PromptBuilder, plan: SweepPlan) -> None:
        self.engine = engine
        self.builder = builder
        self.plan = plan
        self._cancel = threading.Event()
        self._turn_id = 0
        self.samples: list[Sample] = []  # every run measured so far (warm-ups too), for a partial result
        self.notes: list[str] = []

    def cancel(self) -> None:
        """Stop after (or, through the engine, during) the current turn. Thread-safe."""
        self._cancel.set()
        self.engine.cancel()

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancel.is_set()

    def __iter__(self) -> Iterator[SweepEvent]:
        plan = self.plan
        samples, notes = self.samples, self.notes
        done, total = 0, plan.total_runs
        for kind, prompt_tokens, depth in plan.cells():
            for i in range(plan.warmup + plan.reps):
                if self.cancelled:
                    break
                sample = self.measure_once(kind, prompt_tokens, depth, i, notes)
                if sample is None:
                    break
                samples.append(sample)
                done += 1
                yield SweepProgress(done, total, sample)
            if self.cancelled:
                break
        yield self.partial(self.cancelled)

    def partial(self, cancelled: bool = True) -> SweepDone:
        """The runs measured so far as a :class:`SweepDone` (safe to call from another thread meanwhile)."""
        samples = list(self.samples)
        counted = [s for s in samples if not s.warmup]
        return SweepDone(
            aggregate(counted, self.plan.gen_tokens), tuple(samples), cancelled, tuple(dict.fromkeys(self.notes))
        )

    def measure_once(self, kind: CellKind, prompt_tokens: int, depth: int, i: int, notes: list[str]) -> Sample | None:
        """Run one repetition ``i`` of a cell (the first ``plan.warmup`` are warm-ups) and return its sample;
        ``None`` once cancelled. A depth run that did not reuse its cached prefix adds a line to ``notes``."""
        warm = i < self.plan.warmup
        rep = i - self.plan.warmup if not warm else i
        metrics = self._run_cell_once(kind, prompt_tokens, depth)
        if metrics is None or metrics.stop_reason == "cancelled":
            self._cancel.set()  # also when the engine was cancelled by someone else
            return None
        sample = _sample(kind, prompt_tokens, depth, rep, warm, metrics)
        if kind == "depth" and depth and sample.cached_tokens != depth and not warm:
            notes.append(f"depth {depth}: engine reused {sample.cached_tokens} cached tokens, not {depth}")
        return sample

    def _run_cell_once(self, kind: CellKind, prompt_tokens: int, depth: int) -> TurnMetrics | None:
        gen = self.plan.gen_tokens
        if kind == "prompt" or depth == 0:
            return self._turn(self.builder.tokens(prompt_tokens), reset=True, max_tokens=gen)
        prime = self.builder.tokens(depth)
        primed = self._turn(prime, reset=True, max_tokens=1)
        if primed is None or primed.stop_reason == "cancelled":
            return primed
        return self._turn(self.builder.extend(prime, prompt_tokens - depth), reset=False, max_tokens=gen)

    def _turn(self, tokens: Sequence[int], *, reset: bool, max_tokens: int) -> TurnMetrics | None:
        self._turn_id += 1
        request = TurnRequest(
            turn_id=self._turn_id,
            prompt_token_ids=tuple(tokens),
            reset_cache=reset,
            ignore_eos=True,
            sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        )
        finished: TurnMetrics | None = None
        for event in self.engine.run_turn(request):
            if isinstance(event, EngineFailed):
                raise EngineError(f"engine failed during the sweep: {event.message}")
            if isinstance(event, TurnFinished):
                finished = event.metrics
        if finished is None and not self.cancelled:
            raise EngineError("the engine ended a turn without reporting its metrics")
        return finished


def _sample(kind: CellKind, prompt_tokens: int, depth: int, rep: int, warm: bool, m: TurnMetrics) -> Sample:
    return Sample(
        kind=kind,
        prompt_tokens=prompt_tokens,
        depth=depth,
        rep=rep,
        warmup=warm,
        ttft_ms=m.ttft_ms,
        prefill_tokens_per_s=m.prefill_tokens_per_s,
        decode_tokens_per_s=m.decode_tokens_per_s,
        tpot_ms=m.tpot_ms,
        prefill_tokens=m.prefill_tokens,
        cached_tokens=m.cached_tokens,
        decode_tokens=m.decode_tokens,
        kv_cache_bytes=m.kv_cache_bytes,
        stop_reason=m.stop_reason,
    )


def aggregate(samples: Sequence[Sample], gen_tokens: int) -> tuple[CellResult, ...]:
    """Summarise counted samples per ``(kind, prompt_tokens, depth)`` cell, in first-seen order.

    ``kv_cache_bytes`` is the largest seen in the cell (the cache after the measured turn).
    """
    groups = group_cells(samples, lambda s: (s.kind, s.prompt_tokens, s.depth))
    return tuple(
        CellResult(
            kind=kind,
            prompt_tokens=n,
            depth=d,
            gen_tokens=gen_tokens,
            reps=len(group),
            **summarize_metrics(group, STAT_METRICS),
            kv_cache_bytes=max((s.kv_cache_bytes for s in group if s.kv_cache_bytes is not None), default=None),
        )
        for (kind, n, d), group in groups.items()
    )
