"""One owner of chatphase's folders (chatphase/system/paths.py): each environment variable moves every folder and
file it should, no other module computes a folder itself, and the README's table lists every variable."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from chatphase.chat.ttft_prior import results_dir
from chatphase.engine.local import amx_probe, prefix_store
from chatphase.engine.logfile import default_log_path
from chatphase.engine.remote.slots import index_path
from chatphase.history.db import db_path
from chatphase.models.hub import cached_files
from chatphase.sessions.store import sessions_dir
from chatphase.system import paths
from chatphase.system.engine_registry import registry_dir
from chatphase.system.machine_peaks import peaks_file

ROOT = Path(__file__).resolve().parents[2]
#: the variables that move a folder besides FOLDER_VARIABLES: platformdirs' on Linux, and the build scripts'.
XDG = ("XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR")
SCRIPT_VARIABLES = ("CHATPHASE_LLAMA_BUILD_DIR",)


def _hub_repo_folder() -> Path:
    """Where :func:`chatphase.models.hub.cached_files` looks for a repo (the folder it would list)."""
    seen: list[Path] = []
    real_is_dir = Path.is_dir

    def spy(self: Path) -> bool:
        seen.append(self)
        return real_is_dir(self)

    Path.is_dir = spy  # type: ignore[method-assign]
    try:
        cached_files("o/n")
    finally:
        Path.is_dir = real_is_dir  # type: ignore[method-assign]
    return next(p.parents[2] for p in seen if p.parents[1].name == "models--o--n")


#: variable -> (what, the path it gives, that path relative to the variable's value)
FOLLOWERS: dict[str, list[tuple[str, Callable[[], Path], str]]] = {
    "CHATPHASE_DATA_DIR": [
        ("data folder", paths.data_dir, "."),
        ("sessions", sessions_dir, "sessions"),
        ("history database", db_path, "history.db"),
        ("saved results", results_dir, "results"),
        ("models folder", paths.models_dir, "models"),
    ],
    "CHATPHASE_MODELS_DIR": [("models folder", paths.models_dir, ".")],
    "CHATPHASE_CACHE_DIR": [
        ("cache folder", paths.cache_dir, "."),
        ("prefix store", prefix_store.store_dir, "prefix"),
        ("AMX probe verdict", amx_probe._cache_file, "amx-probe.json"),
        ("remote slot index", index_path, "remote-slots.json"),
        ("machine peaks", peaks_file, "machine-peaks.json"),
    ],
    "CHATPHASE_LOG_DIR": [("log folder", paths.log_dir, "."), ("engine log", default_log_path, "engine.log")],
    "CHATPHASE_RUNTIME_DIR": [("runtime folder", paths.runtime_dir, "."), ("engine registry", registry_dir, "engines")],
    "CHATPHASE_CONFIG": [("config file", paths.config_file, ".")],
    "HF_HUB_CACHE": [("hub cache", paths.hf_cache_dir, "."), ("hub repo lookup", _hub_repo_folder, ".")],
    "HF_HOME": [("hub cache", paths.hf_cache_dir, "hub"), ("hub repo lookup", _hub_repo_folder, "hub")],
}


@pytest.fixture
def bare_env(monkeypatch, tmp_path):
    """No folder variable set, and a working directory without ``./models``."""
    for name in (*paths.FOLDER_VARIABLES, *XDG):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_every_folder_variable_has_its_followers():
    assert set(FOLLOWERS) == set(paths.FOLDER_VARIABLES)


@pytest.mark.parametrize("variable", paths.FOLDER_VARIABLES)
def test_each_variable_moves_every_folder_that_follows_it(bare_env, tmp_path, variable):
    before = {what: get() for what, get, _ in FOLLOWERS[variable]}
    target = tmp_path / "moved"
    bare_env.setenv(variable, str(target))
    for what, get, relative in FOLLOWERS[variable]:
        assert get() == (target / relative if relative != "." else target), f"{variable} did not move the {what}"
        assert get() != before[what]


def test_a_leading_tilde_is_expanded(bare_env, tmp_path):
    bare_env.setenv("HOME", str(tmp_path))
    for variable in paths.FOLDER_VARIABLES:
        bare_env.setenv(variable, "~/x")
    for variable, followers in FOLLOWERS.items():
        for what, get, _ in followers:
            assert str(get()).startswith(str(tmp_path)), f"{variable}=~/x left the {what} at {get()}"


def test_models_folder_precedence_models_dir_then_data_dir_then_working_dir(bare_env, tmp_path):
    (tmp_path / "models").mkdir()
    assert paths.models_dir() == tmp_path / "models"  # ./models when nothing is set
    bare_env.setenv("CHATPHASE_DATA_DIR", str(tmp_path / "data"))
    assert paths.models_dir() == tmp_path / "data" / "models"  # an explicit variable beats ./models
    bare_env.setenv("CHATPHASE_MODELS_DIR", str(tmp_path / "gguf"))
    assert paths.models_dir() == tmp_path / "gguf"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the XDG variables are Linux's")
def test_platform_defaults_follow_xdg_on_linux(bare_env, tmp_path):
    for name in XDG:
        bare_env.setenv(name, str(tmp_path / name))
    assert paths.data_dir() == tmp_path / "XDG_DATA_HOME" / "chatphase"
    assert paths.models_dir() == tmp_path / "XDG_DATA_HOME" / "chatphase" / "models"
    assert paths.cache_dir() == tmp_path / "XDG_CACHE_HOME" / "chatphase"
    assert paths.log_dir().is_relative_to(tmp_path / "XDG_STATE_HOME" / "chatphase")
    assert paths.config_file() == tmp_path / "XDG_CONFIG_HOME" / "chatphase" / "config.toml"
    assert paths.runtime_dir() == tmp_path / "XDG_RUNTIME_DIR" / "chatphase"
    assert paths.hf_cache_dir() == tmp_path / "XDG_CACHE_HOME" / "huggingface" / "hub"


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or ``environ``: this process's environment (a dict built for a child process is not)."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _folder_computations(tree: ast.AST) -> list[str]:
    """What in ``tree`` computes a folder itself: platformdirs, ``Path.home()``, a ``~`` literal expanded, or a
    folder variable read from the environment."""
    watched = {*paths.FOLDER_VARIABLES, *XDG}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            found += [f"imports {n}" for n in names if n and n.split(".")[0] == "platformdirs"]
        elif isinstance(node, ast.Attribute | ast.Name):
            name = node.attr if isinstance(node, ast.Attribute) else node.id
            if re.fullmatch(r"(user|site)_\w+_(dir|path)", name):
                found.append(f"uses {name}")
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called == "home":
                found.append("calls Path.home()")
            literal = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if called == "expanduser" and any(s.startswith("~") for s in literal):
                found.append("expands a ~ literal")
            of_environ = called == "getenv" or (
                called == "get" and isinstance(func, ast.Attribute) and _is_environ(func.value)
            )
            if of_environ and any(s in watched for s in literal):
                found.append(f"reads {literal[0]}")
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)  # setting one for a child process is fine
            and _is_environ(node.value)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value in watched
        ):
            found.append(f"reads {node.slice.value}")
    return found


def test_no_module_but_the_owner_computes_a_folder():
    owner = ROOT / "chatphase" / "system" / "paths.py"
    assert _folder_computations(ast.parse(owner.read_text())), "the scan finds nothing even in the owner"
    offenders = {
        str(f.relative_to(ROOT)): found
        for folder in ("chatphase", "benchmarks")
        for f in sorted((ROOT / folder).rglob("*.py"))
        if f != owner and (found := _folder_computations(ast.parse(f.read_text(encoding="utf-8"))))
    }
    assert not offenders, f"ask chatphase.system.paths instead: {offenders}"


def test_the_readme_lists_every_variable_in_one_table_before_development():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    heads = re.findall(r"^## .*$", readme, flags=re.M)
    assert "## Where chatphase keeps its files" in heads
    assert heads[heads.index("## Where chatphase keeps its files") + 1] == "## Development"
    section = readme.split("## Where chatphase keeps its files", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    in_rows = set(re.findall(r"`((?:CHATPHASE|HF|XDG)_[A-Z_]+)`", "\n".join(rows)))
    assert in_rows >= {*paths.FOLDER_VARIABLES, *XDG, *SCRIPT_VARIABLES}
    elsewhere = re.findall(r"`((?:CHATPHASE|HF)_[A-Z_]*(?:DIR|HOME|CACHE|CONFIG))`", readme.replace(section, ""))
    assert set(elsewhere) <= in_rows, f"a folder variable outside the table: {set(elsewhere) - in_rows}"
