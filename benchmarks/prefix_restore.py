"""Prefix restore: TTFT of a turn after a long history — cold, from the in-memory KV cache, and restored from
the prefix store on disk (page cache warm, and dropped) — and the decision rule checked against it.

Run: ``python -m benchmarks.prefix_restore [--models default,synth:llama-3.2-1b]
[--depths 1024,2048,4096,8192] [--reps 3] [--drop fadvise|root|none] [--out FILE.md]``

Per model and history depth ``D`` (tokens), in one engine child (:class:`~chatphase.engine.process.host.
EngineHost`), the store in a temporary directory (``CHATPHASE_CACHE_DIR``), a turn of ``D`` history tokens plus
a 32-token new message ``Q``, greedy, ``--gen`` tokens, end of sequence ignored. Arms, each rep:

- ``cold``: the KV cache cleared (``reset_cache``), ``D + Q`` prefilled;
- ``memory``: ``D`` evaluated first, then ``D + Q`` with the cache kept: only ``Q`` is prefilled;
- ``disk warm``: the cache emptied by a one-token turn, then ``D + Q`` with the store on: the history's state
  is read from the store's file (saved once per depth by a turn on ``D`` and an engine close), in the page cache;
- ``disk dropped``: the same after the file's pages were dropped — ``--drop fadvise`` (the default, no root
  needed): ``posix_fadvise(POSIX_FADV_DONTNEED)`` on the file, which drops its clean pages; ``--drop root``:
  ``echo 1 > /proc/sys/vm/drop_caches`` (the whole page cache; root only); ``none``: the arm is left out.

TTFT is the engine's own (``TurnMetrics.ttft_ms``: submit to first token, restore included). The disk's
sequential read rate is measured by reading the store's largest file after dropping its pages (8 MiB reads).
Reported: per depth the median TTFT of each arm, disk ÷ cold, the restore's ms, bytes and bytes/s against
the disk's rate and against ``bytes ÷ measured rate`` (the rule's prediction), and whether the rule
(:func:`chatphase.engine.restore_policy.decide_restore`, fed this run's cold prefill rate and restore rate)
chose what measured quicker; the crossover depth below which recomputing wins follows from a line fitted
to the restore times (fixed cost + bytes ÷ rate) against the cold prefill rate.

Timing figures belong here, never in unit tests; run it on a quiet machine (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import greedy, load_note, machine_line, rotation, synthetic_model
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, PrefillStarted, TurnFinished, TurnRequest
from chatphase.engine.restore_policy import decide_restore

SYNTH_1B = "synth:llama-3.2-1b"  # written once into the user cache (benchmarks.harness.synthetic_model)
ARMS = ("cold", "memory", "disk warm", "disk dropped")
Q_TOKENS = 32


@dataclass
class Depth:
    """One depth's measurements: TTFT ms per arm, and the disk arms' restore figures."""

    depth: int
    ttft: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})
    restore_ms: dict[str, list[float]] = field(default_factory=lambda: {"disk warm": [], "disk dropped": []})
    restore_bytes: int | None = None
    prefill_ms: list[float] = field(default_factory=list)  # cold arm's prefill of D + Q
    notes: list[str] = field(default_factory=list)


def drop_pages(path: Path, how: str) -> None:
    """Drop ``path``'s pages from the page cache (see the module docstring for ``how``)."""
    if how == "root":
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_read_rate(path: Path, how: str) -> float:
    """Sequential read rate of ``path`` with its pages dropped first, bytes per second."""
    drop_pages(path, how)
    t0 = time.perf_counter()
    total = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(8 << 20):
            total += len(chunk)
    return total / (time.perf_counter() - t0)


class Engine:
    """The engine child with the store in ``store``; :meth:`turn` returns ``(PrefillStarted, TurnMetrics)``."""

    def __init__(self, info, config: EngineConfig) -> None:
        from chatphase.engine.process.host import EngineHost

        self.host = EngineHost(info, config)
        self._turn = 0
        for ev in self.host.load():
            if isinstance(ev, EngineFailed):
                self.host.close()
                raise SystemExit(f"chatphase engine failed to load: {ev.message}")

    def turn(self, prompt, *, reset: bool, store: bool, gen: int):
        self._turn += 1
        req = TurnRequest(
            self._turn,
            prompt_token_ids=tuple(prompt),
            reset_cache=reset,
            ignore_eos=True,
            sampling=greedy(gen),
            prefix_store=store,
        )
        started = metrics = None
        for ev in self.host.run_turn(req):
            if isinstance(ev, EngineFailed):
                raise SystemExit(f"chatphase engine failed: {ev.message}")
            if isinstance(ev, PrefillStarted):
                started = ev
            if isinstance(ev, TurnFinished):
                metrics = ev.metrics
        if started is None or metrics is None:
            raise SystemExit("chatphase engine ended a turn without metrics")
        return started, metrics

    def close(self) -> None:
        self.host.close()


