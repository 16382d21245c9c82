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

#: unit -> the units it imports (besides itself), exactly: an edge the code stops using must leave the table
#: too. A unit is a top-level module or package of chatphase; engine/, ui/ and bench/ count per subpackage, their
#: top-level modules being the unit "engine" (the contract every backend speaks: events, metrics, config),
#: "ui" (the app shell) and "bench" (the experiments' registry and what-if), and the engine's
#: factory a unit of its own (it picks a backend, so it sits above them). Lower layers first.
LAYERS = {
    # leaves, under everything
    "errors": set(),
    "units": set(),
    "timing": set(),
    "plotting": {"errors"},
    "system": set(),
    "models": {"errors", "system", "units"},
    # the engine: its contract, then prompting, the backends, the child-process host and the factory
    "engine": {"errors", "models", "system", "units"},  # units: the memory plan's words (engine/memory_plan.py)
    "engine.threads": {"engine", "system"},
    "engine.prompting": {"engine", "errors", "models"},
    "engine.local": {"engine", "engine.prompting", "engine.threads", "errors", "models", "system", "units"},
    "engine.remote": {"engine", "engine.prompting", "errors", "models", "system", "units"},
    "engine.process": {"engine", "engine.local", "models"},
    "engine.factory": {"engine", "engine.process", "engine.remote", "errors", "models"},
    # beside the engine's users
    "explain": {"engine", "models", "units"},
    "settings": {"engine", "errors", "system"},
    "sessions": {"engine", "errors", "system", "units"},
    "history": {"engine", "errors", "plotting", "sessions", "system", "timing", "units"},
    # the experiments: their contract and shared parts, one subpackage each (importing only the core, and the sweep
    # for those built on its loop), the registry
    "bench.core": {
        "engine",
        "engine.local",
        "engine.process",
        "engine.prompting",
        "errors",
        "models",
        "plotting",
        "system",
        "timing",
        "units",
    },
    "bench.sweep": {"bench.core", "engine", "errors", "models", "timing"},
    "bench.parallel": {"bench.core", "bench.sweep", "engine", "errors", "models", "plotting", "timing", "units"},
    "bench.grid": {"bench.core", "bench.sweep", "engine", "engine.local", "errors", "models", "units"},
    "bench.spec": {"bench.core", "engine", "engine.local", "errors", "models"},
    "bench.offload": {"bench.core", "bench.sweep", "engine", "errors", "models", "plotting", "units"},
    "bench.interference": {"bench.core", "engine", "engine.local", "errors", "models", "plotting", "timing", "units"},
    "bench.rates": {"bench.core", "engine", "errors", "units"},
    "bench.rpc": {"bench.core", "engine", "engine.factory", "engine.local", "errors", "models", "plotting", "units"},
    "bench": {
        "bench.compare",
        "bench.core",
        "bench.grid",
        "bench.interference",
        "bench.rates",
        "bench.rpc",
        "bench.offload",
        "bench.parallel",
        "bench.spec",
        "bench.sweep",
        "engine",
        "errors",
        "models",
        "plotting",
    },
    # the turn
    "chat": {
        "engine",
        "engine.process",
        "errors",
        "history",
        "models",
        "sessions",
        "settings",
        "system",
        "timing",
        "units",
    },
    # side by side: two conversations, each its own chat controller, so above the turn
    "bench.compare": {
        "bench.core",
        "chat",
        "engine",
        "engine.factory",
        "engine.local",  # in the Experiments screen's job, a daemonic process, the local engine runs in-process
        "errors",
        "models",
        "plotting",
        "settings",
        "units",
    },
    # the TUI: its parts, then the app shell
    "ui.compat": set(),  # Textual's private API, in one place
    "ui.transcript": {"chat", "engine", "models", "ui.compat", "units"},
    "ui.dashboard": {"chat", "engine", "explain", "system", "timing", "units"},
    "ui.phases": {"engine", "models", "ui.dashboard", "ui.transcript", "units"},
    "ui.screens": {
        "chat",
        "engine",
        "engine.prompting",
        "errors",
        "models",
        "sessions",
        "settings",
        "system",
        "units",
    },
    "ui.experiments": {
        "bench",
        "bench.compare",
        "bench.core",
        "bench.grid",
        "bench.interference",
        "bench.parallel",
        "bench.spec",
        "bench.sweep",
        "engine",
        "errors",
        "models",
        "settings",
        "units",
    },
    "ui": {
        "chat",
        "engine",
        "errors",
        "history",
        "models",
        "sessions",
        "settings",
        "units",
        "ui.compat",
        "ui.dashboard",
        "ui.experiments",
        "ui.phases",
        "ui.screens",
        "ui.transcript",
    },
    # the command line
    "commands": {
        "bench",
        "bench.compare",
        "bench.core",
        "bench.grid",
        "bench.sweep",
        "chat",
        "engine",
        "engine.factory",
        "engine.local",
        "engine.prompting",
        "engine.remote",
        "errors",
        "history",
        "models",
        "plotting",
        "sessions",
        "settings",
        "system",
        "timing",
        "ui",
        "units",
    },
    "cli": {"engine", "errors"},
    "__main__": {"cli"},
    "chatphase": set(),  # the package's __init__
}


