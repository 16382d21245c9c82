"""One turn in full: its timeline, every metric, and the plain-language line per phase."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Label, Static

from chatphase.chat.exactness import logits_pairs
from chatphase.chat.overflow import overflow_pairs
from chatphase.chat.remote_wait import remote_wait_pairs
from chatphase.engine.events import LoadedModel
from chatphase.engine.metrics import TurnMetrics
from chatphase.explain import explain_turn
from chatphase.ui.dashboard.timeline import TurnTimeline
from chatphase.units import DASH, fmt_at_threads, fmt_bytes, fmt_int, fmt_stop_reason


def metric_pairs(m: TurnMetrics) -> list[tuple[str, str]]:
    """``[(name with unit, value), ...]`` of every metric of the turn, ``–`` when undefined; for a remote
    reply, who counted its tokens (``decode_tokens_source``)."""

    def num(v: float | None, digits: int = 1) -> str:
        return DASH if v is None else f"{v:,.{digits}f}"

    threads = (
        []
        if m.n_threads_decode is None
        else [("threads prefill/decode", f"{m.n_threads_prefill}/{m.n_threads_decode}")]
    )
    thinking = []
    if m.thought:  # a reasoning model's turn (docs/metrics.md, "Reasoning models")
        thinking = [
            ("thinking tokens", fmt_int(m.thinking_tokens)),
            ("thinking ms", num(m.thinking_ms)),
            ("answer tokens", fmt_int(m.answer_tokens)),
            ("TTFA ms", num(m.ttfa_ms)),
            ("answer tok/s", num(m.answer_tokens_per_s)),
            ("thinking cut short", "yes" if m.thinking_cut_short else "no"),
        ]
    spec = []
    if m.spec_mode is not None:  # speculative decoding (docs/metrics.md, "Speculative decoding")
        pct = DASH if m.spec_acceptance is None else f"{m.spec_acceptance:.0%}"
        spec = [
            ("decode mode", m.spec_mode),
            ("drafted / accepted", f"{fmt_int(m.spec_drafted)} / {fmt_int(m.spec_accepted)} ({pct})"),
            ("accepted per step", num(m.spec_accepted_per_step, 2)),
            ("target steps", fmt_int(m.spec_steps)),
            ("tokens per step", num(m.spec_tokens_per_step, 2)),
            ("verify step ms", num(m.spec_verify_step_ms, 2)),
            ("plain step ms", num(m.spec_plain_step_ms, 2) + fmt_at_threads(m.spec_plain_threads)),
            ("speed-up", DASH if m.spec_speedup is None else f"×{m.spec_speedup:.2f}"),
            ("step p50/p95 ms", f"{num(m.step_ms_p50, 2)} / {num(m.step_ms_p95, 2)}"),
        ]
    predicted = []
    low, high = m.ttft_predicted_low_ms, m.ttft_predicted_high_ms
    if m.ttft_predicted_ms is not None:  # to hold against the measured TTFT (docs/metrics.md, "TTFT predicted")
        predicted = [("TTFT pred. ms", num(m.ttft_predicted_ms))]
        if low is not None and high is not None:
            predicted.append(("TTFT pred. range ms", f"{num(low)}–{num(high)}"))
    elif m.ttft_prediction_note is not None:  # withheld (why: ask's line, --json, the budget line), its bounds
        bounds = [f"≥ {num(low)}"] if low is not None else []
        bounds += [f"≤ {num(high)}"] if high is not None else []
        predicted = [("TTFT pred. ms", "withheld")] + ([("TTFT bound ms", ", ".join(bounds))] if bounds else [])
    return [
        ("prompt tokens", fmt_int(m.prompt_tokens)),
        ("cached tokens", fmt_int(m.cached_tokens)),
        *(
            [
                ("restored tokens", fmt_int(m.restored_tokens)),
                ("restore ms", num(m.restore_ms)),
                ("restore bytes", fmt_bytes(m.restore_bytes)),
            ]
            if m.restored_tokens is not None
            else []
        ),
        ("prefill tokens", fmt_int(m.prefill_tokens)),
        ("tokenize ms", num(m.tokenize_ms)),
        ("prefill ms", num(m.prefill_ms)),
        ("prefill tok/s", num(m.prefill_tokens_per_s, 0)),
        ("TTFT ms", num(m.ttft_ms)),
        ("decode tokens", fmt_int(m.decode_tokens)),
        ("decode ms", num(m.decode_ms)),
        ("decode tok/s", num(m.decode_tokens_per_s)),
        ("TPOT ms", num(m.tpot_ms, 2)),
        ("ITL p50 ms", num(m.itl_ms_p50, 2)),
        ("ITL p95 ms", num(m.itl_ms_p95, 2)),
        ("ITL max ms", num(m.itl_ms_max, 2)),
        *thinking,
        *spec,
        ("KV tokens", fmt_int(m.kv_cache_tokens)),
        ("KV bytes", fmt_bytes(m.kv_cache_bytes)),
        ("KV capacity", fmt_bytes(m.kv_capacity_bytes)),
        ("KV bytes/token", fmt_int(m.kv_bytes_per_token)),
        ("dropped messages", str(m.dropped_messages)),
        ("stop reason", m.stop_reason),
        *threads,
        *predicted,
        *overflow_pairs(m),
        *logits_pairs(m),
        *remote_wait_pairs(m),
    ] + (
        [("decode counted by", _COUNTED_BY.get(m.decode_tokens_source, m.decode_tokens_source))]
        if m.decode_tokens_source
        else []
    )


#: who counted a remote reply's tokens (``TurnMetrics.decode_tokens_source``), in words.
_COUNTED_BY = {"usage": "server usage", "timings": "server timings", "tokenizer": "server tokenizer"}


def metrics_table(m: TurnMetrics, pairs_per_row: int = 2) -> Table:
    """A grid of :func:`metric_pairs`, ``pairs_per_row`` (name, value) pairs to a row."""
    table = Table.grid(padding=(0, 1), expand=True)
    for _ in range(pairs_per_row):
        table.add_column(style="dim", no_wrap=True)
        table.add_column(justify="right", no_wrap=True)
    pairs = metric_pairs(m)
    for i in range(0, len(pairs), pairs_per_row):
        row = [cell for pair in pairs[i : i + pairs_per_row] for cell in pair]
        table.add_row(*row, *[""] * (2 * pairs_per_row - len(row)))
    return table


class MetricsGrid:
    """:func:`metrics_table` with two pairs to a row where they fit the width they are drawn at, else one
    (in the side panel, 4-digit figures and a ``context_full`` stop need 53 cells for two)."""

    def __init__(self, metrics: TurnMetrics) -> None:
        self.metrics = metrics

    def _table(self, console: Console, options: ConsoleOptions) -> Table:
        two = metrics_table(self.metrics, 2)
        two.expand = False  # measure the width the figures need, not the width on offer
        fits = Measurement.get(console, options.update_width(10_000), two).maximum <= options.max_width
        two.expand = True
        return two if fits else metrics_table(self.metrics, 1)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._table(console, options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self._table(console, options))


class TurnDetail(Widget):
    """The chosen turn: title, :class:`TurnTimeline`, metrics grid and the prefill/decode explanations."""

    DEFAULT_CSS = """
    TurnDetail {
        height: auto;
        padding: 1 0 0 0;
    }
    TurnDetail #detail-title {
        text-style: bold;
        color: $text-primary;
    }
    TurnDetail #detail-explain {
        margin: 1 0 0 0;
        color: $text-secondary;
    }
    """

    def compose(self) -> ComposeResult:
        yield Label("no turn selected", id="detail-title")
        yield TurnTimeline(id="detail-timeline")
        yield Static("", id="detail-metrics")
        yield Static("", id="detail-explain")

    def show(self, number: int, metrics: TurnMetrics, model: LoadedModel | None) -> None:
        """Show turn ``number``; the explanations need ``model`` (omitted when ``None``)."""
        self.query_one("#detail-title", Label).update(f"turn {number} · stop: {fmt_stop_reason(metrics.stop_reason)}")
        self.query_one(TurnTimeline).show(metrics)
        self.query_one("#detail-metrics", Static).update(MetricsGrid(metrics))
        lines = explain_turn(model, metrics) if model is not None else []
        if metrics.threads_reason:
            lines = [*lines, f"threads: {metrics.threads_reason}"]
        explain = "\n".join(lines)
        self.query_one("#detail-explain", Static).update(explain)

    def clear(self) -> None:
        """Show nothing (new chat)."""
        self.query_one("#detail-title", Label).update("no turn selected")
        self.query_one(TurnTimeline).clear()
        self.query_one("#detail-metrics", Static).update("")
        self.query_one("#detail-explain", Static).update("")