def measure_model(spec: str, depths: list[int], reps: int, gen: int, threads: int | None, drop: str):
    """Every depth's :class:`Depth` for the model ``spec``, and the store's largest file (for the disk rate)."""
    from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder
    from chatphase.engine.local.prefix_store import SUFFIX, store_dir
    from chatphase.engine.logfile import default_log_path
    from chatphase.engine.prompting.vocab import VocabFile
    from chatphase.models.gguf_meta import read_model_info
    from chatphase.models.resolve import resolve_model

    info = read_model_info(resolve_model(None if spec == "default" else spec))
    config = EngineConfig(n_ctx=max(depths) + Q_TOKENS + gen + 256, n_threads=threads, prefix_cache="on")
    with VocabFile(info.path, default_log_path()) as vocab:
        builder = PromptBuilder(EngineTokenizer(vocab))
        prompts = {depth: list(builder.tokens(depth + Q_TOKENS)) for depth in depths}
    engine = Engine(info, config)
    results = []
    try:
        for depth in depths:
            tokens = prompts[depth]
            history = tokens[:depth]
            # the state of the history, saved once: a store turn on it, then a close (which saves)
            engine.turn(history, reset=True, store=False, gen=1)
            engine.turn(history, reset=False, store=True, gen=1)
            engine.close()
            engine = Engine(info, config)
            files = sorted(store_dir().glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_size)
            d = Depth(depth)
            for rep in range(reps):
                for arm in rotation(list(ARMS), rep):
                    if arm == "disk dropped" and drop == "none":
                        continue
                    if arm == "cold":
                        _, m = engine.turn(tokens, reset=True, store=False, gen=gen)
                        d.prefill_ms.append(m.prefill_ms or 0.0)
                    elif arm == "memory":
                        engine.turn(history, reset=True, store=False, gen=1)
                        _, m = engine.turn(tokens, reset=False, store=False, gen=gen)
                    else:
                        engine.turn([tokens[-1]], reset=True, store=False, gen=1)  # empties the KV cache
                        if arm == "disk dropped" and files:
                            drop_pages(files[-1], drop)
                        started, m = engine.turn(tokens, reset=False, store=True, gen=gen)
                        if not started.restored_tokens:
                            d.notes.append(f"{arm}: not restored ({started.restore_note or 'no stored prefix'})")
                            continue
                        d.restore_ms[arm].append(started.restore_ms or 0.0)
                        d.restore_bytes = started.restore_bytes
                    if m.ttft_ms is not None:
                        d.ttft[arm].append(m.ttft_ms)
            results.append(d)
    finally:
        engine.close()
    files = sorted(store_dir().glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_size)
    return info.name, results, (files[-1] if files else None)


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fmt(x: float | None, digits: int = 0) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def report(name: str, results: list[Depth], disk_bps: float | None) -> list[str]:
    """The Markdown lines of one model's results."""
    lines = [
        f"### {name}",
        "",
        "| history tok | cold TTFT ms | memory TTFT ms | disk warm TTFT ms | disk dropped TTFT ms | warm ÷ cold "
        "| restore ms warm / dropped | restore MiB | restore MB/s warm | rule | measured quicker |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    fixed, per_byte = fit_restore(results)
    for d in results:
        cold, warm = med(d.ttft["cold"]), med(d.ttft["disk warm"])
        r_warm, r_drop = med(d.restore_ms["disk warm"]), med(d.restore_ms["disk dropped"])
        prefill = med(d.prefill_ms)
        rate = d.restore_bytes / r_warm * 1000 if d.restore_bytes and r_warm else None
        rule = "–"
        if d.restore_bytes and prefill:
            verdict = decide_restore(d.restore_bytes, d.depth, rate, (d.depth + Q_TOKENS) / prefill * 1000)
            rule = "restore" if verdict.restore else "prefill"
        quicker = "–" if cold is None or warm is None else ("restore" if warm < cold else "prefill")
        lines.append(
            f"| {d.depth:,} | {fmt(cold)} | {fmt(med(d.ttft['memory']))} | {fmt(warm)} | "
            f"{fmt(med(d.ttft['disk dropped']))} | {fmt(warm / cold if warm and cold else None, 3)} | "
            f"{fmt(r_warm, 1)} / {fmt(r_drop, 1)} | {fmt(d.restore_bytes / 2**20 if d.restore_bytes else None, 1)} | "
            f"{fmt(rate / 1e6 if rate else None)} | {rule} | {quicker} |"
        )
    lines.append("")
    if disk_bps:
        lines.append(f"Disk sequential read (the largest stored file, pages dropped): {disk_bps / 1e6:,.0f} MB/s.")
    if per_byte is not None and fixed is not None:
        lines.append(f"Restore time fitted: {fixed:.1f} ms + bytes ÷ {1 / per_byte / 1e3:,.0f} MB/s (page cache warm).")
        lines.append(crossover_line(results, fixed, per_byte))
    for d in results:
        lines.extend(f"- {d.depth:,}: {n}" for n in sorted(set(d.notes)))
    return [*lines, ""]


def fit_restore(results: list[Depth]) -> tuple[float | None, float | None]:
    """Least squares ``restore_ms = fixed + per_byte × bytes`` over the warm restores."""
    pts = [(d.restore_bytes, ms) for d in results if d.restore_bytes for ms in d.restore_ms["disk warm"]]
    if len({b for b, _ in pts}) < 2:
        return None, None
    slope, intercept = statistics.linear_regression([float(b) for b, _ in pts], [ms for _, ms in pts])
    return intercept, slope


def crossover_line(results: list[Depth], fixed: float, per_byte: float) -> str:
    """The depth below which recomputing is quicker: ``fixed + per_byte × bytes/token × n = n ÷ prefill rate``."""
    rows = [(d.restore_bytes / d.depth, (d.depth + Q_TOKENS) / med(d.prefill_ms)) for d in results if d.restore_bytes and d.prefill_ms]  # fmt: skip
    if not rows:
        return "Crossover: no measured restores."
    bytes_per_token, ms_per_token = rows[0][0], statistics.median(r[1] for r in rows) ** -1
    margin = ms_per_token - per_byte * bytes_per_token
    if margin <= 0:
        return "Crossover: none — recomputing is quicker at every depth here."
    if fixed <= 0:
        return "Crossover: none measured — the fitted fixed cost of a restore is not above zero."
    n = fixed / margin
    return f"Crossover: recomputing wins below ≈ {n:,.0f} history tokens (restore fixed cost ÷ per-token saving)."


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prefix_restore", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=f"default,{SYNTH_1B}", help="comma list of model specs (default: %(default)s)")
    p.add_argument("--depths", default="1024,2048,4096,8192", help="history tokens, comma list")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--gen", type=int, default=4, help="tokens generated per turn")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--drop", choices=("fadvise", "root", "none"), default="fadvise")
    p.add_argument("--out", type=Path, default=None, help="write the Markdown report here too")
    args = p.parse_args(argv)
    try:
        depths = [int(x) for x in args.depths.split(",") if x]
    except ValueError:
        p.error("--depths takes a comma list of token counts")
    if args.drop == "root" and os.geteuid() != 0:
        p.error("--drop root needs root (use --drop fadvise)")
    lines = [
        "## Prefix restore: TTFT cold, from memory, restored from disk",
        "",
        f"Machine: {machine_line()}",
        f"Reps {args.reps}, gen {args.gen}, new message {Q_TOKENS} tokens, page drop: {args.drop}.",
        "",
    ]
    for spec in [m for m in args.models.split(",") if m]:
        if spec.startswith("synth:"):  # written once into the user cache, before the store's own dir is set below
            spec = str(synthetic_model(spec.removeprefix("synth:")))
        if spec != "default" and not Path(spec).exists():
            lines.append(f"{spec}: not found, skipped")
            continue
        with tempfile.TemporaryDirectory(prefix="chatphase-prefix-bench-") as tmp:
            os.environ["CHATPHASE_CACHE_DIR"] = tmp
            name, results, largest = measure_model(spec, depths, args.reps, args.gen, args.threads, args.drop)
            disk = disk_read_rate(largest, args.drop) if largest and args.drop != "none" else None
            lines.extend(report(name, results, disk))
    lines.append(f"After: {load_note()}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
