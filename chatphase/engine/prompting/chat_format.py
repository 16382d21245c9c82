"""Which chat format a model is prompted in, and a check that it renders, before any turn.

A format is one of:

* ``model``: the Jinja template in the GGUF (``tokenizer.chat_template``), rendered by llama-cpp-python's
  ``Jinja2ChatFormatter`` in Jinja's immutable sandbox (CVE-2024-34359 was the unsandboxed case);
* ``file``: a Jinja template from a file (``--chat-template FILE``), rendered the same way;
* ``builtin``: one of llama.cpp's named formats (``llama_chat_builtin_templates``: gemma, llama3, phi3,
  mistral-v7, chatml, …), rendered by ``llama_chat_apply_template`` (``--chat-template NAME``);
* ``completion``: no chat markup at all, ``User: …`` / ``Assistant:`` lines (llama.cpp's ``rwkv-world``
  layout), for a file whose vocabulary has no chat tokens.

A file without a template gets, by :func:`choose_format`, the first built-in format whose markers are
special tokens of its vocabulary, those made for its architecture first (Gemma's ``<start_of_turn>``,
Llama 3's ``<|start_header_id|>``…); ChatML only when ``<|im_start|>`` / ``<|im_end|>`` are tokens
(a vocabulary without them reads them as plain text and writes them back as text); else ``completion``.

Every format has end-of-turn markers (:attr:`ChatFormat.stops`): the text its template writes after an
assistant message (``<end_of_turn>``, ``<|im_end|>``), found by rendering one; ``completion`` stops at the
next ``User:`` line. Generation stops on them even when the model writes them as text
(:mod:`chatphase.engine.prompting.stops`).

:func:`probe` renders a small conversation and raises :class:`TemplateError` (a
:class:`~chatphase.errors.ModelError`, exit 2) with one plain line when a template cannot be parsed,
raises, is refused by the sandbox or renders none of the conversation.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from chatphase.engine.events import Message
from chatphase.errors import ModelError, UsageError
from chatphase.models.gguf_meta import ModelInfo

if TYPE_CHECKING:
    from llama_cpp.llama_types import ChatCompletionRequestMessage

#: the ``--chat-template`` value for the plain completion prompt (not a llama.cpp name).
COMPLETION = "completion"
#: the llama.cpp built-in that has the completion prompt's layout.
_COMPLETION_LAYOUT = "rwkv-world"
OVERRIDE_HINT = "choose a format with --chat-template NAME|FILE (a llama.cpp built-in such as chatml, or a Jinja file)"

#: built-in formats tried for a file without a template: (llama.cpp name, architectures it was made for,
#: markers that must be special tokens of the vocabulary). Without an architecture match, the first entry
#: whose tokens exist wins, in :data:`_ANY_ARCH_ORDER` order.
FALLBACKS: tuple[tuple[str, frozenset[str], tuple[str, ...]], ...] = (
    (
        "gemma",
        frozenset({"gemma", "gemma2", "gemma3", "gemma3n", "gemma-embedding"}),
        ("<start_of_turn>", "<end_of_turn>"),
    ),
    ("llama4", frozenset({"llama4"}), ("<|header_start|>", "<|header_end|>", "<|eot|>")),
    ("llama3", frozenset({"llama"}), ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    ("phi4", frozenset({"phi3"}), ("<|im_start|>", "<|im_sep|>", "<|im_end|>")),
    ("phi3", frozenset({"phi3"}), ("<|user|>", "<|assistant|>", "<|end|>")),
    ("gpt-oss", frozenset({"gpt-oss"}), ("<|start|>", "<|message|>", "<|end|>")),
    ("command-r", frozenset({"command-r", "cohere2"}), ("<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>")),
    ("granite", frozenset({"granite", "granitemoe", "granitehybrid"}), ("<|start_of_role|>", "<|end_of_role|>")),
    ("deepseek3", frozenset({"deepseek2"}), ("<｜User｜>", "<｜Assistant｜>")),
    ("exaone3", frozenset({"exaone"}), ("[|user|]", "[|assistant|]", "[|endofturn|]")),
    ("mistral-v7", frozenset({"llama", "mistral3"}), ("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[INST]", "[/INST]")),
    ("mistral-v3", frozenset({"llama"}), ("[INST]", "[/INST]")),
    ("chatml", frozenset({"qwen", "qwen2", "qwen3", "smollm3"}), ("<|im_start|>", "<|im_end|>")),
)
_ANY_ARCH_ORDER = ("chatml", "llama3", "gemma", "phi3", "mistral-v7", "mistral-v3")
#: the probe conversation; the last user message must appear in any useful rendering.
PROBE = (
    Message("user", "Hello, who are you?"),
    Message("assistant", "I am an assistant."),
    Message("user", "What is 2 + 2?"),
)


class TemplateError(ModelError):
    """A chat template that cannot be used (exit 2); ``str`` is one line ending in the override hint."""


@dataclass(frozen=True)
class ChatFormat:
    """How prompts are written: ``kind`` (``model``, ``file``, ``builtin``, ``completion``), ``name`` (the
    llama.cpp name, the template file's path, the model's name or ``completion``), the Jinja ``template`` source for
    ``model``/``file``, ``stops`` (end-of-turn text markers) and ``why`` (how it was chosen, for a note)."""

    kind: str
    name: str
    template: str | None = None
    stops: tuple[str, ...] = ()
    why: str = ""

    @property
    def label(self) -> str:
        """What the user reads, e.g. ``gemma (llama.cpp built-in)``."""
        return {
            "model": "the model's own template",
            "file": f"Jinja template {self.name}",
            "builtin": f"{self.name} (llama.cpp built-in)",
            "completion": "plain completion (User:/Assistant: lines, no chat markup)",
        }[self.kind]


@functools.lru_cache(maxsize=1)
def builtin_names() -> tuple[str, ...]:
    """llama.cpp's built-in chat format names (``llama_chat_builtin_templates``)."""
    import llama_cpp as lc

    n = lc.llama_chat_builtin_templates(None, 0)
    out = (ctypes.c_char_p * max(n, 0))()
    lc.llama_chat_builtin_templates(out, n)
    return tuple(name.decode() for name in out)


