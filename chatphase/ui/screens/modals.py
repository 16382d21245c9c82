"""Modal screens: the engine log viewer and the help page (Esc or q closes either)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.cells import cell_len, chop_cells
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Log, Markdown

from chatphase.engine.text import inert

#: at most this much of the end of the log file is read (bytes): the file is rotated at
#: :data:`~chatphase.engine.logfile.LOG_CAP_BYTES` when an engine starts, so this reaches back to it.
LOG_TAIL_BYTES = 4 * 2**20

METRICS_HELP = """
## What the figures mean

- **Prefill**: the whole prompt is read in one parallel pass; this is the pause before the first token.
  The bar counts the prompt tokens evaluated this turn; tokens **cached** in the KV cache from earlier
  turns are skipped.
- **TTFT** (time to first token) = first token sampled − your submit: templating + tokenisation + prefill + first sample.
- **Decode**: one token per step, bound by memory bandwidth. **decode tok/s** = (tokens − 1) / (t_last − t_first)
  (TPOT as in vLLM's benchmark and MLPerf; the first token belongs to TTFT).
- **ITL p50 / p95**: inter-token latency, gaps between consecutive tokens (linear-interpolated percentiles).
- **KV cache**: cells in use × bytes per token, against the context allocated for n_ctx.
- **Thinking** (reasoning models): the thinking block is decode too; its tokens and time, the **answer**'s
  tokens and rate, and **TTFA** (time to the first answer token; TTFT stays the first generated token).
"""


def help_entry(key: str, title: str, action_id: str, what: str) -> str:
    """One Markdown list item of the help page: the key, the command, its id for ``[keys]``, what it does
    (its ``<`` escaped: Markdown would take ``<think>`` for HTML and drop it)."""
    ident = f" · `{action_id}`" if action_id else ""
    escaped = what.replace("<", "\\<")
    return f"- **{key}** — {title}{ident}: {escaped}"


class CloseableScreen(ModalScreen[None]):
    """A modal screen closed by Esc or q; its title says so (:meth:`titled`)."""

    BINDINGS = [Binding("escape,q", "dismiss_screen", "Close", id="screen.close")]

    @staticmethod
    def titled(title: str) -> str:
        """``title`` with how to close the screen: ``Engine log: …  ·  Esc close``."""
        return f"{title}  ·  Esc close"

    def action_dismiss_screen(self) -> None:
        self.dismiss(None)


class LogScreen(CloseableScreen):
    """Shows the engine's log file at ``path`` (its last :data:`LOG_TAIL_BYTES`); with the engine's
    ``pid``, from that engine's own ``--- chatphase: loading … (pid N)`` line on, opened at that line
    (the engine's start in view, its later lines below). Long lines wrap at the screen's width
    (:func:`fold_lines`, again on a resize): llama.cpp's and a traceback's lines are often wider than a
    terminal, and Textual's log scrolls sideways only with the mouse."""

    CSS_PATH = "modals.tcss"

    def __init__(self, path: str, pid: int = 0) -> None:
        super().__init__()
        self.path = path
        self.pid = pid
        self.lines: list[str] = []
        self._width = 0

    def compose(self) -> ComposeResult:
        with Vertical(id="log-box", classes="modal-box"):
            yield Label(inert(self.titled(f"Engine log: {self.path or '(none)'}")), classes="panel-title", markup=False)
            yield Log(id="engine-log", highlight=False, auto_scroll=False)

    def on_mount(self) -> None:
        self.lines = from_engine_start(read_log_tail(self.path), self.pid)
        log = self.query_one(Log)
        log.focus()
        self.call_after_refresh(self._fill, home=True)  # once the log has its width

    def on_resize(self) -> None:
        self.call_after_refresh(self._fill)

    def _fill(self, home: bool = False) -> None:
        logs = self.query(Log)
        width = logs.first().scrollable_content_region.width if logs else 0  # a resize may come before compose
        if width <= 0 or (width == self._width and not home):
            return
        self._width = width
        log = logs.first()
        log.clear()
        log.write_lines(fold_lines(self.lines, width))
        if home:
            log.scroll_home(animate=False)  # this engine's start in view


#: how a wrapped log line's continuation starts.
CONTINUATION = "  "


def fold_lines(lines: list[str], width: int) -> list[str]:
    """``lines`` wrapped at ``width`` terminal cells (wide characters count two); a line's continuations
    start with :data:`CONTINUATION`."""
    out: list[str] = []
    rest_width = max(1, width - len(CONTINUATION))
    for line in lines:
        if cell_len(line) <= width:
            out.append(line)
            continue
        first, *more = chop_cells(line, width)
        out.append(first)
        for piece in chop_cells("".join(more), rest_width) if more else ():
            out.append(CONTINUATION + piece)
    return out


def read_log_tail(path: str, limit: int = LOG_TAIL_BYTES) -> list[str]:
    """Lines of the last ``limit`` bytes of ``path``, made inert, or one explanatory line when it cannot be read."""
    if not path:
        return ["No engine log yet: the engine has not reported one (is the model loaded?)."]
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as fh:
            fh.seek(max(0, size - limit))
            data = fh.read()
    except OSError as exc:
        return [inert(f"Cannot read the engine log {path}: {exc.strerror or exc}")]
    # inert: the log holds what llama.cpp printed, model metadata and a server's text among it
    lines = [inert(line) for line in data.decode("utf-8", errors="replace").splitlines()]
    return lines or ["(the engine log is empty)"]


def from_engine_start(lines: list[str], pid: int) -> list[str]:
    """``lines`` from the last ``--- chatphase: loading … (pid {pid})`` marker on (all when absent).

    The log file is shared by every engine process; its other lines may still interleave.
    """
    marker = f"(pid {pid})"
    if pid:
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].startswith("--- chatphase:") and lines[i].endswith(marker):
                return lines[i:]
    return lines


class HelpScreen(CloseableScreen):
    """Keys and what each measured figure means. ``rows``: ``(keys, title, action id, help)`` per action, in
    order (the app's are :func:`chatphase.ui.actions.help_rows`, with the user's remapped keys)."""

    CSS_PATH = "modals.tcss"

    def __init__(self, rows: Sequence[tuple[str, str, str, str]]) -> None:
        super().__init__()
        self.rows = tuple(rows)

    def compose(self) -> ComposeResult:
        # a list, not a table: a table's columns cut the keys off in an 80-column terminal
        fixed = (
            ("Enter", "Send", "", "Send the message"),
            ("Ctrl+J", "New line", "", "Shift+Enter and Alt+Enter too, where the terminal reports them (not in tmux)"),
        )
        tail = (
            ("Ctrl+P", "Command palette", "", "Every command above, by name"),
            ("Ctrl+Q", "Quit", "", "Stops the engine and exits"),
        )
        entries = (*fixed, *self.rows, *tail)
        text = (
            "\n".join(help_entry(*entry) for entry in entries)
            + '\n\nRemap a key in the config file\'s `[keys]` table by its id, e.g. `"chat.stop" = "ctrl+s"`.\n'
            + METRICS_HELP
        )
        with Vertical(id="help-box", classes="modal-box"):
            yield Label(self.titled("chatphase help: keys and figures"), classes="panel-title", markup=False)
            with VerticalScroll(id="help-text"):
                yield Markdown(text)
