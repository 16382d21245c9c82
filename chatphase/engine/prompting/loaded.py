"""A loaded model's prompting, decided once at load: its chat format (checked to render), the template that
turns a conversation into tokens, the end-of-turn stop strings and the thinking markers
(:mod:`chatphase.engine.prompting.chat_format`, :mod:`chatphase.engine.prompting.prompt`, :mod:`chatphase.engine.prompting.thinking`)."""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp as lc

from chatphase.engine.prompting.chat_format import ChatFormat, choose_format, probe, renderer
from chatphase.engine.prompting.prompt import ChatTemplate
from chatphase.engine.prompting.thinking import ThinkingFormat, detect_format
from chatphase.engine.prompting.vocab import Vocab


@dataclass(frozen=True)
class Prompting:
    """``format`` the chat format in use, ``template`` its renderer, ``stops`` its end-of-turn markers,
    ``thinking`` the model's thinking markers (``None`` for a model that does not think), ``switch`` whether
    the template turns thinking on and off (``enable_thinking``), ``notes`` what the user should be told."""

    format: ChatFormat
    template: ChatTemplate
    stops: tuple[str, ...]
    thinking: ThinkingFormat | None
    switch: bool
    notes: tuple[str, ...]


def model_prompting(model: lc.llama_model_p, vocab: Vocab, architecture: str, override: str | None) -> Prompting:
    """The prompting of the llama.cpp ``model`` (its GGUF's template, or the format ``override`` names).

    Raises:
        TemplateError, UsageError: a template that cannot be used, an unknown override (one line).
    """
    raw = lc.llama_model_chat_template(model, None)
    model_template = raw.decode("utf-8", errors="replace") if raw else None
    fmt = choose_format(architecture, model_template, vocab.has_special, override)
    render = renderer(fmt, bos_token=vocab.bos_text, eos_token=vocab.eos_text)
    fmt = probe(fmt, render)
    notes = []
    if fmt.kind != "model":
        notes.append(f"chat format: {fmt.label} — {fmt.why}")
    template = fmt.template or ""
    thinking = detect_format(template, lambda text: len(vocab.tokenize(text, False)) == 1)
    switch = "enable_thinking" in template
    if thinking is not None:
        how = "; the template switches it (enable_thinking)" if switch else ""
        notes.append(f"thinking: {thinking.open}…{thinking.close} marks the model's thinking{how}")
    return Prompting(fmt, ChatTemplate(render, vocab.tokenize), fmt.stops, thinking, switch, tuple(notes))
