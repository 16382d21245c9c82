"""``--server``, ``--api-key-env`` and ``--remote-model``: run ``chat``, ``ask`` or ``bench`` on a remote
OpenAI-compatible server (llama-server, vLLM, llama-cpp-python's server, Ollama's ``/v1``).

The three are :class:`~chatphase.settings.schema.Settings` fields too, so the config file (``server = "…"``) and
the environment (``CHATPHASE_SERVER``) can set them; a flag wins, as for every setting.
"""

from __future__ import annotations

import argparse
import weakref

from chatphase.bench.core.contract import P, validate_plan
from chatphase.commands.options import add_setting_flags
from chatphase.engine.base import Engine
from chatphase.engine.factory import DEFAULT_API_KEY_ENV, check_remote_options, make_engine
from chatphase.engine.text import inert
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.settings.schema import Settings


def add_server_options(p: argparse.ArgumentParser) -> None:
    """Add the remote-server option group (all default to ``None`` = the configured value)."""
    g = p.add_argument_group("remote server (instead of a local model)")
    add_setting_flags(g, "server", default_api_key_env=DEFAULT_API_KEY_ENV)


def model_info_for(settings: Settings, pull: bool = False, warn=None) -> ModelInfo:
    """The model to show before loading: the served model's placeholder with a server, else the local
    GGUF (resolved — downloaded with ``pull`` or the user's y/N consent on a terminal — validated, and its
    memory checked: a warning goes to ``warn(text)``, default stderr). Checks the server settings too, so
    a command fails on one line before any UI starts.

    Raises:
        UsageError: a malformed server URL, an unset ``api_key_env`` variable, remote options without a
            server, an unknown ``--chat-template``. ModelError: a local model that cannot be used, or
            whose chat template fails to render (:func:`chatphase.engine.prompting.chat_format.format_before_load`).
    """
    check_remote_options(settings.server, settings.api_key_env, settings.remote_model)
    if settings.server:
        from chatphase.engine.remote.engine import remote_model_info
        from chatphase.engine.remote.url import ServerURL

        return remote_model_info(ServerURL(settings.server).display, settings.remote_model)
    import sys

    from chatphase.models.gguf_meta import read_model_info
    from chatphase.models.memory import preflight
    from chatphase.models.resolve import resolve_model

    def consent(question: str) -> bool:  # a y/N prompt only where a person can answer it
        if not sys.stdin.isatty():
            return False
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")

    info = read_model_info(resolve_model(settings.model, settings.models_dir, pull=pull, confirm=consent))
    from chatphase.engine.prompting.chat_format import format_before_load

    engine = settings.engine
    format_before_load(info, engine.chat_template)  # a broken template: one line, exit 2, before any UI
    verdict = preflight(info, engine.n_ctx_before_load, engine.n_ubatch_used, engine.type_k, engine.type_v)
    if verdict.level == "warn":
        (warn or (lambda text: print(inert(f"chatphase: warning: {text}"), file=sys.stderr)))(verdict.message)
    return info


def engine_for(settings: Settings, info: ModelInfo | None) -> Engine:
    """The engine ``settings`` ask for (see :func:`chatphase.engine.factory.make_engine`).

    Raises:
        UsageError: as :func:`~chatphase.engine.factory.make_engine`.
    """
    return make_engine(
        info,
        settings.engine,
        server=settings.server,
        api_key_env=settings.api_key_env,
        remote_model=settings.remote_model,
    )


def remote_bench_options(settings: Settings, info: ModelInfo) -> dict:
    """Extra :class:`~chatphase.bench.sweep.run.SweepRun` arguments for ``bench --server`` (``{}`` without one).

    The sweep sends exact-length token-id prompts, so it needs the served model's vocabulary: it is read
    (vocabulary only) from the local GGUF ``info`` — pass ``--model`` naming the file the server runs.
    The server must accept token-id prompts on ``/v1/completions`` (llama-server and vLLM do).
    """
    if not settings.server:
        return {}
    from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder
    from chatphase.engine.logfile import default_log_path
    from chatphase.engine.prompting.vocab import VocabFile

    try:  # llama.cpp's log goes to the engine log, as the engine's does
        vocab = VocabFile(info.path, default_log_path())
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None
    builder = PromptBuilder(EngineTokenizer(vocab.vocab))
    # free llama.cpp's objects with the builder (or before interpreter exit), never during teardown
    weakref.finalize(builder, vocab.close)
    return {"engine_factory": lambda model_info, _config: engine_for(settings, model_info), "builder": builder}


def validate_bench_plan(plan: P, settings: Settings) -> P:
    """``plan`` validated before any work against ``--n-ctx`` and ``--n-batch``; over ``--server`` against neither
    (the server's context and slots are checked after connecting).

    Raises:
        UsageError: the plan's one-line reason.
    """
    if settings.server:
        return validate_plan(plan, None)
    return validate_plan(plan, settings.engine.n_ctx_before_load, settings.engine.n_batch)
