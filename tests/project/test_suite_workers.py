"""The suite's parallel workers: each on its own CPUs, and the engines they start sized to that share."""

from __future__ import annotations

import os

import pytest
from workers_support import worker_cpus

from chatphase.system.cpu_features import usable_cores


def test_two_workers_on_two_cpus_get_one_each():
    assert [worker_cpus(i, 2, [0, 1]) for i in range(2)] == [[0], [1]]


def test_an_smt_machine_keeps_siblings_together():
    # Linux numbers a 2-core SMT machine's siblings 0/2 and 1/3
    assert [worker_cpus(i, 2, [3, 1, 0, 2]) for i in range(2)] == [[0, 2], [1, 3]]


def test_more_workers_than_cpus_share_round_robin_and_none_is_left_out():
    shares = [worker_cpus(i, 3, [0, 1]) for i in range(3)]
    assert shares == [[0], [1], [0]]


def test_no_cpus_or_no_workers_pins_nothing():
    assert worker_cpus(0, 2, []) == [] and worker_cpus(0, 0, [0, 1]) == []


@pytest.mark.skipif("PYTEST_XDIST_WORKER" not in os.environ, reason="runs in one process (-n 0)")
def test_this_worker_is_pinned_and_an_engine_would_size_its_threads_to_it():
    count = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    mask = os.sched_getaffinity(0)
    if count > 1:
        assert len(mask) < (os.cpu_count() or 1)
    assert 1 <= usable_cores() <= len(mask)
