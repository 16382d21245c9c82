"""Settings: one typed object for the engine, sampling and UI defaults, and the one definition of each setting.

Precedence (highest first): CLI flag > environment > config file > built-in default. The config file
and environment layers live in :mod:`chatphase.settings.file`; this module holds the typed values. The
engine's part is an :class:`~chatphase.engine.config.EngineConfig` (:attr:`Settings.engine`): the engine
never sees the rest.

**One definition per setting.** A setting is a dataclass field — of :class:`Settings`, of its
:class:`~chatphase.engine.config.EngineConfig` or of its :class:`~chatphase.engine.events.SamplingParams` —
and everything else is derived from that field (:data:`FIELDS`): its key (the config-file key, in
``[sampling]`` for the sampling ones; ``CHATPHASE_<KEY>`` in the environment), its type and default, and
from its ``metadata``:

- ``flags``, ``metavar``, ``help`` (``{default}``, ``{choices}`` and the names the flag's adder passes
  filled in), ``choices``; ``auto``: the
  flag takes ``auto`` for "chatphase chooses"; ``const``: a switch flag that stores this value
  (``--no-kv-offload``); ``cli``: the flag's group where it is not the part's (``model``, ``sampling``,
  ``server``, ``chat``). The flags are built by :mod:`chatphase.commands.options`.
- ``label`` and ``hint``: the field in the settings screen (:mod:`chatphase.ui.screens.settings`).
- ``reload``: what a change needs while a chat runs: ``model`` (a new model is loaded) or ``engine`` (a new
  engine; every engine setting needs one), else nothing (the next turn takes it).
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from chatphase.engine.config import TRI_STATE, EngineConfig, check_choices
from chatphase.engine.events import SamplingParams
from chatphase.engine.overflow import DEFAULT_OVERFLOW, OVERFLOW_POLICIES
from chatphase.errors import UsageError

ENV_PREFIX = "CHATPHASE_"
#: the config file's table of the sampling settings.
SAMPLING_TABLE = "sampling"


@dataclass
class Settings:
    """User-facing settings, with the defaults chatphase chooses by itself.

    ``engine``: the engine's settings (their meaning and defaults: :class:`~chatphase.engine.config.EngineConfig`),
    flat in the config file, the environment and the flags (``n_ctx = 2048``, ``CHATPHASE_N_CTX``, ``--n-ctx``).

    Remote: ``server`` (an OpenAI-compatible server URL; ``None`` = run the local model), ``api_key_env``
    (the environment variable holding its API key: the key itself is never a setting, so never saved),
    ``remote_model`` (the served model to ask for). See :mod:`chatphase.engine.remote.engine`.

    Thinking (reasoning models): ``thinking`` ``on``/``off`` sets the template's ``enable_thinking`` where
    the template takes it (``auto`` leaves the template's default); ``sampling.think_budget`` closes the
    thinking block after that many tokens; ``thinking_open`` keeps the TUI's thinking block expanded once the
    answer starts (else it collapses to one line).

    Keys: ``keys`` maps the TUI's action ids (``chat.stop``, ``chat.new``…; F1 lists them) to keys
    (``"ctrl+s"``, or several as ``"ctrl+s,f6"``), the config file's ``[keys]`` table.
    """

    model: str | None = field(
        default=None,
        metadata={"flags": ("--model", "-m"), "metavar": "SPEC", "cli": "model", "reload": "model",
                  "help": "GGUF path, file name in the models directory, or OWNER/NAME[:FILE|:QUANT] from the "
                  "Hugging Face cache; default: bundled SmolLM2-135M-Instruct",
                  "label": "Model", "hint": "GGUF path or file name in the models directory; empty = bundled default"},
    )  # fmt: skip
    models_dir: str | None = field(
        default=None,
        metadata={"flags": ("--models-dir",), "metavar": "DIR", "cli": "model", "reload": "model",
                  "help": "directory of the user's GGUF files", "label": "Models directory", "hint": "empty = default"},
    )  # fmt: skip
    engine: EngineConfig = field(default_factory=EngineConfig)
    system_prompt: str | None = field(
        default=None,
        metadata={"flags": ("--system",), "metavar": "TEXT", "cli": "sampling", "help": "system prompt",
                  "label": "System prompt", "hint": "empty = none"},
    )  # fmt: skip
    server: str | None = field(
        default=None,
        metadata={"flags": ("--server",), "metavar": "URL", "cli": "server", "reload": "engine",
                  "help": "OpenAI-compatible server, e.g. http://127.0.0.1:8080 (…/v1 optional); "
                  "the local engine options are then ignored"},
    )  # fmt: skip
    api_key_env: str | None = field(
        default=None,
        metadata={"flags": ("--api-key-env",), "metavar": "NAME", "cli": "server", "reload": "engine",
                  "help": "environment variable holding the server's API key (default: {default_api_key_env} if set)"},
    )  # fmt: skip
    remote_model: str | None = field(
        default=None,
        metadata={"flags": ("--remote-model",), "metavar": "NAME", "cli": "server", "reload": "engine",
                  "help": "model name to ask the server for (default: the first one it lists)"},
    )  # fmt: skip
    sampling: SamplingParams = field(default_factory=SamplingParams)
    thinking: str = field(
        default="auto",
        metadata={"flags": ("--thinking",), "choices": TRI_STATE, "cli": "sampling",
                  "help": "reasoning models: think before answering (on/off where the template can switch it; "
                  "default {default})",
                  "label": "Thinking", "hint": "reasoning models: on/off where the template can switch it; auto = its default"},
    )  # fmt: skip
    thinking_open: bool = field(default=False, metadata={"label": "Keep a reasoning model's thinking expanded"})
    theme: str = field(
        default="textual-dark",
        metadata={"flags": ("--theme",), "metavar": "NAME", "cli": "chat", "label": "Theme",
                  "help": "Textual theme, e.g. textual-dark, textual-light"},
    )  # fmt: skip
    keys: dict[str, str] = field(default_factory=dict)
    overflow: str = field(
        default=DEFAULT_OVERFLOW,
        metadata={"flags": ("--overflow",), "choices": OVERFLOW_POLICIES, "cli": "sampling",
                  "help": "when the conversation outgrows n_ctx: drop-oldest (re-prefill what is kept), shift "
                  "(llama.cpp's KV shift, no re-prefill), stop (refuse); default {default}",
                  "label": "Overflow", "hint": "when the conversation outgrows n_ctx"},
    )  # fmt: skip

    def validate(self) -> Settings:
        """Check ranges and choices; returns ``self``.

        Raises:
            UsageError: naming the first bad setting.
        """
        self.engine.validate()
        s = self.sampling
        if s.max_tokens < 1:
            raise UsageError(f"max_tokens must be positive (got {s.max_tokens})")
        if not 0 <= s.temperature < math.inf:  # ``not``: NaN fails every comparison
            raise UsageError(f"temperature must be a number >= 0 (got {s.temperature})")
        if not 0 < s.top_p <= 1:
            raise UsageError(f"top_p must be in (0, 1] (got {s.top_p})")
        if not 0 <= s.min_p <= 1:
            raise UsageError(f"min_p must be in [0, 1] (got {s.min_p})")
        if not 0 < s.repeat_penalty < math.inf:
            raise UsageError(f"repeat_penalty must be > 0 (got {s.repeat_penalty})")
        if s.think_budget is not None and s.think_budget < 0:
            raise UsageError(f"think_budget must be >= 0 (got {s.think_budget})")
        check_choices(self)
        return self

    def with_overrides(self, **overrides) -> Settings:
        """A copy with the given non-``None`` settings replaced, by their keys (engine and sampling ones
        flat: ``n_ctx=2048, temperature=0``).

        Raises:
            TypeError: an unknown key.
        """
        return with_values(self, {k: v for k, v in overrides.items() if v is not None})

    def to_dict(self) -> dict:
        """Plain JSON-ready dict: every setting by its key, the sampling ones in a ``sampling`` dict."""
        top = {f.key: f.get(self) for f in FIELDS if f.part != "sampling"}
        return top | {
            SAMPLING_TABLE: {f.key: f.get(self) for f in FIELDS if f.part == "sampling"},
            "keys": dict(self.keys),
        }


@dataclass(frozen=True)
class SettingField:
    """One setting as the config file, the environment, the flags and the settings screen know it.

    ``part``: ``None`` for a field of :class:`Settings`, else the attribute holding its dataclass
    (``engine``, ``sampling``); ``type``: ``int``, ``float``, ``str`` or ``bool``; ``optional``: ``None``
    is a value (automatic, none); ``metadata``: the field's (see this module's docstring).
    """

    key: str
    part: str | None
    type: type
    optional: bool
    default: Any
    metadata: Mapping[str, Any]

    @property
    def env(self) -> str:
        """The environment variable: ``CHATPHASE_<KEY>``."""
        return ENV_PREFIX + self.key.upper()

    @property
    def table(self) -> str | None:
        """The config-file table it belongs in (``None``: the top level)."""
        return SAMPLING_TABLE if self.part == "sampling" else None

    @property
    def reload(self) -> str | None:
        """``model``, ``engine`` or ``None``: what a change needs while a chat runs."""
        return "engine" if self.part == "engine" else self.metadata.get("reload")

    @property
    def cli_group(self) -> str | None:
        """The group of the flag (``model``, ``sampling``, ``server``, ``chat``); ``None``: no flag."""
        if not self.metadata.get("flags"):
            return None
        return self.metadata.get("cli") or {"engine": "model", "sampling": "sampling"}[self.part or ""]

    def get(self, settings: Settings) -> Any:
        """This setting's value in ``settings``."""
        return getattr(getattr(settings, self.part) if self.part else settings, self.key)


