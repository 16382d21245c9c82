"""scripts/llama_build.sh fetches Debian 13's Vulkan headers only from the archive this machine's own apt
configuration names (scripts/debian_mirror.sh), never from a host of its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIRROR = ROOT / "scripts" / "debian_mirror.sh"


def mirror(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MIRROR), *map(str, files)], capture_output=True, text=True, timeout=30)


def test_deb822_and_one_line_sources(tmp_path):
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\n# http://snapshot.debian.org/archive/debian/ a comment is no source\n"
        "URIs: http://mirror.example.org/debian/\nSuites: bookworm\nComponents: main\n"
    )
    assert mirror(deb822).stdout == "http://mirror.example.org/debian\n"
    one_line = tmp_path / "sources.list"
    one_line.write_text(
        "# deb http://commented.example/debian bookworm main\ndeb https://local.example/debian bookworm main\n"
    )
    assert mirror(tmp_path / "missing.list", one_line).stdout == "https://local.example/debian\n"


def test_no_debian_archive_is_one_line_and_exit_1(tmp_path):
    other = tmp_path / "other.list"
    other.write_text(
        "deb https://packages.example.com/apt stable main\n# deb http://deb.debian.org/debian bookworm main\n"
    )
    done = mirror(other)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "name no Debian archive" in done.stderr


def test_the_build_script_names_no_host_of_its_own():
    script = (ROOT / "scripts" / "llama_build.sh").read_text()
    assert "debian_mirror.sh" in script
    assert "deb.debian.org" not in script
