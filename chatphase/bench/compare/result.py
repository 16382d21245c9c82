"""The comparison's result: the two sides, every turn of each, the ratios B ÷ A per turn, and the text forms.

JSON: ``{"kind": "compare", "version", "model", "settings", "cancelled", "label", "sides": [...], "turns": [...]}``;
CSV: one row per turn and side (:data:`CSV_COLUMNS`); ``table``/``md``: the turns side by side, the ratios,
then each side's settings where they differ and the replies (inert).
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
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.text import inert
from chatphase.plotting import write_rows
from chatphase.units import fmt_mib

#: the figures compared per turn, and whether more is better.
FIGURES: dict[str, bool] = {
    "ttft_ms": False,
    "prefill_tokens_per_s": True,
    "decode_tokens_per_s": True,
    "kv_cache_bytes": False,
    "rss_bytes": False,
}
#: why the sides never run at once, and their warm-up (said under every table).
ONE_AT_A_TIME = (
    "the sides ran one after the other, never at once: on a shared CPU each would slow the other; the first "
    "alternates each turn; each side ran one short warm-up turn first, not counted (a process's first evaluation "
    "after its load is slower)"
)


@dataclass(frozen=True)
class CompareTurn:
    """One side's turn ``turn`` (0-based), ``position`` 0 when it went first; its phase figures (the turn's
    :class:`~chatphase.engine.metrics.TurnMetrics`), the engine process's resident bytes after it and its reply."""

    turn: int
    side: str
    position: int
    prompt_tokens: int | None
    cached_tokens: int | None
    prefill_tokens: int | None
    ttft_ms: float | None
    prefill_ms: float | None
    prefill_tokens_per_s: float | None
    decode_tokens: int | None
    decode_ms: float | None
    decode_tokens_per_s: float | None
    kv_cache_bytes: int | None
    rss_bytes: int | None
    stop_reason: str
    reply: str = ""

    @classmethod
    def of(cls, turn: int, side: str, position: int, m: TurnMetrics, rss_bytes: int | None, reply: str):
        return cls(
            turn=turn, side=side, position=position, prompt_tokens=m.prompt_tokens, cached_tokens=m.cached_tokens,
            prefill_tokens=m.prefill_tokens, ttft_ms=m.ttft_ms, prefill_ms=m.prefill_ms,
            prefill_tokens_per_s=m.prefill_tokens_per_s, decode_tokens=m.decode_tokens, decode_ms=m.decode_ms,
            decode_tokens_per_s=m.decode_tokens_per_s, kv_cache_bytes=m.kv_cache_bytes, rss_bytes=rss_bytes,
            stop_reason=str(m.stop_reason), reply=reply,
        )  # fmt: skip

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CompareTurn:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class CompareSide:
    """A side: ``name`` (A or B), its model's name, its settings (by key) and the engine's as loaded, load ms."""

    name: str
    model: str
    settings: dict
    engine: dict = field(default_factory=dict)
    load_ms: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CompareSide:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def ratio(a: float | None, b: float | None) -> float | None:
    """``b / a`` (``None`` where either is missing or ``a`` is 0)."""
    return b / a if a and b is not None else None


