"""The phase panel: the current/last turn's measured phases, the KV cache gauge, and the model.

Sections (each a child widget, styled in the panel's ``DEFAULT_CSS``):

- ``#turn-figures``: TTFT, prompt tokens (cached), prefill tokens, prefill tok/s, decode tokens,
  decode tok/s, ITL p50/p95, stop reason: live while a turn runs, then the turn's final
  :class:`~chatphase.engine.metrics.TurnMetrics` (the definitions of ``docs/metrics.md``). A turn with a
  thinking block adds two rows: ``thinking`` (its tokens and time) and ``answer`` (the answer's tokens,
  TTFA — the first answer token — and the answer's rate).
- ``#kv-gauge`` / ``#kv-figures``: KV cache cells in use against the allocated context (tokens and
  bytes = tokens × ``kv_bytes_per_token``; capacity = ``LoadedModel.kv_capacity_bytes``).
- ``#model-figures``: name, parameters, file size, quantisation, layers, GPU offload on/off
  (layers offloaded / total from llama.cpp's log), threads, n_ctx, load time, the chat format prompts
  are written in (``LoadedModel.chat_format``), each slow path by its name (the dashboard's System tab has it
  whole), and the engine's notes (e.g. the settings chosen for an AMX CPU, the format chosen for a file
  without a chat template). With a thread policy
  (``threads_policy`` in the settings), a ``threads`` row shows the last turn's prefill and decode threads
  and why.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Label, ProgressBar, Static

from chatphase.engine.events import LoadedModel, PrefillStarted
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.text import inert
from chatphase.models.gguf_meta import SYNTHETIC_LABEL
from chatphase.models.kv import KV_CELL_PAD
from chatphase.ui.dashboard.system_figures import device_lines, gpu_offload_text, memory_text, placement_lines
from chatphase.ui.transcript.thinking_block import thinking_live
from chatphase.units import (
    DASH,
    fmt_bytes,
    fmt_cached,
    fmt_count,
    fmt_int,
    fmt_ms,
    fmt_params,
    fmt_rate,
    fmt_stop_reason,
    fmt_value,
)


def threads_text(m: TurnMetrics) -> str:
    """A turn's threads in a few words: the counts, the reason before the turn, and how many changes
    decode saw (the turn's detail in the dashboard spells them out)."""
    before = (m.threads_reason or "").split("; ")[0]  # the reason is "choice; change; change ..."
    text = f"{m.n_threads_decode} decode / {m.n_threads_prefill} prefill · {before}"
    if m.decode_thread_changes:
        text += f" · then {fmt_count(m.decode_thread_changes, 'change')} during decode"
    return text


def slow_path_head(line: str) -> str:
    """A slow path in the panel: its name, the words before its first ``: `` (``AMX off``), and where the whole
    line is; in full its few lines pushed the rest of the model out of a short panel."""
    return f"{line.split(': ', 1)[0]} (why: System tab)"


def _grid(rows: list[tuple[str, str]]) -> Table:
    """Two columns of plain text, inert (model names, devices, notes come from the model and the engine)."""
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")
    for name, value in rows:
        table.add_row(Text(inert(name)), Text(inert(value)))
    return table


class PhasePanel(VerticalScroll):
    """Side panel of phase figures (see the module docstring)."""

    DEFAULT_CSS = """
    PhasePanel #kv-gauge { width: 100%; }
    PhasePanel #kv-gauge Bar { width: 1fr; }
    PhasePanel #kv-figures { margin-bottom: 1; color: $text-muted; }
    PhasePanel #model-figures { margin-bottom: 1; height: auto; }
    PhasePanel #turn-figures { margin-bottom: 1; }
    PhasePanel #turn-title { width: 100%; }  /* "Turn 10" whole after a live (no-layout) update of "Turn 9" */
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model: LoadedModel | None = None
        self.number: int | None = None
        self.figures: dict[str, str] = {}
        self._kv_base_tokens: int | None = 0  # None: a server that does not report its cache
        self._kv_prefilled: int | None = 0
        self._threads: str | None = None  # the last turn's threads and why

    def compose(self) -> ComposeResult:
        self._title = Label("Turn", id="turn-title", classes="panel-title")
        self._turn = Static(id="turn-figures")
        self._gauge = ProgressBar(total=1, show_eta=False, id="kv-gauge")
        self._kv = Static(id="kv-figures")
        self._model = Static(id="model-figures")
        yield self._title
        yield self._turn
        yield Label("KV cache", classes="panel-title")
        yield self._gauge
        yield self._kv
        yield Label("Model", classes="panel-title")
        yield self._model

    def on_mount(self) -> None:
        self.reset()

    # -- model ---------------------------------------------------------------------------------
    def set_model(self, model: LoadedModel) -> None:
        """Show the loaded model and size the KV gauge to its context. A loaded model is a fresh engine (first
        load, switch, restart, new engine settings): its cache starts empty, whatever the last one held."""
        self.model = model
        self._threads = None
        self._kv_base_tokens = self._kv_prefilled = 0
        self._render_model()
        self.set_kv_tokens(0)

    def _render_model(self) -> None:
        model = self.model
        if model is None:
            return
        info, s = model.info, model.settings
        policy = s.threads_policy
        engine = f"n_ctx {fmt_int(s.n_ctx)} · load {fmt_ms(model.load_ms)}"
        rows = [
            ("name", info.name),
            ("size", f"{fmt_params(info.n_params)} params · {info.quantization} · {fmt_bytes(info.size_bytes)}"),
            ("layers", f"{fmt_int(info.n_layer)} · GPU offload {gpu_offload_text(model)}"),
            ("engine", engine if policy else f"{fmt_value(s.n_threads)} threads · {engine}"),
        ]
        rows += [("slow", slow_path_head(line)) for line in model.slow_paths]  # above the rows a short panel cuts
        if getattr(info, "synthetic", False):
            rows.append(("synthetic", f"{SYNTHETIC_LABEL} (random weights)"))
        if model.chat_format:
            rows.append(("format", model.chat_format))
        if policy:  # the threads row says what they are
            rows.append(("threads", self._threads or f"{policy}, up to {fmt_value(s.n_threads)} cores"))
        rows += [("device", line) for line in device_lines(model)]
        if model.layers_offloaded:  # where each layer lives, once some live on a GPU
            rows += [("on", line) for line in placement_lines(model)]
        if memory := memory_text(model):
            rows.append(("memory", memory))
        rows += [("note", note) for note in model.notes]
        self._model.update(_grid(rows))

    # -- turn ----------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the turn figures (a new chat)."""
        self.number = None
        self.figures = {}
        self._kv_base_tokens = self._kv_prefilled = 0
        self._render_turn()
        self.set_kv_tokens(0)

    def turn_started(self, number: int, event: PrefillStarted) -> None:
        """A turn's prefill starts: prompt and cached tokens are known."""
        self.number = number
        self._kv_base_tokens = self._kv_prefilled = event.cached_tokens
        self.figures = {
            "prompt": f"{fmt_int(event.prompt_tokens)} tok ({fmt_cached(event.cached_tokens, event.restored_tokens)})",
            "prefill": f"{fmt_int(event.prefill_tokens)} tok",
        }
        if event.restored_tokens:
            self.figures["restore"] = (
                f"{fmt_bytes(event.restore_bytes)} · {fmt_ms(event.restore_ms)} "
                f"(prefill ≈ {fmt_ms(event.restore_prefill_ms)})"
            )
        self._render_turn(layout=False)  # while a turn runs, no layouts (they compete with the engine)
        self.set_kv_tokens(event.cached_tokens, layout=False)

    def prefill_progress(self, done_tokens: int, total_tokens: int, elapsed_ms: float) -> None:
        """Prefill advanced: ``done_tokens`` of ``total_tokens`` evaluated after ``elapsed_ms``."""
        rate = done_tokens * 1000 / elapsed_ms if elapsed_ms > 0 else None
        self.figures["prefill"] = f"{fmt_int(done_tokens)}/{fmt_int(total_tokens)} tok · {fmt_rate(rate)}"
        self._kv_prefilled = None if self._kv_base_tokens is None else self._kv_base_tokens + done_tokens
        self._render_turn(layout=False)
        self.set_kv_tokens(self._kv_prefilled, layout=False)

    def first_token(self, ttft_ms: float) -> None:
        """Decode begins."""
        self.figures["TTFT"] = fmt_ms(ttft_ms)
        self._render_turn(layout=False)

    def decode_live(
        self, decode_tokens: int, tokens_per_s: float | None, thinking: tuple[int, float, bool] | None = None
    ) -> None:
        """Live decode figures (call at a bounded rate); ``thinking``: the thinking block's tokens and
        seconds so far, and whether it has ended (a reasoning model's turn)."""
        self.figures["decode"] = f"{fmt_int(decode_tokens)} tok · {fmt_rate(tokens_per_s)}"
        rows = len(self.figures)
        if thinking is not None:
            tokens, seconds, ended = thinking
            self.figures["thinking"] = thinking_live(tokens, seconds)
            if ended:
                self.figures["answer"] = f"{fmt_int(decode_tokens - tokens)} tok"
        self._render_turn(layout=len(self.figures) != rows)  # a new row is a layout, once per turn
        self.set_kv_tokens(None if self._kv_prefilled is None else self._kv_prefilled + decode_tokens, layout=False)

    def turn_finished(self, number: int, metrics: TurnMetrics, kv: bool = True) -> None:
        """Show the turn's final metrics; ``kv=False``: not its KV figures (a turn whose engine stopped: the
        figures it measured, :meth:`~chatphase.chat.turn.Turn.metrics_so_far`, have none)."""
        m = metrics
        self.number = number
        self.figures = {
            "TTFT": f"{fmt_ms(m.ttft_ms)} · stop: {fmt_stop_reason(m.stop_reason)}",
            "prompt": f"{fmt_int(m.prompt_tokens)} tok ({fmt_cached(m.cached_tokens, m.restored_tokens)})",
            "prefill": f"{fmt_int(m.prefill_tokens)} tok · {fmt_ms(m.prefill_ms)} · {fmt_rate(m.prefill_tokens_per_s)}",
            "decode": f"{fmt_int(m.decode_tokens)} tok · {fmt_ms(m.decode_ms)} · {fmt_rate(m.decode_tokens_per_s)}",
            "ITL p50/p95": f"{fmt_ms(m.itl_ms_p50)} / {fmt_ms(m.itl_ms_p95)}",
        }
        if m.restored_tokens is not None:
            self.figures["restore"] = f"{fmt_bytes(m.restore_bytes)} · {fmt_ms(m.restore_ms)}"
        if m.thought:
            cut = " · cut short" if m.thinking_cut_short else ""
            self.figures["thinking"] = f"{fmt_int(m.thinking_tokens)} tok · {fmt_ms(m.thinking_ms)}{cut}"
            self.figures["answer"] = (
                f"{fmt_int(m.answer_tokens)} tok · TTFA {fmt_ms(m.ttfa_ms)} · {fmt_rate(m.answer_tokens_per_s)}"
            )
        self._render_turn()
        if kv:
            self._kv_base_tokens = self._kv_prefilled = m.kv_cache_tokens
            self.set_kv_tokens(m.kv_cache_tokens, m.kv_cache_bytes)
        if m.n_threads_decode is not None and self.model is not None:
            self._threads = threads_text(m)
            self._render_model()

    def _render_turn(self, layout: bool = True) -> None:
        """Redraw the turn figures; ``layout=False`` for live updates (5 rows, 7 with thinking: the height
        stays, a value that wraps is laid out at the next full update)."""
        title = "Turn" if self.number is None else f"Turn {self.number}"
        self._title.update(title, layout=layout)
        keys = ["TTFT", "prompt", "prefill", "decode", "ITL p50/p95"]
        keys[4:4] = [k for k in ("thinking", "answer") if k in self.figures]
        rows = [(k, self.figures.get(k, DASH)) for k in keys]
        self._turn.update(_grid(rows), layout=layout)

    # -- KV cache ------------------------------------------------------------------------------
    def set_kv_tokens(self, tokens: int | None, used_bytes: int | None = None, layout: bool = True) -> None:
        """Draw the KV gauge: ``tokens`` cells in use of the n_ctx context (bytes = tokens × per-token)."""
        if self.model is None or tokens is None or not self.model.kv_bytes_per_token:
            text = f"{fmt_int(tokens)} tok" if tokens is not None else "KV cache: not reported by the server"
            self._kv.update(text, layout=layout)
            return
        per_token = self.model.kv_bytes_per_token
        capacity = self.model.kv_capacity_bytes
        cells = capacity // per_token if capacity is not None else KV_CELL_PAD
        n_ctx = self.model.settings.n_ctx or cells
        used_bytes = tokens * per_token if used_bytes is None else used_bytes
        self._gauge.update(total=n_ctx, progress=min(tokens, n_ctx))
        text = (
            f"{fmt_int(tokens)} / {fmt_int(n_ctx)} tok · "
            f"{fmt_bytes(used_bytes)} / {fmt_bytes(self.model.kv_capacity_bytes)}"
        )
        self._kv.update(text, layout=layout)
