"""The arrivals of a rate and the accounting of what the server made of them (testable with scripted times).

**Arrivals** (:func:`arrival_times_s`): open loop, as ``vllm bench serve`` draws them: the gaps between requests are
Gamma-distributed with shape ``burstiness`` and mean ``1 / rate`` (shape 1: a Poisson process; below 1 burstier,
above 1 more regular), from a seeded generator, so a run can be repeated.

**Per request** (:class:`RequestRecord`, times in ms from the rate's start on the client's clock): ``ttft_ms`` = first
token − send; every gap between its tokens (vLLM's ITL: all gaps kept); ``tpot_ms`` = (last − first token) / (tokens
− 1); ``latency_ms`` = end − send.

**Per rate** (:func:`summarise`): TTFT, ITL (all requests' gaps pooled) and TPOT p50/p90/p99 (linear interpolation
between closest ranks); ``output_tokens_per_s`` = Σ tokens / (the last end − the first send); ``requests_per_s`` =
completed / the same span; ``goodput_requests_per_s`` = completed requests with TTFT ≤ the SLO's ``ttft`` and TPOT ≤ its
``tpot`` / the span (vLLM's ``--goodput``; a bound not given is not checked). Counted beside them, never dropped
silently: ``over_capacity`` (arrived while ``max_concurrency`` requests were in flight: not sent), ``queued`` (sent
while every server slot was busy: waits in the server's queue, its wait in its TTFT), ``failed`` and ``cut`` (still
running when the rate's time ran out or the run was cancelled; hung up, not counted as completed).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise

from chatphase.engine.metrics import gap_percentiles_ms

PERCENTS = (50, 90, 99)


def arrival_times_s(rate: float, count: int, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """``count`` send times in seconds from 0 (the first at its gap), ``rate`` requests/s on average (module doc)."""
    rng = random.Random(f"{seed}:{rate}:{burstiness}")
    t, times = 0.0, []
    for _ in range(count):
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        times.append(t)
    return times


@dataclass(frozen=True)
class RequestRecord:
    """One request (module docstring). ``status``: ``"ok"``, ``"failed"``, ``"cut"`` or ``"over_capacity"``;
    ``queued``: sent while every server slot was busy."""

    index: int
    prompt_tokens: int
    send_ms: float
    token_ms: tuple[float, ...]
    end_ms: float | None
    status: str
    queued: bool = False
    error: str = ""

    @property
    def ttft_ms(self) -> float | None:
        return self.token_ms[0] - self.send_ms if self.token_ms else None

    @property
    def gaps_ms(self) -> list[float]:
        return [b - a for a, b in pairwise(self.token_ms)]

    @property
    def tpot_ms(self) -> float | None:
        n = len(self.token_ms)
        return (self.token_ms[-1] - self.token_ms[0]) / (n - 1) if n >= 2 else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RequestRecord:
        return cls(
            index=int(d["index"]),
            prompt_tokens=int(d["prompt_tokens"]),
            send_ms=float(d["send_ms"]),
            token_ms=tuple(float(t) for t in d["token_ms"]),
            end_ms=None if d.get("end_ms") is None else float(d["end_ms"]),
            status=str(d["status"]),
            queued=bool(d.get("queued", False)),
            error=str(d.get("error", "")),
        )


@dataclass(frozen=True)
class Slo:
    """A service-level objective: ``ttft_ms`` and ``tpot_ms`` bounds (``None``: not checked)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def met(self, record: RequestRecord) -> bool:
        ttft, tpot = record.ttft_ms, record.tpot_ms
        if self.ttft_ms is not None and (ttft is None or ttft > self.ttft_ms):
            return False
        return not (self.tpot_ms is not None and tpot is not None and tpot > self.tpot_ms)


def _pcts(values_ms: Sequence[float]) -> list[float | None]:
    return list(gap_percentiles_ms([round(v * 1e6) for v in values_ms], PERCENTS))


@dataclass(frozen=True)
class RateSummary:
    """One rate's figures (module docstring); ``*_ms`` lists are p50, p90, p99."""

    rate: float
    sent: int
    completed: int
    failed: int
    cut: int
    over_capacity: int
    queued: int
    ttft_ms: list[float | None]
    itl_ms: list[float | None]
    tpot_ms: list[float | None]
    output_tokens_per_s: float | None
    requests_per_s: float | None
    goodput_requests_per_s: float | None
    span_s: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def summarise(rate: float, records: Sequence[RequestRecord], slo: Slo) -> RateSummary:
    """The :class:`RateSummary` of one rate's records (module docstring)."""
    sent = [r for r in records if r.status != "over_capacity"]
    ok = [r for r in sent if r.status == "ok"]
    ends = [r.end_ms for r in ok if r.end_ms is not None]
    span_ms = max(ends) - min(r.send_ms for r in sent) if ends and sent else None
    span_s = span_ms / 1e3 if span_ms else None

    def per_s(count: float) -> float | None:
        return count / span_s if span_s else None

    return RateSummary(
        rate=rate,
        sent=len(sent),
        completed=len(ok),
        failed=sum(r.status == "failed" for r in records),
        cut=sum(r.status == "cut" for r in records),
        over_capacity=len(records) - len(sent),
        queued=sum(r.queued for r in sent),
        ttft_ms=_pcts([t for r in ok if (t := r.ttft_ms) is not None]),
        itl_ms=_pcts([g for r in ok for g in r.gaps_ms]),
        tpot_ms=_pcts([t for r in ok if (t := r.tpot_ms) is not None]),
        output_tokens_per_s=per_s(sum(len(r.token_ms) for r in ok)),
        requests_per_s=per_s(len(ok)),
        goodput_requests_per_s=per_s(sum(slo.met(r) for r in ok)) if slo.ttft_ms or slo.tpot_ms else None,
        span_s=span_s,
    )