@dataclass
class CompareResult(Labelled):
    """A comparison (module docstring)."""

    model: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    cancelled: bool = False
    label: str = ""
    sides: list[CompareSide] = field(default_factory=list)
    turns: list[CompareTurn] = field(default_factory=list)

    kind = "compare"

    def pairs(self) -> list[tuple[int, CompareTurn | None, CompareTurn | None]]:
        """Per turn number: A's turn and B's (``None`` where it did not run)."""
        by = {(t.turn, t.side): t for t in self.turns}
        return [(k, by.get((k, "A")), by.get((k, "B"))) for k in sorted({t.turn for t in self.turns})]

    def ratios(self) -> list[dict]:
        """Per turn: B ÷ A of each of :data:`FIGURES` (``None`` where a side lacks it)."""
        out = []
        for k, a, b in self.pairs():
            row: dict = {"turn": k + 1}
            for figure in FIGURES:
                row[figure] = ratio(getattr(a, figure) if a else None, getattr(b, figure) if b else None)
            out.append(row)
        return out

    def differences(self) -> dict[str, tuple[object, object]]:
        """The settings in which the sides differ: key -> (A's, B's)."""
        if len(self.sides) < 2:
            return {}
        a, b = self.sides[0].settings, self.sides[1].settings
        flat_a = {**a, **a.get("sampling", {}), "model": self.sides[0].model}  # the model by its name (unset: default)
        flat_b = {**b, **b.get("sampling", {}), "model": self.sides[1].model}
        return {k: (flat_a.get(k), flat_b.get(k)) for k in flat_a if k != "sampling" and flat_a.get(k) != flat_b.get(k)}

    def to_dict(self) -> dict:
        return stamp(
            "compare",
            {
                **header_of(self, "model", "settings"),
                "sides": [s.to_dict() for s in self.sides],
                "turns": [t.to_dict() for t in self.turns],
                "ratios": self.ratios(),
            },
        )

    @classmethod
    def from_dict(cls, data: dict) -> CompareResult:
        """Inverse of :meth:`to_dict`.

        Raises:
            UsageError: a future version, or not a comparison's result.
        """
        check_saved(data, "turns", "compare")
        try:
            return cls(
                **header_fields(data, "model", "settings"),
                sides=[CompareSide.from_dict(s) for s in data.get("sides") or []],
                turns=[CompareTurn.from_dict(t) for t in data["turns"]],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise malformed(exc) from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def to_csv(self) -> str:
        return rows_csv(CSV_COLUMNS, ([getattr(t, c) for c in CSV_COLUMNS] for t in self.turns))

    def render(self, fmt: str) -> str:
        """``table``/``md``: the turns side by side, the ratios, then the settings that differ and the replies;
        ``csv``/``json``: the file forms.

        Raises:
            UsageError: for an unknown format.
        """
        turns = [_turn_cells(t) for _, a, b in self.pairs() for t in (a, b) if t is not None]
        ratios = [[str(r["turn"]), *(_ratio(r[f]) for f in FIGURES)] for r in self.ratios()]
        return render_report(self, fmt, [(TURN_HEADERS, turns), (RATIO_HEADERS, ratios)], lines=summary_lines)


CSV_COLUMNS = tuple(f.name for f in fields(CompareTurn))
TURN_HEADERS = ["turn", "side", "first", "prompt tok", "cached", "TTFT ms", "prefill tok/s", "decode tok", "decode tok/s",
                "KV MiB", "RSS MiB"]  # fmt: skip
RATIO_HEADERS = ["turn", "TTFT B/A", "prefill B/A", "decode B/A", "KV B/A", "RSS B/A"]


def _turn_cells(t: CompareTurn) -> list[str]:
    count = lambda n: "–" if n is None else f"{n:,}"  # noqa: E731
    return [str(t.turn + 1), t.side, "yes" if t.position == 0 else "", count(t.prompt_tokens),
            count(t.cached_tokens), num(t.ttft_ms), num(t.prefill_tokens_per_s), count(t.decode_tokens),
            num(t.decode_tokens_per_s), fmt_mib(t.kv_cache_bytes), fmt_mib(t.rss_bytes)]  # fmt: skip


def _ratio(r: float | None) -> str:
    return "–" if r is None else f"{r:.2f}×"


def summary_lines(result: CompareResult) -> list[str]:
    plan = result.settings.get("plan", {})
    names = " · ".join(f"{s.name} = {s.model}" for s in result.sides) or "no side loaded"
    lines = [f"compare: {names}; greedy replies of {plan.get('gen_tokens', '?')} tokens at most; {ONE_AT_A_TIME}"]
    for key, (a, b) in result.differences().items():
        lines.append(f"{key}: A {a!r}, B {b!r}")
    for k, a, b in result.pairs():
        for t in (a, b):
            if t is not None and t.reply:
                short = " ".join(t.reply.split())
                lines.append(f"turn {k + 1} {t.side} replied: {inert(short[:160])}{'…' if len(short) > 160 else ''}")
    if result.cancelled:
        lines.append("(cancelled: the turns above are the ones that ran)")
    return lines


def write_compare_plot(results: list[CompareResult], path: str | os.PathLike) -> Path:
    """:func:`draw_compare` of the first result (:func:`chatphase.plotting.write_rows`).

    Raises:
        UsageError: as :func:`chatphase.plotting.check_plot_path`, or when the file cannot be written.
    """
    return write_rows([(draw_compare, results[:1])], path)


def draw_compare(results: Sequence[CompareResult], ax1, ax2) -> None:
    """``ax1``: each turn's phase timeline on one time axis, prefill (TTFT) then decode, A above B; ``ax2``:
    the ratios B ÷ A per turn."""
    result = results[0]
    labels, y = [], 0
    for k, a, b in result.pairs():
        for t in (a, b):
            if t is None:
                continue
            ttft, decode = t.ttft_ms or 0.0, t.decode_ms or 0.0
            ax1.barh(y, ttft, color="C0", label="prefill (TTFT)" if y == 0 else None)
            ax1.barh(y, decode, left=ttft, color="C1", label="decode" if y == 0 else None)
            labels.append(f"turn {k + 1} {t.side}")
            y += 1
    ax1.set_yticks(range(len(labels)), labels)
    ax1.invert_yaxis()
    ax1.set(title="Each turn's phases", xlabel="ms from the turn's start")
    ratios = result.ratios()
    xs = [r["turn"] for r in ratios]
    for i, figure in enumerate(FIGURES):
        ys = [r[figure] if r[figure] is not None else float("nan") for r in ratios]
        ax2.plot(xs, ys, "o-", color=f"C{i}", label=figure)
    ax2.axhline(1.0, color="grey", linestyle=":")
    ax2.set(title="B ÷ A per turn", xlabel="turn", ylabel="ratio")
