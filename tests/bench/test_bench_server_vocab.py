"""``bench --server`` builds its exact-length prompts from the local GGUF's vocabulary: that load's
llama.cpp log goes to the engine log, never to the terminal (``docs/engine-settings.md``: the log never prints over the
screen). Run in a fresh process, where no log capture is installed yet, as on the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

_SCRIPT = """
import sys
from chatphase.commands.server_options import remote_bench_options
from chatphase.settings.schema import Settings
from chatphase.models.gguf_meta import read_model_info

options = remote_bench_options(Settings(server="http://127.0.0.1:9"), read_model_info(sys.argv[1]))
assert len(options["builder"].tokens(64)) == 64
print("built")
"""


def test_the_vocabulary_load_for_a_remote_bench_logs_to_the_engine_log_only(default_model_path, tmp_path):
    env = {"CHATPHASE_LOG_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(default_model_path)], capture_output=True, text=True, env=env, timeout=100
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "built\n"
    assert proc.stderr == ""  # no llama.cpp line (llama_context: …, llama_model_loader: …) on the terminal
    assert "llama_model_loader" in (tmp_path / "engine.log").read_text()
