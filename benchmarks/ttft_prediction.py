"""Can the TTFT predicted before sending be trusted? Scripted chats replayed on the product's own path, every
prediction shown scored against the TTFT then measured.

Method: per model (``--models``: the bundled default and a synthetic Llama-3.2-1B, Q4_0, written once into the user
cache), one chat (:class:`~chatphase.chat.controller.ChatController`, the engine in its child process as the TUI and
``ask`` run it, greedy, ``--gen`` tokens, the prefix store on, ``--overflow drop-oldest``), recorded as sessions in
a temporary data folder (so each new chat's prediction is fitted on the earlier chats' turns through the history
database, as a user's would be, and nothing of the user's own history or bench results is read) with the prefix
store in a temporary cache folder. Before each turn its message is counted by the engine's tokenizer and its
budget taken — the prediction the user sees (:mod:`chatphase.chat.budget`; the turn carries that same object) —
then sent; its TTFT is the engine's. The scripted chats, in order, ``--reps`` times:

- ``long first turn``: a new chat opening with a file of ``--long-tokens``, then two short follow-ups;
- ``short first turn``: a new chat opening with a short message, then ~200 tokens;
- ``file at depth``: three short turns, then a file of ``--file-tokens``;
- ``deep follow-ups``: five short follow-ups in that chat, deep in its context;
- ``resumed (restore)``: twice, the engine restarted (its KV cache empty) and that chat resumed: the next turn's
  prefix is restored from the prefix store where the store's rule says that beats prefill, then a second turn
  (a prediction after a restore needs two restores measured: the first reps' are withheld);
- ``after an overflow``: a new chat of files of 40 % of ``--n-ctx`` and short turns, until the third file
  leaves the oldest messages out and the kept history is evaluated again;
- ``after a cancelled turn``: a new chat whose first message (a file of ``--file-tokens``) is stopped after its
  first token (its prefill completed), then a short turn and ~150 tokens.

Scored, per model and in all: for each prediction shown, ``predicted ÷ measured − 1``; the median |error|, the
share outside 0.5–2× and the share of measured TTFTs inside the shown range; withheld predictions are counted (with
why) and not scored. Targets (the issue "Trust 5"): median |error| ≤ 15 %, none outside 0.5–2×, the range holding
the measured TTFT ≥ 80 % of the time — exit 1 when one is not met. The machine and its load are in the report;
figures from a busy machine mean little.

Run: ``python -m benchmarks.ttft_prediction [--models default,synth:llama-3.2-1b] [--reps 2] [--long-tokens 1500]
[--file-tokens 800] [--gen 16] [--n-ctx 2048] [--threads N] [--output FILE.md]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from typing_extensions import override

from benchmarks.harness import machine_line, synthetic_model
from chatphase.chat.attachments import Attachment, message_text
from chatphase.chat.budget import budget_of, withheld_text
from chatphase.chat.controller import ChatController
from chatphase.chat.dispatch import InlineDispatcher
from chatphase.chat.listener import ChatListener
from chatphase.chat.recording import SessionRecording
from chatphase.chat.turn import Turn
from chatphase.engine.events import FirstToken, TurnFinished
from chatphase.engine.factory import make_engine
from chatphase.engine.metrics import TurnMetrics
from chatphase.models.gguf_meta import ModelInfo, read_model_info
from chatphase.models.resolve import resolve_model
from chatphase.settings.schema import Settings

SYNTH_1B = "synth:llama-3.2-1b"
MEDIAN_TARGET = 0.15
COVERAGE_TARGET = 0.80
SHORT = (
    "What is prefill?",
    "And what is decode?",
    "Which of the two is memory bound?",
    "Why does the context length matter?",
    "Say that again in one sentence.",
    "What does the KV cache hold?",
    "How long is a token?",
)
WORDS = (
    "cache token layer matrix prompt decode prefill latency memory bandwidth kernel thread batch context window "
    "attention query key value head model weight quantised river mountain garden window orange violet quiet "
    "engine measure predict table figure number seven thirty ninety little larger smallest between"
).split()
CASES = (
    "long first turn",
    "short first turn",
    "file at depth",
    "deep follow-ups",
    "resumed (restore)",
    "after an overflow",
    "after a cancelled turn",
)


def long_text(n_words: int, seed: int) -> str:
    """``n_words`` deterministic words in sentences of 12 (varied enough that the tokenizer does not merge them)."""
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return "\n".join(" ".join(words[i : i + 12]).capitalize() + "." for i in range(0, n_words, 12))


@dataclass
class Shown:
    """One turn: what was shown before it was sent and what it measured."""

    model: str
    case: str
    new_tokens: int
    depth: int
    restored: int
    predicted_ms: float | None
    low_ms: float | None
    high_ms: float | None
    note: str
    measured_ms: float | None
    stop: str

    @property
    def ratio(self) -> float | None:
        if self.predicted_ms is None or not self.measured_ms:
            return None
        return self.predicted_ms / self.measured_ms

    @property
    def in_range(self) -> bool | None:
        if self.predicted_ms is None or self.low_ms is None or self.high_ms is None or self.measured_ms is None:
            return None
        return self.low_ms <= self.measured_ms <= self.high_ms


class _Turns(ChatListener):
    """Keeps each finished turn's metrics; stops the turn at its first token when told to (Esc after a prefill)."""

    def __init__(self, chat: ChatController) -> None:
        self.chat = chat
        self.metrics: list[TurnMetrics] = []
        self.stop_next = False

    @override
    def first_token(self, turn: Turn, event: FirstToken) -> None:
        if self.stop_next:
            self.stop_next = False
            self.chat.stop()

    @override
    def turn_finished(self, turn: Turn, event: TurnFinished) -> None:
        self.metrics.append(event.metrics)


