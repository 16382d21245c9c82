"""Old path of :mod:`chatphase.bench.core.peaks`, kept for ``commands/whatif.py`` and ``benchmarks/`` until they import the new one."""

from chatphase.bench.core.peaks import measure_peaks

__all__ = ["measure_peaks"]
