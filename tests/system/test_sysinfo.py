"""sysinfo.py: process RSS / CPU % and system memory via psutil, at a bounded rate."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chatphase.system.process import ProcessSampler


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_samples_own_process():
    clock = FakeClock()
    sampler = ProcessSampler(os.getpid(), min_interval_s=1.0, clock=clock)
    first = sampler.sample()
    assert first.process_alive and first.pid == os.getpid()
    assert first.rss_bytes > 1_000_000 and first.num_threads >= 1
    assert first.cpu_percent is None  # no previous sample to measure against
    assert 0 < first.mem_available_bytes <= first.mem_total_bytes
    sum(i * i for i in range(200_000))  # some CPU time between the samples
    clock.t += 1.0
    second = sampler.sample()
    assert second.cpu_percent is not None and second.cpu_percent >= 0


def test_rate_is_bounded():
    clock = FakeClock()
    sampler = ProcessSampler(os.getpid(), min_interval_s=1.0, clock=clock)
    first = sampler.sample()
    clock.t += 0.5
    assert sampler.sample() is first
    assert sampler.samples_taken == 1
    clock.t += 0.5
    assert sampler.sample() is not first
    assert sampler.samples_taken == 2


@pytest.mark.parametrize("pid", [None, 0, -5])
def test_no_process_gives_system_memory_only(pid):
    s = ProcessSampler(pid).sample()
    assert s.pid is None and not s.process_alive
    assert s.rss_bytes is None and s.cpu_percent is None and s.num_threads is None
    assert s.mem_available_bytes > 0


def test_process_that_exits_is_reported_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        clock = FakeClock()
        sampler = ProcessSampler(child.pid, min_interval_s=1.0, clock=clock)
        assert sampler.sample().process_alive
    finally:
        child.kill()
        child.wait()
    clock.t += 1.0
    gone = sampler.sample()
    assert not gone.process_alive and gone.rss_bytes is None
    assert not ProcessSampler(child.pid).sample().process_alive


def test_negative_interval_is_refused():
    with pytest.raises(ValueError):
        ProcessSampler(None, min_interval_s=-1)
