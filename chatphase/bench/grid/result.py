"""A lever grid's results (:mod:`chatphase.bench.grid.run` measures them): each point's cells with the roofline's
prediction and the measured / predicted ratio (:class:`GridCell`), the whole run (:class:`GridResult`, saved as
JSON and read back), and how they read as a table, CSV or Markdown with their notes (:func:`grid_row`,
:func:`above_lines`, :func:`lever_lines`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from chatphase.bench.core.contract import saved_version, stamp
from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.report import mean_sd, num
from chatphase.bench.core.results import CellResult
from chatphase.bench.grid.levers import PREDICTED, Prediction, bound_share, ratio
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import SYNTHETIC_LABEL
from chatphase.models.roofline import (
    no_prefill_bound_text,
)
from chatphase.units import DASH


@dataclass(frozen=True)
class GridCell:
    """One point's measured cell with its prediction (``None`` without peaks), the KV figures the
    engine reported (``llama_kv_cache_bytes`` as llama.cpp printed it) and the model's weight type
    (``ModelInfo.quantization``; ``None`` in a result saved before it was recorded)."""

    point: str
    levers: dict
    model: str
    synthetic: bool
    cell: CellResult
    prediction: Prediction | None
    kv_bytes_per_token: int | None
    kv_capacity_bytes: int | None
    llama_kv_cache_bytes: int | None
    weight_bytes_per_token: int | None
    weight_type: str | None = None

    def ratios(self) -> dict:
        """measured / predicted for ``ttft_ms``, ``prefill_tokens_per_s``, ``decode_tokens_per_s``."""
        p = self.prediction
        return {m: ratio(getattr(self.cell, m).mean, getattr(p, m) if p else None) for m in PREDICTED}

    def above_bound(self) -> dict:
        """Per metric of :data:`~chatphase.bench.grid.levers.PREDICTED`, the measurement's share of its bound
        where it is above it (:func:`~chatphase.bench.grid.levers.bound_share`); metrics within it are left out."""
        p = self.prediction
        shares = {m: bound_share(m, getattr(self.cell, m).mean, getattr(p, m) if p else None) for m in PREDICTED}
        return {m: share for m, share in shares.items() if share is not None and share.above}

    def row(self) -> list[str]:
        """The cell as text under :data:`GRID_HEADERS`."""
        return grid_row(self.point, self.synthetic, self.cell, self.prediction, self.kv_bytes_per_token)

    def to_dict(self) -> dict:
        return {
            "point": self.point,
            "levers": self.levers,
            "model": self.model,
            "synthetic": self.synthetic,
            **self.cell.to_dict(),
            "prediction": self.prediction.to_dict() if self.prediction else None,
            "ratio": self.ratios(),
            "above_bound": sorted(self.above_bound()),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_capacity_bytes": self.kv_capacity_bytes,
            "llama_kv_cache_bytes": self.llama_kv_cache_bytes,
            "weight_bytes_per_token": self.weight_bytes_per_token,
            "weight_type": self.weight_type,
        }


@dataclass
class GridResult:
    """A whole grid run: cells of every point, the peaks per thread count, the plan, notes, system facts."""

    cells: list[GridCell] = field(default_factory=list)
    peaks: dict[int, MachinePeaks] = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    system: dict = field(default_factory=dict)
    cancelled: bool = False

    kind = "grid"

    def to_dict(self) -> dict:
        return stamp(
            "grid",
            {
                "grid": [c.to_dict() for c in self.cells],
                "peaks": {str(t): p.to_dict() | {"conditions": p.conditions} for t, p in self.peaks.items()},
                "plan": self.plan,
                "notes": self.notes,
                "system": self.system,
                "cancelled": self.cancelled,
            },
        )

    @classmethod
    def from_dict(cls, data: dict) -> GridResult:
        """Inverse of :meth:`to_dict`.

        Raises:
            UsageError: a future version, or not a lever grid's result.
        """
        saved_version(data)
        try:
            peak_names = {f.name for f in fields(MachinePeaks)}
            return cls(
                cells=[_grid_cell(c) for c in data["grid"]],
                peaks={
                    int(t): MachinePeaks(**{k: v for k, v in p.items() if k in peak_names})
                    for t, p in (data.get("peaks") or {}).items()
                },
                plan=dict(data.get("plan") or {}),
                notes=list(data.get("notes") or []),
                system=dict(data.get("system") or {}),
                cancelled=bool(data.get("cancelled", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise UsageError("malformed lever grid result (is it a chatphase bench file?)") from None

    def footnotes(self) -> list[str]:
        """What the table's columns mean, the peaks behind the predictions, the notes (one line each)."""
        foot = [
            "pred = the roofline: a decode step ≥ weights read per token / read bandwidth + the larger of KV bytes "
            "× context / read bandwidth and attention's FLOPs / matmul FLOP/s; prefill ≤ matmul FLOP/s / (2 × "
            "params) and TTFT ≥ evaluated tokens / that, for float32 weights only; × = measured / predicted "
            "('above': beyond the bound)"
        ]
        unbounded = (c.weight_type for c in self.cells if c.prediction and c.prediction.prefill_tokens_per_s is None)
        foot += [no_prefill_bound_text(t) for t in dict.fromkeys(unbounded)]
        foot += above_lines(self.cells) + lever_lines(self.cells)
        for t, p in sorted(self.peaks.items()):
            foot.append(
                f"peaks at {t} thread(s): read {p.bandwidth_bytes_per_s / 1e9:.1f} GB/s, matmul "
                f"{p.flops_per_s / 1e9:.1f} GFLOP/s ({p.conditions})"
            )
        if any(c.synthetic for c in self.cells):
            foot.append(f"(synthetic) = random weights in a real model's shapes: {SYNTHETIC_LABEL}")
        foot += [f"note: {n}" for n in self.notes]
        if self.cancelled:
            foot.append("CANCELLED: partial results")
        return foot

    def to_json(self) -> str:
        """:meth:`render` ``json`` (what :func:`~chatphase.bench.core.results.save_result` writes for ``.json``)."""
        return self.render("json")

    def to_csv(self) -> str:
        """:meth:`render` ``csv``."""
        return self.render("csv")

    def render(self, fmt: str) -> str:
        """``table``, ``md`` or ``json`` text (``csv``: one row per cell with the ratios).

        Raises:
            UsageError: an unknown format.
        """
        if fmt == "json":
            return json.dumps(self.to_dict(), indent=2) + "\n"
        headers, rows = GRID_HEADERS, [c.row() for c in self.cells]
        if fmt == "csv":
            import csv
            import io

            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(["point", "kind", "prompt_tokens", "depth", "ttft_ms", "ttft_ms_pred", "prefill_tokens_per_s",
                        "prefill_tokens_per_s_pred", "decode_tokens_per_s", "decode_tokens_per_s_pred",
                        "kv_bytes_per_token"])  # fmt: skip
            for c in self.cells:
                p = c.prediction
                w.writerow(
                    [c.point, c.cell.kind, c.cell.prompt_tokens, c.cell.depth]
                    + [
                        v
                        for m in ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s")
                        for v in (getattr(c.cell, m).mean, getattr(p, m) if p else "")
                    ]
                    + [c.kv_bytes_per_token]
                )
            return buf.getvalue()
        if fmt not in ("table", "md"):
            raise UsageError(f"unknown format {fmt!r}: choose one of table, md, csv, json")
        if fmt == "md":
            table = "\n".join("| " + " | ".join(r) + " |" for r in [headers, ["---"] * len(headers), *rows])
        else:
            widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
            lines = [headers, ["-" * w for w in widths], *rows]
            table = "\n".join(
                "  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True)))
                for r in lines
            )
        plan = self.plan
        head = (
            f"lever grid: {len({c.point for c in self.cells})} points, interleaved: each round runs every point's "
            f"cells once; gen {plan.get('gen_tokens')} tokens, {plan.get('reps')} reps + {plan.get('warmup')} warm-up"
        )
        foot = self.footnotes()
        return "\n\n".join([head, table, "\n".join(foot)]) + "\n"


