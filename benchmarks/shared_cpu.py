"""Decode on a shared CPU: chatphase's thread policy against fixed thread counts and llama-bench.

Run (the real one, on a machine nobody else is using; ~15 min on 2 vCPUs):

    python -m benchmarks.shared_cpu --reps 5 --llama-bench --output benchmarks/results/shared_cpu-DATE.md

(``--llama-bench`` alone: ``scripts/llama_build.sh``'s build; ``--llama-bench PATH``: that one)

Smoke run (proves it works, numbers meaningless): ``--reps 1 --pp 32 --tg 16 --spin-s 60``.

Conditions: ``quiet``; ``busy1`` / ``busy2``: one / two spin loops that this script starts and always
stops (at the end of each condition, on Ctrl+C or any error; each also exits by itself after ``--spin-s``
seconds or as soon as this script is gone). Arms, on the same model and prompt tokens:

- ``auto``: chatphase's default (``--threads auto``: :mod:`chatphase.engine.threads.policy`);
- ``fixed N``: ``--threads N`` with N = the physical cores, and N = 1;
- ``llama-bench N`` (with ``--llama-bench``): llama.cpp's own tool at the same counts, ``-r 1``, repacking
  weights where chatphase does.

Each arm runs in its own engine child process (:class:`~chatphase.engine.process.host.EngineHost`, as the TUI and
``ask`` do), loaded once and kept: per repetition, a cold ``pp`` prompt (``--pp`` tokens, cache cleared,
1 token generated: TTFT and prefill tok/s) and a ``tg`` turn (1-token prompt, ``--tg`` tokens with the end
of sequence ignored: decode tok/s and ITL p50/p95/max, the definitions of ``docs/metrics.md``). Repetitions
are interleaved: rep 1 of every condition and arm, then rep 2, with the order of conditions and of arms
rotating each rep, so that no arm always runs first or on a machine that drifted. Before each arm the
machine rests ``--settle-s`` seconds: the auto arm's load sample covers about the last second, which
should hold the condition's spin loops, not the arm that ran just before. A turn still running
after ``--turn-timeout-s`` is cancelled and its figures cover the tokens it made (marked in the table).

Printed (and written to ``--output``): per condition, medians with the spread (min–max) over
repetitions, the ratio of decode tok/s to the best fixed arm of that condition, the threads the auto arm
used, then the targets with PASS/FAIL: quiet ≥ 0.97 × llama-bench at its best thread count on pp and tg;
under one and two busy processes, auto decode ≥ 0.9 × the best fixed arm and auto ITL p95 ≤ 2 × p50.
The load average is printed beside each condition's results: other processes skew every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import EngineTurns, greedy, llama_bench, load_note, machine_line, pp_tg, rotation, tool
from chatphase.engine.config import EngineConfig
from chatphase.engine.process.host import EngineHost
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model
from chatphase.system.cpu_features import physical_cores

CONDITIONS = {"quiet": 0, "busy1": 1, "busy2": 2}
#: the figures of a :class:`Sample` that have medians.
FIGURES = ("pp_tokens_per_s", "ttft_ms", "decode_tokens_per_s", "itl_ms_p50", "itl_ms_p95", "itl_ms_max")
#: a spin loop: stops after argv[1] seconds, or once its parent (this script) is gone.
SPIN = """
import os, sys, time
end, parent = time.monotonic() + float(sys.argv[1]), os.getppid()
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(100_000):
        pass