class Replay:
    """The scripted chats on one model (module docstring)."""

    def __init__(self, name: str, info: ModelInfo, settings: Settings, args: argparse.Namespace) -> None:
        self.name, self.args = name, args
        self.chat = ChatController(settings, info, lambda i, s: make_engine(i, s.engine), InlineDispatcher())
        self.turns = _Turns(self.chat)
        self.chat.add_listener(self.turns)
        self.recording = SessionRecording(self.chat, on_error=lambda m: print(f"benchmarks: {m}", file=sys.stderr))
        self.chat.add_listener(self.recording)
        self.shown: list[Shown] = []
        self.words_per_token = 1.0
        self.seed = 0

    def start(self) -> None:
        self.chat.start_engine()
        if self.chat.loaded is None:
            raise SystemExit(f"benchmarks: {self.name} did not load (see the engine log)")
        request = self.chat.draft_request("x", (long_text(240, 99),))
        count = self.chat.count(request) if request is not None else None
        if count is None or not count.text_tokens:
            raise SystemExit("benchmarks: the engine could not count a text")
        self.words_per_token = 240 / count.text_tokens[0]

    def file_message(self, tokens: int) -> str:
        """A message asking about a file of about ``tokens`` tokens (as ``ask -f`` puts it in)."""
        self.seed += 1
        body = long_text(max(12, round(tokens * self.words_per_token)), self.seed)
        return message_text("Summarise this file in one sentence.", [Attachment("notes.txt", body, len(body.encode()))])

    def medium(self, tokens: int) -> str:
        self.seed += 1
        return "Explain this: " + long_text(max(12, round(tokens * self.words_per_token)), self.seed)

    def turn(self, case: str, text: str, stop_after_first_token: bool = False) -> None:
        """Count ``text``, take its budget (the prediction shown), send it, keep both."""
        request = self.chat.draft_request(text)
        count = self.chat.count(request) if request is not None else None
        if count is None or count.new_tokens is None:
            raise SystemExit(f"benchmarks: {case}: the message was not counted ({count and count.too_long})")
        budget = budget_of(count, self.chat.ttft)
        p = budget.prediction
        assert p is not None
        before = len(self.turns.metrics)
        self.turns.stop_next = stop_after_first_token
        self.chat.send(text)
        if len(self.turns.metrics) == before:
            raise SystemExit(f"benchmarks: {case}: the turn did not finish")
        m = self.turns.metrics[-1]
        print(f"benchmarks: {self.name} · {case} · +{count.new_tokens} tok · TTFT {_ms(m.ttft_ms)} ms", file=sys.stderr)
        if m.ttft_predicted_ms != p.ttft_ms:  # the turn carries the budget's prediction
            raise SystemExit(f"benchmarks: {case}: two predictions ({p.ttft_ms} shown, {m.ttft_predicted_ms} kept)")
        note = withheld_text(p.withheld) if p.withheld is not None else ""
        self.shown.append(
            Shown(self.name, case, count.new_tokens, count.cached_tokens + count.restore_tokens, count.restore_tokens,
                  p.ttft_ms, p.low_ms, p.high_ms, note, m.ttft_ms, m.stop_reason)
        )  # fmt: skip

    def new_chat(self) -> None:
        if self.recording.history is not None:
            self.recording.history.wait()  # the last chat's turns are in the history database
        self.chat.new_chat()

    def one_rep(self) -> None:
        a, n_ctx = self.args, self.args.n_ctx
        short = iter(SHORT * 20)
        self.new_chat()
        self.turn(CASES[0], self.file_message(min(a.long_tokens, int(n_ctx * 0.7))))
        for _ in range(2):
            self.turn(CASES[0], next(short))
        self.new_chat()
        self.turn(CASES[1], next(short))
        self.turn(CASES[1], self.medium(200))
        self.new_chat()
        for _ in range(3):
            self.turn(CASES[2], next(short))
        self.turn(CASES[2], self.file_message(min(a.file_tokens, int(n_ctx * 0.4))))
        for _ in range(5):
            self.turn(CASES[3], next(short))
        for _ in range(2):
            session = self.recording.session()
            self.chat.restart_engine()  # a fresh engine: its KV cache is empty, the prefix store is not
            if self.chat.loaded is None:
                raise SystemExit(f"benchmarks: {self.name} did not load again")
            if session is not None:
                self.chat.restore(session)
                for _ in range(2):
                    self.turn(CASES[4], next(short))
        self.new_chat()
        for _ in range(3):
            self.turn(CASES[5], self.file_message(int(n_ctx * 0.4)))
            self.turn(CASES[5], next(short))
        self.new_chat()
        self.turn(CASES[6], self.file_message(min(a.file_tokens, int(n_ctx * 0.4))), stop_after_first_token=True)
        self.turn(CASES[6], next(short))
        self.turn(CASES[6], self.medium(150))

    def close(self) -> None:
        self.chat.close()
        self.recording.close()


