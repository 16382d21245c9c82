"""Old path of :mod:`chatphase.bench.core.results`, kept for ``commands/whatif.py`` and ``benchmarks/`` until they
import the new one (``load_result`` here reads a sweep or parallel result: :func:`chatphase.bench.experiments.load_bench_result`)."""

from chatphase.bench.core.results import BenchResult, save_result
from chatphase.bench.experiments import load_bench_result as load_result

__all__ = ["BenchResult", "load_result", "save_result"]
