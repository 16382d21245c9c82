"""``chatphase ask``: headless turns on the same engine and metrics as the TUI.

Each PROMPT is the next user turn of one conversation. Without ``--json`` the reply streams to stdout
and one metrics line per turn goes to stderr; with ``--json`` one object goes to stdout:
``{"model": {...}, "settings": {...}, "turns": [{"prompt", "reply", "thinking", "metrics": {TurnMetrics},
"server_timings"}]}`` (``thinking``: a reasoning model's thinking text, apart from the reply;
``server_timings``: a remote server's own timings, else ``null``; ``--server`` runs on a remote server).
A reasoning model's thinking goes to stderr only with ``--show-thinking``. ``--tokens`` prints each turn's token
view after its reply (:mod:`chatphase.commands.ask_tokens`); with ``--json`` each turn carries ``"tokens"``
(:func:`chatphase.chat.token_view.as_json`: the prompt's tokens with their source, the reply's with their times).
The model's text is written inert (:func:`~chatphase.engine.text.inert`: control characters other than
newline and tab shown as pictures, ESC as ␛), to a terminal and to a pipe alike, unless ``--raw``;
chatphase's own lines on stderr (notes, errors, metrics) always are, and ``--json`` escapes them.
``-f FILE`` (repeatable; ``-`` reads stdin) puts text files into the first PROMPT
(:mod:`chatphase.chat.attachments`); a file that cannot go in (binary, not UTF-8, larger than the context, a
directory, unreadable) is one line and exit 2 before anything is sent, and so is a message that would not fit.
With files, the first turn's budget (:mod:`chatphase.chat.budget`) goes to stderr before it is sent.
Exit codes: 0 ok; 2 bad usage or unusable model (one line on stderr); 1 engine failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace

from typing_extensions import override

from chatphase.chat.attachments import Attachment, byte_limit, message_text, read_attachment, too_many_tokens
from chatphase.chat.budget import budget_of
from chatphase.chat.controller import ChatController
from chatphase.chat.dispatch import InlineDispatcher
from chatphase.chat.exactness import logits_words
from chatphase.chat.listener import ChatListener, Notice
from chatphase.chat.recording import SessionRecording
from chatphase.chat.remote_wait import remote_wait_words
from chatphase.chat.token_view import as_json as token_json
from chatphase.chat.turn import Turn
from chatphase.commands.ask_tokens import colour_wanted, token_lines
from chatphase.commands.options import add_model_options, add_sampling_options, settings_from_args
from chatphase.commands.server_options import add_server_options, engine_for, model_info_for
from chatphase.engine.events import (
    FirstToken,
    LoadedModel,
    ThinkingEnded,
    TokensDecoded,
    TurnFinished,
    memory_by_place,
)
from chatphase.engine.memory_plan import layer_ranges
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.spec_modes import spec_figures_text
from chatphase.engine.text import inert, json_inert
from chatphase.errors import EngineError, UsageError
from chatphase.models.gguf_meta import SYNTHETIC_LABEL
from chatphase.units import fmt_at_threads, fmt_bytes, fmt_int, fmt_ms, fmt_rate, fmt_seconds, fmt_stop_reason


def register(sub) -> None:
    p = sub.add_parser(
        "ask", help="run one conversation headless and print replies and metrics", description=__doc__.split("\n\n")[0]
    )
    add_model_options(p)
    add_sampling_options(p)
    add_server_options(p)
    p.add_argument(
        "--json", action="store_true", help="print one JSON object with model, settings and per-turn metrics"
    )
    p.add_argument(
        "--no-save", action="store_true", help="do not save this conversation as a session (see `chatphase sessions`)"
    )
    p.add_argument("--show-thinking", action="store_true", help="print a reasoning model's thinking to stderr")
    p.add_argument(
        "--tokens",
        action="store_true",
        help="show each turn's tokens: the prompt's by where they came from (restored, cached, prefilled, dropped), "
        "the reply's with their times; with --json, one object per token",
    )
    p.add_argument(
        "--raw",
        action="store_true",
        help="write the model's text byte for byte, control characters included, for a pipe that wants them; "
        "on a terminal this lets the model's text drive it (escape sequences: clipboard, screen, title). "
        "Default: control characters other than newline and tab are shown as pictures (ESC as ␛)",
    )
    p.add_argument(
        "-f",
        "--file",
        action="append",
        dest="files",
        default=[],
        metavar="FILE",
        help="put this text file into the first PROMPT (repeatable; - reads stdin)",
    )
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="user turns, in order")
    p.set_defaults(func=run)


def metrics_line(turn: int, m: TurnMetrics, flash_attn_enabled: bool | None = None) -> str:
    """One human-readable line of a turn's phase metrics (for stderr); a turn whose logits a cold run might not
    compute says so, beside how flash attention resolved (``flash_attn_enabled``)."""
    itl = "–" if m.itl_ms_p50 is None else f"{m.itl_ms_p50:.1f}/{m.itl_ms_p95:.1f} ms"
    n = lambda count: "–" if count is None else count  # noqa: E731 - a count a remote server did not report
    src = " (server tokenizer)" if m.decode_tokens_source == "tokenizer" else ""
    threads = ""
    if m.n_threads_decode is not None:
        changes = f" ({m.threads_reason})" if m.decode_thread_changes else ""
        threads = f"threads {m.n_threads_prefill}/{m.n_threads_decode}{changes} · "
    thinking = ""
    if m.thought:
        cut = ", cut short" if m.thinking_cut_short else ""
        thinking = (
            f"thinking {n(m.thinking_tokens)} tok in {fmt_ms(m.thinking_ms)}{cut} · first answer token "
            f"{fmt_ms(m.ttfa_ms)} · answer {n(m.answer_tokens)} tok @ {fmt_rate(m.answer_tokens_per_s)} · "
        )
    spec = ""
    if m.spec_mode is not None:
        steps = (
            f"{fmt_ms(m.spec_verify_step_ms)} drafted vs {fmt_ms(m.spec_plain_step_ms)} plain step"
            f"{fmt_at_threads(m.spec_plain_threads)}"
        )
        spec = (
            f"spec {spec_figures_text(m.spec_mode, m.spec_tokens_per_step, m.spec_acceptance, m.spec_speedup)} "
            f"({n(m.spec_accepted)}/{n(m.spec_drafted)} drafted, {n(m.spec_steps)} steps, {steps}) · "
        )
    predicted = ttft_prediction_words(m)
    restore = ""
    if m.restored_tokens:
        restore = f"restored {n(m.restored_tokens)} tok ({fmt_bytes(m.restore_bytes)}) in {fmt_ms(m.restore_ms)} · "
    logits = ""
    if m.logits_exact is False:  # said only where it is not a cold run's
        logits = f"logits: {logits_words(m, flash_attn_enabled)} · "
    return (
        f"[turn {turn}] prompt {n(m.prompt_tokens)} tok (cached {n(m.cached_tokens)}) · {restore}TTFT {fmt_ms(m.ttft_ms)}{predicted} · "
        f"prefill {n(m.prefill_tokens)} tok @ {fmt_rate(m.prefill_tokens_per_s)} · decode {n(m.decode_tokens)} tok{src} @ "
        f"{fmt_rate(m.decode_tokens_per_s)} · {thinking}{spec}ITL p50/p95 {itl} · KV {n(m.kv_cache_tokens)} tok "
        f"({fmt_bytes(m.kv_cache_bytes)} of {fmt_bytes(m.kv_capacity_bytes)}) · {threads}{remote_wait_words(m)}{logits}"
        f"{fmt_stop_reason(m.stop_reason)}"
    )


def ttft_prediction_words(m: TurnMetrics) -> str:
    """`` (predicted 8,412 ms, 7,900–9,100 ms)``: the turn's TTFT prediction and its range beside the measured
    TTFT; withheld, why and its bounds: `` (not predicted: not enough turns yet (1); ≥ 2,130 ms)``; ``""`` when
    the turn had none."""
    low, high = m.ttft_predicted_low_ms, m.ttft_predicted_high_ms
    if m.ttft_predicted_ms is not None:
        spread = "" if low is None or high is None else f", {fmt_ms(low)}–{fmt_ms(high)}"
        return f" (predicted {fmt_ms(m.ttft_predicted_ms)}{spread})"
    if m.ttft_prediction_note is None:
        return ""
    bounds = [f"≥ {fmt_ms(low)}"] if low is not None else []
    bounds += [f"≤ {fmt_ms(high)}"] if high is not None else []
    return f" (not predicted: {m.ttft_prediction_note}{'; ' + ', '.join(bounds) if bounds else ''})"


def say(line: str) -> None:
    """One line of chatphase's own on stderr, inert (it may quote a server, a model or a file name)."""
    print(inert(line), file=sys.stderr)


