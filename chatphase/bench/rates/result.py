"""The rate sweep's result: per rate its summary, every request's record (every gap kept), and the text forms.

JSON: ``{"kind": "rates", "version", "model", "settings", "cancelled", "label", "summaries": [...], "records":
[[...] per rate]}``; CSV: one row per rate (:data:`CSV_COLUMNS`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from chatphase.bench.core.contract import stamp
from chatphase.bench.core.report import num, render_report
from chatphase.bench.core.results import Labelled, check_saved, header_fields, header_of, malformed, rows_csv
from chatphase.bench.rates.accounting import RateSummary, RequestRecord

HEADERS = [
    "rate/s",
    "sent",
    "done",
    "over cap.",
    "queued",
    "failed+cut",
    "TTFT p50/p90/p99 ms",
    "ITL p50/p90/p99 ms",
    "TPOT p50 ms",
    "out tok/s",
    "req/s",
    "goodput req/s",
]
CSV_COLUMNS = (
    "rate", "sent", "completed", "over_capacity", "queued", "failed", "cut",
    "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p90", "itl_ms_p99",
    "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99", "output_tokens_per_s", "requests_per_s", "goodput_requests_per_s",
)  # fmt: skip


def _three(values: list[float | None]) -> str:
    return "/".join(num(v, 0) for v in values)


def row_cells(s: RateSummary) -> list[str]:
    return [
        f"{s.rate:g}",
        str(s.sent),
        str(s.completed),
        str(s.over_capacity),
        str(s.queued),
        str(s.failed + s.cut),
        _three(s.ttft_ms),
        _three(s.itl_ms),
        num(s.tpot_ms[0]),
        num(s.output_tokens_per_s),
        num(s.requests_per_s, 2),
        num(s.goodput_requests_per_s, 2),
    ]


@dataclass
class RateResult(Labelled):
    """A rate sweep (module docstring)."""

    model: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    cancelled: bool = False
    label: str = ""
    summaries: list[RateSummary] = field(default_factory=list)
    records: list[list[RequestRecord]] = field(default_factory=list)

    kind = "rates"

    def to_dict(self) -> dict:
        return stamp(
            "rates",
            {
                **header_of(self, "model", "settings"),
                "summaries": [s.to_dict() for s in self.summaries],
                "records": [[r.to_dict() for r in rate] for rate in self.records],
            },
        )

    @classmethod
    def from_dict(cls, data: dict) -> RateResult:
        """Inverse of :meth:`to_dict`.

        Raises:
            UsageError: a future version, or not a rate sweep's result.
        """
        check_saved(data, "summaries", "bench --rates")
        try:
            return cls(
                **header_fields(data, "model", "settings"),
                summaries=[RateSummary(**s) for s in data["summaries"]],
                records=[[RequestRecord.from_dict(r) for r in rate] for rate in data.get("records") or []],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise malformed(exc) from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        rows = (
            [s.rate, s.sent, s.completed, s.over_capacity, s.queued, s.failed, s.cut, *s.ttft_ms, *s.itl_ms,
             *s.tpot_ms, s.output_tokens_per_s, s.requests_per_s, s.goodput_requests_per_s]
            for s in self.summaries
        )  # fmt: skip
        return rows_csv(CSV_COLUMNS, rows)

    def render(self, fmt: str) -> str:
        """``table``/``md``: one row per rate, then how it was measured; ``csv``/``json``: the file forms.

        Raises:
            UsageError: for an unknown format.
        """
        return render_report(self, fmt, [(HEADERS, [row_cells(s) for s in self.summaries])], lines=summary_lines)


def summary_lines(result: RateResult) -> list[str]:
    plan = result.settings.get("plan", {})
    engine = result.settings.get("engine", {})
    slo = plan.get("slo") or {}
    bounds = [f"{k.removesuffix('_ms')} ≤ {v:g} ms" for k, v in slo.items() if v is not None]
    lines = [
        f"model {result.model.get('name', '?')} on {engine.get('server') or 'the server'} "
        f"({engine.get('server_kind') or '?'}, {engine.get('total_slots') or '?'} slots); prompts of "
        f"{', '.join(map(str, plan.get('prompt_lengths', [])))} tokens, {plan.get('gen_tokens', '?')} tokens each",
        f"open-loop arrivals: Gamma gaps of shape {plan.get('burstiness', 1):g} (1 = Poisson), at most "
        f"{plan.get('requests', '?')} requests or {plan.get('duration_s', '?')} s per rate, seed {plan.get('seed', 0)}; "
        "client clock; ITL = every gap between tokens (vLLM's), TPOT = (last − first token) / (tokens − 1); "
        "over cap. = arrived with every connection busy, not sent; queued = sent with every server slot busy",
        "goodput: completed requests within " + (", ".join(bounds) if bounds else "no SLO given (--slo ttft=…,tpot=…)"),
    ]
    if result.cancelled:
        lines.append("CANCELLED: partial results")
    return lines
