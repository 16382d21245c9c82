"""The Experiments screen's Side by side tab: one conversation on two sides, as ``chatphase compare``.

The form takes side B's settings (``KEY=VALUE,...`` on top of the chat's: ``type_k=q8_0``, ``model=FILE``) and the
reply length; the turns are the paragraphs of the text area below it. Run starts the comparison in a child process
(:func:`~chatphase.bench.experiments.job_for`); the sides run one after the other, never at once, and the status
line says so. Two columns (:class:`PhaseColumn`), A and B, draw each turn's phases as it ends — prefill (TTFT) then
decode — on **one time axis** shared by both columns, so a longer bar is a slower turn whichever side it is on. The
table gives the ratios B ÷ A per turn.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import TextArea

from chatphase.bench.compare.plan import ComparePlan, split_turns
from chatphase.bench.compare.result import FIGURES, ONE_AT_A_TIME, CompareResult, CompareTurn
from chatphase.bench.compare.run import CompareProgress
from chatphase.errors import UsageError
from chatphase.settings.schema import Settings
from chatphase.ui.experiments.form import PlanForm
from chatphase.ui.experiments.panes import ExperimentPane
from chatphase.units import DASH

#: the turns the text area starts with.
DEFAULT_TURNS = "Name three colours.\n\nWhich one is the warmest?\n\nWhy?"
#: a bar's cell: yellow in the prefill (TTFT), cyan in the decode
BLOCK = "█"
#: columns of a row's turn label.
LABEL_WIDTH = 8
#: columns of a row's TTFT before its bar (its other figures are in the table).
FIGURES_WIDTH = 10


class PhaseColumn(Widget):
    """One side's turns, a row each: its TTFT, then the turn's prefill (TTFT) and decode as a bar on the time axis
    ``scale_ms`` (the same for both columns: :meth:`ComparePane.rescale`)."""

    DEFAULT_CSS = "PhaseColumn { height: auto; min-height: 3; width: 1fr; margin-right: 1; }"

    def __init__(self, side: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.side = side
        self.turns: list[CompareTurn] = []
        self.scale_ms = 1.0
        self.title = f"side {side}"

    def show(self, turns: list[CompareTurn], scale_ms: float, title: str) -> None:
        self.turns, self.scale_ms, self.title = turns, max(scale_ms, 1e-9), title
        self.refresh(layout=True)

    def get_content_height(self, container, viewport, width: int) -> int:
        return 2 + max(len(self.turns), 1)

    def render(self) -> Text:
        text = Text(self.title, style="bold")
        if not self.turns:
            text.append("\n(no turn yet)", style="dim")
            return text
        width = max(self.size.width - LABEL_WIDTH - FIGURES_WIDTH - 1, 4)
        for t in self.turns:
            ttft, decode = t.ttft_ms or 0.0, t.decode_ms or 0.0
            a = round(ttft / self.scale_ms * width)
            b = round((ttft + decode) / self.scale_ms * width) - a
            text.append(f"\nturn {t.turn + 1:<3}", style="dim")
            text.append(f"{_ms(t.ttft_ms):>9} ", style="dim")
            text.append(BLOCK * a, style="yellow")
            text.append(BLOCK * b, style="cyan")
        text.append(f"\n{'':<{LABEL_WIDTH + FIGURES_WIDTH}}")
        text.append(BLOCK, style="yellow")
        text.append(" TTFT ", style="dim")
        text.append(BLOCK, style="cyan")
        text.append(f" decode  0–{self.scale_ms:,.0f} ms", style="dim")
        return text


def _ms(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f} ms"


class ComparePane(ExperimentPane):
    """Side by side (module docstring)."""

    kind = "compare"
    TITLE = "Side by side"
    COLUMNS = ("turn", "TTFT A", "TTFT B", *(f"{f} B/A" for f in ("TTFT", "prefill", "decode", "KV", "RSS")))

    def __init__(self) -> None:
        super().__init__()
        self._live: list[CompareTurn] = []

    def compose(self) -> ComposeResult:
        yield PlanForm(self.experiment, {"b": "type_k=q8_0"})
        yield TextArea(DEFAULT_TURNS, id="exp-cturns", soft_wrap=True, show_line_numbers=False)
        with Horizontal(id="exp-ccolumns", classes="exp-plots"):
            yield PhaseColumn("A", id="exp-cside-a")
            yield PhaseColumn("B", id="exp-cside-b")

    def plan(self, settings: Settings) -> ComparePlan:
        """The comparison the form and the turns describe.

        Raises:
            UsageError: a malformed field, no turn, or no side B.
        """
        turns = split_turns(self.query_one("#exp-cturns", TextArea).text)
        if not turns:
            raise UsageError("Turns: write at least one (paragraphs separated by a blank line)")
        plan = ComparePlan(turns=turns, **self.query_one(PlanForm).values())
        return plan.validate(settings.engine.n_ctx_before_load, settings.engine.n_batch)

    def start_live(self, label: str) -> None:
        self._live = []
        self.rescale(self._live)

    def add_progress(self, event) -> None:
        if isinstance(event, CompareProgress):
            self._live.append(event.turn)
            self.rescale(self._live)

    def show_results(self, current: CompareResult | None, overlays) -> None:
        self.rescale(current.turns if current else self._live)

    def rescale(self, turns: list[CompareTurn]) -> None:
        """Both columns on one time axis: the longest turn of either side spans the bar width."""
        scale = max(((t.ttft_ms or 0.0) + (t.decode_ms or 0.0) for t in turns), default=1.0)
        for side in ("A", "B"):
            mine = sorted((t for t in turns if t.side == side), key=lambda t: t.turn)
            self.query_one(f"#exp-cside-{side.lower()}", PhaseColumn).show(mine, scale, f"side {side}")

    @staticmethod
    def rows(result: CompareResult) -> list[list[str]]:
        by_turn = {k: (a, b) for k, a, b in result.pairs()}
        out = []
        for r in result.ratios():
            a, b = by_turn[r["turn"] - 1]
            cells = [_ms(a.ttft_ms if a else None), _ms(b.ttft_ms if b else None)]
            cells += [DASH if r[f] is None else f"{r[f]:.2f}×" for f in FIGURES]
            out.append([str(r["turn"]), *cells])
        return out

    def live_rows(self, progress: list, plan) -> list[list[str]]:
        turns = [e.turn for e in progress if isinstance(e, CompareProgress)]
        return self.rows(CompareResult(turns=turns))

    @staticmethod
    def summary(result: CompareResult) -> str:
        names = " · ".join(f"{s.name} = {s.model}" for s in result.sides)
        diffs = "; ".join(f"{k}: A {a!r}, B {b!r}" for k, (a, b) in result.differences().items())
        return "\n".join(line for line in (names, diffs, ONE_AT_A_TIME[:1].upper() + ONE_AT_A_TIME[1:] + ".") if line)
