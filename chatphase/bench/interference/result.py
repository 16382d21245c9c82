"""The interference experiment's result (``chatphase bench --interference``): every run's sample (every gap kept,
its swim-lane timeline), the per-policy rows drawn from them, the mixed step's roofline, and their text forms.

JSON: ``{"kind": "interference", "version", "model", "settings", "system", "roofline", "cancelled", "label",
"samples": [...]}``; CSV: one row per policy (:data:`CSV_COLUMNS`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from chatphase.bench.core.contract import stamp
from chatphase.bench.core.report import mean_sd, num, peak_lines, render_report, setup_line
from chatphase.bench.core.results import Labelled, check_saved, header_fields, header_of, malformed, rows_csv
from chatphase.bench.interference.analysis import InterferenceSample, PolicyRow, Timeline, policy_rows
from chatphase.bench.interference.plan import policy_name

HEADERS = [
    "policy",
    "runs",
    "ITL p50 ms",
    "ITL p99 ms",
    "ITL max ms",
    "stall ms",
    "stall ×",
    "newcomer TTFT ms",
    "aggregate tok/s",
    "prompt step ms",
    "prompt steps",
]

CSV_COLUMNS = (
    "policy", "chunk", "runs", "itl_ms_p50", "itl_ms_p99", "itl_ms_max", "baseline_itl_ms_p50", "stall_ms",
    "stall_ratio", "newcomer_ttft_ms_mean", "newcomer_ttft_ms_sd", "aggregate_decode_tokens_per_s_mean",
    "prompt_step_ms", "prompt_steps", "sub_batches",
)  # fmt: skip


def row_cells(row: PolicyRow) -> list[str]:
    """A policy's table cells, in :data:`HEADERS` order."""
    return [
        policy_name(row.chunk),
        str(row.runs),
        num(row.itl_ms_p50),
        num(row.itl_ms_p99),
        num(row.itl_ms_max),
        num(row.stall_ms),
        num(row.stall_ratio, 2),
        mean_sd(row.newcomer_ttft_ms),
        mean_sd(row.aggregate_decode_tokens_per_s),
        num(row.prompt_step_ms),
        str(row.prompt_steps),
    ]


