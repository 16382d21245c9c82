"""The phase dashboard: live decode rate, KV gauge with forecast, turn history + detail, plots, system figures.

The app mounts ``Dashboard()`` and drives it with four calls (nothing here talks to the engine):
:meth:`Dashboard.set_model` on ``ModelLoaded``, :meth:`Dashboard.turn_finished` on ``TurnFinished``,
:meth:`Dashboard.decode_rate` during decode (at a bounded rate: each call repaints the sparkline) and
:meth:`Dashboard.reset` on a new chat.

Layout: two always-visible lines (live tokens/s sparkline, KV gauge) above tabs — *Turns* (history table,
then the chosen turn's timeline, metrics and phase explanations), *Plots*, *System* — so it stays readable in
the few rows an 80×24 terminal leaves it. Each widget carries its own styles (``DEFAULT_CSS``).

The Plots tab's *every session* toggle adds this model's turns from every earlier session to both plots: read by
the ``history_source`` the app gives (the history database), in a thread worker, never on the UI thread.
"""

from __future__ import annotations

from collections.abc import Callable

from textual import work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Checkbox, TabbedContent, TabPane

from chatphase.engine.events import LoadedModel
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.overflow import DEFAULT_OVERFLOW
from chatphase.timing.forecast import forecast_kv
from chatphase.ui.dashboard.history_table import TurnHistoryTable
from chatphase.ui.dashboard.kv_forecast import KvGauge
from chatphase.ui.dashboard.live_rate import LiveRate
from chatphase.ui.dashboard.phase_plots import DecodeDepthPlot, TtftPlot
from chatphase.ui.dashboard.system_figures import SystemFigures
from chatphase.ui.dashboard.turn_detail import TurnDetail


