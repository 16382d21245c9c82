"""The Experiments screen's Interference tab: N streams decode while a new prompt arrives, as
``chatphase bench --interference``.

The form sets N (running streams), the newcomer's prompt tokens, the chunk sizes, the repetitions and the decode
steps (the plan's knobs). Run starts the experiment in a child process (:func:`~chatphase.bench.experiments.job_for`). Two swim-lane
views (:class:`SwimLanes`) draw the runs as they go, from the run's :class:`~chatphase.bench.interference.run.LaneUpdate`
messages (a few a second, never one per token): the *whole prompt first* runs in the first, the chunked runs in the
second. One lane per sequence (the newcomer last), a tick per token, a block per step that held prompt tokens, shaded
across every lane, so the gap in each stream's lane under a big block is plain. The view repaints at most
:data:`REPAINT_HZ` times a second. When the run ends, the views show the last counted run of the whole prompt and of the
smallest chunk; the table gives every policy's ITL, stall and newcomer TTFT, the summary the trade-off and the mixed
step's roofline.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widget import Widget

from chatphase.bench.interference.analysis import Timeline, policy_rows
from chatphase.bench.interference.plan import InterferencePlan, policy_name
from chatphase.bench.interference.result import HEADERS, InterferenceResult, row_cells, tradeoff_lines
from chatphase.bench.interference.run import InterferenceProgress, LaneUpdate
from chatphase.ui.experiments.panes import ExperimentPane

#: the most repaints a second of a swim-lane view while a run goes.
REPAINT_HZ = 4
#: columns of a lane's name.
LABEL_WIDTH = 10
TICK, BLOCK, BLOCK_ALT, SHADE, EMPTY = "│", "█", "▓", "░", "·"


class SwimLanes(Widget):
    """Swim lanes of one run (module docstring): ``lanes[j]`` lane j's token times in ms, ``blocks`` the
    prompt-holding steps as ``(start_ms, end_ms)``, ``arrival_ms`` the newcomer's arrival (``None``: not yet)."""

    DEFAULT_CSS = "SwimLanes { height: auto; min-height: 4; width: 1fr; margin-right: 1; }"

    def __init__(self, title: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.title = title
        self.lanes: list[list[float]] = []
        self.blocks: list[tuple[float, float]] = []
        self.arrival_ms: float | None = None
        self._origin_ns = 0
        self._dirty = False

    def on_mount(self) -> None:
        self.set_interval(1 / REPAINT_HZ, self._repaint_if_changed)

    def _repaint_if_changed(self) -> None:
        if self._dirty:
            self._dirty = False
            self.refresh(layout=True)

    def add_update(self, update: LaneUpdate) -> None:
        """Add a live update's steps (a run's first update starts the lanes afresh); repainted at the next tick."""
        if update.first or len(self.lanes) != update.n_running + 1:
            self.lanes = [[] for _ in range(update.n_running + 1)]
            self.blocks, self.arrival_ms, self._origin_ns = [], None, update.t_start_ns
            self.title = f"live: {policy_name(update.policy)}"
        for step in update.steps:
            end = (step.t_end_ns - self._origin_ns) / 1e6
            for j in step.decoded:
                self.lanes[j].append(end)
            if step.prompt_tokens:
                start = (step.t_start_ns - self._origin_ns) / 1e6
                self.arrival_ms = start if self.arrival_ms is None else self.arrival_ms
                self.blocks.append((start, end))
        self._dirty = True

    def show(self, timeline: Timeline | None, title: str) -> None:
        """Draw a finished run's timeline (``None``: empty)."""
        self.title = title
        self.lanes = [list(x) for x in timeline.lanes] if timeline else []
        self.blocks = [(a, b) for a, b, _ in timeline.blocks] if timeline else []
        self.arrival_ms = timeline.arrival_ms if timeline else None
        self.refresh(layout=True)

    def get_content_height(self, container, viewport, width: int) -> int:
        return 2 + max(len(self.lanes), 1)

    def render(self) -> Text:
        width = max(self.size.width - LABEL_WIDTH, 10)
        text = Text(self.title, style="bold")
        if not self.lanes:
            text.append("\n(no run yet)", style="dim")
            return text
        times = [t for lane in self.lanes for t in lane] + [b for _, b in self.blocks]
        lo = min(times, default=0.0)
        lo = min(lo, self.arrival_ms) if self.arrival_ms is not None else lo
        span = max(max(times, default=1.0) - lo, 1e-9)

        def col(t: float) -> int:
            return min(width - 1, int((t - lo) / span * (width - 1)))

        block = [-1] * width  # the prompt-holding step over each column (-1: none)
        for i, (a, b) in enumerate(self.blocks):
            for c in range(col(a), col(b) + 1):
                block[c] = i
        n = len(self.lanes)
        for j, lane in enumerate(self.lanes):
            newcomer = j == n - 1
            # the newcomer's lane shows each step's block, alternating so that back-to-back chunks stay apart
            row = [(BLOCK if i % 2 == 0 else BLOCK_ALT) if newcomer and i >= 0 else SHADE if i >= 0 else EMPTY
                   for i in block]  # fmt: skip
            for t in lane:
                row[col(t)] = TICK
            name = "newcomer" if newcomer else f"stream {j}"
            text.append(f"\n{name:<{LABEL_WIDTH}}", style="dim")
            for ch in row:
                text.append(ch, style="red" if ch in (BLOCK, BLOCK_ALT, SHADE) else "cyan" if ch == TICK else "dim")
        marker = [" "] * width
        if self.arrival_ms is not None:
            marker[col(self.arrival_ms)] = "▲"
        text.append(f"\n{'':<{LABEL_WIDTH}}" + "".join(marker).rstrip(), style="yellow")
        text.append(f"  {lo:,.0f}–{lo + span:,.0f} ms", style="dim")
        return text


class InterferencePane(ExperimentPane):
    """Prefill meets decode: the whole prompt first against chunked-mixed steps (module docstring)."""

    kind = "interference"
    TITLE = "Interference"
    COLUMNS = tuple(HEADERS)

    def compose(self) -> ComposeResult:
        yield self.form()
        with Horizontal(id="exp-ilanes", classes="exp-plots"):
            yield SwimLanes("whole prompt first", id="exp-lanes-whole")
            yield SwimLanes("chunked", id="exp-lanes-chunked")

    def lanes(self, policy: int | None) -> SwimLanes:
        return self.query_one("#exp-lanes-whole" if policy is None else "#exp-lanes-chunked", SwimLanes)

    def add_lanes(self, update: LaneUpdate) -> None:
        """A running run's steps onto its view (the whole prompt's or the chunked runs')."""
        self.lanes(update.policy).add_update(update)

    def take_event(self, event: object, plan: InterferencePlan) -> str | None:
        """A :class:`LaneUpdate` (a few a second while a run goes) onto the live swim lanes; a run's first says
        the run in the status line (no 'Loading…' while the lanes draw)."""
        if not isinstance(event, LaneUpdate):
            return None
        self.add_lanes(event)
        return f"{self.lane_text(event, plan)}…" if event.first and isinstance(plan, InterferencePlan) else None

    def show_results(self, current: InterferenceResult | None, overlays) -> None:
        chunks = sorted({s.chunk for s in current.samples if s.chunk is not None}) if current else []
        smallest = chunks[0] if chunks else None
        self.lanes(None).show(current.timeline(None) if current else None, "whole prompt first")
        self.query_one("#exp-lanes-chunked", SwimLanes).show(
            current.timeline(smallest) if current and chunks else None,
            f"{policy_name(smallest)} (the smallest)" if chunks else "chunked",
        )

    @staticmethod
    def lane_text(update: LaneUpdate, plan: InterferencePlan) -> str:
        """The status line's words for the run that ``update`` starts: its policy and repetition."""
        warm = update.rep < plan.warmup
        rep = f"warm-up {update.rep + 1}" if warm else f"rep {update.rep - plan.warmup + 1}"
        return f"measuring {policy_name(update.policy)} {rep}"

    @staticmethod
    def rows(result: InterferenceResult) -> list[list[str]]:
        return [row_cells(r) for r in result.rows()]

    @staticmethod
    def live_rows(progress: list[InterferenceProgress], plan: InterferencePlan) -> list[list[str]]:
        """Rows of the policies measured so far (counted runs)."""
        return [row_cells(r) for r in policy_rows([e.sample for e in progress])]

    @staticmethod
    def summary(result: InterferenceResult) -> str:
        return "\n".join([*tradeoff_lines(result.rows()), *(result.roofline or {}).get("interference_lines", [])])


__all__ = ["InterferencePane", "SwimLanes"]
