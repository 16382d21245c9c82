"""The RPC link sweep's result: every turn's sample, a row per (RPC devices, link), and the text forms.

JSON: ``{"kind": "rpc", "version", "model", "settings", "system", "placements", "cancelled", "label", "rows":
[...], "samples": [...]}`` (``placements``: per device count, where llama.cpp put the model); CSV: one row per
cell (:data:`CSV_COLUMNS`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from chatphase.bench.core.contract import stamp
from chatphase.bench.core.report import num, render_report
from chatphase.bench.core.results import Labelled, check_saved, header_fields, header_of, malformed, rows_csv
from chatphase.bench.rpc.link import LinkCounters
from chatphase.engine.memory_plan import layer_ranges
from chatphase.plotting import write_rows
from chatphase.units import fmt_bytes


@dataclass(frozen=True)
class RpcSample:
    """One turn: ``devices`` RPC devices behind links of ``rtt_ms`` added RTT and ``mbit_per_s`` (``None``:
    loopback's); its TTFT, prefill tokens/s and decode step (TPOT, ms) as the engine measured them;
    ``decode_steps`` decode steps after the first token; what the links carried during prefill (turn start
    to first token) and during decode (first token to the end)."""

    devices: int
    rtt_ms: float
    mbit_per_s: float | None
    rep: int
    warmup: bool
    ttft_ms: float | None
    prefill_tokens_per_s: float | None
    decode_step_ms: float | None
    decode_steps: int
    prefill_link: LinkCounters = LinkCounters()  # noqa: RUF009  # frozen: immutable
    decode_link: LinkCounters = LinkCounters()  # noqa: RUF009

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RpcSample:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        for key in ("prefill_link", "decode_link"):
            values[key] = LinkCounters(**data.get(key, {}))
        return cls(**values)


@dataclass(frozen=True)
class RpcRow:
    """One cell: medians of its counted turns (TTFT ms, prefill tokens/s, decode step ms), what the links
    carried per turn's prefill and per decode step (round trips, bytes both ways), and the network term's
    predictions (:mod:`chatphase.bench.rpc.network`; ``None`` for the local load and the baselines)."""

    devices: int
    rtt_ms: float
    mbit_per_s: float | None
    reps: int
    ttft_ms: float | None
    prefill_tokens_per_s: float | None
    decode_step_ms: float | None
    prefill_round_trips: float = 0.0
    prefill_bytes: float = 0.0
    decode_round_trips_per_step: float | None = None
    decode_bytes_per_step: float | None = None
    ttft_predicted_ms: float | None = None
    decode_step_predicted_ms: float | None = None

    @property
    def decode_tokens_per_s(self) -> float | None:
        return 1000 / self.decode_step_ms if self.decode_step_ms else None

    @property
    def decode_error(self) -> float | None:
        """Predicted ÷ measured decode step − 1 (``None`` without both)."""
        if self.decode_step_predicted_ms is None or not self.decode_step_ms:
            return None
        return self.decode_step_predicted_ms / self.decode_step_ms - 1

    def link_label(self) -> str:
        if not self.devices:
            return "local"
        rate = f", {self.mbit_per_s:g} Mbit/s" if self.mbit_per_s else ""
        return f"+{self.rtt_ms:g} ms{rate}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RpcRow:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


HEADERS = [
    "RPC dev", "link", "reps", "TTFT ms", "pred. ms", "prefill tok/s", "decode step ms", "pred. ms", "error",
    "decode tok/s", "RT/step", "bytes/step",
]  # fmt: skip
CSV_COLUMNS = (
    "devices", "rtt_ms", "mbit_per_s", "reps", "ttft_ms", "ttft_predicted_ms", "prefill_tokens_per_s",
    "decode_step_ms", "decode_step_predicted_ms", "decode_tokens_per_s", "prefill_round_trips", "prefill_bytes",
    "decode_round_trips_per_step", "decode_bytes_per_step",
)  # fmt: skip


def _cells(r: RpcRow) -> list[str]:
    error = r.decode_error
    return [
        str(r.devices),
        r.link_label(),
        str(r.reps),
        num(r.ttft_ms),
        num(r.ttft_predicted_ms),
        num(r.prefill_tokens_per_s),
        num(r.decode_step_ms, 2),
        num(r.decode_step_predicted_ms, 2),
        "–" if error is None else f"{error:+.0%}",
        num(r.decode_tokens_per_s),
        num(r.decode_round_trips_per_step, 2),
        "–" if r.decode_bytes_per_step is None else fmt_bytes(int(r.decode_bytes_per_step)),
    ]


@dataclass
class RpcResult(Labelled):
    """An RPC link sweep (module docstring)."""

    model: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    system: dict = field(default_factory=dict)
    placements: dict = field(default_factory=dict)
    cancelled: bool = False
    label: str = ""
    rows: list[RpcRow] = field(default_factory=list)
    samples: list[RpcSample] = field(default_factory=list)

    kind = "rpc"

    def to_dict(self) -> dict:
        return stamp(
            "rpc",
            {
                **header_of(self, "model", "settings", "system", "placements"),
                "rows": [r.to_dict() for r in self.rows],
                "samples": [s.to_dict() for s in self.samples],
            },
        )

    @classmethod
    def from_dict(cls, data: dict) -> RpcResult:
        """Inverse of :meth:`to_dict`.

        Raises:
            UsageError: a future version, or not an RPC sweep's result.
        """
        check_saved(data, "rows", "bench --rpc-rtt")
        try:
            return cls(
                **header_fields(data, "model", "settings", "system", "placements"),
                rows=[RpcRow.from_dict(r) for r in data["rows"]],
                samples=[RpcSample.from_dict(s) for s in data.get("samples") or []],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise malformed(exc) from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        return rows_csv(CSV_COLUMNS, ([getattr(r, c) for c in CSV_COLUMNS] for r in self.rows))

    def render(self, fmt: str) -> str:
        """``table``/``md``: one row per cell, then how it was measured; ``csv``/``json``: the file forms.

        Raises:
            UsageError: for an unknown format.
        """
        return render_report(self, fmt, [(HEADERS, [_cells(r) for r in self.rows])], lines=summary_lines)


def summary_lines(result: RpcResult) -> list[str]:
    """The setup line, then where each load put the layers and what the prediction is."""
    plan = result.settings.get("plan", {})
    engine = result.settings.get("engine", {})
    lines = [
        f"{result.model.get('name', '?')}: {plan.get('prompt_tokens')}-token prompts, {plan.get('gen_tokens')} "
        f"tokens each, {plan.get('reps')} reps (+{plan.get('warmup')} warm-up); rpc-servers on this machine with "
        f"{plan.get('server_threads')} thread(s) each, client threads {engine.get('n_threads')}"
    ]
    for devices, facts in sorted(result.placements.items(), key=lambda kv: int(kv[0])):
        hosts = {d.get("name"): d.get("host") for d in facts.get("devices", ())}
        places = []
        for p in facts.get("placement", ()):
            at = f" at {hosts[p['device']]}" if hosts.get(p["device"]) else ""
            output = " + output" if p.get("output_layer") else ""
            places.append(f"{p['device']}{at} layers {layer_ranges(tuple(p.get('layers', ()))) or 'none'}{output}")
        lines.append(f"{devices} RPC devices: {'; '.join(places) or 'all on the CPU'}")
    lines.append(
        "prediction: the same device count's baseline (nothing added) + round trips × RTT + bytes ÷ link rate, "
        "round trips and bytes counted on the links (RT/step: round trips per decode step)"
    )
    if result.cancelled:
        lines.append("(cancelled: the rows above are the cells that ran)")
    return lines


def write_rpc_plot(results: list[RpcResult], path: str | os.PathLike) -> Path:
    """:func:`draw_rpc` of ``results`` as a figure (:func:`chatphase.plotting.write_rows`).

    Raises:
        UsageError: as :func:`chatphase.plotting.check_plot_path`, or when the file cannot be written.
    """
    return write_rows([(draw_rpc, results)], path)


def draw_rpc(results: Sequence[RpcResult], ax1, ax2) -> None:
    """Decode step (``ax1``) and TTFT (``ax2``) against the added RTT, a line per RPC device count, measured
    (solid) beside predicted (dashed); the local load a dotted level."""
    for result in results:
        by_devices: dict[int, list[RpcRow]] = {}
        for row in result.rows:
            by_devices.setdefault(row.devices, []).append(row)
        for i, (devices, rows) in enumerate(sorted(by_devices.items())):
            rows = sorted(rows, key=lambda r: r.rtt_ms)
            xs = [r.rtt_ms for r in rows]
            for ax, measured, predicted in (
                (ax1, "decode_step_ms", "decode_step_predicted_ms"),
                (ax2, "ttft_ms", "ttft_predicted_ms"),
            ):
                ys = [getattr(r, measured) for r in rows]
                if not devices:  # the local load has no link
                    ax.axhline(ys[0] or 0, color="grey", linestyle=":", label="local")
                    continue
                ax.plot(xs, [_nan(y) for y in ys], "o-", color=f"C{i}", label=f"{devices} RPC measured")
                pred = [getattr(r, predicted) for r in rows]
                if any(v is not None for v in pred):
                    ax.plot(xs, [_nan(v) for v in pred], "--", color=f"C{i}", alpha=0.7,
                            label=f"{devices} RPC predicted")  # fmt: skip
    ax1.set(title="Decode step vs added RTT", xlabel="added RTT (ms)", ylabel="decode step (ms)")
    ax2.set(title="TTFT vs added RTT", xlabel="added RTT (ms)", ylabel="TTFT (ms)")


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def rpc_rows(result: RpcResult) -> list[dict]:
    """Rows for ``--rerun``: named by devices and RTT."""
    figures = ("ttft_ms", "decode_step_ms", "decode_step_predicted_ms")
    return [
        {"devices": float(r.devices), "rtt_ms": r.rtt_ms, **{f: getattr(r, f) for f in figures}} for r in result.rows
    ]