def unit_of(module: str) -> str:
    """The layer-table unit of a dotted module name (see :data:`LAYERS`)."""
    parts = module.split(".")[1:]
    if not parts:
        return "chatphase"
    if module == "chatphase.engine.factory":
        return "engine.factory"
    if parts[0] in ("engine", "ui", "bench") and len(parts) > 2:
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def unit_edges() -> dict[str, set[str]]:
    """``{unit: the units its modules import}``, read from the source."""
    edges: dict[str, set[str]] = {unit_of(m): set() for m in g.modules()}
    for src, targets in g.graph().items():
        edges[unit_of(src)] |= {unit_of(dst) for dst in targets} - {unit_of(src)}
    return edges


def test_the_layer_table_covers_every_unit():
    assert sorted(unit_edges()) == sorted(LAYERS)


@pytest.mark.parametrize("unit", sorted(LAYERS))
def test_layers_import_one_way(unit):
    bad = sorted(
        f"{src} imports {dst}"
        for src, targets in g.graph().items()
        if unit_of(src) == unit
        for dst in targets
        if unit_of(dst) not in LAYERS[unit] | {unit}
    )
    assert bad == []


def test_the_layer_table_has_no_unused_edge():
    used = unit_edges()
    unused = sorted(f"{u} -> {d}" for u, allowed in LAYERS.items() for d in allowed - used.get(u, set()))
    assert unused == []


#: bench/'s experiments, one subpackage each.
EXPERIMENTS = (
    "bench.compare",
    "bench.grid",
    "bench.interference",
    "bench.rates",
    "bench.rpc",
    "bench.offload",
    "bench.parallel",
    "bench.spec",
    "bench.sweep",
)


def test_every_bench_subpackage_is_the_core_or_an_experiment():
    packages = {unit for unit in unit_edges() if unit.startswith("bench.")}
    assert packages == {"bench.core", *EXPERIMENTS}


#: the experiments built on the sweep: they run its measuring loop (``bench/sweep/loop.py``) or its run.
ON_THE_SWEEP = ("bench.grid", "bench.offload", "bench.parallel")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_an_experiment_imports_the_core_and_no_other_experiment_but_the_sweep(experiment):
    bench_units = {u for u in unit_edges()[experiment] if u.startswith("bench")}
    assert bench_units == {"bench.core", *(("bench.sweep",) if experiment in ON_THE_SWEEP else ())}


def test_the_bench_core_imports_no_experiment():
    assert not {u for u in unit_edges()["bench.core"] if u.startswith("bench")}


def test_units_import_without_a_cycle():
    """Not just modules: no two units import each other, even through different modules."""
    assert g.cycles(unit_edges()) == []


def test_no_import_cycle():
    assert g.cycles(g.graph()) == []


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


def test_parsing_the_command_line_loads_neither_llama_cpp_nor_numpy():
    """Every command pays for what building the argument parser imports: ``--help`` or a mistyped flag should not
    wait for llama.cpp (it did, about 0.1 s, through ``chatphase info``'s top-level import)."""
    code = (
        "import sys\nfrom chatphase.cli import build_parser\nbuild_parser()\n"
        f"print(' '.join(m for m in {NOT_IN_THE_UI_PROCESS!r} if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(g.PACKAGE_DIR.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        ([], "chat"),
        (["--model", "x.gguf"], "chat"),
        (["--verbose", "stats", "--by", "model"], "stats"),
        (["ask", "hi"], "ask"),
        (["--help"], None),
        (["--version"], None),
        (["bogus"], None),
    ],
)
def test_a_run_registers_the_command_it_runs(argv, command):
    from chatphase.cli import command_of

    assert command_of(argv) == command


def test_a_command_loads_no_other_command():
    """``stats`` paid for the TUI's controller and every experiment's module (a third of its 1.2 s on the Intel
    kind) when the parser registered every subcommand."""
    code = (
        "import sys\nfrom chatphase import cli\n"
        "try:\n    cli.main(['stats', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(' '.join(m for m in sys.modules if m.startswith(('chatphase.commands.', 'chatphase.chat', "
        "'chatphase.bench', 'chatphase.ui'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(g.PACKAGE_DIR.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    commands = {m.rsplit(".", 1)[1] for m in out.stdout.split() if m.startswith("chatphase.commands.")}
    assert commands & set(__import__("chatphase.cli").cli.COMMAND_MODULES) == {"stats"}
    assert not [m for m in out.stdout.split() if m.startswith(("chatphase.chat", "chatphase.ui"))]


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


def test_the_app_is_a_view_of_a_controller_without_textual():
    """The turn belongs to a plain-Python controller; the App only composes, maps and draws."""
    controller = g.modules()["chatphase.chat.controller"]
    assert not g.external_imports(controller) & {"textual", "rich"}
    assert "chatphase.chat.controller" in g.graph()["chatphase.ui.app"]


def test_graph_sees_lazy_imports():
    """The graph is only as good as its reading: a function-level import must be an edge."""
    edges = g.graph()
    assert "chatphase.models.hub" in edges["chatphase.models.resolve"]  # imported inside resolve_model
