"""EngineConfig: the engine's own settings (context, batching, threads, offload, KV cache types).

The engine takes this and nothing else of the user's settings (sampling and the system prompt travel
with each :class:`~chatphase.engine.events.TurnRequest`; theme and paths are not the engine's business).
The user's settings hold one (:attr:`chatphase.settings.schema.Settings.engine`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from chatphase.engine.memory_plan import AUTO_N_CTX_MIN, DEFAULT_MARGIN_MIB
from chatphase.engine.rpc_endpoints import UNAUTHENTICATED_FLAG, RpcEndpoint, parse_rpc
from chatphase.engine.slow_paths import quantised_v_without_flash_attn
from chatphase.engine.spec_modes import parse_spec
from chatphase.errors import UsageError
from chatphase.models.kv import KV_TYPE_BYTES
from chatphase.system.cpu_features import usable_cores

TRI_STATE = ("auto", "on", "off")
#: the prefix store: ``on`` restores n − 1 of a prompt's n tokens, ``exact`` only up to a batch start of the run
#: that saved them (:mod:`chatphase.engine.local.prefix_keeper`), ``off``.
PREFIX_CACHE_CHOICES = ("on", "exact", "off")
#: llama.cpp's limit on sequences in one context (``LLAMA_MAX_SEQ`` in src/llama-cparams.h).
MAX_SEQUENCES = 256


#: the most pinned threads allowed per logical CPU.
MAX_THREADS_PER_CPU = 2


def check_choices(settings: Any) -> None:
    """Check each field of the dataclass instance ``settings`` that lists its ``choices`` in its metadata.

    Raises:
        UsageError: naming the first field whose value is not one of them.
    """
    for f in fields(settings):
        choices, value = f.metadata.get("choices"), getattr(settings, f.name)
        if choices is not None and value not in choices:
            raise UsageError(f"{f.name} must be one of {', '.join(choices)} (got {value!r})")


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings, with chatphase's own defaults (llama-cpp-python's cost speed; see
    docs/engine-settings.md).

    ``n_ctx`` tokens of context; ``n_batch`` prompt tokens per prefill chunk (also the step of the live
    prefill progress); ``n_ubatch`` the physical batch; ``n_threads`` / ``n_threads_batch`` decode and
    prefill threads (``None`` = auto: chosen before each turn from the cores other processes leave free,
    and decode's changed between tokens when the engine is preempted, :mod:`chatphase.engine.threads.policy`; a
    number pins it, and a pinned ``n_threads`` pins prefill too unless ``n_threads_batch`` is given);
    ``n_gpu_layers`` (``None`` = auto: the most layers whose plan leaves each GPU device ``gpu_margin_mib`` free,
    from llama.cpp's own memory projection, :mod:`chatphase.engine.local.projection`; 0 on a build or machine
    without a GPU device; -1 = all); ``flash_attn`` (auto lets llama.cpp enable it where the backend supports it);
    ``type_k`` / ``type_v`` KV cache element types; ``extra_bufts`` llama.cpp's extra weight buffer types
    (AMX, repacking: auto turns them off on CPUs with AMX, whose batched prefill crashes, llama.cpp #20824);
    ``offload_kqv`` keep the KV cache (and attention) on the device of each offloaded layer (llama.cpp's
    ``offload_kqv``; off puts it in host memory, llama.cpp's ``--no-kv-offload``); ``op_offload`` let llama.cpp
    run a large batch's matrix products of the layers left on the CPU on the GPU (its ``op_offload``; off is its
    ``--no-op-offload``);
    ``chat_template`` the prompt format: ``None`` = the model's own template, else a format fitting its
    vocabulary; a llama.cpp built-in name or a Jinja file overrides (:mod:`chatphase.engine.prompting.chat_format`).
    ``spec`` the decode mode: ``off``, ``lookup``, ``auto`` or ``draft:MODEL`` (speculative decoding,
    :mod:`chatphase.engine.local.speculative`).
    ``n_seq_max`` sequences the context holds at once (llama.cpp's ``n_seq_max``; its KV cache is then split
    into that many streams of ``n_ctx / n_seq_max`` cells): set by the parallel-decode sweep, not a user
    setting (``metadata["setting"]`` is false, so no flag, config key or settings-screen field names it).
    ``kv_unified`` one KV cache shared by all sequences (llama.cpp's ``kv_unified``): set by the interference
    experiment (a per-sequence cache splits a mixed batch per sequence), not a user setting either.
    ``rpc`` llama.cpp rpc-servers (``HOST:PORT`` comma-separated, :mod:`chatphase.engine.rpc_endpoints`) whose
    devices the local engine registers before the load (:mod:`chatphase.engine.local.rpc`);
    ``rpc_unauthenticated_ok`` accepts servers outside loopback and private networks.

    Each user setting's flag, help and settings-screen label are its field's ``metadata``, read by
    :mod:`chatphase.settings.schema` (the one definition of a setting; the engine reads none of it).
    """

    n_ctx: int | None = field(
        default=4096,
        metadata={"flags": ("--n-ctx",), "metavar": "N|auto", "auto": True,
                  "help": "context size in tokens (default {default}); auto = the largest that fits the memory after "
                  "the layers, up to the model's training context, by llama.cpp's own memory projection",
                  "label": "n_ctx", "hint": "context size, tokens; auto = the largest that fits, up to the training context"},
    )  # fmt: skip
    n_batch: int = field(
        default=256,
        metadata={"flags": ("--n-batch",), "metavar": "N", "help": "prompt tokens per prefill chunk (default {default})",
                  "label": "n_batch", "hint": "prompt tokens per prefill chunk"},
    )  # fmt: skip
    n_ubatch: int = field(
        default=256,
        metadata={"flags": ("--n-ubatch",), "metavar": "N", "help": "physical batch size (default {default})"},
    )
    n_threads: int | None = field(
        default=None,
        metadata={"flags": ("--threads",), "metavar": "N|auto", "auto": True,
                  "help": "decode threads; auto (the default) chooses them each turn from the cores other processes "
                  "leave free, and fewer mid-reply when decode is preempted; a number pins them (and prefill's)",
                  "label": "Threads", "hint": "auto or empty = chosen each turn from the cores left free; a number pins it"},
    )  # fmt: skip
    n_threads_batch: int | None = field(
        default=None,
        metadata={"flags": ("--threads-batch",), "metavar": "N|auto", "auto": True,
                  "help": "prefill threads (default: as --threads)"},
    )  # fmt: skip
    n_gpu_layers: int | None = field(
        default=None,
        metadata={"flags": ("--n-gpu-layers", "-ngl"), "metavar": "N|auto", "auto": True,
                  "help": "layers to offload to the GPU: auto (the default) = the most that fit the GPU's free memory "
                  "at --n-ctx with --gpu-margin-mib left, by llama.cpp's own memory projection (0 without a GPU); "
                  "-1 = all; a number",
                  "label": "n_gpu_layers",
                  "hint": "auto or empty = the most that fit the free GPU memory with the margin; -1 = all"},
    )  # fmt: skip
    gpu_margin_mib: int = field(
        default=DEFAULT_MARGIN_MIB,
        metadata={"flags": ("--gpu-margin-mib",), "metavar": "MIB",
                  "help": "GPU memory --n-gpu-layers auto leaves free on each device, MiB (default {default}, "
                  "llama.cpp's --fit-target)",
                  "label": "GPU margin (MiB)", "hint": "memory n_gpu_layers auto leaves free on each GPU"},
    )  # fmt: skip
    flash_attn: str = field(
        default="auto",
        metadata={"flags": ("--flash-attn",), "choices": TRI_STATE,
                  "help": "flash attention: {choices} (default {default})",
                  "label": "Flash attention", "hint": "auto = llama.cpp enables it where the backend supports it"},
    )  # fmt: skip
    type_k: str = field(
        default="f16",
        metadata={"flags": ("--cache-type-k",), "choices": tuple(KV_TYPE_BYTES),
                  "help": "KV cache K type: {choices} (default {default})"},
    )  # fmt: skip
    type_v: str = field(
        default="f16",
        metadata={"flags": ("--cache-type-v",), "choices": tuple(KV_TYPE_BYTES),
                  "help": "KV cache V type (default {default})"},
    )  # fmt: skip
    extra_bufts: str = field(
        default="auto",
        metadata={"flags": ("--extra-bufts",), "choices": TRI_STATE,
                  "help": "llama.cpp extra weight buffer types (AMX, repacking); auto = off on AMX CPUs, whose batched "
                  "path crashes"},
    )  # fmt: skip
    offload_kqv: bool = field(
        default=True,
        metadata={"flags": ("--no-kv-offload",), "const": False,
                  "help": "keep the KV cache in host memory, not on the GPU (llama.cpp's offload_kqv off; slower)"},
    )  # fmt: skip
    op_offload: bool = field(
        default=True,
        metadata={"flags": ("--no-op-offload",), "const": False,
                  "help": "keep the prefill of the layers left on the CPU there; by default llama.cpp sends a large "
                          "batch's matrix products to the GPU, copying those layers' weights each batch (its "
                          "op_offload: a fast GPU gains, a weak one loses)"},
    )  # fmt: skip
    chat_template: str | None = field(
        default=None,
        metadata={"flags": ("--chat-template",), "metavar": "NAME|FILE",
                  "help": "prompt format: a llama.cpp built-in (chatml, gemma, llama3, phi3, mistral-v7, …), "
                  "completion (no chat markup) or a Jinja file; default: the model's own template, else a format "
                  "its vocabulary has",
                  "label": "Chat template",
                  "hint": "empty = the model's own, else one its vocabulary has; a llama.cpp name or a Jinja file"},
    )  # fmt: skip
    spec: str = field(
        default="off",
        metadata={"flags": ("--spec",), "metavar": "MODE",
                  "help": "decode mode: off (default), lookup (draft from the conversation's n-grams), draft:MODEL "
                  "(a small model of the same vocabulary drafts; default = the bundled one), auto (lookup where it "
                  "pays)",
                  "label": "Decode mode", "hint": "off, lookup, auto, or draft:MODEL (speculative decoding)"},
    )  # fmt: skip
    rpc: str | None = field(
        default=None,
        metadata={"flags": ("--rpc",), "metavar": "HOST:PORT,...",
                  "help": "llama.cpp rpc-servers whose devices take a share of the layers (a comma-separated list; "
                  "they are registered before the model loads): an RPC build of llama.cpp, on a trusted network "
                  "only (docs/rpc.md)",
                  "label": "RPC servers", "hint": "HOST:PORT,... of llama.cpp rpc-servers; empty = none"},
    )  # fmt: skip
    rpc_unauthenticated_ok: bool = field(
        default=False,
        metadata={"flags": (UNAUTHENTICATED_FLAG,), "const": True,
                  "help": "accept --rpc servers outside loopback and private networks: llama.cpp's RPC protocol has "
                  "no authentication or encryption",
                  "label": "RPC beyond private networks (unauthenticated)"},
    )  # fmt: skip
    n_seq_max: int = field(default=1, metadata={"setting": False})
    kv_unified: bool = field(default=False, metadata={"setting": False})
    prefix_cache: str = field(
        default="on",
        metadata={"flags": ("--prefix-cache",), "choices": PREFIX_CACHE_CHOICES,
                  "help": "keep prompt prefixes' KV cache on disk and restore it when that beats prefill: {choices} "
                  "(default {default}); exact keeps a kept or restored KV cache only up to where the run that made it "
                  "began a batch and evaluates the rest again (up to n_batch tokens more prefill), so that with flash "
                  "attention on the reply is the one that run gave",
                  "label": "Prefix store",
                  "hint": "on = saved to disk, restored when quicker than prefill; exact = the same reply, at up to "
                  "n_batch tokens more prefill"},
    )  # fmt: skip
    prefix_cache_mib: int | None = field(
        default=None,
        metadata={"flags": ("--prefix-cache-mib",), "metavar": "MIB",
                  "help": "the prefix store's size cap in MiB (default: 5%% of the free disk, at most 4 GiB)",
                  "label": "Prefix store cap (MiB)", "hint": "empty = 5% of the free disk, at most 4 GiB"},
    )  # fmt: skip

    def validate(self) -> EngineConfig:
        """Check ranges and choices; returns ``self``.

        Raises:
            UsageError: naming the first bad setting.
        """
        if self.n_ctx is not None and self.n_ctx < 16:
            raise UsageError(f"n_ctx must be at least 16 (got {self.n_ctx})")
        if self.n_batch < 1 or self.n_ubatch < 1:
            raise UsageError("n_batch and n_ubatch must be positive")
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"{name} must be positive (got {value})")
            # a little oversubscription is an experiment; far more threads than CPUs only wait on each other
            # (llama.cpp's threads spin at its barriers), which reads as a hang
            most = MAX_THREADS_PER_CPU * (os.cpu_count() or 1)
            if value is not None and value > most:
                raise UsageError(
                    f"{name} {value} is far more than this machine's {os.cpu_count()} CPUs (at most {most}, or auto)"
                )
        parse_spec(self.spec)
        if not 1 <= self.n_seq_max <= MAX_SEQUENCES:
            raise UsageError(f"n_seq_max must be 1 to {MAX_SEQUENCES} (got {self.n_seq_max})")
        if self.prefix_cache_mib is not None and self.prefix_cache_mib < 0:
            raise UsageError(f"prefix_cache_mib must be >= 0 (got {self.prefix_cache_mib})")
        if self.n_gpu_layers is not None and self.n_gpu_layers < -1:
            raise UsageError(f"n_gpu_layers must be auto, -1 (all) or >= 0 (got {self.n_gpu_layers})")
        if self.gpu_margin_mib < 0:
            raise UsageError(f"gpu_margin_mib must be >= 0 (got {self.gpu_margin_mib})")
        self.rpc_endpoints()
        check_choices(self)
        if refusal := quantised_v_without_flash_attn(self.type_v, self.flash_attn):
            raise UsageError(refusal)
        return self

    def rpc_endpoints(self) -> tuple[RpcEndpoint, ...]:
        """The ``rpc`` servers, parsed (``()``: none).

        Raises:
            UsageError: a bad list or an untrusted address (:func:`~chatphase.engine.rpc_endpoints.parse_rpc`).
        """
        return parse_rpc(self.rpc, self.rpc_unauthenticated_ok)

    @property
    def n_ctx_before_load(self) -> int:
        """The context a request is checked against before the load: ``n_ctx``, or for auto the least it chooses
        (:data:`~chatphase.engine.memory_plan.AUTO_N_CTX_MIN`; less only for a model trained on less, which the
        loaded model's own checks then catch)."""
        return self.n_ctx if self.n_ctx is not None else AUTO_N_CTX_MIN

    @property
    def n_ubatch_used(self) -> int:
        """The physical batch llama.cpp runs: ``n_ubatch``, at most ``n_batch`` (llama.cpp clamps it so when
        the context is made, ``llama_context``'s constructor); the memory estimate must use this one too."""
        return min(self.n_ubatch, self.n_batch)

    def threads_policy(self) -> str:
        """``auto``, ``fixed``, or which of decode and prefill is which (``decode auto, prefill fixed``)."""
        decode = "fixed" if self.n_threads is not None else "auto"
        prefill = "fixed" if (self.n_threads_batch or self.n_threads) is not None else "auto"
        return decode if decode == prefill else f"decode {decode}, prefill {prefill}"

    def resolved(self) -> dict[str, Any]:
        """The settings with automatic values resolved, as a plain dict; auto threads resolve to the
        usable cores (physical, within the affinity mask and cgroup quota), the count the context starts
        with (each turn then chooses its own)."""
        cores = usable_cores()
        return {
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch_used,
            "n_threads": self.n_threads or cores,
            "n_threads_batch": self.n_threads_batch or self.n_threads or cores,
            "threads_policy": self.threads_policy(),
            "n_gpu_layers": self.n_gpu_layers,
            "gpu_margin_mib": self.gpu_margin_mib,
            "flash_attn": self.flash_attn,
            "type_k": self.type_k,
            "type_v": self.type_v,
            "extra_bufts": self.extra_bufts,
            "offload_kqv": self.offload_kqv,
            "op_offload": self.op_offload,
            "n_seq_max": self.n_seq_max,
            "chat_template": self.chat_template,
            "spec": self.spec,
            "kv_unified": self.kv_unified,
            "rpc": self.rpc,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (unresolved: ``None`` means automatic)."""
        return asdict(self)
