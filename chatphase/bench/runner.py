"""Old path of :mod:`chatphase.bench.core.runner`, kept for ``commands/whatif.py`` and ``benchmarks/`` until they import the new one."""

from chatphase.bench.core.runner import SweepPlan, SweepProgress

__all__ = ["SweepPlan", "SweepProgress"]
