"""The package's shape: layers that import one way, no import cycle, Textual and llama.cpp where they belong.

Read from the source (:mod:`tests.import_graph`), so a lazy import inside a function counts too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import import_graph as g
import pytest

#: package -> the chatphase packages it may import (besides itself). Lower layers first:
#: models <- engine <- chat <- ui / commands; sessions and bench beside chat; system and the leaf
#: modules (errors, units) under everything.
LEAF = {"errors", "units"}
ALLOWED = {
    "errors": set(),
    "units": set(),
    "system": LEAF,
    "models": LEAF,
    "engine": LEAF | {"models", "system"},
    "settings": LEAF | {"engine", "models", "system"},
    "explain": LEAF | {"engine", "models"},
    "forecast": LEAF,
    "sessions": LEAF | {"engine", "models"},
    "bench": LEAF | {"engine", "models", "system", "explain"},
    "chat": LEAF | {"engine", "models", "system", "sessions", "settings"},
}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_import_cycle():
    assert g.cycles(g.graph()) == []


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_layers_import_one_way(package):
    bad = sorted(
        f"{src} imports {dst}"
        for src, targets in g.graph().items()
        if package_of(src) == package
        for dst in targets
        if package_of(dst) not in ALLOWED[package] | {package, ""}
    )
    assert bad == []


def test_textual_only_in_ui():
    outside = [
        name
        for name, path in g.modules().items()
        if package_of(name) != "ui" and g.external_imports(path) & {"textual", "textual_plotext"}
    ]
    assert outside == []


def test_ui_never_imports_llama_cpp():
    inside = [
        name
        for name, path in g.modules().items()
        if package_of(name) == "ui" and "llama_cpp" in g.external_imports(path)
    ]
    assert inside == []


#: what the UI process must not load at start: llama.cpp (libllama and ~0.4 s of import; the engine's
#: child process has it) and NumPy (only the experiments and the bench's fits need it, imported there).
NOT_IN_THE_UI_PROCESS = ("llama_cpp", "numpy")


def test_the_ui_process_loads_neither_llama_cpp_nor_numpy():
    """What ``import chatphase.ui.app`` really loads, through every module it imports (direct imports
    alone would miss a chain such as chat -> engine helper -> llama_cpp)."""
    code = f"import sys, chatphase.ui.app\nprint(' '.join(m for m in {NOT_IN_THE_UI_PROCESS!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(g.PACKAGE_DIR.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []


def test_only_the_engine_loads_llama_cpp_models():
    """A model or vocabulary loaded anywhere else would print llama.cpp's log on the terminal: the engine's
    loaders (``LlamaEngine``, ``BatchedEngine``, ``VocabFile``) send it to the engine log."""
    loads = re.compile(r"\bLlama\(|llama_model_load_from_file|vocab_only\s*=")
    outside = [
        name for name, path in g.modules().items() if package_of(name) != "engine" and loads.search(path.read_text())
    ]
    assert outside == []


def test_engine_takes_its_own_config():
    """The engine never sees the user's settings (theme, paths, sampling defaults): it takes an EngineConfig."""
    bad = [
        f"{src} imports {dst}"
        for src, targets in g.graph().items()
        if package_of(src) == "engine"
        for dst in targets
        if dst in ("chatphase.settings.schema", "chatphase.settings.file")
    ]
    assert bad == []


def test_modules_stay_small():
    big = {name: n for name, path in g.modules().items() if (n := len(path.read_text().splitlines())) > 400}
    assert big == {}


def test_the_app_is_a_view_of_a_controller_without_textual():
    """The turn belongs to a plain-Python controller; the App only composes, maps and draws."""
    app = g.PACKAGE_DIR / "ui" / "app.py"
    assert len(app.read_text().splitlines()) <= 300
    controller = g.modules()["chatphase.chat.controller"]
    assert not g.external_imports(controller) & {"textual", "rich"}
    assert "chatphase.chat.controller" in g.graph()["chatphase.ui.app"]


def test_graph_sees_lazy_imports():
    """The graph is only as good as its reading: a function-level import must be an edge."""
    edges = g.graph()
    assert "chatphase.models.hub" in edges["chatphase.models.resolve"]  # imported inside resolve_model