def resolve_override(value: str | None) -> ChatFormat | None:
    """The format ``--chat-template VALUE`` names: a built-in name, ``completion``, or a Jinja file.
    ``None``, empty or ``auto`` -> ``None`` (choose automatically).

    Raises:
        UsageError: neither a known name nor a readable UTF-8 file.
    """
    if value is None or value.strip() in ("", "auto"):
        return None
    value = value.strip()
    if value == COMPLETION:
        return ChatFormat("completion", COMPLETION, stops=("\nUser:",), why="--chat-template completion")
    if value in builtin_names():
        return ChatFormat("builtin", value, why=f"--chat-template {value}")
    path = Path(value).expanduser()
    if not path.is_file():
        names = ", ".join((COMPLETION, *builtin_names()))
        raise UsageError(
            f"--chat-template {value}: no such file and no built-in format of that name (built-in: {names})"
        )
    from chatphase.engine.text import read_utf8

    text = read_utf8(path, "chat template file")
    return ChatFormat("file", str(path), template=text, why=f"--chat-template {value}")


def choose_format(
    architecture: str,
    model_template: str | None,
    has_token: Callable[[str], bool],
    override: str | None = None,
    model_name: str = "the model",
) -> ChatFormat:
    """The format to prompt a model in (see the module docstring for the order).

    Args:
        architecture: ``general.architecture`` of the GGUF.
        model_template: its ``tokenizer.chat_template``, or ``None``.
        has_token: whether a text is one special token of the vocabulary (:meth:`chatphase.engine.prompting.vocab.Vocab.has_special`).
        override: the ``--chat-template`` setting.
        model_name: how messages name the model (its file name).

    Raises:
        UsageError: as :func:`resolve_override`.
    """
    forced = resolve_override(override)
    if forced is not None:
        return forced
    if model_template:
        return ChatFormat("model", model_name, template=model_template, why="the model's own template")
    names = builtin_names()
    usable = [(n, archs, toks) for n, archs, toks in FALLBACKS if n in names and all(map(has_token, toks))]
    for name, archs, tokens in usable:
        if architecture in archs:
            return ChatFormat(
                "builtin",
                name,
                why=f"the file has no chat template: {name} for {architecture} ({' '.join(tokens)} are tokens)",
            )
    for name in _ANY_ARCH_ORDER:
        for n, _archs, tokens in usable:
            if n == name:
                return ChatFormat(
                    "builtin", name, why=f"the file has no chat template: {name}, whose {' '.join(tokens)} are tokens"
                )
    return ChatFormat(
        "completion",
        COMPLETION,
        stops=("\nUser:",),
        why="the file has no chat template and its vocabulary no chat tokens: a plain completion prompt",
    )


