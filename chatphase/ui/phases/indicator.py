"""The one-line phase indicator above the prompt: which phase the model is in, live.

- prefill: a :class:`~textual.widgets.ProgressBar` over the prompt tokens being evaluated, with the
  elapsed prefill time and the prefill rate ``done_tokens / elapsed`` (both from the engine's
  ``PrefillProgress`` events, so they describe the engine, not the UI's redraws);
- thinking (a reasoning model's thinking block, a phase of decode): its token count, its time so far
  and TTFT, before the answer's decode;
- decode: the token count, TTFT and the live decode rate (the turn's, from the engine's token
  timestamps: :meth:`chatphase.chat.turn.Turn.live_decode_rate`); with speculative decoding (``--spec``)
  first its mode and figures (``lookup · 2.7 tok/step · 68 % accepted · ×1.6``, :func:`spec_live`);
- done / stopped / failed: the turn's summary or the error and how to recover.

The live decode figures are drawn by :meth:`PhaseIndicator.decode_live`, which the app calls at a
bounded rate. Component parts: ``#phase-badge`` (class ``-prefill``/``-thinking``/``-decode``/``-done``/
``-error``/``-loading``), ``#prefill-bar``, ``#phase-stats``.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from chatphase.engine.events import LoadedModel, PrefillProgress, PrefillStarted, SpecLive
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.spec_modes import spec_figures_text
from chatphase.engine.text import inert
from chatphase.ui.transcript.thinking_block import thinking_live
from chatphase.units import fmt_int, fmt_ms, fmt_rate, fmt_restore, fmt_seconds, fmt_stop_reason


def _left(left_ms: float | None) -> str:
    """`` · ≈ 8.4 s left`` (the predicted time to the first token), ``""`` without a prediction."""
    return "" if left_ms is None else f" · ≈ {fmt_seconds(left_ms / 1000)} left"


def spec_live(spec: SpecLive) -> str:
    """The live figures of :func:`spec_figures_text`."""
    return spec_figures_text(spec.mode, spec.tokens_per_step, spec.acceptance, spec.speedup)


def spec_done(m: TurnMetrics) -> str:
    """`` · lookup · 2.7 tok/step · 68 % accepted · ×1.6`` for a turn decoded speculatively, ``""`` for plain."""
    if m.spec_mode is None:
        return ""
    return " · " + spec_figures_text(m.spec_mode, m.spec_tokens_per_step, m.spec_acceptance, m.spec_speedup)


_BADGE_CLASSES = ("-loading", "-idle", "-prefill", "-thinking", "-decode", "-done", "-error")


class PhaseIndicator(Horizontal):
    """Shows the live phase of the current turn (see the module docstring)."""

    DEFAULT_CSS = """
    PhaseIndicator {
        height: 1;
        padding: 0 1;
        background: $panel;
    }
    /* a fixed badge width keeps phase switches a repaint; the longer, rare badges (ENGINE STOPPED) take what
       they need */
    PhaseIndicator #phase-badge {
        width: 10;
        content-align: center middle;
        text-style: bold;
        margin-right: 1;
    }
    PhaseIndicator #phase-badge.-loading { background: $secondary; color: $text; }
    PhaseIndicator #phase-badge.-idle { background: $panel-lighten-2; color: $text; }
    PhaseIndicator #phase-badge.-prefill { background: $warning; color: $background; }
    PhaseIndicator #phase-badge.-thinking { background: $success-darken-3; color: $text; }  /* decode, dimmed: thinking */
    PhaseIndicator #phase-badge.-decode { background: $success; color: $background; }
    PhaseIndicator #phase-badge.-done { background: $primary; color: $text; }
    PhaseIndicator #phase-badge.-error { background: $error; color: $text; width: auto; }
    PhaseIndicator #prefill-bar { width: auto; margin-right: 1; }
    PhaseIndicator #prefill-bar Bar { width: 14; }
    /* the figures come most telling first, so a narrow chat column cuts the key hint, with an ellipsis */
    PhaseIndicator #phase-stats { width: 1fr; color: $text; text-wrap: nowrap; text-overflow: ellipsis; }
    /* an error is read whole: its line wraps (up to 4 rows) */
    PhaseIndicator.-error { height: auto; max-height: 4; }
    PhaseIndicator.-error #phase-stats { height: auto; text-wrap: wrap; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._drawn: tuple | None = None  # the live decode figures last drawn
        self._cached_note = ""

    def compose(self) -> ComposeResult:
        self._badge = Label("", id="phase-badge")
        self._bar = ProgressBar(
            total=1, show_eta=False, show_percentage=False, id="prefill-bar"
        )  # the stats give done/total
        self._stats = Label("", id="phase-stats", markup=False)  # model names, errors: plain text
        yield self._badge
        yield self._bar
        yield self._stats

    def _set(self, badge: str, kind: str, stats: str, bar: bool = False) -> None:
        """Switch phase. The badge and the stats have fixed sizes (``DEFAULT_CSS``), so only showing or hiding
        the prefill bar, or an error (whose text wraps), is a layout; everything else is a repaint."""
        self._badge.update(f" {badge} ", layout=False)
        self._badge.remove_class(*_BADGE_CLASSES)
        self._badge.add_class(f"-{kind}")
        if self._bar.display != bar:
            self._bar.display = bar
        error = kind == "error"  # an error's words wrap (the line grows), the rest of it is what to do
        grows = error or self.has_class("-error")
        self.set_class(error, "-error")
        self._stats.update(inert(stats), layout=grows)

    def _set_stats(self, stats: str) -> None:
        """Live figures within a phase: the line's size is fixed, so no layout."""
        self._stats.update(stats, layout=False)

    def show_loading(self, model_name: str) -> None:
        """The engine is starting and loading ``model_name``."""
        self._set("LOADING", "loading", f"loading {model_name}…")

    def show_ready(self, model: LoadedModel) -> None:
        """Idle with a loaded model."""
        n_ctx = model.settings.n_ctx
        self._set("READY", "idle", f"{model.info.name} · n_ctx {fmt_int(n_ctx)} · load {fmt_ms(model.load_ms)}")

    def submitted(self) -> None:
        """A turn was sent: switch to the prefill look now (a layout), so that :meth:`prefill_started`
        and the progress, which arrive while the engine evaluates the prompt, need none."""
        self._bar.update(total=1, progress=0)
        self._cached_note = ""
        self._set("PREFILL", "prefill", "sent · templating…", bar=True)

    def prefill_started(self, event: PrefillStarted, left_ms: float | None = None) -> None:
        """Prefill of ``event.prefill_tokens`` begins (``event.cached_tokens`` reused from the KV cache);
        ``left_ms``: the time to the first token predicted (:mod:`chatphase.timing.ttft_prediction`)."""
        self._bar.update(total=max(event.prefill_tokens or 0, 1), progress=0)
        restored = event.restored_tokens or 0
        in_memory = (event.cached_tokens or 0) - restored
        cached = f" · {fmt_int(in_memory)} cached" if in_memory else ""
        if restored:
            cached += f" · {fmt_restore(restored, event.restore_bytes, event.restore_ms, event.restore_prefill_ms)}"
        stats = f"0/{fmt_int(event.prefill_tokens)} tok{_left(left_ms)}{cached}"
        self._cached_note = cached
        if self._badge.has_class("-prefill") and self._bar.display:
            self._set_stats(stats)  # already in the prefill look (:meth:`submitted`): no layout
        else:
            self._set("PREFILL", "prefill", stats, bar=True)

    def prefill_progress(self, event: PrefillProgress, left_ms: float | None = None) -> None:
        """``done/total`` prompt tokens evaluated after ``elapsed_ms``; ``left_ms``: the time to the first
        token, predicted and corrected by the chunks done."""
        self._bar.update(total=max(event.total_tokens, 1), progress=event.done_tokens)
        rate = event.done_tokens * 1000 / event.elapsed_ms if event.elapsed_ms > 0 else None
        stats = (
            f"{fmt_int(event.done_tokens)}/{fmt_int(event.total_tokens)} tok{_left(left_ms)} · {fmt_ms(event.elapsed_ms)}"
            f" · {fmt_rate(rate)}{self._cached_note}"
        )
        self._set_stats(stats)

    def first_token(self, thinking: bool = False) -> None:
        """Decode begins (in a thinking block when ``thinking``). The prefill bar stays, full (no layout
        while the engine decodes)."""
        if self._bar.total is not None:  # set at the prefill's start
            self._bar.update(progress=self._bar.total)
        self._set("THINKING" if thinking else "DECODE", "thinking" if thinking else "decode", "", bar=True)
        self._drawn = None

    def _phase(self, thinking: bool) -> None:
        """Switch between the thinking and the answer's decode look (a repaint, no layout)."""
        if self._badge.has_class("-thinking") != thinking:
            self._set("THINKING" if thinking else "DECODE", "thinking" if thinking else "decode", "", bar=True)
            self._drawn = None

    def decode_live(
        self, decode_tokens: int, tokens_per_s: float | None, ttft_ms: float | None, spec: SpecLive | None = None
    ) -> None:
        """Draw the live decode figures, if they changed since the last call; with speculative decoding
        (``spec``) its mode and figures after the badge (:func:`spec_live`)."""
        self._phase(False)
        figures = (decode_tokens, tokens_per_s, ttft_ms, spec)
        if figures == self._drawn:
            return
        self._drawn = figures
        head = f"{spec_live(spec)} · " if spec is not None else ""
        self._set_stats(
            f"{head}{fmt_int(decode_tokens)} tok · {fmt_rate(tokens_per_s)} · TTFT {fmt_ms(ttft_ms)} · Esc stop"
        )

    def thinking_live(self, thinking_tokens: int, thinking_s: float, ttft_ms: float | None) -> None:
        """Draw the live thinking figures (tokens and seconds of the block so far), if they changed."""
        self._phase(True)
        figures = ("thinking", thinking_tokens, round(thinking_s, 1), ttft_ms)
        if figures == self._drawn:
            return
        self._drawn = figures
        self._set_stats(f"{thinking_live(thinking_tokens, thinking_s)} · TTFT {fmt_ms(ttft_ms)} · Esc stop")

    def finished(self, metrics: TurnMetrics) -> None:
        """The turn is over: show its summary."""
        badge, kind = ("STOPPED", "error") if metrics.stop_reason in ("cancelled", "error") else ("DONE", "done")
        ttfa = ""  # a reasoning model's turn: when its answer began (the thinking block says for how long)
        if metrics.thought:
            ttfa = f"TTFA {fmt_ms(metrics.ttfa_ms)} · "
        self._set(
            badge,
            kind,
            (
                f"TTFT {fmt_ms(metrics.ttft_ms)} · {ttfa}{fmt_int(metrics.decode_tokens)} tok · "
                f"{fmt_rate(metrics.decode_tokens_per_s)}{spec_done(metrics)} · {fmt_stop_reason(metrics.stop_reason)}"
            ),
        )

    def failed(self, message: str, restart_key: str | None = None) -> None:
        """The turn failed (``ERROR``), or the engine did and needs a restart with ``restart_key``."""
        hint = f" · {restart_key} restart engine" if restart_key else ""
        self._set("ENGINE STOPPED" if restart_key else "ERROR", "error", f"{message}{hint}")
