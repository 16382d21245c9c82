"""Every folder chatphase reads or writes, and the environment variables that move them: the one owner.

Each function reads the environment when called (a test or a changed environment is honoured), creates nothing,
and expands a leading ``~``. The platform defaults are platformdirs' (on Linux they follow ``XDG_DATA_HOME``,
``XDG_CACHE_HOME``, ``XDG_STATE_HOME``, ``XDG_CONFIG_HOME`` and ``XDG_RUNTIME_DIR``):

- :func:`data_dir`: ``CHATPHASE_DATA_DIR``;
- :func:`models_dir`: ``CHATPHASE_MODELS_DIR``, then ``CHATPHASE_DATA_DIR`` (``<data>/models``), then ``./models``;
- :func:`cache_dir`: ``CHATPHASE_CACHE_DIR``; :func:`log_dir`: ``CHATPHASE_LOG_DIR``;
- :func:`runtime_dir`: ``CHATPHASE_RUNTIME_DIR``; :func:`config_file`: ``CHATPHASE_CONFIG`` (a file);
- :func:`hf_cache_dir` (the Hugging Face hub's own cache, read for pulled models): ``HF_HUB_CACHE``, ``HF_HOME``.

The data folder holds what cannot be rebuilt (sessions, the history index, saved results); the cache what can
(the AMX probe's verdict, the prefix store, the remote slot index, the machine's peaks); the runtime folder the
running engines' registry. The modules that own those files name them under these folders, and compute no
folder of their own (``tests/project/test_paths.py`` checks). ``CHATPHASE_MODELS_DIR`` is also the ``models_dir`` setting (flag, config file), which
the commands pass explicitly; :func:`models_dir` is the default under it.
"""

from __future__ import annotations

import os
import tempfile
import typing
import warnings
from pathlib import Path

import platformdirs

APP = "chatphase"

#: every environment variable that moves a folder of chatphase's (the README's table lists each).
FOLDER_VARIABLES = (
    "CHATPHASE_DATA_DIR",
    "CHATPHASE_MODELS_DIR",
    "CHATPHASE_CACHE_DIR",
    "CHATPHASE_LOG_DIR",
    "CHATPHASE_RUNTIME_DIR",
    "CHATPHASE_CONFIG",
    "HF_HUB_CACHE",
    "HF_HOME",
)


def _env(name: str, environ: typing.Mapping[str, str] | None = None) -> Path | None:
    value = (os.environ if environ is None else environ).get(name)
    return Path(value).expanduser() if value else None


def data_dir() -> Path:
    """What cannot be rebuilt: ``$CHATPHASE_DATA_DIR``, else the platform's user data directory."""
    return _env("CHATPHASE_DATA_DIR") or Path(platformdirs.user_data_dir(APP))


def models_dir() -> Path:
    """The user's GGUF files when no ``models_dir`` setting names them: ``$CHATPHASE_MODELS_DIR``, else
    ``$CHATPHASE_DATA_DIR/models``, else ``./models`` when it exists, else ``models`` in the platform's user data
    directory. An explicit variable beats the working directory's ``./models``."""
    explicit = _env("CHATPHASE_MODELS_DIR")
    if explicit:
        return explicit
    data = _env("CHATPHASE_DATA_DIR")
    if data:
        return data / "models"
    local = Path.cwd() / "models"
    if local.is_dir():
        return local
    return data_dir() / "models"


def cache_dir() -> Path:
    """What can be rebuilt (nothing in it is needed to read a session): ``$CHATPHASE_CACHE_DIR``, else the
    platform's user cache directory."""
    return _env("CHATPHASE_CACHE_DIR") or Path(platformdirs.user_cache_dir(APP))


def log_dir() -> Path:
    """The engine log's folder: ``$CHATPHASE_LOG_DIR``, else the platform's user log directory."""
    return _env("CHATPHASE_LOG_DIR") or Path(platformdirs.user_log_dir(APP))


def runtime_dir() -> Path:
    """Files that live as long as a process (the engine registry): ``$CHATPHASE_RUNTIME_DIR``, else the
    platform's user runtime directory, else ``chatphase`` in the temporary directory where the platform has
    none."""
    explicit = _env("CHATPHASE_RUNTIME_DIR")
    if explicit:
        return explicit
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset, then falls back
        warnings.simplefilter("ignore")
        base = platformdirs.user_runtime_dir(APP)
    return Path(base) if base else Path(tempfile.gettempdir()) / APP


def config_file(environ: typing.Mapping[str, str] | None = None) -> Path:
    """The config file: ``$CHATPHASE_CONFIG`` (of ``environ``, default ``os.environ``), else ``config.toml`` in
    the platform's user config directory."""
    return _env("CHATPHASE_CONFIG", environ) or Path(platformdirs.user_config_dir(APP)) / "config.toml"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``${XDG_CACHE_HOME:-~/.cache}/huggingface/hub`` (the rules of ``huggingface_hub.constants``, read now and
    not at its import, so a changed environment is honoured)."""
    explicit = _env("HF_HUB_CACHE")
    if explicit:
        return explicit
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"
