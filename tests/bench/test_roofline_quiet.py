"""Roofline peaks with chatphase engines beside the measurement (real processes): the measurement waits
for a busy engine to stop, names one that stays busy, neither waits for nor names an idle one (the chat
TUI's own while its Experiments screen measures), and the bench measures before it loads its own engine.
Sizes are tiny: this checks the conditions, not the figures."""

from __future__ import annotations

import os
import threading
import time

import pytest
from bench_support import CharTokenizer, ScriptedTokenEngine
from fake_engine import fake_model_info

from chatphase.bench.core.peaks import measure_peaks
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.sweep.loop import SweepPlan
from chatphase.bench.sweep.run import BenchStatus, SweepRun
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import ModelLoaded
from chatphase.system.engine_registry import busy_engines, engine_cpu_s, register, running_engines, unregister

TINY = dict(array_bytes=2**20, matmul_n=32, max_s=0.05)


@pytest.fixture
def engine_child(default_model_info, tmp_path):
    from chatphase.engine.process.host import EngineHost

    host = EngineHost(default_model_info, EngineConfig(n_ctx=256), log_path=str(tmp_path / "engine.log"))
    assert isinstance(list(host.load())[-1], ModelLoaded)
    yield host
    host.close()


def test_an_engine_child_is_registered_while_it_runs(engine_child):
    assert running_engines() == [engine_child.pid]
    engine_child.close()
    assert running_engines() == []


@pytest.fixture
def busy_engine():
    """A registered "engine" that spins one core (as OpenMP workers do during and after a turn)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    register(child.pid)
    yield child
    child.kill()
    child.wait()
    unregister(child.pid)


def test_peaks_wait_for_a_busy_engine_to_stop(busy_engine):
    closed_at: list[float] = []

    def close_soon():
        time.sleep(1.0)
        busy_engine.kill()
        busy_engine.wait()
        closed_at.append(time.monotonic())

    threading.Thread(target=close_soon, daemon=True).start()
    t0 = time.monotonic()
    peaks = measure_peaks(threads=1, quiet_wait_s=60, **TINY)
    assert closed_at and peaks.waited_s >= closed_at[0] - t0 - 0.3  # measured only after the child ended
    assert peaks.engines_beside == [] and peaks.conditions.startswith("measured with no chatphase engine busy")


def test_peaks_name_an_engine_that_stays_busy(busy_engine):
    peaks = measure_peaks(threads=1, quiet_wait_s=0.3, **TINY)
    assert peaks.engines_beside == [busy_engine.pid]
    assert peaks.engines_before == [busy_engine.pid]
    assert f"beside chatphase engine pid {busy_engine.pid} (still busy after 0." in peaks.conditions
    assert peaks.spread["read"]["passes"] >= 5 and peaks.copy_bandwidth_bytes_per_s > 0


def test_an_idle_engine_child_is_neither_waited_for_nor_named(engine_child):
    """The chat TUI's engine waiting for a message uses next to no CPU: it cannot lower the peaks, and
    advice to close it could not be followed from the TUI's Experiments screen."""
    time.sleep(0.5)  # past the load's last spinning workers
    peaks = measure_peaks(threads=1, quiet_wait_s=3, **TINY)
    assert running_engines() == [engine_child.pid]  # it is still there, just idle
    assert peaks.waited_s < 1.5 and peaks.engines_beside == []
    assert peaks.conditions == "measured with no chatphase engine busy beside it"


def test_an_engine_busy_during_the_measurement_or_started_since_counts(busy_engine):
    before, t0 = engine_cpu_s(), time.monotonic()
    time.sleep(0.3)
    assert busy_engines(before, time.monotonic() - t0) == [busy_engine.pid]
    assert busy_engines({}, 0.3) == [busy_engine.pid]  # not in the snapshot: it started meanwhile
    assert busy_engines(before, time.monotonic() - t0, exclude=(busy_engine.pid,)) == []


def _bench(engine_factory, quiet_wait_s=0.3):
    plan = SweepPlan(prompt_lengths=(8,), depths=(0,), gen_tokens=2, reps=1, warmup=0)
    return SweepRun(
        fake_model_info(),
        EngineConfig(n_ctx=256, n_threads=1),
        plan,
        engine_factory=engine_factory,
        builder=PromptBuilder(CharTokenizer()),
        quiet_wait_s=quiet_wait_s,
    )


def test_the_bench_measures_before_loading_its_engine_and_says_it_waited(busy_engine):
    loaded_while_measuring = []

    class Recording(ScriptedTokenEngine):
        def load(self):
            loaded_while_measuring.append(running_engines(exclude=(os.getpid(),)))
            yield from super().load()

    run = _bench(lambda i, c: Recording())
    statuses = [e.text for e in run if isinstance(e, BenchStatus)]
    assert statuses[0] == f"waiting up to 0.3 s for busy chatphase engine pid {busy_engine.pid}"
    assert statuses.index("measuring memory bandwidth and matmul FLOP/s") < next(
        i for i, s in enumerate(statuses) if s.startswith("loading")
    )
    assert loaded_while_measuring == [[busy_engine.pid]]


def test_the_bench_beside_an_idle_engine_does_not_wait_or_warn(engine_child):
    time.sleep(0.5)
    events = list(_bench(lambda i, c: ScriptedTokenEngine(), quiet_wait_s=3))
    statuses = [e.text for e in events if isinstance(e, BenchStatus)]
    assert not any(s.startswith("waiting") for s in statuses)
    roofline = events[-1].result.roofline
    assert "measured beside" not in str(roofline) and "no chatphase engine busy" in roofline["conditions"]


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


def test_an_engine_busy_only_during_the_measurement_is_said_so():
    """No wait ran out: the engine started its work once the measurement had begun (seen: "busy after 0 s of
    waiting" of another user's engine, which read as if chatphase had not waited)."""
    from chatphase.bench.core.peaks import MachinePeaks

    during = MachinePeaks(1e10, "read", 1e11, "matmul", engines_beside=[4242], waited_s=0.25)
    assert "pid 4242 (busy during the measurement)" in during.conditions
    before = MachinePeaks(1e10, "read", 1e11, "matmul", engines_beside=[4242], engines_before=[4242], waited_s=10.2)
    assert "pid 4242 (still busy after 10.2 s of waiting)" in before.conditions