# -- rendering -----------------------------------------------------------------------------------
class Render(Protocol):
    """``(messages, add_generation_prompt, enable_thinking) -> (text, add_special)``: the templated conversation
    and whether tokenising it should add BOS/EOS (only when the template did not)."""

    def __call__(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, enable_thinking: bool | None = None
    ) -> tuple[str, bool]: ...


def renderer(fmt: ChatFormat, bos_token: str = "", eos_token: str = "") -> Render:
    """A :data:`Render` function for ``fmt``; ``bos_token`` / ``eos_token`` are passed to Jinja templates.

    Raises:
        TemplateError: a Jinja template that cannot be parsed.
    """
    if fmt.template is not None:
        return _jinja_renderer(fmt, fmt.template, bos_token, eos_token)
    name = _COMPLETION_LAYOUT if fmt.kind == "completion" else fmt.name

    def render(
        messages: Sequence[Message], add_generation_prompt: bool = True, enable_thinking: bool | None = None
    ) -> tuple[str, bool]:
        return _apply_builtin(name, messages, add_generation_prompt), True

    return render


def _jinja_renderer(fmt: ChatFormat, template: str, bos_token: str, eos_token: str) -> Render:
    import jinja2
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    try:
        with_prompt, without = (
            Jinja2ChatFormatter(template, eos_token=eos_token, bos_token=bos_token, add_generation_prompt=flag)
            for flag in (True, False)
        )
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"{_whose(fmt)} cannot be read (line {exc.lineno}: {exc.message}); {OVERRIDE_HINT}"
        ) from None

    def render(
        messages: Sequence[Message], add_generation_prompt: bool = True, enable_thinking: bool | None = None
    ) -> tuple[str, bool]:
        formatter = with_prompt if add_generation_prompt else without
        # llama_cpp's message TypedDicts do not list reasoning_content, which the templates read
        data = cast("list[ChatCompletionRequestMessage]", [_message_dict(m) for m in messages])
        extra: dict[str, Any] = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        result = formatter(messages=data, **extra)
        return result.prompt, not result.added_special

    return render


def _message_dict(m: Message) -> dict[str, Any]:
    """A message as chat templates take it: an assistant message's thinking as ``reasoning_content``
    (Qwen3's, DeepSeek's and gpt-oss's templates render or strip it as they were trained to)."""
    d = {"role": m.role, "content": m.content}
    if m.reasoning:
        d["reasoning_content"] = m.reasoning
    return d


def _apply_builtin(name: str, messages: Sequence[Message], add_generation_prompt: bool) -> str:
    import llama_cpp as lc

    data = [(m.role.encode(), m.content.encode("utf-8")) for m in messages]
    chat = (lc.llama_chat_message * len(data))(*(lc.llama_chat_message(r, c) for r, c in data))
    size = sum(len(c) + 64 for _r, c in data) + 256
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = lc.llama_chat_apply_template(name.encode(), chat, len(data), add_generation_prompt, buf, size)
        if n < 0:
            raise TemplateError(f"llama.cpp does not know the chat format {name!r}; {OVERRIDE_HINT}")
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n + 1
    raise TemplateError(f"llama.cpp's {name} format gave no stable length; {OVERRIDE_HINT}")