@dataclass
class InterferenceResult(Labelled):
    """One interference experiment (module docstring). ``label`` names it (the model by default)."""

    model: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    system: dict = field(default_factory=dict)
    roofline: dict = field(default_factory=dict)
    cancelled: bool = False
    label: str = ""
    samples: list[InterferenceSample] = field(default_factory=list)

    kind = "interference"

    def timeline(self, chunk: int | None) -> Timeline | None:
        """The swim lanes of ``chunk``'s last counted run (``None``: the whole prompt first; no such run: ``None``)."""
        runs = [s for s in self.samples if s.chunk == chunk and not s.warmup and s.timeline is not None]
        return runs[-1].timeline if runs else None

    def rows(self) -> list[PolicyRow]:
        """The per-policy rows of the counted samples."""
        return policy_rows(self.samples)

    def to_dict(self) -> dict:
        return stamp(
            "interference",
            {
                **header_of(self, "model", "settings", "system", "roofline"),
                "samples": [s.to_dict() for s in self.samples],
            },
        )

    @classmethod
    def from_dict(cls, data: dict) -> InterferenceResult:
        """Inverse of :meth:`to_dict`.

        Raises:
            UsageError: a future version, or not an interference result.
        """
        check_saved(data, "samples", "bench --interference")
        try:
            return cls(
                **header_fields(data, "model", "settings", "system", "roofline"),
                samples=[InterferenceSample.from_dict(s) for s in data["samples"]],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise malformed(exc) from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        rows = (
            [
                policy_name(r.chunk), r.chunk, r.runs, r.itl_ms_p50, r.itl_ms_p99, r.itl_ms_max,
                r.baseline_itl_ms_p50, r.stall_ms, r.stall_ratio, r.newcomer_ttft_ms.mean, r.newcomer_ttft_ms.sd,
                r.aggregate_decode_tokens_per_s.mean, r.prompt_step_ms, r.prompt_steps, r.sub_batches,
            ]
            for r in self.rows()
        )  # fmt: skip
        return rows_csv(CSV_COLUMNS, rows)

    def render(self, fmt: str) -> str:
        """``table``/``md``: the policies' table, then :func:`summary_lines`; ``csv``/``json``: the file forms.

        Raises:
            UsageError: for an unknown format.
        """
        return render_report(self, fmt, [(HEADERS, [row_cells(r) for r in self.rows()])], lines=summary_lines)


def summary_lines(result: InterferenceResult) -> list[str]:
    """Header, method, the trade-off, the mixed step's roofline and the notes, as sentences."""
    plan = result.settings.get("plan", {})
    engine = result.settings.get("engine", {})
    lines = [
        setup_line(result, "decode steps before the arrival and after the newcomer's first token"),
        method_line(plan, engine),
    ]
    if result.cancelled:
        lines.append("CANCELLED: partial results")
    lines.extend(tradeoff_lines(result.rows()))
    lines.extend(server_prefill_lines(result.samples))
    lines.extend(peak_lines(result.roofline))
    lines.extend((result.roofline or {}).get("interference_lines", []))
    lines.extend(f"note: {n}" for n in result.settings.get("notes", []))
    return lines


def method_line(plan: dict, engine: dict) -> str:
    """How the experiment measured, in one sentence (over a server: its streams on the client's clock)."""
    if engine.get("backend") == "remote":
        return (
            f"interference on the server: {plan.get('n_running', '?')} streams (token-id prompts of "
            f"{plan.get('running_prompt_tokens', '?')} tokens) when a {plan.get('newcomer_tokens', '?')}-token prompt "
            "arrives, batched by the server's own policy; client clock (network included), the newcomer's prefill "
            "also by the server's timings; ITL = every gap of the streams from the arrival to the newcomer's first "
            "token; stall = the longest gap − the median gap before the arrival"
        )
    return (
        f"interference: {plan.get('n_running', '?')} streams decode in one context (their prompts "
        f"{plan.get('running_prompt_tokens', '?')} tokens) when a {plan.get('newcomer_tokens', '?')}-token prompt "
        f"arrives; whole = the prompt alone in n_batch {engine.get('n_batch', '?')} pieces, streams paused; chunk C = "
        "each step one llama_decode of the N decode tokens + C prompt tokens; KV cache unified, n_ubatch "
        f"{engine.get('n_ubatch', '?')}; ITL = every gap of the running streams from the arrival to the newcomer's "
        "first token; stall = the longest gap − the median gap before the arrival"
    )


def tradeoff_lines(rows: list[PolicyRow]) -> list[str]:
    """The stall against the newcomer's TTFT, smallest chunk to the whole prompt, in one sentence."""
    shown = [r for r in rows if r.stall_ms is not None and r.newcomer_ttft_ms.mean is not None]
    if len(shown) < 2:
        return []
    shown.sort(key=lambda r: float("inf") if r.chunk is None else r.chunk)
    parts = ", ".join(
        f"{policy_name(r.chunk)}: stall {r.stall_ms:.0f} ms, TTFT {r.newcomer_ttft_ms.mean:.0f} ms" for r in shown
    )
    return [f"trade-off (smaller chunks: shorter stalls, later first token): {parts}"]


def server_prefill_lines(samples: list[InterferenceSample]) -> list[str]:
    """Over a server: the newcomer's prefill by the server's own timings beside its TTFT on the client's clock."""
    pairs = [(s.server_prompt_ms, s.newcomer_ttft_ms) for s in samples if not s.warmup and s.server_prompt_ms]
    known = [(p, t) for p, t in pairs if t is not None]
    if not known:
        return []
    prompt = sum(p for p, _ in known) / len(known)
    ttft = sum(t for _, t in known) / len(known)
    return [
        f"the newcomer's prefill by the server's timings (prompt_ms): {prompt:,.0f} ms; its TTFT on this client's "
        f"clock: {ttft:,.0f} ms (network, queueing and the running streams' steps between its chunks make the rest)"
    ]
