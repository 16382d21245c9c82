"""The Experiments screen's Speculative tab: decode modes side by side, as ``chatphase bench --spec``.

The form lists the modes (``off,lookup,auto,draft:MODEL``; ``off`` always runs: the ratios are to it), the
repetitions and the reply tokens. Run measures every mode on the input-grounded and open-ended prompts,
interleaved (:class:`~chatphase.bench.spec.run.SpecRun` in a child process,
:class:`~chatphase.bench.core.job.SpecJob`), then the verify-step cost for k = 1…16 tokens. The table
(:func:`~chatphase.bench.spec.arms.row_cells`) fills as runs end; the plot shows ms per verify step against k beside
k single steps, the gap being what drafting can win on this machine.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal

from chatphase.bench.core.contract import Progress
from chatphase.bench.spec.arms import HEADERS, collect, row_cells, summary_rows
from chatphase.bench.spec.run import SpecPlan, SpecProgress, SpecResult
from chatphase.ui.experiments.panes import ExperimentPane
from chatphase.ui.experiments.plot import COLORS, SeriesPlot
from chatphase.units import DASH


class VerifyCostPlot(SeriesPlot):
    """ms per verify step against the tokens it evaluates (k), and k single-token steps for scale."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.costs: dict[int, float] = {}
        self.depth = 0

    def set_costs(self, costs: dict[int, float], depth: int) -> None:
        self.costs, self.depth = dict(costs), depth
        self.replot()

    def live_point(self, sample) -> None:  # the sweep runs after the arms, all at once
        return None

    def series_count(self) -> int:
        return 1 if self.costs else 0

    def replot(self) -> None:
        """Rebuild the plotext figure and schedule a repaint."""
        title = "Verify step: ms vs tokens evaluated" + (f" ({self.depth} cached)" if self.costs else "")
        plt = self.begin_figure(title, "k (tokens in one step)", "ms per step")
        if self.costs:
            ks = sorted(self.costs)
            ms = [self.costs[k] for k in ks]
            one = self.costs[ks[0]] / ks[0]
            singles = [one * k for k in ks]
            plt.plot(ks, singles, marker="braille", color="gray", label="k single steps")
            plt.plot(ks, ms, marker="dot", color=COLORS[0], label="one step of k")
            plt.xticks(sorted({ks[0], *(k for k in ks if k % 4 == 0)}))
            self.y_top = max(*ms, *singles)
            self.legend_lines = 2
        self.refresh()


class SpecPane(ExperimentPane):
    """Decode modes as arms, interleaved, and the verify-step cost (see the module docstring)."""

    kind = "spec"
    TITLE = "Speculative"
    COLUMNS = HEADERS

    def compose(self) -> ComposeResult:
        yield self.form()
        with Horizontal(id="exp-splots", classes="exp-plots"):
            yield VerifyCostPlot(id="exp-plot-verify")

    def add_progress(self, event: Progress) -> None:
        """The arms' runs draw nothing live (the verify-cost sweep runs after them, all at once)."""

    def plots(self):
        return self.query(VerifyCostPlot)

    def show_results(self, current: SpecResult | None, overlays) -> None:
        plot = self.query_one(VerifyCostPlot)
        plot.set_costs(current.costs_ms if current else {}, current.plan.get("depth", 0) if current else 0)

    @staticmethod
    def rows(result: SpecResult) -> list[list[str]]:
        return [row_cells(r) for r in result.rows]

    @staticmethod
    def live_rows(progress: list[SpecProgress], plan: SpecPlan) -> list[list[str]]:
        """Rows of the runs so far (a ratio to ``off`` once ``off`` ran the same prompt)."""
        return [row_cells(r) for r in summary_rows(collect([e.sample for e in progress]))]

    @staticmethod
    def summary(result: SpecResult) -> str:
        lines = []
        differ = sorted({r["spec"] for r in result.rows if not r["identical"]})
        if result.rows:
            lines.append(
                "Replies at temperature 0: identical to off for every arm."
                if not differ
                else f"Replies at temperature 0: {', '.join(differ)} parted from off (at a near-tie a batched "
                "step can pick another top token)."
            )
        costs = result.costs_ms
        if costs:
            one = costs[min(costs)]
            shown = [k for k in (2, 4, 8, 16) if k in costs]
            ratios = ", ".join(f"k={k} {costs[k] / one:.2f}×" for k in shown)
            lines.append(
                f"One step of k tokens costs, in single steps: {ratios} — a draft pays when a step keeps more "
                "tokens than that."
            )
        elif result.cancelled:
            lines.append(f"Verify-step cost: {DASH} (cancelled before it).")
        return "\n".join(lines)


__all__ = ["SpecPane", "VerifyCostPlot"]
