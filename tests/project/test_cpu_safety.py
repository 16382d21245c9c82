"""Third-party llama.cpp code started by the tests (llama-cpp-python's server) runs with the engine's
CPU-safety choice: on an Intel AMX CPU, llama.cpp's extra buffer types off (docs/architecture.md)."""

from __future__ import annotations

import llama_cpp.llama_cpp as low
import pytest
from llama_cpp import Llama
from remote_support import _SERVER_MAIN

pytestmark = pytest.mark.model


@pytest.mark.parametrize(
    ("kind", "probe_safe", "extra_bufts"),
    [("amx", False, False), ("amx", True, True), ("other", False, True)],
    ids=["amx-cpu-probe-fails", "amx-cpu-probe-passes", "other-cpu"],
)
def test_the_server_entry_point_reaches_llama(default_model_path, monkeypatch, fake_cpu, kind, probe_safe, extra_bufts):
    """The server's patch must reach what ``Llama`` reads (the submodule's ``llama_model_default_params``;
    patching the package's re-export did not, and the server died of SIGILL/SIGSEGV on AMX CPUs). The CPU is
    faked whole, the probe's verdict with it: the same outcome on every machine."""
    cpu = fake_cpu(kind, probe_safe)
    monkeypatch.setattr(low, "llama_model_default_params", low.llama_model_default_params)  # restored after
    patch = _SERVER_MAIN.split("from llama_cpp.server")[0]
    exec(patch, {})
    llm = Llama(default_model_path, n_ctx=64, vocab_only=True, verbose=False)
    try:
        assert llm.model_params.use_extra_bufts is extra_bufts
        assert cpu.probes == (kind == "amx")  # the probe is asked on AMX CPUs only
    finally:
        llm.close()
