"""Plots that grow as turns accumulate (textual-plotext ``PlotextPlot`` scatter plots).

- :class:`TtftPlot`: TTFT (ms) against prompt tokens. Prefill grows with the prompt; turns that reused a
  cached prefix are a second series, since their TTFT follows the *evaluated* tokens, not the prompt. A
  reasoning model's turns add a third: TTFA, the first *answer* token, which waits for the thinking too.
- :class:`DecodeDepthPlot`: decode tokens/s against context depth (KV tokens after the turn). Each decode
  step re-reads the whole KV cache, so the rate falls as the conversation grows.

Both redraw only when a turn is added or the chat is reset (never per token); plotext re-lays out on resize.

Either can also show the model's turns from every earlier session (:meth:`_ScatterPlot.set_history`, the
dashboard's *every session* toggle): one more series, drawn beneath this chat's. TTFT's earlier points are at
the prompt tokens each turn *evaluated* (those not served from the KV cache), so everyday chats, whose later
turns reuse a cached prefix, fill the prompt-length curve where a cold prompt of that length would sit.
"""

from __future__ import annotations

from textual.app import RenderResult
from textual_plotext import PlotextPlot

from chatphase.engine.metrics import TurnMetrics


class _ScatterPlot(PlotextPlot):
    """A scatter plot of (x, y) points in named series.

    Series are told apart by marker (``MARKERS``, named in the title); plotext's legend would cover the
    points in the top-left corner. Subclasses set the titles and ``SERIES`` and define ``point_for(metrics) -> (series, x, y) | None``
    (or ``points_for``, for more than one point a turn).
    """

    DEFAULT_CSS = """
    _ScatterPlot {
        height: 1fr;
        min-height: 10;
    }
    """

    TITLE = ""
    #: the marker of the earlier sessions' points (:meth:`set_history`)
    HISTORY_MARKER = "·"
    XLABEL = ""
    YLABEL = ""
    SERIES: tuple[str, ...] = ()
    MARKERS: tuple[str, ...] = ("dot", "x")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.points: dict[str, list[tuple[float, float]]] = {s: [] for s in self.SERIES}
        self.history: list[tuple[float, float]] = []  # earlier sessions' points, drawn beneath

    def on_mount(self) -> None:
        # PlotextPlot's own on_mount (theme subscription) is dispatched by Textual too: no super() call
        self.replot()

    def clear_points(self) -> None:
        """Remove every point (new chat)."""
        self.points = {s: [] for s in self.SERIES}
        self.replot()

    def add_turn(self, metrics: TurnMetrics) -> None:
        """Add the turn's point, if its metrics define one."""
        points = self.points_for(metrics)
        for series, x, y in points:
            self.points[series].append((x, y))
        if points:
            self.replot()

    def set_history(self, rows: list[dict]) -> None:
        """Show earlier sessions' turns (dicts of the metric fields :meth:`history_point` reads; ``[]`` hides them)."""
        self.history = [p for r in rows if (p := self.history_point(r)) is not None]
        self.replot()

    def history_point(self, row: dict) -> tuple[float, float] | None:
        """An earlier turn's ``(x, y)`` from its recorded figures (each plot's own)."""
        raise NotImplementedError

    def point_for(self, metrics: TurnMetrics) -> tuple[str, float, float] | None:
        """The turn's one ``(series, x, y)`` point, ``None`` when its figures are unknown (each plot's own)."""
        raise NotImplementedError

    def points_for(self, metrics: TurnMetrics) -> list[tuple[str, float, float]]:
        """The turn's points: :meth:`point_for`'s, if any."""
        point = self.point_for(metrics)
        return [] if point is None else [point]

    def title(self) -> str:
        """The title (:attr:`TITLE`), naming the earlier sessions' points when shown."""
        return self.TITLE + (f" · {len(self.history)} earlier" if self.history else "")

    def short_title(self) -> str:
        """The title without its markers' legend, for a plot too narrow for :meth:`title`."""
        return self.TITLE.split(" (", 1)[0] + (f" · {len(self.history)} earlier" if self.history else "")

    def drawn_title(self) -> str:
        """The title that fits the plot's width: plotext draws none at all when it is wider."""
        width = self.size.width or 80
        for title in (self.title(), self.short_title()):
            if len(title) <= width:
                return title
        return self.short_title()[: max(width - 1, 0)] + "…"

    def render(self) -> RenderResult:
        self.plt.title(self.drawn_title())  # at the width it is drawn at
        return super().render()

    def replot(self) -> None:
        """Rebuild the plotext figure from :attr:`points` and schedule a repaint."""
        plt = self.plt
        plt.clear_data()
        plt.xlabel(self.XLABEL)
        plt.ylabel(self.YLABEL)
        if self.history:
            xs, ys = zip(*self.history, strict=True)
            plt.scatter(list(xs), list(ys), marker=self.HISTORY_MARKER)
        for pts, marker in zip(self.points.values(), self.MARKERS, strict=False):
            if pts:
                xs, ys = zip(*pts, strict=True)
                plt.scatter(list(xs), list(ys), marker=marker)
        self.refresh()


class TtftPlot(_ScatterPlot):
    """TTFT (ms) against prompt tokens; series ``cold`` (nothing cached) and ``cached prefix``."""

    TITLE = "TTFT vs prompt tokens (• cold, x cached prefix)"
    XLABEL = "prompt tokens"
    YLABEL = "TTFT ms"
    SERIES = ("cold", "cached prefix", "first answer")
    MARKERS = ("dot", "x", "+")

    def point_for(self, metrics: TurnMetrics) -> tuple[str, float, float] | None:
        if metrics.ttft_ms is None or metrics.prompt_tokens is None:
            return None
        series = "cached prefix" if metrics.cached_tokens else "cold"
        return series, float(metrics.prompt_tokens), float(metrics.ttft_ms)

    def points_for(self, metrics: TurnMetrics) -> list[tuple[str, float, float]]:
        """TTFT's point, and TTFA's for a turn whose answer followed a thinking block."""
        points = super().points_for(metrics)
        if points and metrics.ttfa_ms is not None and metrics.prompt_tokens is not None:
            points.append(("first answer", float(metrics.prompt_tokens), float(metrics.ttfa_ms)))
        return points

    def title(self) -> str:
        title = "TTFT vs prompt tokens (• cold, x cached, + TTFA)" if self.points["first answer"] else self.TITLE
        return title + (f" · {len(self.history)} earlier (tokens evaluated)" if self.history else "")

    def history_point(self, row: dict) -> tuple[float, float] | None:
        prompt, ttft = row.get("prompt_tokens"), row.get("ttft_ms")
        if prompt is None or ttft is None:
            return None
        return float(prompt - (row.get("cached_tokens") or 0)), float(ttft)


class DecodeDepthPlot(_ScatterPlot):
    """Decode tokens/s against context depth (``kv_cache_tokens`` after the turn)."""

    TITLE = "decode tok/s vs context depth"
    XLABEL = "KV tokens"
    YLABEL = "tok/s"
    SERIES = ("decode",)

    def history_point(self, row: dict) -> tuple[float, float] | None:
        depth, rate = row.get("kv_cache_tokens"), row.get("decode_tokens_per_s")
        return None if depth is None or rate is None else (float(depth), float(rate))

    def point_for(self, metrics: TurnMetrics) -> tuple[str, float, float] | None:
        if metrics.decode_tokens_per_s is None or metrics.kv_cache_tokens is None:
            return None
        return "decode", float(metrics.kv_cache_tokens), float(metrics.decode_tokens_per_s)
