"""The machine's peaks for the roofline (:mod:`chatphase.bench.core.roofline`): memory bandwidth and matmul
FLOP/s, measured here, honestly.

- **Quiet first**: other chatphase engines that are busy (using CPU: a turn, a load, OpenMP workers
  spinning after one) are waited for (up to ``quiet_wait_s``; they register in
  :mod:`chatphase.system.engine_registry`), because such workers beside a bandwidth test make it read
  far low (11.6 against 18.5 GB/s seen on 2 vCPUs). An idle engine (one waiting for a turn, as the chat
  TUI's own while its Experiments screen measures) cannot lower a peak and is neither waited for nor
  named. The bench measures before it loads its own engine. Engines busy before or during the
  measurement are named in the method text.
- **Repeated until stable**: passes run until the best three agree within :data:`STABLE_TOLERANCE`
  (or :data:`MAX_PASSES` / ``max_s`` run out); the best pass counts, as STREAM reports, and the spread
  (min, median, max over the passes) is kept and printed.
- **At the engine's thread count**: the arrays are split over ``threads`` Python threads (NumPy
  releases the GIL in every kernel, BLAS is held to one thread per Python thread for the read kernels);
  BLAS is limited to ``threads_batch`` threads (threadpoolctl) for the matmul, the count prefill runs on.
- **Read: the best of several kernels** (:data:`READ_KERNELS`). A read bound must be one that decode
  cannot beat, and one kernel is not enough: ``numpy.add.reduce`` on float64 (pairwise summation) is
  limited by its own arithmetic on one or two threads of a fast core (33 GB/s on a Zen 5 where llama.cpp
  decoding read ≥ 37 GB/s of weights). The kernels are what llama.cpp's decode resembles — a float32
  matrix-vector product (BLAS ``sgemv``), SIMD min/max and nonzero counts — and the plain sum; every
  pass counts only the bytes read, the best kernel's best pass is the read bandwidth, and which kernel won
  is said (:attr:`MachinePeaks.bandwidth_kernel`, :attr:`MachinePeaks.read_kernels`).
- **Copy** is STREAM's Copy kernel (``numpy.copyto``, read + write bytes counted), the figure to compare
  with a STREAM build (``benchmarks/roofline_vs_stream.py``; ``benchmarks/results/`` holds one comparison).
- FLOP/s: a float32 ``numpy.matmul`` of two n × n matrices, ``2 n³`` FLOPs per product.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

#: the best three passes must lie within this fraction of the best for a figure to count as stable.
STABLE_TOLERANCE = 0.03
MIN_PASSES, MAX_PASSES = 5, 40
#: the longest a chatphase engine is waited for before measuring anyway (seconds).
QUIET_WAIT_S = 10.0


@dataclass(frozen=True)
class Repeated:
    """Rates of the timed passes of one kernel (units of the caller), best first in :attr:`best`."""

    rates: tuple[float, ...]
    stable: bool

    @property
    def best(self) -> float:
        return max(self.rates)

    def spread(self) -> dict:
        """``min``, ``median``, ``max`` and ``passes``: what the method text and the JSON report."""
        return {
            "min": min(self.rates),
            "median": statistics.median(self.rates),
            "max": max(self.rates),
            "passes": len(self.rates),
            "stable": self.stable,
        }

    def describe(self, scale: float, unit: str) -> str:
        s = self.spread()
        state = "stable" if self.stable else f"not stable within {STABLE_TOLERANCE:.0%}"
        return (
            f"best of {s['passes']} passes, spread {s['min'] / scale:.1f}–{s['max'] / scale:.1f} {unit} "
            f"(median {s['median'] / scale:.1f}; {state})"
        )


def repeat_until_stable(run_once: Callable[[], float], max_s: float = 3.0) -> Repeated:
    """Call ``run_once`` (returns a rate) until the best three rates are within :data:`STABLE_TOLERANCE`
    of the best, at least :data:`MIN_PASSES` and at most :data:`MAX_PASSES` times or ``max_s`` seconds."""
    rates: list[float] = []
    t0 = time.perf_counter()
    while True:
        rates.append(run_once())
        top = sorted(rates, reverse=True)[:3]
        stable = len(rates) >= MIN_PASSES and top[-1] >= top[0] * (1 - STABLE_TOLERANCE)
        if stable or len(rates) >= MAX_PASSES or (len(rates) >= MIN_PASSES and time.perf_counter() - t0 > max_s):
            return Repeated(tuple(rates), stable)


def _slices(n: int, threads: int) -> list[slice]:
    import numpy as np  # here: the TUI imports this module (MachinePeaks), and NumPy would cost it ~0.1 s

    bounds = np.linspace(0, n, threads + 1, dtype=np.int64)
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


#: the read kernels (name -> what it runs), each over a whole slice of one buffer, counting its bytes read.
READ_KERNELS: dict[str, str] = {
    "sgemv": "float32 matrix-vector product (numpy.dot, BLAS sgemv on one thread per Python thread)",
    "max": "float32 maximum (numpy.maximum.reduce, SIMD)",
    "count_nonzero": "int8 nonzero count (numpy.count_nonzero, SIMD)",
    "sum": "float64 sum (numpy.add.reduce, pairwise)",
}
#: columns of the matrix the ``sgemv`` kernel views a slice as (its vector, 16 KiB, stays in L1).
_GEMV_COLUMNS = 4096


def _read_kernel(name: str, buf, sl: slice) -> Callable[[], object]:
    """One read pass of kernel ``name`` over ``buf[sl]`` (``buf`` bytes as uint8; ``sl`` in bytes, a whole
    multiple of the kernel's row)."""
    import numpy as np

    part = buf[sl]
    if name == "sgemv":
        rows = part.view(np.float32).reshape(-1, _GEMV_COLUMNS)
        ones = np.ones(_GEMV_COLUMNS, dtype=np.float32)
        return lambda: rows @ ones
    if name == "max":
        x = part.view(np.float32)
        return lambda: np.maximum.reduce(x)
    if name == "count_nonzero":
        y = part.view(np.int8)
        return lambda: np.count_nonzero(y)
    z = part.view(np.float64)
    return lambda: np.add.reduce(z)


def _timed(pool: ThreadPoolExecutor, work: Sequence[Callable[[], object]], nbytes: int, max_s: float) -> Repeated:
    """Run ``work`` (one callable per thread) together until stable; rates in bytes/s of ``nbytes`` a pass."""
    list(pool.map(lambda f: f(), work))  # touch every page once before timing

    def once() -> float:
        t = time.perf_counter()
        list(pool.map(lambda f: f(), work))
        return nbytes / (time.perf_counter() - t)

    return repeat_until_stable(once, max_s)


def measure_bandwidth(
    kind: str = "copy",
    array_bytes: int = 128 * 2**20,
    threads: int = 1,
    max_s: float = 3.0,
    kernels: tuple[str, ...] | None = None,
) -> tuple[Repeated, str]:
    """Memory bandwidth in bytes per second: ``kind`` ``"read"`` (the best of ``kernels``, default all of
    :data:`READ_KERNELS`; see :func:`measure_read`) or ``"copy"`` (STREAM Copy, read + write bytes counted),
    over ``threads`` threads on arrays of ``array_bytes`` each (far above the last-level cache). Returns
    the winning kernel's passes and a description of the method.

    Raises:
        ValueError: an unknown ``kind`` or kernel, or a non-positive size or thread count.
    """
    if kind == "read":
        best, method, _ = measure_read(array_bytes, threads, max_s, kernels)
        return best, method
    import numpy as np  # here: the TUI imports this module (MachinePeaks), and NumPy would cost it ~0.1 s

    if kind != "copy" or array_bytes <= 0 or threads < 1:
        raise ValueError("kind must be read or copy; array_bytes and threads must be positive")
    n = max(threads, array_bytes // 8)
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    work = [lambda sl=sl: np.copyto(dst[sl], src[sl]) for sl in _slices(n, threads)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        passes = _timed(pool, work, 2 * n * 8, max_s)
    what = "STREAM-style Copy (numpy.copyto, read + write bytes counted)"
    method = f"{what} of {n * 8 / 2**20:.0f} MiB float64 arrays on {threads} thread(s), {passes.describe(1e9, 'GB/s')}"
    return passes, method


def measure_read(
    array_bytes: int = 128 * 2**20, threads: int = 1, max_s: float = 3.0, kernels: tuple[str, ...] | None = None
) -> tuple[Repeated, str, dict[str, float]]:
    """Read bandwidth (bytes/s): every kernel of ``kernels`` (default all of :data:`READ_KERNELS`) reads one
    buffer of ``array_bytes`` split over ``threads`` threads, each until stable (``max_s`` shared among
    them); the best kernel wins. Returns its passes, the method (naming the winner and the others' best)
    and each kernel's best rate by name.

    Raises:
        ValueError: an unknown kernel, or a non-positive size or thread count.
    """
    import numpy as np  # here: the TUI imports this module (MachinePeaks), and NumPy would cost it ~0.1 s
    from threadpoolctl import threadpool_limits

    names = tuple(kernels or READ_KERNELS)
    if array_bytes <= 0 or threads < 1 or not names or any(k not in READ_KERNELS for k in names):
        raise ValueError(f"kernels must be among {', '.join(READ_KERNELS)}; array_bytes and threads must be positive")
    row = _GEMV_COLUMNS * 4  # every slice a whole number of matrix rows (and of float64s)
    rows = max(threads, array_bytes // row)
    buf = np.ones(rows * row // 8, dtype=np.float64).view(np.uint8)  # ones: no NaN, no zeros to skip
    slices = [slice(s.start * row, s.stop * row) for s in _slices(rows, threads)]
    results: dict[str, Repeated] = {}
    with ThreadPoolExecutor(max_workers=threads) as pool, threadpool_limits(limits=1, user_api="blas"):
        for name in names:
            work = [_read_kernel(name, buf, sl) for sl in slices]
            results[name] = _timed(pool, work, buf.nbytes, max_s / len(names))
    winner = max(results, key=lambda k: results[k].best)
    best = results[winner]
    others = ", ".join(f"{k} {r.best / 1e9:.1f}" for k, r in results.items() if k != winner)
    method = (
        f"read, best of {len(names)} kernels on {buf.nbytes / 2**20:.0f} MiB and {threads} thread(s): "
        f"{winner} won — {READ_KERNELS[winner]}, {best.describe(1e9, 'GB/s')}"
        + (f"; the others' best: {others} GB/s" if others else "")
    )
    return best, method, {k: r.best for k, r in results.items()}


def measure_matmul_flops(n: int = 1024, threads: int | None = None, max_s: float = 3.0) -> tuple[Repeated, str]:
    """float32 matrix-multiply FLOP/s (``2 n³`` FLOPs per product) with BLAS on ``threads`` threads
    (``None``: BLAS's own count). Returns the passes and the method.

    Raises:
        ValueError: when an argument is not positive.
    """
    import numpy as np  # here: the TUI imports this module (MachinePeaks), and NumPy would cost it ~0.1 s

    if n < 1 or (threads is not None and threads < 1):
        raise ValueError("n and threads must be positive")
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    with threadpool_limits(limits=threads, user_api="blas"):
        a @ b  # warm-up (thread pool start, page faults)

        def once() -> float:
            t = time.perf_counter()
            a @ b
            return 2.0 * n**3 / (time.perf_counter() - t)

        passes = repeat_until_stable(once, max_s)
    on = f"BLAS on {threads} thread(s)" if threads else "BLAS on its own thread count"
    return passes, f"numpy.matmul float32 {n}×{n} (2n³ FLOPs, {on}), {passes.describe(1e9, 'GFLOP/s')}"


@dataclass(frozen=True)
class MachinePeaks:
    """Measured peaks: ``bandwidth_bytes_per_s`` (read bandwidth: the decode bound's) and
    ``flops_per_s``, each with the method that measured it; ``copy_bandwidth_bytes_per_s`` (STREAM
    Copy, for comparison), ``spread`` per kernel (:meth:`Repeated.spread`), ``threads`` /
    ``threads_batch`` used, ``engines_beside`` (pids of chatphase engines busy before or during the
    measurement, idle ones not counted: ``[]`` for a clean one), ``engines_before`` those of them still busy
    when the wait for them ran out, and ``waited_s`` the wait;
    ``bandwidth_kernel`` the read kernel that won and ``read_kernels`` each one's best (bytes/s)."""

    bandwidth_bytes_per_s: float
    bandwidth_method: str
    flops_per_s: float
    flops_method: str
    copy_bandwidth_bytes_per_s: float | None = None
    copy_method: str = ""
    spread: dict = field(default_factory=dict)
    threads: int | None = None
    threads_batch: int | None = None
    engines_beside: list[int] = field(default_factory=list)
    waited_s: float = 0.0
    bandwidth_kernel: str = ""
    read_kernels: dict[str, float] = field(default_factory=dict)
    engines_before: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)

    @property
    def conditions(self) -> str:
        """One sentence on the conditions: quiet, or beside which engines."""
        if not self.engines_beside:
            waited = f" (waited {self.waited_s:.1f} s for one to stop)" if self.waited_s >= 0.5 else ""
            return f"measured with no chatphase engine busy beside it{waited}"
        pids = ", ".join(map(str, self.engines_beside))
        when = (  # busy before the measurement (the wait ran out) or only once it had begun
            f"still busy after {self.waited_s:.1f} s of waiting"
            if self.engines_before
            else "busy during the measurement"
        )
        return (
            f"measured beside chatphase engine pid {pids} ({when}): "
            "the peaks may read low; let it finish or close it, and measure again"
        )


def measure_peaks(
    threads: int = 1,
    threads_batch: int | None = None,
    quiet_wait_s: float = QUIET_WAIT_S,
    array_bytes: int = 128 * 2**20,
    matmul_n: int = 1024,
    max_s: float = 3.0,
) -> MachinePeaks:
    """Wait for other busy chatphase engines (up to ``quiet_wait_s``), then measure read (the best of
    :data:`READ_KERNELS`) and copy bandwidth on ``threads`` threads and matmul FLOP/s on ``threads_batch`` (default ``threads``) BLAS
    threads; engines busy before or during the measurement are named (idle ones are not). A quiet measurement's
    FLOP/s is kept as this machine's peak (:func:`chatphase.system.machine_peaks.record_flops`)."""
    from chatphase.system.engine_registry import busy_engines, engine_cpu_s, wait_until_quiet
    from chatphase.system.machine_peaks import record_flops

    me = (os.getpid(),)
    waited, busy_before = wait_until_quiet(quiet_wait_s, exclude=me)
    before, t0 = engine_cpu_s(me), time.monotonic()
    read, read_method, kernels = measure_read(array_bytes, threads, max_s)
    copy, copy_method = measure_bandwidth("copy", array_bytes, threads, max_s)
    flops, flops_method = measure_matmul_flops(matmul_n, threads_batch or threads, max_s)
    beside = sorted(set(busy_before) | set(busy_engines(before, time.monotonic() - t0, me)))
    if not beside:  # kept for the chat's TTFT bound (machine_peaks); one measured beside a busy engine reads low
        record_flops(flops.best, threads_batch or threads, flops_method)
    return MachinePeaks(
        bandwidth_bytes_per_s=read.best,
        bandwidth_method=read_method,
        flops_per_s=flops.best,
        flops_method=flops_method,
        copy_bandwidth_bytes_per_s=copy.best,
        copy_method=copy_method,
        spread={"read": read.spread(), "copy": copy.spread(), "matmul": flops.spread()},
        threads=threads,
        threads_batch=threads_batch or threads,
        engines_beside=beside,
        waited_s=waited,
        bandwidth_kernel=max(kernels, key=kernels.__getitem__),
        read_kernels=kernels,
        engines_before=sorted(busy_before),
    )