def score(rows: list[Shown]) -> tuple[str, bool]:
    """One summary line of ``rows`` and whether the targets were met."""
    ratios = [r.ratio for r in rows if r.ratio is not None]
    held = [r.in_range for r in rows if r.in_range is not None]
    withheld = sum(1 for r in rows if r.predicted_ms is None)
    if not ratios:
        return f"no prediction shown ({withheld} withheld)", False
    median = statistics.median(abs(x - 1) for x in ratios)
    outside = sum(1 for x in ratios if not 0.5 <= x <= 2.0)
    coverage = sum(held) / len(held) if held else 0.0
    met = median <= MEDIAN_TARGET and outside == 0 and coverage >= COVERAGE_TARGET
    line = (
        f"{len(ratios)} predictions shown, {withheld} withheld: median |error| {median:.0%} (target ≤ "
        f"{MEDIAN_TARGET:.0%}), {outside} outside 0.5–2× (target 0), range held the measured TTFT "
        f"{coverage:.0%} of the time (target ≥ {COVERAGE_TARGET:.0%})"
    )
    return line, met


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f}"


def _range(r: Shown) -> str:
    """The range shown (``1,650–6,000``), or a withheld prediction's bounds (``≥ 205``, ``≤ 206``, ``≥ 9, ≤ 80``)."""
    if r.predicted_ms is not None and r.low_ms is not None and r.high_ms is not None:
        return f"{_ms(r.low_ms)}–{_ms(r.high_ms)}"
    bounds = [f"≥ {_ms(r.low_ms)}"] if r.low_ms is not None else []
    bounds += [f"≤ {_ms(r.high_ms)}"] if r.high_ms is not None else []
    return ", ".join(bounds) or "–"


