"""Settings: one typed object for the engine, sampling and UI defaults.

Precedence (highest first): CLI flag > environment > config file > built-in default. The config file
and environment layers live in :mod:`chatphase.settings.file`; this module holds the typed values. The
engine's part is an :class:`~chatphase.engine.config.EngineConfig` (:meth:`Settings.engine_config`): the
engine never sees the rest.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from chatphase.engine.config import TRI_STATE, EngineConfig
from chatphase.engine.events import SamplingParams
from chatphase.errors import UsageError

#: the fields of :class:`Settings` that make up its :class:`EngineConfig` (those marked ``setting: False``,
#: such as ``n_seq_max``, are chosen by the code that needs them, not by the user).
ENGINE_FIELDS = tuple(f.name for f in fields(EngineConfig) if f.metadata.get("setting", True))


@dataclass
class Settings:
    """User-facing settings, with the defaults chatphase chooses by itself.

    Engine: ``n_ctx`` … ``chat_template``, flat here so that flags, environment and the config file name
    them directly; their meaning and defaults are :class:`~chatphase.engine.config.EngineConfig`'s.

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

    model: str | None = None
    models_dir: str | None = None
    # the engine's settings, with its defaults (one source: EngineConfig)
    n_ctx: int = EngineConfig.n_ctx
    n_batch: int = EngineConfig.n_batch
    n_ubatch: int = EngineConfig.n_ubatch
    n_threads: int | None = EngineConfig.n_threads
    n_threads_batch: int | None = EngineConfig.n_threads_batch
    n_gpu_layers: int | None = EngineConfig.n_gpu_layers
    flash_attn: str = EngineConfig.flash_attn
    type_k: str = EngineConfig.type_k
    type_v: str = EngineConfig.type_v
    extra_bufts: str = EngineConfig.extra_bufts
    offload_kqv: bool = EngineConfig.offload_kqv
    chat_template: str | None = EngineConfig.chat_template
    spec: str = EngineConfig.spec
    system_prompt: str | None = None
    server: str | None = None
    api_key_env: str | None = None
    remote_model: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    theme: str = "textual-dark"
    thinking: str = "auto"
    thinking_open: bool = False
    keys: dict[str, str] = field(default_factory=dict)

    def validate(self) -> Settings:
        """Check ranges and choices; returns ``self``.

        Raises:
            UsageError: naming the first bad setting.
        """
        self.engine_config().validate()
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
        if self.thinking not in TRI_STATE:
            raise UsageError(f"thinking must be one of {', '.join(TRI_STATE)} (got {self.thinking!r})")
        return self

    def with_overrides(self, **overrides) -> Settings:
        """A copy with the given non-``None`` fields replaced; sampling fields are accepted by name too."""
        sampling_names = {f.name for f in fields(SamplingParams)}
        top = {k: v for k, v in overrides.items() if v is not None and k not in sampling_names}
        samp = {k: v for k, v in overrides.items() if v is not None and k in sampling_names}
        out = replace(self, **top)
        if samp:
            out = replace(out, sampling=replace(out.sampling, **samp))
        return out

    def engine_config(self) -> EngineConfig:
        """The engine's part of these settings."""
        return EngineConfig(**{name: getattr(self, name) for name in ENGINE_FIELDS})

    def to_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return asdict(self)
