"""The Experiments screen's plots (textual-plotext): TTFT vs prompt tokens, decode tok/s vs depth, and the
parallel sweep's aggregate and per-sequence decode tok/s against N (:class:`ParallelPlot`).

A plot holds *series*: the running sweep (its samples appear as they are measured, so the plot fills
in) and any number of finished results (current or loaded from a file, for overlays). A finished
series draws each cell's mean joined by a line with ±1 sample sd error bars; series are told apart by
colour and named in plotext's legend. Redraws happen per measured run, never faster.

The y axis is set here, not left to plotext (:func:`y_axis`): plotext puts its ticks on data rows, which
gives uneven labels (27.1, 23.7, 20.3, 13.4), and draws the legend over the top-left of the data. Ticks
are round, even steps from 0, and the axis reaches high enough that the legend's rows stay above every point.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from textual_plotext import PlotextPlot

from chatphase.bench.core.results import CellResult, Sample, SweepResult
from chatphase.bench.parallel.records import ParallelSample
from chatphase.bench.parallel.result import ParallelResult
from chatphase.engine.text import inert

PlotKind = Literal["ttft", "decode"]
#: plotext colour names, one per series in order.
COLORS = ("cyan", "orange", "green", "magenta", "yellow", "red", "blue")
#: rows of a plot widget that are not the data area: title, the frame's two lines, x ticks, x label.
NON_DATA_ROWS = 5


def nice_step(top: float, count: int = 4) -> float:
    """A round tick step (1, 2, 2.5 or 5 × 10^k) that splits ``0..top`` into about ``count`` steps."""
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def y_axis(top: float, rows: int, legend_lines: int) -> list[float]:
    """Even y ticks from 0 for data up to ``top`` on ``rows`` data rows, the last tick high enough that
    the top ``legend_lines`` rows (plotext's legend) plus one hold no point."""
    if top <= 0:
        return [0.0, 1.0]
    free = min(legend_lines + 1, rows // 2) if legend_lines else 0
    axis_top = top * rows / max(1, rows - free)
    step = nice_step(axis_top)
    return [i * step for i in range(math.ceil(axis_top / step - 1e-9) + 1)]


def cell_point(kind: PlotKind, cell: CellResult) -> tuple[float, float, float] | None:
    """``(x, mean, sd)`` of ``cell`` on a plot of ``kind``, or ``None`` when it does not belong there."""
    if kind == "ttft" and cell.kind == "prompt" and cell.ttft_ms.mean is not None:
        return float(cell.prompt_tokens), cell.ttft_ms.mean, cell.ttft_ms.sd or 0.0
    if kind == "decode" and cell.kind == "depth" and cell.decode_tokens_per_s.mean is not None:
        return float(cell.depth), cell.decode_tokens_per_s.mean, cell.decode_tokens_per_s.sd or 0.0
    return None


def sample_point(kind: PlotKind, s: Sample | ParallelSample) -> tuple[float, float] | None:
    """``(x, y)`` of one measured repetition on a plot of ``kind`` (warm-ups are not plotted)."""
    if s.warmup or not isinstance(s, Sample):
        return None
    if kind == "ttft" and s.kind == "prompt" and s.ttft_ms is not None:
        return float(s.prompt_tokens), s.ttft_ms
    if kind == "decode" and s.kind == "depth" and s.decode_tokens_per_s is not None:
        return float(s.depth), s.decode_tokens_per_s
    return None


class SeriesPlot(PlotextPlot):
    """A plot of finished results plus the running sweep's points; subclasses say where a sample goes
    (:meth:`live_point`, ``None`` when it is not theirs) and draw (:meth:`replot`)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.results: list[SweepResult | ParallelResult] = []
        self.live: list[tuple[float, ...]] = []
        self.live_label = ""
        self.y_top = 0.0  # the highest point drawn (error bars included), set by replot
        self.legend_lines = 0  # the series named in the legend, set by replot

    def render(self):
        """Set the y axis for this size (:func:`y_axis`), then let plotext draw."""
        ticks = y_axis(self.y_top, max(2, self.size.height - NON_DATA_ROWS), self.legend_lines)
        self.plt.ylim(ticks[0], ticks[-1])
        self.plt.yticks(ticks, [f"{t:g}" for t in ticks])
        return super().render()

    def on_mount(self) -> None:
        # no super().on_mount(): Textual dispatches PlotextPlot's own handler itself
        self.replot()

    def set_results(self, results: list[SweepResult | ParallelResult]) -> None:
        """Show these finished results (overlays; the current run's result included when done)."""
        self.results = list(results)
        self.replot()

    def start_live(self, label: str) -> None:
        """Begin a running series named ``label`` (clears the previous live points)."""
        self.live, self.live_label = [], inert(label)  # a model's name: plotext's ANSI is parsed (OSC 8 too)
        self.replot()

    def add_sample(self, sample: Sample | ParallelSample) -> None:
        """Add one measured repetition to the running series (ignored when it does not belong here)."""
        point = self.live_point(sample)
        if point is not None:
            self.live.append(point)
            self.replot()

    def end_live(self) -> None:
        """Drop the running series (its finished result is shown through :meth:`set_results`)."""
        self.live = []
        self.replot()

    def live_point(self, sample: Sample | ParallelSample) -> tuple[float, ...] | None:
        raise NotImplementedError

    def series_count(self) -> int:
        raise NotImplementedError

    def begin_figure(self, title: str, xlabel: str, ylabel: str):
        """Clear the figure for :meth:`replot` and label it (the title says when nothing is drawn yet);
        returns plotext's figure."""
        plt = self.plt
        plt.clear_data()
        plt.title(title if self.series_count() else f"{title} — no data yet")
        plt.xlabel(xlabel)
        plt.ylabel(ylabel)
        self.y_top, self.legend_lines = 0.0, 0
        return plt

    def draw_live(self) -> None:
        """The running sweep's ``(x, y)`` repetitions as white crosses, named in the legend."""
        if self.live:
            xs, ys = (list(v) for v in zip(*self.live, strict=True))
            self.plt.scatter(xs, ys, marker="x", color="white", label=f"{self.live_label} (running)")
            self.y_top = max(self.y_top, *ys)
            self.legend_lines += 1

    def replot(self) -> None:
        raise NotImplementedError


class BenchPlot(SeriesPlot):
    """One experiment plot; ``kind`` picks the axes ("ttft" or "decode")."""

    TITLES: ClassVar[dict[str, tuple[str, str, str]]] = {
        "ttft": ("Prefill: TTFT vs prompt length", "prompt tokens", "TTFT ms"),
        "decode": ("Decode: tok/s vs context depth", "depth (tokens in KV cache)", "tok/s"),
    }

    def __init__(self, kind: PlotKind, **kwargs) -> None:
        super().__init__(**kwargs)
        self.kind: PlotKind = kind

    def live_point(self, sample: Sample | ParallelSample) -> tuple[float, float] | None:
        return sample_point(self.kind, sample)

    def series_count(self) -> int:
        """How many series have points on this plot (for tests and the empty-state hint)."""
        drawn = sum(
            1 for r in self.results if isinstance(r, SweepResult) and any(cell_point(self.kind, c) for c in r.results)
        )
        return drawn + (1 if self.live else 0)

    def replot(self) -> None:
        """Rebuild the plotext figure and schedule a repaint."""
        plt = self.begin_figure(*self.TITLES[self.kind])
        for i, res in enumerate(self.results):
            if not isinstance(res, SweepResult):  # a parallel sweep's: drawn on the Parallel tab
                continue
            pts = sorted(p for p in (cell_point(self.kind, c) for c in res.results) if p)
            if not pts:
                continue
            color = COLORS[i % len(COLORS)]
            xs, ys, sds = (list(v) for v in zip(*pts, strict=True))
            plt.plot(xs, ys, marker="dot", color=color, label=inert(res.display_label()))  # a loaded file's
            if any(sds):
                plt.error(xs, ys, yerr=sds, color=color)
            self.y_top = max(self.y_top, *(y + sd for y, sd in zip(ys, sds, strict=True)))
            self.legend_lines += 1
        self.draw_live()
        self.refresh()


class ParallelPlot(SeriesPlot):
    """Aggregate and per-sequence decode tok/s against N (sequences decoded together).

    Each finished result draws two lines in its colour: the aggregate (dots) and the per-sequence rate
    (crosses, "per seq" in the legend); the running sweep's repetitions appear as they are measured.
    """

    def live_point(self, sample: Sample | ParallelSample) -> tuple[float, float, float] | None:
        """``(N, aggregate, per sequence)`` tok/s of a measured parallel repetition."""
        if (
            isinstance(sample, ParallelSample)
            and not sample.warmup
            and sample.aggregate_decode_tokens_per_s is not None
        ):
            return float(sample.n_seq), sample.aggregate_decode_tokens_per_s, sample.decode_tokens_per_s or 0.0
        return None

    def series_count(self) -> int:
        """How many results (and the running sweep) have points here."""
        return sum(1 for r in self.results if isinstance(r, ParallelResult) and r.parallel) + (1 if self.live else 0)

    def replot(self) -> None:
        """Rebuild the plotext figure and schedule a repaint."""
        plt = self.plt
        plt.clear_data()
        title = "Parallel decode: tok/s vs sequences decoded together"
        plt.title(title if self.series_count() else f"{title} — no data yet")
        plt.xlabel("N (sequences)")
        plt.ylabel("tok/s")
        ticks: set[float] = set()
        drawn = 0
        self.y_top, self.legend_lines = 0.0, 0
        for res in self.results:
            if not isinstance(res, ParallelResult):  # a sweep's: drawn on the Prompt length & depth tab
                continue
            cells = sorted(
                (c for c in res.parallel if c.aggregate_decode_tokens_per_s.mean is not None), key=lambda c: c.n_seq
            )
            if not cells:
                continue
            color = COLORS[drawn % len(COLORS)]
            drawn += 1
            xs = [float(c.n_seq) for c in cells]
            ticks.update(xs)
            label = inert(res.display_label())  # a loaded file's
            plt.plot(
                xs,
                [c.aggregate_decode_tokens_per_s.mean for c in cells],
                marker="dot",
                color=color,
                label=f"{label} aggregate",
            )
            plt.plot(
                xs,
                [c.decode_tokens_per_s.mean or 0.0 for c in cells],
                marker="x",
                color=color,
                label=f"{label} per seq",
            )
            self.y_top = max(self.y_top, *(c.aggregate_decode_tokens_per_s.mean or 0.0 for c in cells))
            self.legend_lines += 2
        if self.live:
            xs, agg, per = (list(v) for v in zip(*self.live, strict=True))
            ticks.update(xs)
            plt.scatter(xs, agg, marker="dot", color="white", label=f"{self.live_label} aggregate (running)")
            plt.scatter(xs, per, marker="x", color="gray", label="per seq (running)")
            self.y_top = max(self.y_top, *agg, *per)
            self.legend_lines += 2
        if ticks:
            plt.xticks(sorted(ticks), [str(int(t)) for t in sorted(ticks)])
        self.refresh()