class _Printer(ChatListener):
    """``ask``'s view of the chat: streams replies to stdout (not with ``--json``), one metrics line
    per turn and the chat's notices to stderr, and keeps the turns and the failure for the exit code.
    The model's text is written inert unless ``raw`` (each chunk as it comes: :func:`inert` is per
    character, so a sequence split across chunks is caught too)."""

    def __init__(self, as_json: bool, show_thinking: bool = False, raw: bool = False, tokens: bool = False) -> None:
        self.as_json = as_json
        self.show_tokens = tokens
        self.shown = (lambda text: text) if raw else inert
        self.show_thinking = show_thinking and not as_json
        self.loaded: LoadedModel | None = None
        self.turns: list[dict] = []
        self.stopped: str | None = None  # the engine is gone (exit 1)
        self.refused: str | None = None  # the turn was refused before prefill (exit 2)
        self.turn_error: str | None = None  # the turn ended with an error (exit 1 after it is kept)

    @override
    def engine_ready(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        for note in loaded.notes:
            say(f"chatphase: {note}")
        if getattr(loaded.info, "synthetic", False):
            say(f"chatphase: {loaded.info.name} is {SYNTHETIC_LABEL}: its text is random, not a reply")
        for line in loaded.slow_paths:
            say(f"chatphase: slow path: {line}")

    def _reply_start(self) -> None:
        """A synthetic model's text is labelled where it is read, not only on stderr."""
        if self.loaded is not None and getattr(self.loaded.info, "synthetic", False) and not self.as_json:
            sys.stdout.write(f"[{SYNTHETIC_LABEL}] ")

    @override
    def engine_stopped(self, message: str) -> None:
        self.stopped = message

    @override
    def first_token(self, turn: Turn, event: FirstToken) -> None:
        self._reply_start()
        self._write(event.text, event.thinking)

    @override
    def tokens_decoded(self, turn: Turn, event: TokensDecoded) -> None:
        self._write(event.text, event.thinking)

    @override
    def thinking_ended(self, turn: Turn, event: ThinkingEnded) -> None:
        if self.show_thinking:
            how = " (budget spent)" if event.forced else ""
            spent = f"{fmt_seconds(event.thinking_ms / 1000)} · {fmt_int(event.thinking_tokens)} tok"
            print(f"\n[thought for {spent}{how}]", file=sys.stderr)

    def _write(self, text: str, thinking: str) -> None:
        if thinking and self.show_thinking:
            sys.stderr.write(self.shown(thinking))
            sys.stderr.flush()
        if text and not self.as_json:
            sys.stdout.write(self.shown(text))
            sys.stdout.flush()

    @override
    def turn_finished(self, turn: Turn, event: TurnFinished) -> None:
        if not self.as_json:
            sys.stdout.write("\n")
            fa = self.loaded.settings.flash_attn_enabled if self.loaded is not None else None
            say(metrics_line(turn.number, event.metrics, fa))
        record = {
            "prompt": turn.user,
            "reply": event.reply,
            "thinking": event.thinking,
            "metrics": event.metrics.to_dict(),
            "server_timings": event.server_timings,
        }
        if self.show_tokens:
            self._tokens(turn, event, record)
        self.turns.append(record)

    def _tokens(self, turn: Turn, event: TurnFinished, record: dict) -> None:
        """The turn's token view: into its JSON record, else on stdout; one line where the engine has none."""
        if event.tokens is None:
            say(f"chatphase: turn {turn.number}: no token view (a remote server does not send its prompt's tokens)")
            if self.as_json:
                record["tokens"] = None
            return
        if self.as_json:
            record["tokens"] = token_json(event.tokens)
            return
        for line in token_lines(event.tokens, turn.number, colour_wanted(sys.stdout)):
            sys.stdout.write(line + "\n")
        sys.stdout.flush()

    @override
    def turn_failed(self, turn: Turn, message: str) -> None:
        if turn.prefill is None and self.stopped is None:
            self.refused = message

    @override
    def notice(self, notice: Notice) -> None:
        if notice.kind == "turn_error":
            self.turn_error = notice.text
        elif notice.kind in ("dropped", "context_full", "model", "spec", "cache_miss", "prefix"):
            say(f"chatphase: {notice.text}")

    def emit_json(self) -> None:
        """With ``--json``, print what was done so far (also before failing)."""
        if not self.as_json or self.loaded is None:
            return
        loaded = self.loaded
        model = loaded.info.to_dict()
        model.pop("attention", None)
        from chatphase.system.gpu import gpu_memory_used_bytes

        hosts = {d.name: d.host for d in loaded.devices}  # an rpc-server's devices: its HOST:PORT
        model.update(
            kv_bytes_per_token=loaded.kv_bytes_per_token,
            load_ms=loaded.load_ms,
            layers_offloaded=loaded.layers_offloaded,
            layers_total=loaded.layers_total,
            gpu_memory_bytes=gpu_memory_used_bytes(loaded.pid),
            notes=list(loaded.notes),
            slow_paths=list(loaded.slow_paths),
            backends=list(loaded.backends),
            devices=[asdict(d) for d in loaded.devices],
            memory=memory_by_place(loaded.buffers),
            buffers=[asdict(b) for b in loaded.buffers],
            placement=[
                {
                    "device": p.device,
                    "host": hosts.get(p.device),
                    "layers": layer_ranges(p.layers),
                    "output_layer": p.output_layer,
                }
                for p in loaded.placement
            ],
        )
        doc = {"model": model, "settings": loaded.settings.to_dict(), "turns": self.turns}
        sys.stdout.write(json_inert(json.dumps(doc, indent=2, ensure_ascii=False)) + "\n")
        sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    """Run the turns; see the module docstring for output and exit codes."""
    settings = settings_from_args(args)
    if any(not p.strip() for p in args.prompts):
        raise UsageError("a PROMPT is empty")
    limit = byte_limit(settings.engine.n_ctx_before_load)
    stdin = sys.stdin.buffer.read(-1 if limit is None else limit + 1) if "-" in args.files else None
    files = [
        read_attachment(f, settings.engine.n_ctx_before_load, stdin) for f in args.files
    ]  # exit 2 before the model loads
    info = model_info_for(settings, pull=args.pull)
    engine = engine_for(settings, info)  # bad server options fail here, before anything starts (exit 2)
    chat = ChatController(settings, info, lambda _info, _settings: engine, InlineDispatcher())
    printer = _Printer(args.json, args.show_thinking, args.raw, args.tokens)
    chat.add_listener(printer)
    recording = None
    if not args.no_save:
        recording = SessionRecording(chat, on_error=lambda m: say(f"chatphase: {m}; not saving"))
        chat.add_listener(recording)
    try:
        return _run(chat, printer, args.prompts, files)
    finally:
        chat.close()
        if recording is not None:
            writer = recording.writer
            recording.close()
            if writer is not None and writer.turns_recorded and not writer.failed:
                print(f"chatphase: saved as session {writer.id}", file=sys.stderr)


def _run(chat: ChatController, printer: _Printer, prompts: list[str], files: list[Attachment]) -> int:
    chat.start_engine()  # inline: loaded (or stopped) when it returns
    if printer.stopped is not None:
        raise EngineError(printer.stopped)
    for i, prompt in enumerate(prompts):
        if i == 0 and files:
            prompt = _with_files(chat, printer, prompt, files)
        chat.send(prompt)  # inline: the whole turn
        failure = printer.stopped or printer.turn_error
        if printer.refused is not None or failure is not None:
            printer.emit_json()
            if printer.refused is not None:
                raise UsageError(printer.refused)
            raise EngineError(failure)
    printer.emit_json()
    return 0


def _with_files(chat: ChatController, printer: _Printer, prompt: str, files: list[Attachment]) -> str:
    """``prompt`` with ``files`` in it, once the model's tokenizer has counted them (its budget said on
    stderr without ``--json``).

    Raises:
        UsageError: a file larger than the context, or the message would not fit (nothing is sent).
    """
    text = message_text(prompt, files)
    request = chat.draft_request(text, tuple(f.text for f in files))
    count = chat.count(request) if request is not None else None
    if count is None:  # an engine that cannot count (a remote server): the server says if it does not fit
        return text
    for f, n in zip(files, count.text_tokens, strict=True):
        if (line := too_many_tokens(replace(f, tokens=n), count.n_ctx)) is not None:
            raise UsageError(line)
    budget = budget_of(count, chat.ttft)
    if not budget.fits:
        raise UsageError(f"message not sent: {budget.line()}")
    if not printer.as_json:
        say(
            "chatphase: "
            + " · ".join(replace(f, tokens=n).line() for f, n in zip(files, count.text_tokens, strict=True))
        )
        say(f"chatphase: {budget.line()}")
    return text
