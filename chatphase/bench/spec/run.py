"""The Speculative tab's runner API: :func:`~chatphase.bench.spec.arms.iter_runs` then
:func:`~chatphase.bench.spec.arms.verify_cost` as picklable events for a child process
(:class:`~chatphase.bench.core.job.SpecJob`), and the result it saves.
"""

from __future__ import annotations

import csv
import io
import json
import threading
from dataclasses import dataclass, replace

from chatphase.bench.core.contract import Done, check_format, saved_version, stamp
from chatphase.bench.core.events import BenchStatus
from chatphase.bench.core.experiment import gen_field, plan_field, reps_field
from chatphase.bench.core.job import ExperimentJob
from chatphase.bench.spec.arms import (
    PROMPTS,
    SpecSample,
    collect,
    format_costs,
    format_rows,
    iter_runs,
    parse_arms,
    summary_rows,
    verify_cost,
    with_off,
)
from chatphase.engine.config import EngineConfig
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import ModelInfo

#: the text forms of a speculative result.
SPEC_FORMATS = ("table", "csv", "json")


def mode_list(text: str) -> tuple[str, ...]:
    """``"off,lookup"`` -> ``("off", "lookup")`` (each mode is checked by :meth:`SpecPlan.validate`)."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


@dataclass(frozen=True)
class SpecPlan:
    """What the Experiments screen's Speculative tab runs: the arms (:func:`with_off`), ``reps`` over
    :data:`PROMPTS`, ``max_tokens`` per reply, then the verify-cost sweep for k in ``ks`` at ``depth``."""

    specs: tuple[str, ...] = plan_field(
        flag="--spec", metavar="off,lookup,auto,draft:MODEL", parse=mode_list, label="Modes",
        form=("off", "lookup", "auto"), width="exp-smodes-field",
        help="instead: decode modes side by side (off is always one: the ratios are to it)",
    )  # fmt: skip
    reps: int = reps_field(3, form=2)
    max_tokens: int = gen_field(160, label="Reply tokens")
    depth: int = 256
    ks: tuple[int, ...] = tuple(range(1, 17))
    warmup: int = 0

    @property
    def total_runs(self) -> int:
        return len(self.specs) * len(PROMPTS) * self.reps

    def validate(self, n_ctx: int | None, n_batch: int | None = None) -> SpecPlan:
        """``self`` when it can run in ``n_ctx`` (and ``n_batch``, when given).

        Raises:
            UsageError: no arms, reps or reply tokens under 1, or a verify step that does not fit.
        """
        if not self.specs:
            raise UsageError("Modes: list one or more of off, lookup, auto, draft:MODEL")
        self = replace(self, specs=tuple(with_off(parse_arms(",".join(self.specs)))))
        if self.reps < 1 or self.max_tokens < 1:
            raise UsageError("Reps and Reply tokens must be 1 or more")
        if (n_ctx is not None and self.depth + max(self.ks) > n_ctx) or max(self.ks) > (n_batch or max(self.ks)):
            raise UsageError(
                f"the verify-cost sweep needs n_ctx ≥ {self.depth + max(self.ks)} and n_batch ≥ {max(self.ks)}"
            )
        return self

    def to_dict(self) -> dict:
        return {"specs": list(self.specs), "reps": self.reps, "max_tokens": self.max_tokens, "depth": self.depth}


@dataclass(frozen=True)
class SpecProgress:
    """One run of a :class:`SpecRun` has ended: the ``done_runs``-th of ``total_runs``."""

    done_runs: int
    total_runs: int
    sample: SpecSample

    #: every run counts (no warm-ups)
    counted = True

    def line(self) -> tuple[str, str]:
        """The run as ``(label, figures)``: ``("lookup · input-grounded prompt 2/4 · rep 1", "41.0 tok/s · 60%
        accepted · 2.10 tok/step")`` (the CLI's progress and the Speculative tab's)."""
        s = self.sample
        figures = f"{s.decode_tokens_per_s:.1f} tok/s"
        if s.acceptance is not None:
            figures += f" · {s.acceptance:.0%} accepted · {s.tokens_per_step:.2f} tok/step"
        return f"{s.spec} · {s.kind} prompt {s.prompt + 1}/{len(PROMPTS)} · rep {s.rep + 1}", figures


@dataclass
class SpecResult:
    """A :class:`SpecRun`'s outcome: :func:`summary_rows`, the verify-step ms by k (empty when cancelled
    before it), the plan, and whether it was cancelled. Saved as JSON or CSV (the rows)."""

    rows: list[dict]
    costs_ms: dict[int, float]
    plan: dict
    cancelled: bool = False

    kind = "spec"

    def to_dict(self) -> dict:
        costs = {str(k): ms for k, ms in self.costs_ms.items()}
        return stamp(
            "spec", {"plan": self.plan, "rows": self.rows, "verify_step_ms": costs, "cancelled": self.cancelled}
        )

    @classmethod
    def from_dict(cls, data: dict) -> SpecResult:
        """Inverse of :meth:`to_dict`.

        Raises:
            UsageError: a future version, or not a speculative result.
        """
        saved_version(data)
        try:
            costs = {int(k): float(v) for k, v in (data.get("verify_step_ms") or {}).items()}
            rows = [dict(r) for r in data["rows"]]
            return cls(rows, costs, dict(data.get("plan") or {}), bool(data.get("cancelled", False)))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise UsageError("malformed speculative result (is it a chatphase bench --spec file?)") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def render(self, fmt: str) -> str:
        """``table``: the arms' rows and the verify-step cost; ``json``, ``csv``: the file forms.

        Raises:
            UsageError: another format (:data:`SPEC_FORMATS`).
        """
        if check_format(fmt, SPEC_FORMATS) == "json":
            return self.to_json()
        if fmt == "csv":
            return self.to_csv()
        costs = format_costs(self.costs_ms) if self.costs_ms else "(not measured: cancelled)"
        cancelled = "\nCANCELLED: partial results\n" if self.cancelled else ""
        depth = self.plan.get("depth", 256)
        return f"{format_rows(self.rows)}\n\nverify-step cost ({depth} tokens cached)\n{costs}\n{cancelled}"

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(self.rows[0]) if self.rows else ["spec"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        return out.getvalue()


@dataclass(frozen=True)
class SpecDone(Done):
    """The run is over; ``result`` holds what was measured (``result.cancelled`` when stopped early)."""

    result: SpecResult


class SpecRun:
    """:func:`iter_runs` then :func:`verify_cost` as events, for a child process
    (:class:`~chatphase.bench.core.job.SpecJob`): ``BenchStatus``, a :class:`SpecProgress` per run, then
    :class:`SpecDone`. :meth:`cancel` (any thread) ends it after the current run, keeping the runs so far
    (the verify-cost sweep is skipped). ``engine_factory`` and ``cost`` replace the real ones in tests.

    Raises (while iterating):
        EngineError: an arm fails to load or run.
    """

    def __init__(self, info, config: EngineConfig, plan: SpecPlan, engine_factory=None, cost=None) -> None:
        self.info, self.config, self.plan = info, replace(config, spec="off"), plan
        self.engine_factory, self.cost = engine_factory, cost or verify_cost
        self._cancel = threading.Event()
        self._samples: list[SpecSample] = []

    def cancel(self) -> None:
        self._cancel.set()

    def partial_done(self) -> SpecDone | None:
        """:meth:`partial` (the name every run's partial result has)."""
        return self.partial()

    def partial(self) -> SpecDone | None:
        """The runs so far as a cancelled result (no verify cost), while the run may still go on in another
        thread; ``None`` before the first run ended."""
        samples = list(self._samples)
        if not samples:
            return None
        return SpecDone(SpecResult(summary_rows(collect(samples)), {}, self.plan.to_dict(), cancelled=True))

    def __iter__(self):
        plan, samples = self.plan, self._samples
        samples.clear()
        yield BenchStatus(f"loading {len(plan.specs)} arms: {', '.join(plan.specs)}")
        runs = iter_runs(self.info, self.config, plan.specs, plan.reps, plan.max_tokens, self._cancel.is_set,
                         self.engine_factory)  # fmt: skip
        for sample in runs:
            samples.append(sample)
            yield SpecProgress(len(samples), plan.total_runs, sample)
        costs = {}
        if not self._cancel.is_set():
            yield BenchStatus(f"verify-step cost, k = {min(plan.ks)}…{max(plan.ks)}")
            costs = self.cost(self.info, self.config, depth=plan.depth, ks=plan.ks)
        result = SpecResult(summary_rows(collect(samples)), costs, plan.to_dict(), self._cancel.is_set())
        yield SpecDone(result)


def make_run(
    info: ModelInfo, config: EngineConfig, plan: SpecPlan, roofline: bool, log_path: str | None, **options
) -> SpecRun:
    """The child's run of a :func:`SpecJob` (no roofline: the arms are compared with each other)."""
    return SpecRun(info, config, plan, **options)


def SpecJob(info: ModelInfo, config: EngineConfig, plan: SpecPlan, log_path: str | None = None) -> ExperimentJob:
    """Decode modes side by side (:class:`SpecRun`) in a child process: its events are ``BenchStatus``,
    ``SpecProgress``, then ``SpecDone`` or ``BenchFailed``.

    Raises:
        UsageError: when the plan does not fit ``config``'s n_ctx and n_batch.
    """
    return ExperimentJob(info, config, plan, make_run, roofline=False, log_path=log_path)
