"""Old path of :mod:`chatphase.bench.sweep.run`, kept for ``commands/whatif.py`` and ``benchmarks/`` until they import the new one."""

from chatphase.bench.sweep.run import BenchDone, BenchRun, BenchStatus, system_facts

__all__ = ["BenchDone", "BenchRun", "BenchStatus", "system_facts"]
