"""The accounting of one interference run, from its token times and steps alone (testable with scripted times).

Lanes ``0 … N-1`` are the running streams, lane ``N`` the newcomer; ``arrival`` is the end of the last step before
the newcomer's prompt (:class:`~chatphase.engine.interference.InterferenceOutcome`). A running stream's **gap** is the
time between two of its tokens (vLLM's ITL: every gap kept, never a mean):

- the **baseline** gaps end at or before the arrival;
- the **window** gaps end after the arrival and start before the newcomer's first token: the gaps its prompt
  could stretch (the one spanning a whole-prompt prefill, or each mixed step's);
- ``itl_ms_p50/p99/max`` are the window gaps' (linear interpolation between closest ranks,
  :func:`~chatphase.engine.metrics.gap_percentiles_ms`); the **stall** is the longest window gap less the baseline's
  median (``stall_ms``) and as a multiple of it (``stall_ratio``, Sarathi-Serve's "× longer");
- ``newcomer_ttft_ms`` = its first token − the arrival;
- ``aggregate_decode_tokens_per_s`` = every token sampled after the arrival (the newcomer's included) / (the last
  token − the arrival);
- ``prompt_step_ms``: the mean time of the steps that held prompt tokens (its steps' bound is the roofline's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise

from chatphase.engine.interference import InterferenceOutcome
from chatphase.engine.metrics import gap_percentiles_ms, ns_to_ms, rate_per_s
from chatphase.timing.stats import Stats, summarize


@dataclass(frozen=True)
class Timeline:
    """One run as swim lanes, in ms from the run's start: ``lanes[j]`` lane j's token times; ``blocks`` each
    prompt-holding step as ``(start_ms, end_ms, prompt_tokens)``; ``arrival_ms`` the newcomer's arrival."""

    lanes: tuple[tuple[float, ...], ...]
    blocks: tuple[tuple[float, float, int], ...]
    arrival_ms: float

    def to_dict(self) -> dict:
        return {"lanes": [list(x) for x in self.lanes], "blocks": [list(b) for b in self.blocks],
                "arrival_ms": self.arrival_ms}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> Timeline:
        return cls(
            lanes=tuple(tuple(float(t) for t in lane) for lane in data["lanes"]),
            blocks=tuple((float(b[0]), float(b[1]), int(b[2])) for b in data["blocks"]),
            arrival_ms=float(data["arrival_ms"]),
        )


@dataclass(frozen=True)
class InterferenceSample:
    """One run of one policy (module docstring); ``chunk`` ``None`` = the whole prompt first. ``window_gaps_ms``
    and ``baseline_gaps_ms`` keep every gap. ``None``: undefined (e.g. cancelled before the newcomer's first token)."""

    chunk: int | None
    rep: int
    warmup: bool
    n_running: int
    newcomer_tokens: int
    baseline_gaps_ms: tuple[float, ...]
    window_gaps_ms: tuple[float, ...]
    newcomer_ttft_ms: float | None
    aggregate_decode_tokens_per_s: float | None
    prompt_steps: int
    prompt_step_ms: float | None
    sub_batches: int
    stop_reason: str = "length"
    timeline: Timeline | None = field(default=None, compare=False)
    server_prompt_ms: float | None = None  # over --server: the newcomer's prefill by the server's own timings

    @property
    def itl_ms(self) -> tuple[float | None, float | None, float | None]:
        """The window gaps' p50, p99 and max."""
        return percentiles_ms(self.window_gaps_ms)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["timeline"] = self.timeline.to_dict() if self.timeline else None
        return d

    @classmethod
    def from_dict(cls, data: dict) -> InterferenceSample:
        timeline = data.get("timeline")
        return cls(
            chunk=None if data["chunk"] is None else int(data["chunk"]),
            rep=int(data["rep"]),
            warmup=bool(data["warmup"]),
            n_running=int(data["n_running"]),
            newcomer_tokens=int(data["newcomer_tokens"]),
            baseline_gaps_ms=tuple(float(g) for g in data["baseline_gaps_ms"]),
            window_gaps_ms=tuple(float(g) for g in data["window_gaps_ms"]),
            newcomer_ttft_ms=_opt(data.get("newcomer_ttft_ms")),
            aggregate_decode_tokens_per_s=_opt(data.get("aggregate_decode_tokens_per_s")),
            prompt_steps=int(data["prompt_steps"]),
            prompt_step_ms=_opt(data.get("prompt_step_ms")),
            sub_batches=int(data.get("sub_batches", 1)),
            stop_reason=str(data.get("stop_reason", "length")),
            timeline=Timeline.from_dict(timeline) if timeline else None,
            server_prompt_ms=_opt(data.get("server_prompt_ms")),
        )


def _opt(value) -> float | None:
    return None if value is None else float(value)