"""


class Spinners:
    """``n`` busy processes for the length of a ``with`` block (each bounded by ``max_s`` itself)."""

    def __init__(self, n: int, max_s: float) -> None:
        self.n, self.max_s = n, max_s
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Spinners:
        try:
            for _ in range(self.n):
                self.procs.append(subprocess.Popen([sys.executable, "-c", SPIN, str(self.max_s)]))
            if self.n:
                time.sleep(0.5)  # let them start spinning before the engine measures anything
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()
        self.procs.clear()


@dataclass
class Sample:
    """One repetition of one arm: rates in tokens/s, times in ms; ``threads`` as the auto arm reported."""

    pp_tokens_per_s: float | None
    ttft_ms: float | None
    decode_tokens_per_s: float | None
    itl_ms_p50: float | None = None
    itl_ms_p95: float | None = None
    itl_ms_max: float | None = None
    threads: str | None = None
    cancelled: bool = False


@dataclass
class Arm:
    key: str
    threads: int | None  # None = auto
    host: EngineHost | None = None  # None for llama-bench
    samples: dict[str, list[Sample]] = field(default_factory=dict)


class EngineArm:
    """Turns on one engine child process (loaded here; ``threads`` ``None`` = auto), each cancelled after
    ``timeout_s``."""

    def __init__(self, info, n_ctx: int, threads: int | None, timeout_s: float) -> None:
        self.turns = EngineTurns(info, EngineConfig(n_ctx=n_ctx, n_threads=threads), timeout_s=timeout_s)
        self.host = self.turns.host

    def turn(self, prompt: list[int], max_tokens: int):
        return self.turns.turn(prompt, greedy(max_tokens))

    def sample(self, prompt: list[int], short: list[int], n_tg: int) -> Sample:
        pp = self.turn(prompt, 1)
        tg = self.turn(short, n_tg)
        threads = None
        if tg.n_threads_decode is not None:
            threads = f"{pp.n_threads_prefill}/{tg.n_threads_decode}"
            if tg.decode_thread_changes:
                threads += f" ({tg.decode_thread_changes} changes)"
        return Sample(
            pp.prefill_tokens_per_s,
            pp.ttft_ms,
            tg.decode_tokens_per_s,
            tg.itl_ms_p50,
            tg.itl_ms_p95,
            tg.itl_ms_max,
            threads,
            cancelled="cancelled" in (pp.stop_reason, tg.stop_reason),
        )


def prompt_tokens(info, n: int) -> tuple[list[int], list[int]]:
    """``n`` prompt tokens and a 1-token prompt, from chatphase bench's prompt builder."""
    import llama_cpp

    from chatphase.bench.core.prompts import PromptBuilder

    vocab_only = llama_cpp.Llama(model_path=str(info.path), vocab_only=True, verbose=False)
    try:
        builder = PromptBuilder(vocab_only)
        return list(builder.tokens(n)), list(builder.tokens(1))
    finally:
        vocab_only.close()


def med(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs, digits: int = 1) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    m = statistics.median(xs)
    return f"{m:,.{digits}f} ({min(xs):,.{digits}f}–{max(xs):,.{digits}f})" if len(xs) > 1 else f"{m:,.{digits}f}"


def fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def condition_table(cond: str, arms: list[Arm], loads: list[str], args) -> tuple[list[str], dict]:
    """The markdown table of one condition and its medians per arm."""
    rows = [
        f"### {cond}: {CONDITIONS[cond]} busy process{'es' if CONDITIONS[cond] != 1 else ''} beside it",
        "",
        f"load before each rep: {'; '.join(loads)}",
        "",
        f"| arm | decode tok/s (tg{args.tg}) | × best fixed | ITL p50 ms | ITL p95 ms | ITL max ms | "
        f"TTFT ms (pp{args.pp}) | prefill tok/s | threads prefill/decode |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    medians = {a.key: {k: med(getattr(s, k) for s in a.samples[cond]) for k in FIGURES} for a in arms}
    fixed = [medians[a.key]["decode_tokens_per_s"] for a in arms if a.host is not None and a.threads is not None]
    best_fixed = max((x for x in fixed if x is not None), default=None)
    for a in arms:
        ss = a.samples[cond]
        m = medians[a.key]
        ratio = (
            fmt(m["decode_tokens_per_s"] / best_fixed, 2)
            if best_fixed and m["decode_tokens_per_s"] is not None and a.host is not None
            else "–"
        )
        threads = sorted({s.threads for s in ss if s.threads})
        mark = " (cut at --turn-timeout-s)" if any(s.cancelled for s in ss) else ""
        rows.append(
            f"| {a.key}{mark} | {spread([s.decode_tokens_per_s for s in ss])} | {ratio} | "
            f"{spread([s.itl_ms_p50 for s in ss], 2)} | {spread([s.itl_ms_p95 for s in ss], 2)} | "
            f"{spread([s.itl_ms_max for s in ss], 0)} | {spread([s.ttft_ms for s in ss], 0)} | "
            f"{spread([s.pp_tokens_per_s for s in ss], 0)} | {', '.join(threads) or (str(a.threads) if a.threads else '–')} |"
        )
    return rows, {"medians": medians, "best_fixed_decode": best_fixed}


def targets(summary: dict, arms: list[Arm], args) -> list[str]:
    """The module docstring's targets, each with PASS/FAIL (or why it was not checked)."""
    out = ["| target | measured | result |", "|---|---|---|"]

    def row(name: str, value: float | None, limit: float, ok: bool | None) -> None:
        verdict = "not measured" if ok is None else ("PASS" if ok else "FAIL")
        out.append(f"| {name} | {fmt(value, 2)} (needs {'≥' if 'ITL' not in name else '≤'} {limit:g}) | {verdict} |")

    if "quiet" in summary:
        m = summary["quiet"]["medians"]
        bench = [a.key for a in arms if a.host is None]
        for metric, label in (("pp_tokens_per_s", f"pp{args.pp}"), ("decode_tokens_per_s", f"tg{args.tg}")):
            best = max((m[k][metric] for k in bench if m[k][metric] is not None), default=None)
            value = m["auto"][metric] / best if best and m["auto"][metric] is not None else None
            row(f"quiet: auto {label} ÷ llama-bench at its best", value, 0.97, None if value is None else value >= 0.97)
    for cond in ("busy1", "busy2"):
        if cond not in summary:
            continue
        m, best = summary[cond]["medians"]["auto"], summary[cond]["best_fixed_decode"]
        value = m["decode_tokens_per_s"] / best if best and m["decode_tokens_per_s"] is not None else None
        row(f"{cond}: auto decode ÷ best fixed arm", value, 0.9, None if value is None else value >= 0.9)
        p50, p95 = m["itl_ms_p50"], m["itl_ms_p95"]
        ratio = p95 / p50 if p50 and p95 is not None else None
        row(f"{cond}: auto ITL p95 ÷ p50", ratio, 2, None if ratio is None else ratio <= 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path or name (default: the bundled SmolLM2-135M)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of every condition and arm (default 5)")
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens of the prefill turn (default 512)")
    ap.add_argument("--tg", type=int, default=128, help="generated tokens of the decode turn (default 128)")
    ap.add_argument("--conditions", default="quiet,busy1,busy2", help="comma-separated subset of quiet,busy1,busy2")
    ap.add_argument(
        "--llama-bench",
        nargs="?",
        const="",
        metavar="PATH",
        help="add llama.cpp's llama-bench arms (PATH, or scripts/llama_build.sh's build when none is given)",
    )
    ap.add_argument("--spin-s", type=float, default=1800.0, help="the longest a spin loop may live (default 1800)")
    ap.add_argument("--turn-timeout-s", type=float, default=60.0, help="cancel a turn after this (default 60)")
    ap.add_argument("--settle-s", type=float, default=1.5, help="rest before each arm (default 1.5)")
    ap.add_argument("--output", metavar="FILE", help="also write the markdown report here")
    ap.add_argument("--json", metavar="FILE", help="also write every sample as JSON")
    args = ap.parse_args(argv)
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    if args.reps < 1 or args.pp < 1 or args.tg < 2:
        ap.error("--reps and --pp must be >= 1 and --tg >= 2")
    if unknown := set(conditions) - set(CONDITIONS):
        ap.error(f"--conditions: unknown {', '.join(sorted(unknown))} (choose from {', '.join(CONDITIONS)})")
    bench_exe = None if args.llama_bench is None else tool("llama-bench", args.llama_bench or None)

    info = read_model_info(resolve_model(args.model))
    cores = physical_cores()
    counts = [cores, 1] if cores > 1 else [1]
    prompt, short = prompt_tokens(info, args.pp)
    n_ctx = args.pp + args.tg + 64
    header = [
        f"# Shared CPU — {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"`python -m benchmarks.shared_cpu {' '.join(sys.argv[1:] if argv is None else argv)}`",
        "",
        f"Machine: {machine_line()} at the start. Model {info.name} ({info.quantization}); pp{args.pp} / "
        f"tg{args.tg}, {args.reps} interleaved reps.",
        "",
    ]
    print("\n".join(header), flush=True)

    arms = [Arm("auto", None)] + [Arm(f"fixed {n}", n) for n in counts]
    if bench_exe:
        arms += [Arm(f"llama-bench {n}", n) for n in counts]
    for a in arms:
        a.samples = {c: [] for c in conditions}
    loads: dict[str, list[str]] = {c: [] for c in conditions}

    def on_signal(*_):
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a shell may start a background job ignoring it
        signal.signal(sig, on_signal)
    runners: dict[str, EngineArm] = {}
    try:
        for a in arms:
            if not a.key.startswith("llama-bench"):
                runners[a.key] = EngineArm(info, n_ctx, a.threads, args.turn_timeout_s)
                a.host = runners[a.key].host
                runners[a.key].sample(prompt, short, 8)  # warm-up, not counted
        for rep in range(args.reps):
            for cond in rotation(conditions, rep):
                with Spinners(CONDITIONS[cond], args.spin_s):
                    loads[cond].append(f"{os.getloadavg()[0]:.1f}")
                    for a in rotation(arms, rep):
                        time.sleep(args.settle_s)
                        if a.key in runners:
                            s = runners[a.key].sample(prompt, short, args.tg)
                        else:
                            try:
                                rows = llama_bench(
                                    bench_exe, info.path, a.threads, args.pp, args.tg, timeout_s=args.turn_timeout_s
                                )
                                pp, tg = pp_tg(rows)
                                s = Sample(pp, None, tg)
                            except subprocess.TimeoutExpired:
                                s = Sample(None, None, None, cancelled=True)
                        a.samples[cond].append(s)
                        print(
                            f"rep {rep + 1}/{args.reps} {cond:5} {a.key:14} pp {fmt(s.pp_tokens_per_s, 0):>6} "
                            f"tg {fmt(s.decode_tokens_per_s):>6} ITL p50/p95/max {fmt(s.itl_ms_p50, 2)}/"
                            f"{fmt(s.itl_ms_p95, 2)}/{fmt(s.itl_ms_max, 0)} ms  {s.threads or ''}",
                            flush=True,
                        )
    except KeyboardInterrupt:
        print("interrupted: the spin loops are stopped; results so far follow", file=sys.stderr)
    finally:
        for a in arms:
            if a.host is not None:
                a.host.close()

    report = list(header)
    summary = {}
    for cond in conditions:
        if not all(a.samples[cond] for a in arms):
            continue
        rows, summary[cond] = condition_table(cond, arms, loads[cond], args)
        report += [*rows, ""]
    report += ["## Targets", "", *targets(summary, arms, args), "", f"{load_note()} at the end."]
    text = "\n".join(report)
    print("\n" + "\n".join(report[len(header) :]))
    if args.output:
        Path(args.output).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(
            json.dumps({a.key: {c: [s.__dict__ for s in ss] for c, ss in a.samples.items()} for a in arms}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
