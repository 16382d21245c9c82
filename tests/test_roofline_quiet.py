"""Roofline peaks with an engine child running beside the measurement (real processes): the measurement
waits for a chatphase engine to stop, names one that does not, and the bench measures before it loads
its own engine. Sizes are tiny: this checks the conditions, not the figures."""

from __future__ import annotations

import os
import threading
import time

import pytest
from bench_support import CharTokenizer, ScriptedTokenEngine

from chatphase.bench.api import BenchRun, BenchStatus
from chatphase.bench.peaks import measure_peaks
from chatphase.bench.prompts import PromptBuilder
from chatphase.bench.runner import SweepPlan
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import ModelLoaded
from chatphase.engine.fake import fake_model_info
from chatphase.system.engine_registry import register, running_engines, unregister

TINY = dict(array_bytes=2**20, matmul_n=32, max_s=0.05)


@pytest.fixture
def engine_child(default_model_info, tmp_path):
    from chatphase.engine.host import EngineHost

    host = EngineHost(default_model_info, EngineConfig(n_ctx=256), log_path=str(tmp_path / "engine.log"))
    assert isinstance(list(host.load())[-1], ModelLoaded)
    yield host
    host.close()


def test_an_engine_child_is_registered_while_it_runs(engine_child):
    assert running_engines() == [engine_child.pid]
    engine_child.close()
    assert running_engines() == []


def test_peaks_wait_for_an_engine_child_to_stop(engine_child):
    closed_at: list[float] = []

    def close_soon():
        time.sleep(1.0)
        engine_child.close()
        closed_at.append(time.monotonic())

    threading.Thread(target=close_soon, daemon=True).start()
    t0 = time.monotonic()
    peaks = measure_peaks(threads=1, quiet_wait_s=60, **TINY)
    assert closed_at and peaks.waited_s >= closed_at[0] - t0 - 0.3  # measured only after the child ended
    assert peaks.engines_beside == [] and peaks.conditions.startswith("measured with no chatphase engine running")


def test_peaks_name_an_engine_child_that_keeps_running(engine_child):
    peaks = measure_peaks(threads=1, quiet_wait_s=0.3, **TINY)
    assert peaks.engines_beside == [engine_child.pid]
    assert f"beside chatphase engine pid {engine_child.pid}" in peaks.conditions
    assert peaks.spread["read"]["passes"] >= 5 and peaks.copy_bandwidth_bytes_per_s > 0


def test_the_bench_measures_before_loading_its_engine_and_says_it_waited(engine_child):
    loaded_while_measuring = []

    class Recording(ScriptedTokenEngine):
        def load(self):
            loaded_while_measuring.append(running_engines(exclude=(os.getpid(),)))
            yield from super().load()

    plan = SweepPlan(prompt_lengths=(8,), depths=(0,), gen_tokens=2, reps=1, warmup=0)
    run = BenchRun(
        fake_model_info(),
        EngineConfig(n_ctx=256, n_threads=1),
        plan,
        engine_factory=lambda i, c: Recording(),
        builder=PromptBuilder(CharTokenizer()),
        quiet_wait_s=0.3,
    )
    statuses = [e.text for e in run if isinstance(e, BenchStatus)]
    assert statuses[0] == f"waiting up to 0.3 s for chatphase engine pid {engine_child.pid} to stop"
    assert statuses.index("measuring memory bandwidth and matmul FLOP/s") < next(
        i for i, s in enumerate(statuses) if s.startswith("loading")
    )
    assert loaded_while_measuring == [[engine_child.pid]]


def test_a_record_of_a_killed_engine_is_ignored(tmp_path):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        register(child.pid)
        assert running_engines() == [child.pid]
        child.kill()
        child.wait()
        assert running_engines() == []  # SIGKILL left the file: stale, removed
    finally:
        unregister(child.pid)