def _grid_cell(data: dict) -> GridCell:
    """One ``grid`` entry of :meth:`GridResult.to_dict` read back."""
    prediction = data.get("prediction")
    return GridCell(
        point=str(data["point"]),
        levers=dict(data.get("levers") or {}),
        model=str(data.get("model") or ""),
        synthetic=bool(data.get("synthetic", False)),
        cell=CellResult.from_dict(data),
        prediction=Prediction(**prediction) if prediction else None,
        kv_bytes_per_token=data.get("kv_bytes_per_token"),
        kv_capacity_bytes=data.get("kv_capacity_bytes"),
        llama_kv_cache_bytes=data.get("llama_kv_cache_bytes"),
        weight_bytes_per_token=data.get("weight_bytes_per_token"),
        weight_type=data.get("weight_type"),
    )


#: the columns of :func:`grid_row` (each figure measured, the roofline's prediction, their ratio).
GRID_HEADERS = ["point", "cell", "TTFT ms", "pred", "×", "prefill tok/s", "pred", "×", "decode tok/s", "pred", "×",
                "KV B/tok"]  # fmt: skip


def grid_row(
    point: str, synthetic: bool, cell: CellResult, prediction: Prediction | None, kv_bytes_per_token: int | None
) -> list[str]:
    """One cell as text under :data:`GRID_HEADERS` (a missing prediction or KV figure as a dash)."""
    row = [point + (" (synthetic)" if synthetic else ""), _cell_name(cell)]
    for m in PREDICTED:
        measured, predicted = getattr(cell, m).mean, getattr(prediction, m) if prediction else None
        share = bound_share(m, measured, predicted)
        times = "above" if share is not None and share.above else num(ratio(measured, predicted), 2)
        row += [mean_sd(getattr(cell, m)), num(predicted), times]
    return [*row, DASH if kv_bytes_per_token is None else f"{kv_bytes_per_token:,}"]


