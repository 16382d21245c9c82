"""Command-line options shared by the commands that run a model (chat, ask, bench, info)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from chatphase.engine.config import TRI_STATE
from chatphase.models.kv import KV_TYPE_BYTES
from chatphase.settings.schema import Settings

#: the value of an optional count flag that sets it back to automatic, over a config file or environment.
AUTO = "auto"


def count_or_auto(text: str) -> int | str:
    """An integer, or :data:`AUTO` (any case) for "chatphase chooses" (``--threads auto``).

    Raises:
        argparse.ArgumentTypeError: for anything else (argparse prints it as a usage error, exit 2).
    """
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or {AUTO}, got {text!r}") from None


def add_model_options(p: argparse.ArgumentParser, lists: bool = False) -> None:
    """``--model`` and the engine settings (all default to ``None`` = take the configured value).

    ``lists``: ``--model``, ``--n-ubatch``, ``--threads``, ``--flash-attn`` and ``--cache-type-k/-v`` take
    comma lists, kept as text for the caller to split (``bench``'s lever grid, :mod:`chatphase.bench.grid`).
    """
    g = p.add_argument_group("model and engine")
    many = " (a comma list: every combination is measured)" if lists else ""
    g.add_argument(
        "--model",
        "-m",
        metavar="SPEC",
        help="GGUF path, file name in the models directory, or OWNER/NAME[:FILE|:QUANT] from the Hugging Face "
        "cache; default: bundled SmolLM2-135M-Instruct" + many,
    )
    g.add_argument("--pull", action="store_true", help="download an OWNER/NAME[:QUANT] model that is not local yet")
    g.add_argument("--models-dir", metavar="DIR", help="directory of the user's GGUF files")
    g.add_argument("--n-ctx", type=int, metavar="N", help="context size in tokens (default 4096)")
    g.add_argument("--n-batch", type=int, metavar="N", help="prompt tokens per prefill chunk (default 256)")
    g.add_argument(
        "--n-ubatch", type=str if lists else int, metavar="N", help="physical batch size (default 256)" + many
    )
    g.add_argument(
        "--threads",
        dest="n_threads",
        type=str if lists else count_or_auto,
        metavar="N|auto",
        help="decode threads; auto (the default) chooses them each turn from the cores other processes leave "
        "free, and fewer mid-reply when decode is preempted; a number pins them (and prefill's)" + many,
    )
    g.add_argument(
        "--threads-batch",
        dest="n_threads_batch",
        type=count_or_auto,
        metavar="N|auto",
        help="prefill threads (default: as --threads)",
    )
    g.add_argument(
        "--n-gpu-layers",
        "-ngl",
        type=int,
        metavar="N",
        help="layers to offload to the GPU; -1 = all (default: all when the build supports it)",
    )
    kv_types = list(KV_TYPE_BYTES)
    g.add_argument(
        "--flash-attn",
        choices=None if lists else TRI_STATE,
        help=f"flash attention: {'|'.join(TRI_STATE)} (default auto){many}",
    )
    g.add_argument(
        "--cache-type-k",
        dest="type_k",
        choices=None if lists else kv_types,
        help=f"KV cache K type: {'|'.join(kv_types)} (default f16){many}",
    )
    g.add_argument(
        "--cache-type-v",
        dest="type_v",
        choices=None if lists else kv_types,
        help=f"KV cache V type (default f16){many}",
    )
    g.add_argument(
        "--extra-bufts",
        choices=TRI_STATE,
        help="llama.cpp extra weight buffer types (AMX, repacking); auto = off on AMX CPUs, whose batched path crashes",
    )
    g.add_argument(
        "--no-kv-offload",
        dest="offload_kqv",
        action="store_const",
        const=False,
        help="keep the KV cache in host memory, not on the GPU (llama.cpp's offload_kqv off; slower)",
    )
    g.add_argument(
        "--chat-template",
        metavar="NAME|FILE",
        help="prompt format: a llama.cpp built-in (chatml, gemma, llama3, phi3, mistral-v7, …), completion "
        "(no chat markup) or a Jinja file; default: the model's own template, else a format its vocabulary has",
    )
    g.add_argument(
        "--spec",
        metavar="MODE",
        help="decode mode: off (default), lookup (draft from the conversation's n-grams), draft:MODEL (a small "
        "model of the same vocabulary drafts; default = the bundled one), auto (lookup where it pays)",
    )


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """Sampling and conversation options."""
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, metavar="N", help="most tokens per reply (default 512)")
    g.add_argument("--temperature", "--temp", type=float, metavar="T", help="0 = greedy (default 0.7)")
    g.add_argument("--top-p", type=float, metavar="P")
    g.add_argument("--top-k", type=int, metavar="K")
    g.add_argument("--min-p", type=float, metavar="P")
    g.add_argument("--seed", type=int, metavar="S")
    g.add_argument("--system", dest="system_prompt", metavar="TEXT", help="system prompt")
    g.add_argument(
        "--thinking",
        choices=TRI_STATE,
        help="reasoning models: think before answering (on/off where the template can switch it; default auto)",
    )
    g.add_argument(
        "--think-budget",
        type=int,
        metavar="N",
        help="reasoning models: close the thinking block after N thinking tokens (default: no budget)",
    )


_SETTING_KEYS = (
    "model",
    "models_dir",
    "n_ctx",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "n_threads_batch",
    "n_gpu_layers",
    "flash_attn",
    "type_k",
    "type_v",
    "extra_bufts",
    "offload_kqv",
    "chat_template",
    "spec",
    "system_prompt",
    "server",
    "api_key_env",
    "remote_model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "thinking",
    "think_budget",
)


def settings_from_args(args: argparse.Namespace, base: Settings | None = None) -> Settings:
    """Apply the flags the user gave (non-``None``) over ``base`` (default: the configured settings,
    :func:`chatphase.settings.file.load_settings`: config file < environment) and validate.

    Raises:
        UsageError: when a value is out of range, or a ``CHATPHASE_<KEY>`` variable is invalid.
    """
    if base is None:
        from chatphase.settings.file import load_settings

        base = load_settings()
    overrides = {k: getattr(args, k) for k in _SETTING_KEYS if getattr(args, k, None) is not None}
    autos: dict[str, Any] = {k: None for k, v in overrides.items() if v == AUTO}  # auto beats a configured number
    settings = base.with_overrides(**{k: v for k, v in overrides.items() if k not in autos})
    return replace(settings, **autos).validate()
