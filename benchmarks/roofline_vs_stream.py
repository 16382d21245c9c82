"""chatphase's roofline peaks against a STREAM build, side by side on this machine.

Run: ``python -m benchmarks.roofline_vs_stream --stream PATH [--threads N] [--rounds 3] [--output FILE.md]``

``PATH`` is a STREAM binary built from McCalpin's ``stream.c`` (https://www.cs.virginia.edu/stream/), e.g.
``gcc -O3 -fopenmp -DSTREAM_ARRAY_SIZE=20000000 -DNTIMES=20 stream.c -o stream``. Each round runs, one
after the other, chatphase's :func:`chatphase.bench.core.peaks.measure_peaks` (read bandwidth as the best of
its read kernels, each kernel's best shown, and copy bandwidth on ``--threads`` threads, waiting for other
chatphase engines first) and the STREAM binary with
``OMP_NUM_THREADS=--threads``; the order alternates by round so that neither always runs first. It
prints (and with ``--output`` writes) a Markdown table of every round's figures in GB/s (10⁹ bytes/s;
STREAM prints MB/s = 10⁶ bytes/s), the machine (:func:`benchmarks.harness.machine_line`) and the load averages
before and after, so a busy machine shows in the record.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import load_note, machine_line, rotation
from chatphase.bench.core.peaks import measure_peaks

_STREAM_LINE = re.compile(r"^(Copy|Scale|Add|Triad):\s+([\d.]+)", re.MULTILINE)


def run_stream(path: str, threads: int) -> dict[str, float]:
    """STREAM's best rates in GB/s by kernel name."""
    out = subprocess.run(
        [path], capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)}
    ).stdout
    rates = {name: float(mb) / 1000 for name, mb in _STREAM_LINE.findall(out)}
    if set(rates) != {"Copy", "Scale", "Add", "Triad"}:
        raise SystemExit(f"{path} did not print STREAM's four kernels:\n{out}")
    return rates


def kernels(peaks) -> str:
    """The losing read kernels' best rates, GB/s."""
    return ", ".join(f"{k} {v / 1e9:.1f}" for k, v in peaks.read_kernels.items() if k != peaks.bandwidth_kernel)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stream", required=True, metavar="PATH", help="a STREAM binary (stream.c built with OpenMP)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for both (default: all CPUs)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output", metavar="FILE.md")
    args = p.parse_args(argv)

    machine_before = machine_line()
    rows = []
    for r in range(args.rounds):
        got: dict[str, object] = {}
        for which in rotation(("chatphase", "stream"), r):
            got[which] = (
                measure_peaks(threads=args.threads) if which == "chatphase" else run_stream(args.stream, args.threads)
            )
        rows.append(got)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    load_after = load_note()
    lines = [
        f"# Roofline peaks against STREAM ({platform.node() or 'this machine'})",
        "",
        f"- Machine before: {machine_before}",
        f"- Threads: {args.threads} for both (STREAM: OMP_NUM_THREADS={args.threads})",
        f"- After: {load_after}",
        f"- STREAM: `{args.stream}`; chatphase: `chatphase.bench.core.peaks.measure_peaks(threads={args.threads})`",
        "",
        "| round | chatphase read (winning kernel; others) | chatphase copy | STREAM Copy | STREAM Scale | STREAM Add "
        "| STREAM Triad | chatphase conditions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, row in enumerate(rows, start=1):
        peaks, stream = row["chatphase"], row["stream"]
        lines.append(
            f"| {i} | {peaks.bandwidth_bytes_per_s / 1e9:.1f} ({peaks.bandwidth_kernel}; {kernels(peaks)}) | "
            f"{peaks.copy_bandwidth_bytes_per_s / 1e9:.1f} | "
            f"{stream['Copy']:.1f} | {stream['Scale']:.1f} | {stream['Add']:.1f} | {stream['Triad']:.1f} | "
            f"{peaks.conditions} |"
        )
    last = rows[-1]["chatphase"]
    lines += [
        "",
        "GB/s = 10⁹ bytes/s; best pass of each kernel (STREAM: best of NTIMES after the first).",
        "",
        f"chatphase read method: {last.bandwidth_method}",
        "",
        f"chatphase copy method: {last.copy_method}",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