class Dashboard(Widget):
    """Per-turn phase metrics of the current chat, kept in memory (turn number -> :class:`TurnMetrics`)."""

    DEFAULT_CSS = """
    Dashboard {
        height: 1fr;
        width: 1fr;
        layout: vertical;
    }
    Dashboard #dash-tabs { height: 1fr; }
    Dashboard TabPane { padding: 0; }
    Dashboard TabPane > VerticalScroll { scrollbar-size-vertical: 1; }
    """

    def __init__(
        self,
        kv_usage: bool = True,
        history_source: Callable[[str], list[dict]] | None = None,
        overflow_policy: Callable[[], str] = lambda: DEFAULT_OVERFLOW,
        **kwargs,
    ) -> None:
        """``kv_usage=False``: the KV line shows only the forecast (for a host that shows the live gauge).
        ``history_source(model_name)``: the model's turns from earlier sessions, as dicts of metric fields (blocking:
        called in a worker thread; raises with a message for the user); ``None``: no *every session* toggle.
        ``overflow_policy()``: the policy in use now, for the forecast's words when the context is nearly full."""
        super().__init__(**kwargs)
        self.history_source = history_source
        self.overflow_policy = overflow_policy
        self.model: LoadedModel | None = None
        self.turns: dict[int, TurnMetrics] = {}
        self.selected_turn: int | None = None
        self.kv_usage = kv_usage
        #: KV tokens after each turn of the current engine (a new engine starts with an empty cache), the
        #: latest last; and how many of the conversation's turns the cache held after the latest.
        self._kv_tokens: dict[int, int] = {}
        self._turns_held: int | None = None

    def compose(self) -> ComposeResult:
        yield LiveRate(id="dash-live")
        yield KvGauge(id="dash-kv")
        with TabbedContent(id="dash-tabs"):
            with TabPane("Turns", id="tab-turns"):
                with VerticalScroll(id="dash-turns-scroll"):
                    yield TurnHistoryTable(id="dash-history")
                    yield TurnDetail(id="dash-detail")
            with TabPane("Plots", id="tab-plots"):
                with VerticalScroll(id="dash-plots-scroll"):
                    if self.history_source is not None:
                        yield Checkbox("every session of this model", id="dash-plots-history", compact=True)
                    yield TtftPlot(id="dash-ttft-plot")
                    yield DecodeDepthPlot(id="dash-decode-plot")
            with TabPane("System", id="tab-system"):
                with VerticalScroll():
                    yield SystemFigures(id="dash-system")

    # -- the app's four calls -------------------------------------------------------------------

    def set_model(self, model: LoadedModel) -> None:
        """A model was loaded (or switched): show its figures and size the KV gauge to its n_ctx."""
        self.model = model
        self._kv_tokens.clear()
        self._turns_held = None
        self.query_one(SystemFigures).set_model(model)
        self._load_history()
        self._update_kv()
        if self.selected_turn is not None:
            self.show_turn(self.selected_turn)

    def turn_finished(self, number: int, metrics: TurnMetrics, turns_held: int | None = None) -> None:
        """Record a finished turn: history row (updated in place if the number is shown), plots, KV forecast,
        and show it in the detail view. ``turns_held``: the conversation's turns the KV cache holds after it
        (this one included; default: the turns of this engine), so that a resumed chat's cold prefill of its
        earlier turns is not taken for one turn's growth (:func:`~chatphase.timing.forecast.forecast_kv`)."""
        self.turns[number] = metrics
        if metrics.kv_cache_tokens is not None:
            self._kv_tokens.pop(number, None)  # the latest last
            self._kv_tokens[number] = metrics.kv_cache_tokens
            self._turns_held = turns_held
        self.query_one(TurnHistoryTable).upsert_turn(number, metrics)
        self.query_one(TtftPlot).add_turn(metrics)
        self.query_one(DecodeDepthPlot).add_turn(metrics)
        self.query_one(SystemFigures).set_turn(metrics)
        self.query_one(LiveRate).settle(metrics.decode_tokens_per_s)
        self._update_kv()
        self.show_turn(number)

    def decode_rate(self, tokens_per_s: float) -> None:
        """A live decode-rate sample (tokens/s) for the sparkline; repaints it, so call at a bounded rate."""
        self.query_one(LiveRate).push(tokens_per_s)

    def reset(self) -> None:
        """New chat: forget the turns (the model stays)."""
        self.turns.clear()
        self._kv_tokens.clear()
        self._turns_held = None
        self.selected_turn = None
        self.query_one(TurnHistoryTable).reset()
        self.query_one(TurnDetail).clear()
        self.query_one(TtftPlot).clear_points()
        self.query_one(DecodeDepthPlot).clear_points()
        self.query_one(LiveRate).clear()
        self._update_kv()

    # -- every session -----------------------------------------------------------------------------

    @property
    def showing_history(self) -> bool:
        """Whether the *every session* toggle is on."""
        boxes = self.query("#dash-plots-history").results(Checkbox)
        return any(box.value for box in boxes)

    def on_checkbox_changed(self, message: Checkbox.Changed) -> None:
        if message.checkbox.id == "dash-plots-history":
            message.stop()
            self._load_history()

    def _load_history(self) -> None:
        """Read the earlier turns in a worker when the toggle is on (the latest request wins); hide them when off."""
        if self.showing_history and self.model is not None:
            self._read_history(self.model.info.name)
        else:
            self._show_history([])

    @work(thread=True, exclusive=True, group="dash-history")
    def _read_history(self, model_name: str) -> None:
        assert self.history_source is not None  # the toggle exists only with a source
        try:
            rows = self.history_source(model_name)
        except Exception as exc:  # the source's message (the database cannot be read): a notice, the chat goes on
            self.app.call_from_thread(self.notify, f"history: {exc}", severity="warning")
            return
        self.app.call_from_thread(self._show_history, rows)

    def _show_history(self, rows: list[dict]) -> None:
        if not self.showing_history and rows:
            return  # switched off while it was read
        self.query_one(TtftPlot).set_history(rows)
        self.query_one(DecodeDepthPlot).set_history(rows)

    # -- internals ------------------------------------------------------------------------------

    def show_turn(self, number: int) -> None:
        """Show turn ``number``'s timeline, metrics and explanations in the detail view.

        Raises:
            KeyError: for a turn number the dashboard has not recorded.
        """
        metrics = self.turns[number]
        self.selected_turn = number
        self.query_one(TurnDetail).show(number, metrics, self.model)

    def on_turn_history_table_turn_chosen(self, message: TurnHistoryTable.TurnChosen) -> None:
        message.stop()
        if message.number in self.turns:
            self.show_turn(message.number)

    def _update_kv(self) -> None:
        if self.model is None:
            return
        n_ctx = self.model.settings.n_ctx or 0
        if n_ctx <= 0 or not self.model.kv_bytes_per_token:
            return
        series = list(self._kv_tokens.values())
        self.query_one(KvGauge).update_forecast(
            forecast_kv(series, n_ctx, self._turns_held),
            self.model.kv_bytes_per_token,
            self.model.kv_capacity_bytes,
            usage=self.kv_usage,
            overflow=self.overflow_policy(),
        )
