"""The README is a door and docs/ the manual: the README stays short, keeps its two set-up commands byte for
byte, and links only to pages that exist; the documentation site (mkdocs.yml, MkDocs + Material) builds with
``--strict``, so a broken link, a missing heading or a page no menu lists fails here and in ``.ci/run``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: the README's two set-up commands, as indented code lines (Markdown's four spaces included).
SET_UP_COMMANDS = (
    "    python3 -m pip install -e . && python3 -m chatphase",
    "    python3 -m pip install -e '.[test]' && python3 -m pytest",
)
README_MAX_LINES = 300


def readme_sections() -> dict[str, list[str]]:
    """``## `` heading -> its lines (up to the next ``## ``), in the README's order."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            current = line
            sections[current] = []
        elif current:
            sections[current].append(line)
    return sections


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the manual belongs in docs/"


def test_the_readme_set_up_section_holds_the_two_commands_exactly():
    set_up = readme_sections().get("## Set up")
    assert set_up is not None, "README.md has no '## Set up' section"
    for command in SET_UP_COMMANDS:
        assert command in set_up, f"'## Set up' lacks the line {command!r}"


def test_the_folders_table_comes_just_before_development():
    headings = list(readme_sections())
    assert "## Where chatphase keeps its files" in headings and "## Development" in headings
    assert headings.index("## Development") == headings.index("## Where chatphase keeps its files") + 1
    table = readme_sections()["## Where chatphase keeps its files"]
    for variable in ("CHATPHASE_DATA_DIR", "CHATPHASE_MODELS_DIR", "CHATPHASE_CACHE_DIR", "CHATPHASE_LOG_DIR"):
        assert any(variable in line for line in table), f"the folders table does not name {variable}"


def test_the_readme_links_to_files_that_exist():
    text = README.read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert any(t.startswith("docs/") for t in targets), "README.md links to no docs page"
    missing = [t for t in targets if t and not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_every_docs_page_is_in_the_site_menu():
    """mkdocs --strict says so too; this holds where mkdocs is not installed."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s*([\w./-]+\.md)\s*$", config, flags=re.M))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - listed == set(), f"docs pages missing from mkdocs.yml's nav: {sorted(pages - listed)}"
    assert listed - pages == set(), f"mkdocs.yml's nav names missing pages: {sorted(listed - pages)}"


def test_the_docs_cite_only_this_repository():
    for path in [README, *DOCS.rglob("*.md")]:
        assert "../shared" not in path.read_text(encoding="utf-8"), f"{path.relative_to(ROOT)} cites ../shared"


def test_ci_builds_the_site_strictly_from_the_docs_extra():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python3 -m pip install -e '.[docs]'" in ci
    assert re.search(r"mkdocs build --strict --site-dir", ci), ".ci/run does not build the site with --strict"


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs and mkdocs-material are not installed (pip install -e '.[docs]'; .ci/run installs them)",
)
def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "chat" / "index.html").is_file()