def percentiles_ms(gaps_ms: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """p50, p99 and max of gaps in ms (as :func:`~chatphase.engine.metrics.gap_percentiles_ms`)."""
    p50, p99, top = gap_percentiles_ms([round(g * 1e6) for g in gaps_ms], (50, 99, 100))
    return p50, p99, top


def stall(baseline_gaps_ms: Sequence[float], window_gaps_ms: Sequence[float]) -> tuple[float | None, float | None]:
    """``(stall_ms, stall_ratio)``: the longest window gap less the baseline's median, and over it (module
    docstring); ``None`` without a gap on either side."""
    base = percentiles_ms(baseline_gaps_ms)[0]
    if base is None or not window_gaps_ms:
        return None, None
    top = max(window_gaps_ms)
    return top - base, (top / base if base > 0 else None)


def analyse(outcome: InterferenceOutcome, rep: int = 0, warmup: bool = False) -> InterferenceSample:
    """The sample of one run (module docstring)."""
    n, arrival = outcome.n_running, outcome.t_arrival_ns
    lanes = outcome.token_ns
    newcomer = lanes[n] if len(lanes) > n else ()
    first = newcomer[0] if newcomer else None
    baseline, window = [], []
    for times in lanes[:n]:
        for a, b in pairwise(times):
            if b <= arrival:
                baseline.append(ns_to_ms(b - a))
            elif first is None or a < first:
                window.append(ns_to_ms(b - a))
    after = [t for times in lanes for t in times if t > arrival]
    end = max(after, default=arrival)
    prompt_steps = [s for s in outcome.steps if s.prompt_tokens]
    t0 = outcome.t_start_ns
    timeline = Timeline(
        lanes=tuple(tuple(ns_to_ms(t - t0) for t in times) for times in lanes),
        blocks=tuple((ns_to_ms(s.t_start_ns - t0), ns_to_ms(s.t_end_ns - t0), s.prompt_tokens) for s in prompt_steps),
        arrival_ms=ns_to_ms(arrival - t0),
    )
    return InterferenceSample(
        chunk=outcome.chunk,
        rep=rep,
        warmup=warmup,
        n_running=n,
        newcomer_tokens=outcome.newcomer_prompt_tokens,
        baseline_gaps_ms=tuple(baseline),
        window_gaps_ms=tuple(window),
        newcomer_ttft_ms=None if first is None else ns_to_ms(first - arrival),
        aggregate_decode_tokens_per_s=rate_per_s(len(after), end - arrival),
        prompt_steps=len(prompt_steps),
        prompt_step_ms=ns_to_ms(sum(s.t_end_ns - s.t_start_ns for s in prompt_steps)) / len(prompt_steps)
        if prompt_steps
        else None,
        sub_batches=max((s.sub_batches for s in prompt_steps), default=1),
        stop_reason=outcome.stop_reason,
        timeline=timeline,
    )


@dataclass(frozen=True)
class PolicyRow:
    """One policy over its counted runs: every run's gaps pooled (p50/p99/max, the stall), the newcomer's TTFT and
    the aggregate rate as mean ± sd (:func:`~chatphase.timing.stats.summarize`)."""

    chunk: int | None
    runs: int
    itl_ms_p50: float | None
    itl_ms_p99: float | None
    itl_ms_max: float | None
    baseline_itl_ms_p50: float | None
    stall_ms: float | None
    stall_ratio: float | None
    newcomer_ttft_ms: Stats
    aggregate_decode_tokens_per_s: Stats
    prompt_step_ms: float | None
    prompt_steps: int
    sub_batches: int


def policy_rows(samples: Sequence[InterferenceSample]) -> list[PolicyRow]:
    """A :class:`PolicyRow` per policy of the counted samples, in first-seen order."""
    rows = []
    for chunk in dict.fromkeys(s.chunk for s in samples if not s.warmup):
        group = [s for s in samples if s.chunk == chunk and not s.warmup]
        window = [g for s in group for g in s.window_gaps_ms]
        baseline = [g for s in group for g in s.baseline_gaps_ms]
        p50, p99, top = percentiles_ms(window)
        stall_ms, ratio = stall(baseline, window)
        steps = [s.prompt_step_ms for s in group if s.prompt_step_ms is not None]
        rows.append(
            PolicyRow(
                chunk=chunk,
                runs=len(group),
                itl_ms_p50=p50,
                itl_ms_p99=p99,
                itl_ms_max=top,
                baseline_itl_ms_p50=percentiles_ms(baseline)[0],
                stall_ms=stall_ms,
                stall_ratio=ratio,
                newcomer_ttft_ms=summarize(s.newcomer_ttft_ms for s in group),
                aggregate_decode_tokens_per_s=summarize(s.aggregate_decode_tokens_per_s for s in group),
                prompt_step_ms=sum(steps) / len(steps) if steps else None,
                prompt_steps=max((s.prompt_steps for s in group), default=0),
                sub_batches=max((s.sub_batches for s in group), default=1),
            )
        )
    return rows
