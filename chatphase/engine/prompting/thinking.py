"""Thinking: how reasoning models mark the thinking they do before the answer, and a streaming split.

Formats (:data:`FORMATS`): ``<think>…</think>`` (Qwen3, QwQ, DeepSeek-R1 and its distills, Phi-4-reasoning,
Nemotron, GLM, MiniMax), ``[THINK]…[/THINK]`` (Magistral), ``<seed:think>…</seed:think>`` (Seed-OSS),
``◁think▷…◁/think▷`` (Kimi) and gpt-oss's channels (``<|channel|>analysis<|message|>`` … ``<|end|>``, the
answer after ``<|start|>assistant<|channel|>final<|message|>``). A model's format is found from its own
template and vocabulary (:func:`detect_format`); a model without one is not split at all.

:class:`ThinkingSplitter` splits generated text as it streams: markers are never part of either text, a
marker split across pieces (tokens) is held back until it is whole, a block the template already
opened in the generation prompt starts the reply inside it (``preopened``), and the end of a reply
still inside the block is "thinking cut short". Pure Python: the engines (local and remote) run it
where the tokens and their clock are; :mod:`chatphase.chat` keeps the split turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chatphase.engine.prompting.stops import partial_suffix


@dataclass(frozen=True)
class ThinkingFormat:
    """One way of marking thinking: ``open`` and ``close`` markers, and ``answer_prefix``, text that may
    start an answer given without thinking (gpt-oss's final channel) and is dropped."""

    name: str
    open: str
    close: str
    answer_prefix: str = ""

    @property
    def forced_close(self) -> str:
        """What an engine evaluates to close the block itself: the closing marker, and the blank line a
        tag format's templates put before the answer."""
        return self.close if self.close.endswith("|>") else self.close + "\n\n"


FORMATS: tuple[ThinkingFormat, ...] = (
    ThinkingFormat("think", "<think>", "</think>"),
    ThinkingFormat("mistral", "[THINK]", "[/THINK]"),
    ThinkingFormat("seed", "<seed:think>", "</seed:think>"),
    ThinkingFormat("kimi", "◁think▷", "◁/think▷"),
    ThinkingFormat(
        "gpt-oss",
        "<|channel|>analysis<|message|>",
        "<|end|><|start|>assistant<|channel|>final<|message|>",
        "<|channel|>final<|message|>",
    ),
)


def detect_format(template: str | None, is_token: Callable[[str], bool]) -> ThinkingFormat | None:
    """The model's thinking format: the first of :data:`FORMATS` whose opening marker its chat ``template``
    writes (a template that opens the block in the generation prompt never writes the closing one: the
    model does), or whose opening marker is one token of its vocabulary (``is_token(text)``). ``None`` for
    a model that does not think."""
    for fmt in FORMATS:
        if template and fmt.open in template:
            return fmt
    for fmt in FORMATS:
        if is_token(fmt.open):
            return fmt
    return None


def opened_by_prompt(prompt: str, fmt: ThinkingFormat | None) -> bool:
    """Whether the templated ``prompt`` ends inside an open thinking block (the template opened it in the
    generation prompt, so the reply holds only the closing marker)."""
    if fmt is None:
        return False
    opened = prompt.rfind(fmt.open)
    return opened >= 0 and prompt.rfind(fmt.close) < opened


@dataclass
class Piece:
    """What one fed piece of text added: ``thinking`` and ``answer`` text (markers removed), and whether
    the thinking block closed in it."""

    thinking: str = ""
    answer: str = ""
    closed: bool = False


class ThinkingSplitter:
    """Splits streamed text into thinking and answer (see the module docstring).

    ``state``: ``"start"`` (nothing decided yet), ``"thinking"`` (inside the block), ``"after"`` (the
    block closed; whitespace before the answer is dropped) or ``"answer"``. With ``fmt=None`` everything
    is answer, at once.
    """

    def __init__(self, fmt: ThinkingFormat | None, preopened: bool = False) -> None:
        self.fmt = fmt
        self.state = "answer" if fmt is None else "thinking" if preopened else "start"
        self.opened = preopened  # the block was open at some point
        self._held = ""

    @property
    def thinking(self) -> bool:
        """Whether the text is inside the thinking block now."""
        return self.state == "thinking"

    def feed(self, text: str) -> Piece:
        """Split ``text``, the next piece of the reply."""
        out = Piece()
        if self.fmt is None:
            out.answer = text
            return out
        buf = self._held + text
        self._held = ""
        fmt = self.fmt
        while buf:
            if self.state == "start":
                body = buf.lstrip()
                if body.startswith(fmt.open):
                    self.state, self.opened, buf = "thinking", True, body[len(fmt.open) :]
                elif fmt.answer_prefix and body.startswith(fmt.answer_prefix):
                    self.state, buf = "answer", body[len(fmt.answer_prefix) :]
                elif fmt.open.startswith(body) or (fmt.answer_prefix and fmt.answer_prefix.startswith(body)):
                    self._held = buf  # a marker may be coming
                    return out
                else:
                    self.state = "answer"
            elif self.state == "thinking":
                at = buf.find(fmt.close)
                if at >= 0:
                    out.thinking += buf[:at]
                    out.closed, self.state, buf = True, "after", buf[at + len(fmt.close) :]
                    continue
                keep = partial_suffix(buf, fmt.close)
                out.thinking += buf[: len(buf) - keep]
                self._held = buf[len(buf) - keep :]
                return out
            elif self.state == "after":
                buf = buf.lstrip()
                if buf:
                    self.state = "answer"
            else:  # the answer: a closing marker written again (after a forced close) is still a marker
                at = buf.find(fmt.close)
                if at >= 0:
                    out.answer += buf[:at]
                    buf = buf[at + len(fmt.close) :]
                    continue
                keep = partial_suffix(buf, fmt.close)
                out.answer += buf[: len(buf) - keep]
                self._held = buf[len(buf) - keep :]
                return out
        return out

    def flush(self) -> Piece:
        """The end of the reply: what was held back (a marker that never completed is text)."""
        held, self._held = self._held, ""
        if self.state == "thinking":
            return Piece(thinking=held)
        if self.state == "start":
            self.state = "answer"
            return Piece(answer=held)
        return Piece(answer=held) if self.state == "answer" else Piece()


class ThinkingTracker:
    """An engine's per-token view of the thinking block: feed each generated token's text and sampling
    time (:meth:`token`); it counts the block's tokens (its markers included: the block is the reply's
    first tokens, up to the one that closes it) and notes when it closed.

    ``budget``: thinking tokens after which the engine should close the block itself (:meth:`over_budget`,
    then :meth:`force_close` with the closing marker it evaluated), as llama-server's reasoning budget does.
    """

    def __init__(self, fmt: ThinkingFormat | None, preopened: bool = False, budget: int | None = None) -> None:
        self.splitter = ThinkingSplitter(fmt, preopened)
        self.budget = budget
        self.thinking_tokens = 0
        self.t_end_ns: int | None = None
        self.forced = False
        self._undecided = 0  # tokens fed before the reply showed whether it opens a block

    @property
    def open(self) -> bool:
        """Whether the block is open (the reply is thinking now)."""
        return self.splitter.thinking

    @property
    def happened(self) -> bool:
        """Whether the reply had a thinking block (``False``: its metrics have no thinking fields)."""
        return self.splitter.opened

    def token(self, text: str, t_ns: int) -> Piece:
        """Split one generated token's ``text`` sampled at ``t_ns``."""
        before = self.splitter.state
        piece = self.splitter.feed(text)
        if before == "start":
            self._undecided += 1
            if self.splitter.opened:
                self.thinking_tokens += self._undecided
                self._undecided = 0
        elif before == "thinking":
            self.thinking_tokens += 1
        if piece.closed:
            self.t_end_ns = t_ns
        return piece

    def over_budget(self) -> bool:
        return self.budget is not None and self.open and self.thinking_tokens >= self.budget

    def force_close(self, t_ns: int) -> Piece:
        """The engine closed the block itself (evaluated its closing marker, done at ``t_ns``); only a model
        that thinks has a block to close (:meth:`over_budget` is false without a format)."""
        fmt = self.splitter.fmt
        piece = self.splitter.feed(fmt.close if fmt is not None else "")
        self.t_end_ns, self.forced = t_ns, True
        return piece

    def finish(self, tail: str = "") -> Piece:
        """The reply ended (``tail``: text that came with no token of its own, e.g. the end of a character):
        that and what was held back, split (see :meth:`ThinkingSplitter.flush`)."""
        piece = self.splitter.feed(tail) if tail else Piece()
        rest = self.splitter.flush()
        return Piece(piece.thinking + rest.thinking, piece.answer + rest.answer, piece.closed)

    def metrics_args(self) -> dict[str, Any]:
        """``thinking_tokens`` / ``t_thinking_end_ns`` for :func:`~chatphase.engine.metrics.compute_turn_metrics`."""
        if not self.happened:
            return {}
        return {"thinking_tokens": self.thinking_tokens, "t_thinking_end_ns": self.t_end_ns}
