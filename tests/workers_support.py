"""The suite's pytest-xdist workers, each on its own share of the CPUs (``tests/conftest.py`` pins them)."""

from __future__ import annotations

import os


def worker_cpus(index: int, count: int, cpus: list[int]) -> list[int]:
    """The CPUs of worker ``index`` of ``count`` over the allowed ``cpus``: every ``count``-th from its index (so
    an SMT machine's siblings, numbered a core count apart, stay together), one each round-robin when there are
    more workers than CPUs."""
    cpus = sorted(cpus)
    if not cpus or count < 1:
        return []
    if count <= len(cpus):
        return cpus[index % count :: count]
    return [cpus[index % len(cpus)]]


def pin_this_worker() -> list[int] | None:
    """Pin this process, where it is an xdist worker, to its share; the share, or None where nothing was pinned."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and count.isdigit() and hasattr(os, "sched_setaffinity")):
        return None
    share = worker_cpus(int(worker[2:]), int(count), list(os.sched_getaffinity(0)))
    if share:
        os.sched_setaffinity(0, share)
    return share or None
