"""The parallel-decode sweep's result (``chatphase bench --parallel``): its cells, samples and per-N roofline, and
their text, file and plot forms, through the core's shared report, statistics and plot helpers.

JSON: ``{"kind": "parallel", "version", "model", "settings", "system", "roofline", "cancelled", "label",
"parallel": [cells], "parallel_samples": [samples], "results": []}`` (the empty ``results`` keeps the file
readable by a chatphase from before results carried a ``kind``, which read it as a sweep's). Files written before results carried a ``kind`` were a
sweep's result whose ``results`` list was empty and whose ``parallel`` list held the cells: :meth:`from_dict`
reads those too. CSV: one row per cell, :data:`~chatphase.bench.parallel.records.PARALLEL_CSV_COLUMNS`
(each row of kind ``"parallel"``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from chatphase.bench.core.contract import stamp
from chatphase.bench.core.report import mean_sd, median_range, peak_lines, render_report, setup_line
from chatphase.bench.core.results import Labelled, cells_csv, check_saved, header_fields, header_of, malformed
from chatphase.bench.parallel.records import PARALLEL_CSV_COLUMNS, ParallelCell, ParallelSample
from chatphase.bench.parallel.report import parallel_headers, parallel_rows


@dataclass
class ParallelResult(Labelled):
    """One parallel-decode sweep: ``parallel`` (its cells), ``parallel_samples`` (its repetitions) and the per-N
    roofline, with the model, settings and system facts every result records. ``label`` names it in overlays
    (the model name by default)."""

    model: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    system: dict = field(default_factory=dict)
    roofline: dict = field(default_factory=dict)
    cancelled: bool = False
    label: str = ""
    parallel: list[ParallelCell] = field(default_factory=list)
    parallel_samples: list[ParallelSample] = field(default_factory=list)

    kind = "parallel"

    def to_dict(self) -> dict:
        """The JSON object (see the module docstring)."""
        return stamp(
            "parallel",
            {
                **header_of(self, "model", "settings", "system", "roofline"),
                "parallel": [c.to_dict() for c in self.parallel],
                "parallel_samples": [s.to_dict() for s in self.parallel_samples],
                "results": [],  # no sweep cells: an older chatphase reads the file (see the module docstring)
            },
        )

    @classmethod
    def from_dict(cls, data: dict) -> ParallelResult:
        """Inverse of :meth:`to_dict`; also an older file's sweep-shaped object holding parallel cells.

        Raises:
            UsageError: a future version, or not a parallel sweep's result.
        """
        check_saved(data, "parallel", "bench --parallel")
        try:
            return cls(
                **header_fields(data, "model", "settings", "system", "roofline"),
                parallel=[ParallelCell.from_dict(c) for c in data["parallel"]],
                parallel_samples=[ParallelSample.from_dict(s) for s in data.get("parallel_samples") or []],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise malformed(exc) from None

    def to_json(self) -> str:
        """Indented JSON text."""
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        """CSV text, one row per cell, the columns :data:`PARALLEL_CSV_COLUMNS`."""
        return cells_csv(PARALLEL_CSV_COLUMNS, self.parallel)

    def render(self, fmt: str) -> str:
        """Text in ``fmt`` (table, md, csv, json): two tables of the cells (mean ± sd; median and min–max), then
        :func:`summary_lines`.

        Raises:
            UsageError: for an unknown format.
        """
        tables = [
            (parallel_headers("mean ± sd"), parallel_rows(self.parallel, mean_sd)),
            (parallel_headers("median (min–max)"), parallel_rows(self.parallel, median_range)),
        ]
        return render_report(self, fmt, tables, lines=summary_lines)


def summary_lines(result: ParallelResult) -> list[str]:
    """Header, method, peaks, the per-N verdicts and the run's notes as plain sentences."""
    lines = [setup_line(result, "steps"), method_line(result)]
    if result.cancelled:
        lines.append("CANCELLED: partial results")
    lines.extend(peak_lines(result.roofline))
    lines.extend((result.roofline or {}).get("parallel_verdicts", []))
    lines.extend(f"note: {n}" for n in result.settings.get("notes", []))
    return lines


def method_line(result: ParallelResult) -> str:
    """How the parallel sweep measured, in one sentence (remote: concurrent streams; local: one batch)."""
    plan = result.settings.get("plan", {})
    ns = ", ".join(str(n) for n in plan.get("n_seqs", sorted({c.n_seq for c in result.parallel})))
    if result.settings.get("engine", {}).get("backend") == "remote":
        return (
            f"parallel decode on the server: N = {ns} concurrent streams (token-id prompts, {plan.get('gen_tokens', '?')} "
            "tokens after the first); client clock, server counts; aggregate = Σ (tokens − 1) / decode span"
        )
    return (
        f"parallel decode: N = {ns} sequences in one context, each step one llama_decode of N tokens "
        f"({plan.get('gen_tokens', '?')} steps); aggregate tok/s = N × steps / decode time (llama-batched-bench's S_TG)"
    )