def _whose(fmt: ChatFormat) -> str:
    return {"model": f"the chat template of {fmt.name}", "file": f"the chat template {fmt.name}"}.get(
        fmt.kind, f"the {fmt.name} chat format"
    )


def probe(fmt: ChatFormat, render: Render) -> ChatFormat:
    """Render :data:`PROBE`; returns ``fmt`` with its end-of-turn markers filled in.

    Raises:
        TemplateError: the template raises, is refused by Jinja's sandbox, or renders none of the
            conversation (one plain line naming the problem and ``--chat-template``).
    """
    from jinja2.exceptions import SecurityError

    try:
        text, _ = render(PROBE, True)
        reply_text, _ = render(PROBE[:2], False)
    except TemplateError:
        raise
    except SecurityError:
        raise TemplateError(
            f"{_whose(fmt)} was refused: it reaches outside Jinja's sandbox (unsafe code in the file); {OVERRIDE_HINT}"
        ) from None
    except Exception as exc:  # whatever a template raises (raise_exception gives ValueError) is one line
        raise TemplateError(f"{_whose(fmt)} fails on a plain conversation ({_detail(exc)}); {OVERRIDE_HINT}") from None
    if not text.strip():
        raise TemplateError(f"{_whose(fmt)} renders nothing; {OVERRIDE_HINT}")
    if PROBE[-1].content not in text:
        raise TemplateError(f"{_whose(fmt)} renders none of the conversation's messages; {OVERRIDE_HINT}")
    return replace(fmt, stops=fmt.stops or end_of_turn(reply_text, PROBE[1].content))


def refusal(fmt: ChatFormat, exc: Exception) -> str:
    """One line for a template that raised on a conversation of a turn (a system message it does not
    accept, roles that do not alternate): the template's own words and the override hint."""
    return f"{_whose(fmt)} refuses this conversation ({_detail(exc)}); {OVERRIDE_HINT}"


def _detail(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else "it raised an error"


def end_of_turn(rendered: str, reply: str) -> tuple[str, ...]:
    """The marker a template writes after an assistant ``reply`` in ``rendered`` (its first word after the
    reply, e.g. ``<end_of_turn>``); ``()`` when only whitespace follows."""
    at = rendered.rfind(reply)
    words = rendered[at + len(reply) :].split() if at >= 0 else []
    return (words[0],) if words else ()


def format_before_load(
    info: ModelInfo, override: str | None, log_path: str | os.PathLike[str] | None = None, with_vocab: bool = False
) -> ChatFormat | None:
    """The format the engine will choose for the GGUF ``info``, checked with :func:`probe` before any
    engine starts (the template is in the file's metadata).

    A file without a template gets a built-in format, which needs its vocabulary to choose (a
    vocabulary-only llama.cpp load, ~0.5 s, with ``with_vocab``; llama.cpp's log goes to ``log_path``);
    without ``with_vocab`` that case returns ``None`` (built-in formats always render).

    Raises:
        TemplateError: the template cannot be used (exit 2). UsageError: an unknown ``--chat-template``.
    """
    from chatphase.models.gguf_meta import read_chat_template

    forced = resolve_override(override)
    template = None if forced is not None else read_chat_template(info.path)
    if forced is None and template is None:
        if not with_vocab:
            return None
        from chatphase.engine.logfile import default_log_path
        from chatphase.engine.prompting.vocab import load_vocab

        with load_vocab(info.path, log_path or default_log_path()) as vocab:
            fmt = choose_format(info.architecture, None, vocab.has_special, None, info.name)
            return probe(fmt, renderer(fmt, vocab.bos_text, vocab.eos_text))
    fmt = forced or ChatFormat("model", info.name, template=template, why="the model's own template")
    return probe(fmt, renderer(fmt))
