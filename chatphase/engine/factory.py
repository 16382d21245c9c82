"""Choose the engine for a run: the local llama.cpp engine in its child process, or a remote server.

Commands and the TUI build engines only through :func:`make_engine`, so ``--server`` works the same
everywhere and nothing else needs to know which backend is in use (both speak the
:class:`~chatphase.engine.base.Engine` protocol and emit the same events).
"""

from __future__ import annotations

import os

from chatphase.engine.base import Engine
from chatphase.engine.config import EngineConfig
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import ModelInfo

#: environment variable read for the API key when ``--api-key-env`` is not given.
DEFAULT_API_KEY_ENV = "CHATPHASE_API_KEY"


def api_key_from_env(name: str | None) -> str | None:
    """The API key held in environment variable ``name`` (default :data:`DEFAULT_API_KEY_ENV`).

    Keys come only from the environment (or a config file naming the variable), never from a flag, so
    they stay out of shell history and process lists. Returns ``None`` when the default variable is
    unset (most local servers need no key).

    Raises:
        UsageError: when a variable named explicitly is unset or empty (the key itself is never shown).
    """
    value = os.environ.get(name or DEFAULT_API_KEY_ENV, "").strip()
    if name and not value:
        raise UsageError(f"--api-key-env {name}: that environment variable is not set or is empty")
    return value or None


def check_remote_options(server: str | None, api_key_env: str | None, remote_model: str | None) -> str | None:
    """The API key for ``server`` (``None`` when there is none to send), after checking the remote options.

    Raises:
        UsageError: an unset ``api_key_env`` variable, or remote-only options without ``server``.
    """
    if not server and (api_key_env or remote_model):
        raise UsageError("--api-key-env and --remote-model need --server URL")
    return api_key_from_env(api_key_env) if server else None


def make_engine(
    info: ModelInfo | None,
    config: EngineConfig,
    server: str | None = None,
    api_key_env: str | None = None,
    remote_model: str | None = None,
) -> Engine:
    """An engine: :class:`~chatphase.engine.remote.engine.RemoteEngine` when ``server`` is a URL,
    else :class:`~chatphase.engine.process.host.EngineHost` running the local model ``info``.

    Nothing is started or contacted here; call ``load()`` on the result.

    Raises:
        UsageError: a malformed server URL, an unset ``api_key_env`` variable, remote-only options without
            ``server``, or no local model without ``server``.
    """
    api_key = check_remote_options(server, api_key_env, remote_model)
    if server:
        from chatphase.engine.remote.engine import RemoteEngine

        # one switch for both prefix stores: the local one on disk and a llama-server's slot files
        restore = config.prefix_cache != "off"
        return RemoteEngine(server, api_key=api_key, remote_model=remote_model, prefix_restore=restore)
    if info is None:
        raise UsageError("no local model to run (give --model, or --server URL for a remote one)")
    from chatphase.engine.process.host import EngineHost

    return EngineHost(info, config)
