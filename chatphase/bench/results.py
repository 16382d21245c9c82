"""Old path of :mod:`chatphase.bench.core.results`, kept for ``commands/whatif.py`` and ``benchmarks/`` until they import the new one."""

from chatphase.bench.core.results import BenchResult, load_result, save_result

__all__ = ["BenchResult", "load_result", "save_result"]
