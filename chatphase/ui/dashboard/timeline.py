"""A per-turn timeline drawn to scale: tokenise → prefill → first token → decode (a reasoning model's:
thinking → answer), and the prompt's cached part.

Two bars share the widget's width:

- time (ms): ``tokenize_ms`` (templating + tokenisation), ``prefill_ms`` (evaluating the new prompt tokens),
  first sample (``ttft_ms - tokenize_ms - prefill_ms``: sampling the first token and the hand-off), then
  ``decode_ms``. The TTFT boundary is where decode starts. A turn with a thinking block splits decode into
  ``thinking_ms`` (from the first token to the block's end) and the answer (the rest of ``decode_ms``).
- prompt (tokens): ``cached_tokens`` reused from the KV cache, shown apart from the ``prefill_tokens``
  evaluated this turn — the cached part costs no time, so it only shows on this token scale. Tokens restored
  from the prefix store (``restored_tokens``) are a segment of their own, and their ``restore_ms`` a time
  segment before the prefill.

A turn with a thinking block adds a third bar, reply (tokens): ``thinking_tokens`` then ``answer_tokens``.
A speculative turn adds a steps line under the time bar's legend: its decode's target steps (``spec_steps``),
``spec_tokens_per_step``, the mean verify-step and plain-step ms, and ``spec_speedup`` (:func:`step_items`).

A phase that did not happen (no first token: a turn cancelled in its prefill) gets no cell and reads ``–``
in the legend, not ``0.0 ms``. Each segment with a non-zero length gets at least one cell, so a 1 ms
tokenise step stays visible next to a 2 s decode; cells are shared out by largest remainder. Colours come
from component classes (set in its ``DEFAULT_CSS`` with theme variables, so light and dark themes both work);
each segment also has its own character, so the bar reads without colour.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.widget import Widget

from chatphase.engine.metrics import TurnMetrics
from chatphase.units import DASH, fmt_at_threads

#: segment kind -> (glyph, label)
SEGMENTS: dict[str, tuple[str, str]] = {
    "tokenize": ("░", "tokenise"),
    "prefill": ("█", "prefill"),
    "first": ("▓", "1st token"),
    "decode": ("━", "decode"),
    "thinking": ("┅", "thinking"),
    "answer": ("━", "answer"),
    "cached": ("▒", "cached"),
    "evaluated": ("█", "evaluated"),
    "restore": ("▚", "restore"),
    "restored": ("▚", "restored"),
}


def time_segments(m: TurnMetrics) -> list[tuple[str, float | None]]:
    """``[(kind, ms), ...]`` of the turn's wall time in order: tokenize, prefill, first, decode (or thinking
    and answer, for a turn with a thinking block). ``None`` for a phase that did not happen: without a
    first token (a turn cancelled in its prefill) neither the first token nor decode did."""
    ttft = m.ttft_ms
    if ttft is None:
        decode: list[tuple[str, float | None]] = (
            [("thinking", None), ("answer", None)] if m.thought else [("decode", None)]
        )
    elif m.thought:
        thinking = min(m.thinking_ms or 0.0, m.decode_ms or 0.0)
        decode = [("thinking", thinking), ("answer", max(0.0, (m.decode_ms or 0.0) - thinking))]
    else:
        decode = [("decode", m.decode_ms or 0.0)]
    if m.tokenize_ms is None or m.prefill_ms is None:  # a remote server without timings: TTFT is one block
        return [("first", ttft), *decode]
    restore = [("restore", m.restore_ms)] if m.restore_ms is not None else []
    spent = m.tokenize_ms + m.prefill_ms + (m.restore_ms or 0.0)
    first = max(0.0, ttft - spent) if ttft is not None else None
    return [("tokenize", m.tokenize_ms), *restore, ("prefill", m.prefill_ms), ("first", first), *decode]


def token_segments(m: TurnMetrics) -> list[tuple[str, float]]:
    """``[(kind, tokens), ...]`` of the prompt: cached (kept in memory), restored (read from the prefix store;
    only when some were), then evaluated."""
    if m.cached_tokens is None or m.prefill_tokens is None:  # counts the server did not report
        return []
    if m.restored_tokens:
        return [
            ("cached", float(m.cached_tokens - m.restored_tokens)),
            ("restored", float(m.restored_tokens)),
            ("evaluated", float(m.prefill_tokens)),
        ]
    return [("cached", float(m.cached_tokens)), ("evaluated", float(m.prefill_tokens))]


def reply_segments(m: TurnMetrics) -> list[tuple[str, float]]:
    """``[(kind, tokens), ...]`` of the reply: thinking then answer (``[]`` for a turn without thinking)."""
    if m.thinking_tokens is None:
        return []
    return [("thinking", float(m.thinking_tokens)), ("answer", float(m.answer_tokens or 0))]


def _ms(v: float | None) -> str:
    if v is None:
        return DASH
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.1f} ms"


def step_items(m: TurnMetrics) -> list[str]:
    """The steps line's items of a speculative turn (``[]`` for plain decode or unknown steps):
    ``["12 target steps", "2.5 tok/step", "verify 9.1 ms/step", "plain 6.0 ms/step at 2 threads", "×1.6"]``, each
    where known (the speed-up against plain steps at that decode thread count)."""
    if m.spec_mode is None or m.spec_steps is None:
        return []
    items = [f"{m.spec_steps:,} target steps"]
    if m.spec_tokens_per_step is not None:
        items.append(f"{m.spec_tokens_per_step:.1f} tok/step")
    for name, ms, at in (
        ("verify", m.spec_verify_step_ms, None),
        ("plain", m.spec_plain_step_ms, m.spec_plain_threads),
    ):
        if ms is not None:
            items.append(f"{name} {_ms(ms)}/step{fmt_at_threads(at)}")
    if m.spec_speedup is not None:
        items.append(f"×{m.spec_speedup:.1f}")
    return items


def scale_cells(lengths: Sequence[float], width: int) -> list[int]:
    """Share ``width`` cells among ``lengths`` in proportion (largest remainder).

    Every positive length gets at least one cell while ``width`` allows; zero lengths get none. The result
    sums to ``width`` when any length is positive, else to 0.
    """
    total = sum(x for x in lengths if x > 0)
    if total <= 0 or width <= 0:
        return [0] * len(lengths)
    positive = [i for i, x in enumerate(lengths) if x > 0]
    cells = [0] * len(lengths)
    reserved = min(width, len(positive))
    for i in positive[:reserved]:
        cells[i] = 1
    rest = width - reserved
    exact = [(lengths[i] / total) * rest if i in positive else 0.0 for i in range(len(lengths))]
    floors = [int(e) for e in exact]
    for i, f in enumerate(floors):
        cells[i] += f
    left = rest - sum(floors)
    order = sorted(range(len(lengths)), key=lambda i: exact[i] - floors[i], reverse=True)
    for i in order[:left]:
        cells[i] += 1
    return cells


class TurnTimeline(Widget):
    """Timeline bars of one turn. Call :meth:`show` with a turn's metrics, :meth:`clear` to empty it."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"timeline--{k}" for k in SEGMENTS}
    """``timeline--tokenize|prefill|first|decode|thinking|answer|cached|evaluated``: the colour of each segment."""

    DEFAULT_CSS = """
    TurnTimeline {
        height: auto;
        margin: 0 0 1 0;
    }
    TurnTimeline > .timeline--tokenize { color: $text-muted; }
    TurnTimeline > .timeline--prefill { color: $warning; }
    TurnTimeline > .timeline--first { color: $error; }
    TurnTimeline > .timeline--decode { color: $success; }
    TurnTimeline > .timeline--thinking { color: $secondary; }
    TurnTimeline > .timeline--answer { color: $success; }
    TurnTimeline > .timeline--cached { color: $accent; }
    TurnTimeline > .timeline--evaluated { color: $warning; }
    TurnTimeline > .timeline--restore { color: $primary; }
    TurnTimeline > .timeline--restored { color: $primary; }
    """

    LABEL_WIDTH = 8

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._metrics: TurnMetrics | None = None

    @property
    def metrics(self) -> TurnMetrics | None:
        """The turn drawn (``None`` when empty)."""
        return self._metrics

    def show(self, metrics: TurnMetrics) -> None:
        """Draw ``metrics``."""
        self._metrics = metrics
        self.refresh()

    def clear(self) -> None:
        """Show nothing (new chat)."""
        self._metrics = None
        self.refresh()

    def _bar(self, label: str, segments: Sequence[tuple[str, float | None]], width: int) -> Text:
        text = Text(label.ljust(self.LABEL_WIDTH))
        for (kind, _), n in zip(segments, scale_cells([v or 0.0 for _, v in segments], width), strict=True):
            if n:
                text.append(SEGMENTS[kind][0] * n, style=self.get_component_rich_style(f"timeline--{kind}"))
        return text

    def _legend(self, segments: Sequence[tuple[str, float | None]], fmt, width: int) -> Text:
        """Legend items (glyph, label, value; ``–`` for a phase that did not happen), wrapped between items —
        never inside one — to ``width``."""
        indent = " " * self.LABEL_WIDTH
        text = Text(indent)
        used = 0
        for kind, value in segments:
            glyph, label = SEGMENTS[kind]
            item = f" {label} {fmt(value)}"
            need = 1 + len(item) + (2 if used else 0)
            if used and used + need > width:
                text.append("\n" + indent)
                used = 0
            elif used:
                text.append("  ")
            text.append(glyph, style=self.get_component_rich_style(f"timeline--{kind}"))
            text.append(item)
            used += 1 + len(item) + (2 if used else 0)
        return text

    def _steps(self, items: list[str], width: int) -> list[Text]:
        """The steps line (``[]`` without items): items joined by `` · ``, wrapped between items to ``width``."""
        if not items:
            return []
        lines, line = [], ""
        for item in items:
            if line and len(line) + 3 + len(item) > width:
                lines.append(line)
                line = item
            else:
                line = f"{line} · {item}" if line else item
        lines.append(line)
        labels = ["steps", *[""] * (len(lines) - 1)]
        return [Text(label.ljust(self.LABEL_WIDTH)) + Text(t) for label, t in zip(labels, lines, strict=True)]

    def render_width(self, width: int) -> Text:
        """The timeline as Rich text for a content ``width`` in cells (used by :meth:`render` and for the height)."""
        m = self._metrics
        if m is None:
            return Text("no turn yet", style="italic")
        bar_width = max(4, width - self.LABEL_WIDTH)
        times = time_segments(m)
        tokens = token_segments(m)
        lines = [
            self._bar("time", times, bar_width),
            self._legend(times, _ms, bar_width),
            *self._steps(step_items(m), bar_width),
            self._bar("prompt", tokens, bar_width),
            self._legend(tokens, lambda v: f"{int(v):,} tok", bar_width),
        ]
        reply = reply_segments(m)
        if reply:
            lines += [self._bar("reply", reply, bar_width), self._legend(reply, lambda v: f"{int(v):,} tok", bar_width)]
        return Text("\n").join(lines)

    def render(self) -> Text:
        return self.render_width(self.content_size.width)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self.render_width(width).plain.splitlines())
