"""The import graph of the ``chatphase`` package, read from the source with :mod:`ast` (nothing imported).

Every import counts, also those inside functions (a lazy import is still a dependency) and under
``TYPE_CHECKING``. ``from chatphase.models import hub`` is an edge to ``chatphase.models.hub`` when that is
a module, else to ``chatphase.models``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "chatphase"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """``{dotted name: file}`` of every module of the package."""
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _imports(path: Path, name: str, is_package: bool) -> list[str]:
    """Dotted names ``path`` imports (absolute, relative ones resolved)."""
    return list(_parsed_imports(path, path.stat().st_mtime_ns, name, is_package))


@functools.cache
def _parsed_imports(path: Path, mtime_ns: int, name: str, is_package: bool) -> tuple[str, ...]:
    """Each file is parsed once per test run (keyed on its mtime, so an edited file is read again): the
    architecture tests ask for the graph dozens of times."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out: list[str] = []
    base = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - node.level + 1]
                mod = ".".join(parent + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out += [f"{mod}.{a.name}" for a in node.names] + [mod]
    return tuple(out)


def graph() -> dict[str, set[str]]:
    """``{module: modules of chatphase it imports}``."""
    mods = modules()
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = set()
        for imp in _imports(path, name, path.name == "__init__.py"):
            if imp in mods:
                targets.add(imp)
        # "from pkg import mod" adds both pkg.mod and pkg: keep pkg only when nothing below it was meant
        edges[name] = {t for t in targets if t != name}
    for name in edges:
        edges[name] = {
            t
            for t in edges[name]
            if not any(o.startswith(t + ".") for o in edges[name]) or not (mods[t].name == "__init__.py")
        }
    return edges


def external_imports(path: Path) -> set[str]:
    """Top-level names of the packages a file imports (``textual``, ``llama_cpp``, …)."""
    name = module_name(path)
    return {imp.split(".")[0] for imp in _imports(path, name, path.name == "__init__.py") if imp}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out
