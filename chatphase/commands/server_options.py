"""``--server``, ``--api-key-env`` and ``--remote-model``: run ``chat``, ``ask`` or ``bench`` on a remote
OpenAI-compatible server (llama-server, vLLM, llama-cpp-python's server, Ollama's ``/v1``)."""

from __future__ import annotations

import argparse

from chatphase.config import Settings
from chatphase.engine.base import Engine
from chatphase.engine.factory import DEFAULT_API_KEY_ENV, make_engine
from chatphase.gguf_meta import ModelInfo


def add_server_options(p: argparse.ArgumentParser) -> None:
    """Add the remote-server option group (all default to ``None`` = run the local model)."""
    g = p.add_argument_group("remote server (instead of a local model)")
    g.add_argument("--server", metavar="URL",
                   help="OpenAI-compatible server, e.g. http://127.0.0.1:8080 (…/v1 optional); "
                        "the local model options are then ignored")
    g.add_argument("--api-key-env", metavar="NAME",
                   help=f"environment variable holding the server's API key (default: {DEFAULT_API_KEY_ENV} if set)")
    g.add_argument("--remote-model", metavar="NAME",
                   help="model name to ask the server for (default: the first one it lists)")


def engine_from_args(args: argparse.Namespace, info: ModelInfo | None, settings: Settings) -> Engine:
    """The engine the parsed flags ask for (see :func:`chatphase.engine.factory.make_engine`).

    Raises:
        UsageError: as :func:`~chatphase.engine.factory.make_engine`.
    """
    return make_engine(info, settings, server=getattr(args, "server", None),
                       api_key_env=getattr(args, "api_key_env", None),
                       remote_model=getattr(args, "remote_model", None))
