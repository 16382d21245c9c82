"""The thread policy: how many threads prefill and decode get, from what the machine can give now.

Pure functions of (cores, other processes' CPU load, recent inter-token gaps); the engine's
bookkeeping around them (when to sample, what to report) is :mod:`chatphase.engine.threads.governor`.

Why (measured on 2 vCPUs, no SMT, SmolLM2-135M; ``docs/architecture.md``): llama.cpp's OpenMP workers
spin at every barrier of the graph, so a worker that the OS preempts stalls all the others. Beside one
busy process, 2 threads decode at 27 tok/s where 1 thread keeps 64; beside a two-job compile 2 threads
fell to 5–25 tok/s and prefilled at 87 tok/s where 1 thread decoded at 80 and prefilled at 161. So:

- **Before each turn** a core counts as busy elsewhere when other processes use at least
  :data:`BUSY_CORE_SHARE` of one, and both prefill and decode get the cores that are left (at least one).
  That is where the two counts break even: with a core taken a share f of the time, 2 threads decode
  at about (1 − f) + f / 4 of their quiet speed (27/105 ≈ 1/4 while it is taken), 1 thread at 0.62 of
  it (65/105), equal at f ≈ 0.5 — and 2 threads' ITL is far worse long before that.
  Prefill is compute-bound and decode bandwidth-bound, but the barrier stall hits both alike (prefill on
  2 threads fell to 0.54× of 1 thread beside the compile), so they get the same count; a pinned count
  (``--threads``, ``--threads-batch``) is never changed.
- **During decode** a preempted worker shows in the gaps between tokens: the fastest gap of the turn at
  the current count is the baseline, and when the last :data:`WINDOW` gaps (at least :data:`MIN_GAPS`)
  took over :data:`SLOW_FACTOR` × the baseline each on average, decode drops one thread
  (``llama_set_n_threads`` between two tokens). The mean, not the median, because preemption makes the
  gaps bimodal: beside one busy process, 2 threads had a median gap of 14 ms (1.7× quiet) but a mean of
  48 ms (p95 167 ms). The odd slow gap (the chat UI redrawing, a page fault) moves the mean of 8 gaps
  too little to count. A fresh load sample, taken at most every 0.25 s and only while decode runs on
  fewer threads than cores, brings threads back when cores are free again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: other processes' load, in cores, from which a core counts as busy elsewhere (round half up: 0.5 → 1).
BUSY_CORE_SHARE = 0.5
#: gaps looked at: the last this many at the current thread count ...
WINDOW = 8
#: ... and no judgement on fewer than this many.
MIN_GAPS = 4
#: the window's mean gap over this × the fastest gap at the current count means preemption.
SLOW_FACTOR = 2.0

_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}


@dataclass(frozen=True)
class ThreadChoice:
    """Threads for one turn, and why (``"2 → 1: one core busy elsewhere (other load 1.00 cores)"``)."""

    n_threads_decode: int
    n_threads_prefill: int
    reason: str

    def fields(self) -> dict[str, Any]:
        """As :class:`~chatphase.engine.events.PrefillStarted`'s keyword arguments."""
        return {
            "n_threads_prefill": self.n_threads_prefill,
            "n_threads_decode": self.n_threads_decode,
            "threads_reason": self.reason,
        }


def busy_cores(other_load_cores: float) -> int:
    """Cores that ``other_load_cores`` of other processes' load keeps busy (see :data:`BUSY_CORE_SHARE`)."""
    return int(max(0.0, other_load_cores) + 1.0 - BUSY_CORE_SHARE)


def free_threads(cores: int, other_load_cores: float | None) -> int:
    """Threads the machine can give: ``cores`` minus the busy ones, at least 1 (all cores when unknown)."""
    if other_load_cores is None:
        return max(1, cores)
    return max(1, cores - busy_cores(other_load_cores))


def _cores_text(n: int, cores: int) -> str:
    if n >= cores:
        return "both cores" if cores == 2 else f"all {cores} cores"
    return f"{_WORDS.get(n, n)} core{'s' if n > 1 else ''}"


def choose_turn_threads(
    cores: int, other_load_cores: float | None, n_threads: int | None = None, n_threads_batch: int | None = None
) -> ThreadChoice:
    """The threads of the next turn.

    Args:
        cores: the cores the engine may use (≥ 1; :func:`chatphase.system.cpu_features.usable_cores`).
        other_load_cores: cores other processes used lately (:class:`chatphase.system.cpu_load.OtherCpuLoad`),
            ``None`` when not known yet.
        n_threads / n_threads_batch: pinned decode / prefill counts (``None`` = auto); a pinned decode
            count also pins prefill unless ``n_threads_batch`` says otherwise (llama.cpp's convention).
    """
    cores = max(1, cores)
    auto = free_threads(cores, other_load_cores)
    decode = n_threads or auto
    prefill = n_threads_batch or n_threads or auto
    if n_threads is not None and prefill == decode:
        return ThreadChoice(decode, prefill, f"{decode}: fixed (--threads)")
    if other_load_cores is None:
        why = f"{auto}: {_cores_text(cores, cores)}, no load sample yet"
    elif auto == cores:
        why = f"{auto}: no core busy elsewhere (other load {other_load_cores:.2f} cores)"
    else:
        busy = min(busy_cores(other_load_cores), cores)
        why = f"{cores} → {auto}: {_cores_text(busy, cores)} busy elsewhere (other load {other_load_cores:.2f} cores)"
    if n_threads is not None:
        why = f"decode {decode} fixed (--threads); prefill {why}"
    elif n_threads_batch is not None:
        why = f"{why}; prefill {prefill} fixed (--threads-batch)"
    return ThreadChoice(decode, prefill, why)


def preempted(gaps_ns: Sequence[float], fastest_ns: float) -> str | None:
    """Why the recent gaps (ns, at one thread count, newest last) show the engine preempted, or ``None``.

    ``fastest_ns`` is the baseline: the fastest gap at that count (or an estimate before one is seen).
    Looks at the last :data:`WINDOW` gaps; see the module docstring for the rule.
    """
    window = list(gaps_ns)[-WINDOW:]
    if fastest_ns <= 0 or len(window) < MIN_GAPS:
        return None
    ratio = sum(window) / len(window) / fastest_ns
    if ratio <= SLOW_FACTOR:
        return None
    return f"decode preempted (last {len(window)} gaps {ratio:.1f}× the fastest, {fastest_ns / 1e6:.1f} ms)"


def decode_step(
    n: int, cores: int, gaps_ns: Sequence[float], fastest_ns: float | None, other_load_cores: float | None = None
) -> tuple[int, str] | None:
    """A change of the decode thread count between two tokens, as ``(new count, reason)``, or ``None``.

    Args:
        n: the current count; cores: the most decode may use.
        gaps_ns: gaps (ns) since the count became ``n``, newest last; fastest_ns: the fastest of them.
        other_load_cores: a fresh load sample when the caller took one (only then can threads go up,
            one at a time, to what :func:`free_threads` allows).
    """
    if n > 1 and fastest_ns is not None:
        why = preempted(gaps_ns, fastest_ns)
        if why:
            return n - 1, why
    if other_load_cores is not None and n < cores:
        target = free_threads(cores, other_load_cores)
        if target > n:
            return n + 1, f"{_cores_text(target, cores)} free again (other load {other_load_cores:.2f} cores)"
    return None