#: the parts of :class:`Settings` that hold settings of their own, and its table of keys (not settings).
_PARTS: dict[str, type] = {"engine": EngineConfig, "sampling": SamplingParams}
_WHOLE = (*_PARTS, "keys")


def _fields_of(cls: type, part: str | None) -> dict[str, SettingField]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        if not f.metadata.get("setting", True) or (part is None and f.name in _WHOLE):
            continue
        hint, optional = hints[f.name], False
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            hint, optional = next(a for a in typing.get_args(hint) if a is not type(None)), True
        out[f.name] = SettingField(f.name, part, hint, optional, f.default, f.metadata)
    return out


def _all_fields() -> tuple[SettingField, ...]:
    """Every setting in declaration order, the engine's and the sampling ones where their part is."""
    own = _fields_of(Settings, None)
    out: list[SettingField] = []
    for f in fields(Settings):
        if f.name in _PARTS:
            out += _fields_of(_PARTS[f.name], f.name).values()
        elif f.name in own:
            out.append(own[f.name])
    return tuple(out)


#: every setting, in declaration order (the order of the config file, the flags and the settings screen).
FIELDS: tuple[SettingField, ...] = _all_fields()
#: every setting by its key.
BY_KEY: dict[str, SettingField] = {f.key: f for f in FIELDS}
#: every setting key, in declaration order.
SETTING_KEYS: tuple[str, ...] = tuple(BY_KEY)


def with_values(settings: Settings, values: Mapping[str, Any]) -> Settings:
    """A copy of ``settings`` with ``values`` (by key, ``None`` included) set; ``engine``, ``sampling`` and
    ``keys`` replace those parts whole.

    Raises:
        TypeError: an unknown key.
    """
    own: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        if key not in _WHOLE and key not in BY_KEY:
            raise TypeError(f"unknown setting {key!r}")
        part = None if key in _WHOLE else BY_KEY[key].part
        (own if part is None else parts.setdefault(part, {}))[key] = value
    out = replace(settings, **own)
    for part, changes in parts.items():
        out = replace(out, **{part: replace(getattr(out, part), **changes)})
    return out


def reload_keys(old: Settings, new: Settings) -> tuple[str, ...]:
    """The changed settings that need a new model or engine (their :attr:`SettingField.reload`), in
    :data:`FIELDS` order."""
    return tuple(f.key for f in FIELDS if f.reload and f.get(old) != f.get(new))


def model_change(keys: typing.Iterable[str]) -> bool:
    """Whether changing ``keys`` needs a new model (not just a new engine on the same one)."""
    return any(BY_KEY[k].reload == "model" for k in keys)