def report(rows: list[Shown], models: list[str], args: argparse.Namespace) -> tuple[str, bool]:
    """The Markdown report and whether every target was met (per model and in all)."""
    lines = [
        "# TTFT predicted before sending vs measured: scripted chats replayed",
        "",
        f"- machine: {machine_line()}",
        f"- run: `python -m benchmarks.ttft_prediction {' '.join(sys.argv[1:])}`",
        f"- models: {', '.join(models)}; n_ctx {args.n_ctx}; {args.reps} repetitions of the scripted chats; greedy, "
        f"{args.gen} tokens a reply; prefix store on; overflow drop-oldest",
        "",
        "| model | case | new tok | depth | restored | predicted ms | range (or bound) ms | measured ms | error | "
        "in range | withheld: why | stop |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---|---|---|",
    ]
    for r in rows:
        err = "–" if r.ratio is None else f"{r.ratio - 1:+.0%}"
        rng = _range(r)
        held = "–" if r.in_range is None else ("yes" if r.in_range else "NO")
        lines.append(
            f"| {r.model} | {r.case} | {r.new_tokens} | {r.depth} | {r.restored} | {_ms(r.predicted_ms)} | {rng} | "
            f"{_ms(r.measured_ms)} | {err} | {held} | {r.note} | {r.stop} |"
        )
    lines += ["", "## Scores", ""]
    met = True
    for model in models:
        line, ok = score([r for r in rows if r.model == model])
        met = met and ok
        lines.append(f"- {model}: {line}: {'met' if ok else 'NOT met'}")
    for case in CASES:
        line, _ok = score([r for r in rows if r.case == case])
        lines.append(f"- {case}: {line}")
    line, ok = score(rows)
    met = met and ok
    lines += ["", f"All: {line}: {'met' if met else 'NOT met'}.", ""]
    return "\n".join(lines), met


def model_info(spec: str) -> tuple[str, ModelInfo]:
    """``default`` (the bundled model), ``synth:SHAPE`` (written once into the user cache) or a model name/path."""
    if spec.startswith("synth:"):
        path = synthetic_model(spec.split(":", 1)[1])
        return spec, read_model_info(path)
    info = read_model_info(resolve_model(None if spec == "default" else spec))
    return info.name, info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ttft_prediction", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=f"default,{SYNTH_1B}", help=f"comma-separated (default: default,{SYNTH_1B})")
    p.add_argument("--reps", type=int, default=2, help="repetitions of the scripted chats (default 2)")
    p.add_argument("--long-tokens", type=int, default=1500, help="the long first turn's tokens (default 1500)")
    p.add_argument("--file-tokens", type=int, default=800, help="a file's tokens (default 800)")
    p.add_argument("--gen", type=int, default=16, help="most tokens per reply (default 16)")
    p.add_argument("--n-ctx", type=int, default=2048, help="context size (default 2048)")
    p.add_argument("--threads", type=int, help="engine threads (default: chatphase's)")
    p.add_argument("--output", help="also write the report here")
    args = p.parse_args(argv)
    specs = [s.strip() for s in args.models.split(",") if s.strip()]
    infos = [model_info(s) for s in specs]  # the synthetic file is written (once) into the real user cache
    settings = Settings().with_overrides(
        n_ctx=args.n_ctx,
        max_tokens=args.gen,
        temperature=0,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        overflow="drop-oldest",
    )
    rows: list[Shown] = []
    with tempfile.TemporaryDirectory(prefix="chatphase-ttft-bench-") as tmp:
        os.environ["CHATPHASE_DATA_DIR"] = str(Path(tmp) / "data")  # sessions, history: this run's only
        os.environ["CHATPHASE_CACHE_DIR"] = str(Path(tmp) / "cache")  # the prefix store: this run's only
        for name, info in infos:
            replay = Replay(name, info, settings, args)
            try:
                replay.start()
                for _ in range(args.reps):
                    replay.one_rep()
            finally:
                replay.close()
            rows += replay.shown
    text, met = report(rows, [name for name, _ in infos], args)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
