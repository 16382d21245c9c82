"""Is the TTFT predicted before sending right? Predicted against measured, on the product's own path.

Method, per repetition (``--reps``): a fresh chat (:class:`~chatphase.chat.controller.ChatController`, the engine
in its child process as ``chatphase ask`` runs it, greedy) has three short turns; then a message of at least
``--long-tokens`` new tokens (a text file of deterministic varied words put into it, as ``ask -f`` does) is
counted by the engine's own tokenizer and its budget line taken *before* it is sent — the prediction the user
sees (:mod:`chatphase.chat.budget`, fitted on the three turns: :mod:`chatphase.engine.ttft_prediction`) — and
then sent; its measured TTFT is the engine's. Also reported: the prediction made at the prefill's start
(``ttft_predicted_ms``, exact counts), which should agree with the budget's. Side by side, from the same three
turns: the prediction of a prefill line through the origin (the fit before it had an intercept), to show what
the intercept changes in the same run.

Target: |predicted ÷ measured − 1| ≤ 25 % in every repetition (exit 1 when not met). The machine and its load
are named in the report; figures taken on a busy machine mean little.

Run: ``python -m benchmarks.ttft_prediction [--model M] [--reps 3] [--long-tokens 1000] [--gen 32]
[--n-ctx 4096] [--output FILE]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

from typing_extensions import override

from benchmarks.harness import machine_line
from chatphase.chat.attachments import Attachment, message_text
from chatphase.chat.budget import budget_of
from chatphase.chat.controller import ChatController
from chatphase.chat.dispatch import InlineDispatcher
from chatphase.chat.listener import ChatListener
from chatphase.chat.turn import Turn
from chatphase.engine.events import TurnFinished
from chatphase.engine.factory import make_engine
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.ttft_prediction import fit
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model
from chatphase.settings.schema import Settings

TARGET = 0.25
SHORT_TURNS = ("What is prefill?", "And what is decode?", "Which of the two is memory bound?")
WORDS = (
    "cache token layer matrix prompt decode prefill latency memory bandwidth kernel thread batch context window "
    "attention query key value head model weight quantised river mountain garden window orange violet quiet "
    "engine measure predict table figure number seven thirty ninety little larger smallest between"
).split()


def long_text(n_words: int, seed: int) -> str:
    """``n_words`` deterministic words in sentences of 12 (varied enough that the tokenizer does not merge them)."""
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return "\n".join(" ".join(words[i : i + 12]).capitalize() + "." for i in range(0, n_words, 12))


class _Turns(ChatListener):
    def __init__(self) -> None:
        self.metrics: list[TurnMetrics] = []

    @override
    def turn_finished(self, turn: Turn, event: TurnFinished) -> None:
        self.metrics.append(event.metrics)


def one_rep(chat: ChatController, turns: _Turns, long_tokens: int, seed: int) -> dict:
    """Three short turns, then the long message; its predicted and measured TTFT."""
    chat.new_chat()
    for text in SHORT_TURNS:
        chat.send(text)
    n_words = long_tokens
    while True:  # grow the file until the message's new tokens reach the target
        body = long_text(n_words, seed)
        file = Attachment("long.txt", body, len(body.encode()))
        message = message_text("Summarise this file in one sentence.", [file])
        request = chat.draft_request(message)
        count = chat.count(request) if request is not None else None
        if count is None or count.new_tokens is None:
            raise SystemExit(f"benchmarks: the engine could not count the message ({count and count.too_long})")
        if count.new_tokens >= long_tokens:
            break
        n_words = int(n_words * long_tokens / count.new_tokens) + 12
    budget = budget_of(count, chat.ttft)
    origin = fit(chat.ttft.points, chat.ttft.k, "through the origin", intercept=False)
    assert origin is not None and count.cached_tokens is not None  # three turns were measured; a local count
    prefill_once_ms = chat.ttft.model.prefill_once_ms if chat.ttft.model else None
    chat.send(message)
    m = turns.metrics[-1]
    return {
        "new_tokens": count.new_tokens,
        "depth": count.cached_tokens,
        "predicted_ms": budget.ttft_ms,
        "origin_ms": origin.ttft_ms(count.new_tokens, count.cached_tokens),
        "prefill_once_ms": prefill_once_ms,
        "at_prefill_ms": m.ttft_predicted_ms,
        "measured_ms": m.ttft_ms,
        "source": budget.source,
        "line": budget.line(),
    }


def report(rows: list[dict], model: str, args: argparse.Namespace) -> tuple[str, bool]:
    """The Markdown report and whether the target was met in every repetition."""
    lines = [
        "# TTFT predicted before sending vs measured",
        "",
        f"- machine: {machine_line()}",
        f"- run: `python -m benchmarks.ttft_prediction {' '.join(sys.argv[1:])}`",
        f"- model: {model}; n_ctx {args.n_ctx}; three short turns (greedy, {args.gen} tokens), then a message of "
        f"≥ {args.long_tokens} new tokens",
        "",
        "| rep | new tok | depth | predicted ms | at prefill ms | measured ms | error | p0 ms | origin ms | "
        "origin error | source |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    met = True
    errors, origin_errors = [], []
    for i, r in enumerate(rows, 1):
        err = None if not (r["predicted_ms"] and r["measured_ms"]) else r["predicted_ms"] / r["measured_ms"] - 1
        origin_err = r["origin_ms"] / r["measured_ms"] - 1 if r["measured_ms"] else None
        met = met and err is not None and abs(err) <= TARGET
        if err is not None:
            errors.append(abs(err))
        if origin_err is not None:
            origin_errors.append(abs(origin_err))
        pred = "–" if r["predicted_ms"] is None else f"{r['predicted_ms']:.0f}"
        at = "–" if r["at_prefill_ms"] is None else f"{r['at_prefill_ms']:.0f}"
        shown = "–" if err is None else f"{err:+.0%}"
        p0 = "–" if r["prefill_once_ms"] is None else f"{r['prefill_once_ms']:.1f}"
        origin_shown = "–" if origin_err is None else f"{origin_err:+.0%}"
        lines.append(
            f"| {i} | {r['new_tokens']} | {r['depth']} | {pred} | {at} | {r['measured_ms']:.0f} | {shown} | {p0} | "
            f"{r['origin_ms']:.0f} | {origin_shown} | {r['source']} |"
        )
    median = f"{statistics.median(errors):.0%}" if errors else "–"
    origin_median = f"{statistics.median(origin_errors):.0%}" if origin_errors else "–"
    verdict = "met" if met else "NOT met"
    lines += [
        "",
        f"Median |error| {median} (a line through the origin, the same turns: {origin_median}); "
        f"target ±{TARGET:.0%} in every repetition: {verdict}.",
        "",
    ]
    return "\n".join(lines), met


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ttft_prediction", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model name or path (default: the bundled model)")
    p.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--long-tokens", type=int, default=1000, help="new tokens of the long message (default 1000)")
    p.add_argument("--gen", type=int, default=32, help="most tokens per reply (default 32)")
    p.add_argument("--n-ctx", type=int, default=4096, help="context size (default 4096)")
    p.add_argument("--threads", type=int, help="engine threads (default: chatphase's)")
    p.add_argument("--output", help="also write the report here")
    args = p.parse_args(argv)
    info = read_model_info(resolve_model(args.model))
    settings = Settings().with_overrides(
        n_ctx=args.n_ctx,
        max_tokens=args.gen,
        temperature=0,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        prefix_cache="off",  # a restore from disk is not a prefill: an earlier run's long message would be restored
    )
    engine = make_engine(info, settings.engine)
    chat = ChatController(settings, info, lambda _i, _s: engine, InlineDispatcher())
    chat.ttft.prior = None  # the chat's own turns only: that is what this measures
    turns = _Turns()
    chat.add_listener(turns)
    try:
        chat.start_engine()
        if chat.loaded is None:
            raise SystemExit("benchmarks: the model did not load (see the engine log)")
        rows = [one_rep(chat, turns, args.long_tokens, seed) for seed in range(args.reps)]
    finally:
        chat.close()
    text, met = report(rows, info.name, args)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
