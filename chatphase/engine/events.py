"""Typed events an engine emits, and the request it takes (plain, picklable dataclasses).

One turn yields, in order: ``PrefillStarted``, zero or more ``PrefillProgress``, ``FirstToken``, zero or
more ``TokensDecoded`` (with one ``ThinkingEnded`` among them when a reasoning model's thinking block
closes), then exactly one ``TurnFinished`` — or ``EngineFailed`` at any point. Generated text comes split:
``text`` is the answer's, ``thinking`` the thinking block's (markers removed; :mod:`chatphase.engine.prompting.thinking`). Loading a
model yields ``ModelLoaded`` or ``EngineFailed``. The same events drive the TUI, ``ask`` and ``bench``.
All ``*_ns`` timestamps are ``time.perf_counter_ns()`` values taken inside the engine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.overflow import DEFAULT_OVERFLOW
from chatphase.engine.tokens import TurnTokens
from chatphase.models.gguf_meta import ModelInfo

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class Message:
    """One chat message; ``reasoning`` is an assistant message's thinking (given to the chat template as
    ``reasoning_content``: templates that take it render it, the others leave it out)."""

    role: Role
    content: str
    reasoning: str = ""


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one turn. ``temperature <= 0`` means greedy; ``seed=None`` a random seed;
    ``think_budget``: thinking tokens after which the engine closes a reasoning model's thinking block."""

    # metadata: each setting's flag and settings-screen label (chatphase.settings.schema; the engine reads none)
    max_tokens: int = field(
        default=512,
        metadata={"flags": ("--max-tokens",), "metavar": "N", "help": "most tokens per reply (default {default})",
                  "label": "Max tokens", "hint": "per reply"},
    )  # fmt: skip
    temperature: float = field(
        default=0.7,
        metadata={"flags": ("--temperature", "--temp"), "metavar": "T", "help": "0 = greedy (default {default})",
                  "label": "Temperature", "hint": "0 = greedy"},
    )  # fmt: skip
    top_p: float = field(
        default=0.95, metadata={"flags": ("--top-p",), "metavar": "P", "label": "top_p", "hint": "(0, 1]"}
    )
    top_k: int = field(default=40, metadata={"flags": ("--top-k",), "metavar": "K", "label": "top_k", "hint": "tokens"})
    min_p: float = field(default=0.05, metadata={"flags": ("--min-p",), "metavar": "P"})
    repeat_penalty: float = 1.0
    seed: int | None = field(
        default=None, metadata={"flags": ("--seed",), "metavar": "S", "label": "Seed", "hint": "empty = random"}
    )
    think_budget: int | None = field(
        default=None,
        metadata={"flags": ("--think-budget",), "metavar": "N",
                  "help": "reasoning models: close the thinking block after N thinking tokens (default: no budget)",
                  "label": "Think budget",
                  "hint": "reasoning models: thinking tokens before the block is closed; empty = none"},
    )  # fmt: skip


def overflow_from(first_message: int, left_out_before: int | None) -> int:
    """The oldest messages a request counts as left out already: ``left_out_before`` where the fit starts earlier
    (at ``first_message``), else ``first_message``."""
    return first_message if left_out_before is None else max(first_message, left_out_before)