def _cell_name(cell: CellResult) -> str:
    return f"prompt {cell.prompt_tokens}" if cell.kind == "prompt" else f"depth {cell.depth}"


def above_lines(cells: list[GridCell]) -> list[str]:
    """One line per metric measured above its bound in some cell: how many cells, the first few, and the
    furthest above in words (:meth:`~chatphase.models.roofline.BoundShare.text`)."""
    names = {"ttft_ms": "TTFT", "prefill_tokens_per_s": "prefill", "decode_tokens_per_s": "decode"}
    lines = []
    for m, what in names.items():
        hits = [(share, f"{c.point} {_cell_name(c.cell)}") for c in cells if (share := c.above_bound().get(m))]
        if hits:
            worst = max(hits, key=lambda h: h[0].fraction)[0]
            where = ", ".join(name for _, name in hits[:3]) + (", …" if len(hits) > 3 else "")
            lines.append(f"above: {what} in {len(hits)} cell(s) ({where}): {worst.text()}")
    return lines


#: a lever "loses" when the roofline predicted at least this gain and the measurement fell below 1.0×.
PREDICTED_GAIN = 1.02


def lever_lines(cells: list[GridCell]) -> list[str]:
    """One line per lever that lost: a point whose decode the roofline predicted faster than the first point's
    (the baseline) at the same cell, by :data:`PREDICTED_GAIN` or more, but that measured slower — with why.
    For a quantised K/V cache (predictions exist only for CPU runs) the reason is attention's dequantisation,
    and where both points have a shallower depth cell, attention's measured cost at this depth for each."""
    if not cells:
        return []
    base = cells[0].point
    by_key = {(c.point, c.cell.kind, c.cell.prompt_tokens, c.cell.depth): c for c in cells}
    lines = []
    for c in cells:
        b = by_key.get((base, c.cell.kind, c.cell.prompt_tokens, c.cell.depth))
        if c.point == base or b is None or c.prediction is None or b.prediction is None:
            continue
        measured = ratio(c.cell.decode_tokens_per_s.mean, b.cell.decode_tokens_per_s.mean)
        predicted = ratio(c.prediction.decode_tokens_per_s, b.prediction.decode_tokens_per_s)
        if measured is None or predicted is None or predicted < PREDICTED_GAIN or measured >= 1.0:
            continue
        head = (
            f"lever lost: {c.point} decodes at {measured:.2f}× of {base} at {_cell_name(c.cell)}, where the roofline "
            f"predicted {predicted:.2f}×"
        )
        kv = ("type_k", "type_v")
        quantised = [str(c.levers[k]) for k in kv if c.levers.get(k) not in ("f16", "f32", "bf16", None)]
        if quantised and any(c.levers.get(k) != b.levers.get(k) for k in kv):
            why = (
                f" — on a CPU, attention dequantises the {'/'.join(dict.fromkeys(quantised))} cache for every query "
                "head and every token of context, and that costs more than the bytes it saves"
            )
            growth = [_attention_ms(x, cells) for x in (b, c)]
            if all(g is not None for g in growth):
                why += (
                    f" (the step grew {growth[0]:.2f} ms over its shallowest depth with {base}, {growth[1]:.2f} ms "
                    f"with {c.point})"
                )
        else:
            why = (
                " — the roofline counts bytes read and attention's FLOPs; this lever's cost lies elsewhere "
                "(per-token overhead, threads, kernels)"
            )
        lines.append(head + why)
    return lines


def _attention_ms(c: GridCell, cells: list[GridCell]) -> float | None:
    """How much ``c``'s decode step (ms) grew over its point's shallowest depth cell: attention's measured
    cost of the extra context; ``None`` without a shallower depth cell or a rate."""
    shallow = [x for x in cells if x.point == c.point and x.cell.kind == "depth" and x.cell.depth < c.cell.depth]
    if c.cell.kind != "depth" or not shallow:
        return None
    s = min(shallow, key=lambda x: x.cell.depth)
    deep_rate, shallow_rate = c.cell.decode_tokens_per_s.mean, s.cell.decode_tokens_per_s.mean
    if not deep_rate or not shallow_rate:
        return None
    return 1e3 * (1 / deep_rate - 1 / shallow_rate)