@dataclass(frozen=True)
class TurnRequest:
    """Run one turn: template ``messages`` (the whole conversation, newest last) and generate a reply.

    For experiments (``bench``): ``prompt_token_ids`` replaces the templated conversation with exactly
    these tokens; ``reset_cache`` clears the KV cache first (a cold prefill); ``ignore_eos`` keeps
    decoding until ``max_tokens`` (or the context is full). ``enable_thinking``: the template variable of
    models that can think or not (``None`` leaves the template's default). ``events_every_ms``: how often
    the consumer wants token events (a process host batches them to that; ``None``: its own default) —
    a screen redrawn 5 times a second gains nothing from 40 deliveries, and each costs it a wake-up.
    ``prefix_store``: the turn may restore its prompt's prefix from the engine's prefix store and leave its
    cache to be saved there (chats and ``ask``; never a bench sweep, which measures cold prefill).
    """

    turn_id: int
    messages: tuple[Message, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_token_ids: tuple[int, ...] | None = None
    reset_cache: bool = False
    ignore_eos: bool = False
    enable_thinking: bool | None = None
    events_every_ms: float | None = None
    # context overflow (chatphase.engine.overflow): the policy, the oldest non-system messages already left out
    # (the prompt starts after them), and what the controller knows changed since the last turn (a miss's reason)
    overflow: str = DEFAULT_OVERFLOW
    first_message: int = 0
    history_change: str | None = None
    prefix_store: bool = False
    # the oldest messages the conversation already counts as left out, where the fit starts before them (a fresh
    # engine fits from message 0 again): only what the fit leaves out beyond them is an overflow (None: first_message)
    left_out_before: int | None = None

    @property
    def overflow_from(self) -> int:
        """The messages already left out: the fit's dropping past them is this turn's overflow."""
        return overflow_from(self.first_message, self.left_out_before)


@dataclass(frozen=True)
class DeviceInfo:
    """A device llama.cpp's ggml sees: ``name`` (``Vulkan0``, ``CUDA0``, ``CPU``), ``description``
    (``llvmpipe (LLVM 15.0.6, 256 bits)``), ``type`` (``cpu``, ``gpu``, ``igpu``, ``accel``), memory
    ``free_bytes`` / ``total_bytes`` as ``ggml_backend_dev_memory`` reports it when read (free = total on a
    device that counts no usage: ggml's CPU device, a Vulkan driver without ``VK_EXT_memory_budget``); ``host``
    the ``HOST:PORT`` of the rpc-server a remote device is on (llama.cpp's RPC backend; ``None``: this machine);
    ``buffer_type`` its default buffer type's name where it is not the device's (an RPC device ``RPC1`` allocates
    in ``RPC0[HOST:PORT]``, the server's device 0; ``None``: the device's own name, as ggml's other backends)."""

    name: str
    description: str
    type: str
    free_bytes: int
    total_bytes: int
    host: str | None = None
    buffer_type: str | None = None

    @property
    def buffer_name(self) -> str:
        """The name llama.cpp's buffer lines give this device's memory (``Vulkan0``, ``RPC0[10.0.0.2:50052]``)."""
        return self.buffer_type or self.name


#: device types llama.cpp offloads layers to (an integrated GPU's memory is host memory it maps, still its own).
OFFLOAD_TYPES = frozenset({"gpu", "igpu"})


@dataclass(frozen=True)
class BufferSize:
    """One buffer llama.cpp allocated, from its own log line (``Vulkan0 model buffer size = 98.12 MiB``):
    ``kind`` (``model``, ``KV``, ``compute``, ``output``, ``RS``), llama.cpp's ``buffer`` type name, ``bytes``
    (the printed MiB × 2**20, rounded: 2 decimals of MiB, so within 5 KiB), ``on_device``: the buffer type is
    an offload device's own memory (its name is a GPU device's name), not host memory (``CPU``,
    ``CPU_Mapped``, pinned ``Vulkan_Host`` / ``CUDA_Host``)."""

    kind: str
    buffer: str
    bytes: int
    on_device: bool


#: buffer kinds as the memory figures name them (``memory_by_place``).
MEMORY_KINDS = {"model": "weights", "KV": "kv_cache", "compute": "compute", "output": "output", "RS": "recurrent_state"}


def memory_by_place(buffers: tuple[BufferSize, ...]) -> dict[str, dict[str, int]]:
    """Bytes per kind on the device and on the host: ``{"device": {"weights": …, "kv_cache": …,
    "compute": …}, "host": {…}}`` (kinds with no buffer there are left out), summed over buffers."""
    out: dict[str, dict[str, int]] = {"device": {}, "host": {}}
    for b in buffers:
        place = out["device" if b.on_device else "host"]
        kind = MEMORY_KINDS.get(b.kind, b.kind)
        place[kind] = place.get(kind, 0) + b.bytes
    return out


@dataclass(frozen=True)
class LayerPlacement:
    """Where llama.cpp put a model's layers on one device, from its own lines at the load (``load_tensors: layer
    12 assigned to device Vulkan0``): ``device`` ggml's device name (``CPU`` for the host), ``layers`` the
    repeating layers there, ``output_layer`` the output layer too."""

    device: str
    layers: tuple[int, ...]
    output_layer: bool = False


#: the :class:`LoadedSettings` fields a remote server's engine fills (the others stay ``None``).
REMOTE_SETTING_KEYS = ("backend", "server", "server_kind", "remote_model", "n_ctx", "total_slots")


@dataclass(frozen=True)
class LoadedSettings:
    """The engine settings a loaded model runs with, automatic values resolved.

    The local engine fills the :class:`~chatphase.engine.config.EngineConfig` fields as resolved (threads
    counted, ``n_ubatch`` clamped to ``n_batch``, ``n_ctx`` as llama.cpp sized it, ``n_gpu_layers`` the count
    loaded, -1 for all), plus what the load found: ``n_gpu_layers_why`` (how ``auto`` chose the count, or why a
    count given is short of the margin: :mod:`chatphase.engine.local.projection`), ``n_ctx_why`` (how ``n_ctx
    auto`` chose the context; ``None`` for a context given), ``use_extra_bufts``,
    ``gpu_offload_supported`` (a device to offload layers to was there at the load: a GPU's or an rpc-server's),
    ``amx_detected``, ``flash_attn_enabled`` (how ``flash_attn``
    resolved: ``on`` / ``off`` as set, ``auto`` as llama.cpp's log says it chose; ``None``: not said). A remote
    server's engine
    (``backend="remote"``) fills :data:`REMOTE_SETTING_KEYS`: the ``server`` address, ``server_kind``
    (``llama-server`` or ``OpenAI-compatible server``), the ``remote_model`` asked for, and ``n_ctx`` /
    ``total_slots`` where the server says (``None``: not reported); the rest is ``None``, unknown. ``rpc``: the
    rpc-servers the local engine registered (``HOST:PORT`` comma-separated; ``None``: none).
    """

    backend: Literal["llama.cpp", "remote"] = "llama.cpp"
    n_ctx: int | None = None
    n_ctx_why: str | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_threads: int | None = None
    n_threads_batch: int | None = None
    threads_policy: str | None = None
    n_gpu_layers: int | None = None
    n_gpu_layers_why: str | None = None
    gpu_margin_mib: int | None = None
    flash_attn: str | None = None
    type_k: str | None = None
    type_v: str | None = None
    extra_bufts: str | None = None
    offload_kqv: bool | None = None
    op_offload: bool | None = None
    n_seq_max: int | None = None
    chat_template: str | None = None
    spec: str | None = None
    use_extra_bufts: bool | None = None
    gpu_offload_supported: bool = False
    amx_detected: bool | None = None
    server: str | None = None
    server_kind: str | None = None
    remote_model: str | None = None
    total_slots: int | None = None
    kv_unified: bool | None = None
    flash_attn_enabled: bool | None = None
    rpc: str | None = None

    @property
    def remote(self) -> bool:
        """The model is served by a remote server (most figures unknown)."""
        return self.backend == "remote"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready, as bench results store it: a remote engine's :data:`REMOTE_SETTING_KEYS`, else the
        local engine's fields (no ``backend`` key, nor the remote ones)."""
        values = asdict(self)
        if self.remote:
            return {k: values[k] for k in REMOTE_SETTING_KEYS}
        return {k: v for k, v in values.items() if k not in REMOTE_SETTING_KEYS or k == "n_ctx"}


@dataclass(frozen=True)
class LoadedModel:
    """What the engine reports once a model is loaded.

    ``settings``: the resolved engine settings (:class:`LoadedSettings`); ``kv_bytes_per_token`` /
    ``kv_capacity_bytes`` the KV cache's size per token and at ``n_ctx`` (``None`` from a remote server).
    ``layers_offloaded`` / ``layers_total`` come from llama.cpp's own log (``offloaded X/Y layers to GPU``);
    ``llama_kv_cache_bytes`` is the size llama.cpp printed for the cache, if seen. ``thinking_format``:
    the name of the model's thinking markers (:data:`chatphase.engine.prompting.thinking.FORMATS`), ``None`` for a
    model that does not think; ``thinking_switch``: its template takes ``enable_thinking``. ``chat_format`` says
    how prompts are written (:attr:`chatphase.engine.prompting.chat_format.ChatFormat.label`, e.g. ``gemma
    (llama.cpp built-in)``; ``""`` where the engine does not template, e.g. a remote server). ``spec_mode``:
    the decode mode in use (``off``, ``lookup``, ``auto``, ``draft``; ``off`` where the model cannot take one).
    ``backends`` the ggml backends of the build (``("Vulkan", "CPU")``); ``devices`` the devices it sees,
    memory read after the context was created; ``buffers`` what llama.cpp allocated where (its log lines);
    ``slow_paths`` one line per silent slow path of this load (:mod:`chatphase.engine.slow_paths`); ``placement``
    where each layer lives, per device (:class:`LayerPlacement`, in the order llama.cpp named them; empty where
    the engine does not say).
    """

    info: ModelInfo
    settings: LoadedSettings
    load_ms: float
    kv_bytes_per_token: int | None
    kv_capacity_bytes: int | None
    layers_offloaded: int | None = None
    layers_total: int | None = None
    llama_kv_cache_bytes: int | None = None
    system_info: str = ""
    notes: tuple[str, ...] = ()
    log_path: str = ""
    pid: int = 0
    thinking_format: str | None = None
    thinking_switch: bool = False
    chat_format: str = ""
    spec_mode: str = "off"
    backends: tuple[str, ...] = ()
    devices: tuple[DeviceInfo, ...] = ()
    buffers: tuple[BufferSize, ...] = ()
    slow_paths: tuple[str, ...] = ()
    kv_shift_refusal: str | None = None  # why the ``shift`` overflow policy cannot work here (None: it can)
    placement: tuple[LayerPlacement, ...] = ()


@dataclass(frozen=True)
class ModelLoaded:
    model: LoadedModel


@dataclass(frozen=True)
class PrefillStarted:
    """Templating and tokenisation are done; ``prefill_tokens`` of ``prompt_tokens`` will be evaluated.

    ``dropped_messages`` older messages were left out so the prompt fits ``n_ctx`` (system prompt kept).
    The token counts are ``None`` from a remote server (it reports them only when the turn is over).
    ``n_threads_prefill`` / ``n_threads_decode`` / ``threads_reason``: the threads the turn starts with and
    why (:mod:`chatphase.engine.threads.policy`; ``None`` from an engine without a thread policy).
    Prefix store (:mod:`chatphase.engine.local.prefix_keeper`): ``restored_tokens`` of the ``cached_tokens``
    were read from disk in ``restore_ms`` (``restore_bytes`` of state) before this event, where a prefill of
    them was predicted to take ``restore_prefill_ms``; ``restore_note`` one line when the store was looked at
    and not used (the rule chose prefill, or a file was refused), or cannot save (said once). ``None``: no restore. A remote server's slot
    restore (:mod:`chatphase.engine.remote.slots`) is done before this event too, and its line (restored, or not
    and why) is its ``restore_note``; its figures come with the turn's metrics.
    """

    turn_id: int
    prompt_tokens: int | None
    cached_tokens: int | None
    prefill_tokens: int | None
    dropped_messages: int
    t_ns: int
    n_threads_prefill: int | None = None
    n_threads_decode: int | None = None
    threads_reason: str | None = None
    # an overflow this turn (TurnMetrics' overflow_* fields) and why the cache was missed, known before the prefill
    overflow: str | None = None
    overflow_dropped_messages: int = 0
    overflow_dropped_tokens: int | None = None
    overflow_reprefill_tokens: int | None = None
    cache_miss_reason: str | None = None
    restored_tokens: int | None = None
    restore_ms: float | None = None
    restore_bytes: int | None = None
    restore_prefill_ms: float | None = None
    restore_note: str | None = None


@dataclass(frozen=True)
class PrefillProgress:
    """``done_tokens`` of ``total_tokens`` (the prefill tokens) evaluated after ``elapsed_ms``."""

    turn_id: int
    done_tokens: int
    total_tokens: int
    elapsed_ms: float


@dataclass(frozen=True)
class FirstToken:
    """The first generated token (``text`` may be empty while a multi-byte character is incomplete, or
    while the token is thinking: then ``thinking`` holds its text)."""

    turn_id: int
    text: str
    ttft_ms: float
    t_ns: int
    thinking: str = ""


@dataclass(frozen=True)
class SpecLive:
    """Speculative decoding's running figures in a turn (the ``spec_*`` fields of
    :class:`~chatphase.engine.metrics.TurnMetrics` so far): ``mode`` (``lookup``, ``auto``, ``draft``),
    target ``steps``, draft tokens ``drafted`` and ``accepted``, generated ``tokens`` (after the first)
    and ``speedup`` against this turn's plain steps (``None`` until one was measured)."""

    mode: str
    steps: int
    drafted: int
    accepted: int
    tokens: int
    speedup: float | None = None

    @property
    def tokens_per_step(self) -> float | None:
        return self.tokens / self.steps if self.steps else None

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


@dataclass(frozen=True)
class TokensDecoded:
    """``n_tokens`` more generated tokens whose answer text is ``text`` and thinking text ``thinking``;
    ``decode_tokens`` and ``thinking_tokens`` counted so far; ``spec`` speculative decoding's figures so far
    (``None`` in plain decode); ``drafted_spans``: the parts of ``text`` that came from accepted draft tokens
    (for a view that tints them), as ``(start, end)`` offsets into ``text``.

    The engine emits one per token; :class:`~chatphase.engine.process.host.EngineHost` coalesces them in time
    before they cross the process boundary.
    """

    turn_id: int
    text: str
    n_tokens: int
    decode_tokens: int
    t_ns: int
    thinking: str = ""
    thinking_tokens: int = 0
    spec: SpecLive | None = None
    drafted_spans: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class ThinkingEnded:
    """The thinking block closed after ``thinking_tokens`` tokens and ``thinking_ms`` (from the first
    generated token); ``forced``: the engine closed it (the thinking budget was spent)."""

    turn_id: int
    thinking_tokens: int
    thinking_ms: float
    t_ns: int
    forced: bool = False


@dataclass(frozen=True)
class TurnFinished:
    """The turn is over; ``reply`` is the full answer text (partial when cancelled), ``thinking`` the
    thinking block's.

    ``server_timings``: a remote server's own figures for the turn (llama-server's ``timings``:
    ``prompt_n, prompt_ms, predicted_n, predicted_ms, cache_n``… plus ``network_queue_ms``), ``None``
    for the local engine and for servers that send none (see :mod:`chatphase.engine.remote.wire`).
    ``tokens``: the prompt's and the reply's tokens (:mod:`chatphase.engine.tokens`; the local engine's alone,
    ``None`` for a remote server).
    """

    turn_id: int
    reply: str
    metrics: TurnMetrics
    server_timings: dict[str, Any] | None = None
    thinking: str = ""
    tokens: TurnTokens | None = None


@dataclass(frozen=True)
class EngineFailed:
    """Something went wrong. ``fatal`` means the engine is gone and must be restarted."""

    message: str
    turn_id: int | None = None
    fatal: bool = False


Event = (
    ModelLoaded
    | PrefillStarted
    | PrefillProgress
    | FirstToken
    | TokensDecoded
    | ThinkingEnded
    | TurnFinished
    | EngineFailed
)


@dataclass(frozen=True)
class CountRequest:
    """Count what sending ``messages`` (the whole conversation, the draft message last) would cost, without
    running it: the engine templates and tokenises them as :meth:`run_turn` would (``max_tokens`` keeps
    room for the reply), and tokenises each of ``texts`` alone (the attached files). ``first_message`` and
    ``overflow`` as in :class:`TurnRequest`: the messages already left out, and the policy that fits the rest."""

    messages: tuple[Message, ...]
    max_tokens: int = 512
    enable_thinking: bool | None = None
    texts: tuple[str, ...] = ()
    first_message: int = 0
    overflow: str = DEFAULT_OVERFLOW
    left_out_before: int | None = None  # as in TurnRequest

    @property
    def overflow_from(self) -> int:
        """The messages already left out: what the count newly leaves out is past them."""
        return overflow_from(self.first_message, self.left_out_before)


@dataclass(frozen=True)
class PromptCount:
    """The answer to a :class:`CountRequest`, in tokens of the model's own tokenizer.

    ``prompt_tokens`` the templated prompt (``None`` when it does not fit: ``too_long`` says why, with the
    numbers), ``cached_tokens`` of it the KV cache holds now (reused), ``kv_cache_tokens`` what the cache
    holds now, ``dropped_messages`` the oldest messages sending would newly leave out to fit (beyond the
    request's ``overflow_from``, as the turn would: down to its low-water mark), ``text_tokens`` one count per text,
    ``restore_tokens`` of it the prefix store would restore from disk beyond the cached ones (the rule said
    restoring beats prefill) in about ``restore_ms``.
    """

    prompt_tokens: int | None
    cached_tokens: int
    kv_cache_tokens: int
    n_ctx: int
    dropped_messages: int = 0
    text_tokens: tuple[int, ...] = ()
    too_long: str | None = None
    restore_tokens: int = 0
    restore_ms: float | None = None

    @property
    def new_tokens(self) -> int | None:
        """Tokens the prefill would evaluate (``None`` when it does not fit)."""
        return None if self.prompt_tokens is None else self.prompt_tokens - self.cached_tokens - self.restore_tokens
