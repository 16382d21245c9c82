"""The lesson's levers on real-size synthetic models: decode against llama-bench and against the roofline,
a quantised KV cache, and the cost of writing a synthetic 8B model.

Run: ``python -m benchmarks.levers [LLAMA_BENCH] [--dir FOLDER] [--parts write,decode,kv]
[--shapes llama-3.2-1b,qwen3-4b] [--gen 128] [--depth 1024] [--kv-depth 2048] [--kv-shape qwen3-0.6b] [--reps 2]
[--threads 2]
[--out benchmarks/results/levers-DATE.md]``

Parts:

- ``write``: ``chatphase models synth llama-3.1-8b:Q4_0`` in a child process: wall time and the child's
  peak RSS (``getrusage(RUSAGE_CHILDREN).ru_maxrss``) against one layer's tensor bytes (target: ≤ 2 min,
  memory under one layer).
- ``decode``: for each synthetic shape (Q4_0): llama-bench ``-p 0 -n GEN -d 0,DEPTH -r 1 --repack R -fa on
  -t THREADS`` (``R``: weight repacking as chatphase itself decides it on this CPU and build,
  :func:`chatphase.engine.local.llama_params.cpu_auto_plan` — off only on an AMX CPU whose build fails the
  AMX probe; without it llama.cpp decodes Q4_0 1.4× slower on a Zen 5) and chatphase's ``SweepRun`` (depths 0 and DEPTH, GEN tokens, the same threads and flash
  attention, one counted run each) **interleaved rep by rep**; ratios of medians (target ≥ 0.97×), and
  chatphase's roofline (peaks measured once, before, with no engine running) predicted vs measured at both
  depths (target ±20 %). measured ÷ roofline is printed as a number only up to 1.0: above it the line says
  so in words (:func:`chatphase.models.roofline.share_of_bound`: the peak read low), never a ratio above 1.
- ``kv``: a lever grid (``chatphase.bench.grid.run``) of ``--cache-type-k/-v f16,q8_0`` on synthetic
  Qwen3-0.6B Q4_0 (its KV cache is large beside its weights) at depth KV_DEPTH: KV bytes as llama.cpp printed
  them, decode measured and predicted for each, and where the quantised cache loses although the roofline
  predicted a gain, why (:func:`chatphase.bench.grid.result.lever_lines`).

Big files go to ``--dir`` (outside the repository, never committed). The results file states the machine's
load before and after and the machine (:func:`benchmarks.harness.machine_line`). Timing numbers belong here, never in unit tests.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.harness import (
    ROOT,
    llama_bench,
    load_note,
    machine_line,
    ratio,
    repack,
    rotation,
    synthetic_model,
    tool,
)
from chatphase.bench.core.events import RunDone
from chatphase.bench.core.peaks import measure_peaks
from chatphase.bench.grid.levers import LeverGrid
from chatphase.bench.grid.result import lever_lines
from chatphase.bench.grid.run import GridDone, GridRun
from chatphase.bench.sweep.loop import SweepPlan
from chatphase.bench.sweep.run import SweepRun
from chatphase.engine.config import EngineConfig
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.roofline import share_of_bound
from chatphase.models.synth import plan
from chatphase.models.synth_shapes import SHAPES
from chatphase.system.paths import cache_dir


def ensure(shape_key: str, quant: str, folder: Path) -> Path:
    """The synthetic file, written once (kept between runs in ``folder``)."""
    return synthetic_model(shape_key, quant, folder)


def part_write(folder: Path, lines: list[str]) -> None:
    shape = SHAPES["llama-3.1-8b"]
    synth = plan(shape, "Q4_0")
    target = folder / "write-test-llama-3.1-8b-Q4_0.gguf"
    target.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "chatphase", "models", "synth", "llama-3.1-8b:Q4_0", "-o", str(target)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: KiB
    size = target.stat().st_size
    target.unlink()
    lines += [
        "## Writing a synthetic Llama-3.1-8B Q4_0",
        "",
        f"- file {size / 1e9:.2f} GB ({synth.data_bytes:,} B of tensor data) written in **{wall:.1f} s** "
        f"(target ≤ 120 s), {size / wall / 1e6:.0f} MB/s",
        f"- peak RSS of the writing process **{rss / 2**20:.0f} MiB**; one layer's tensors are "
        f"{synth.largest_layer_bytes / 2**20:.0f} MiB (target: below that); the interpreter with NumPy, gguf and "
        "psutil imported is part of the RSS",
        "",
    ]


def vs_bound(measured: float, bound: float, phase: str = "decode") -> str:
    """measured ÷ bound as a number up to 1.0; above it, in words (the product's own judgement)."""
    share = share_of_bound(measured, bound, phase)
    if share is None:
        return "–"
    return share.text() if share.above else f"{share.fraction:.2f}"


def bench_tg(binary: str, model: Path, gen: int, depth: int, threads: int) -> dict[int, float]:
    """llama-bench tg at depths 0 and ``depth``, flash attention on: {depth: tokens/s} of one repetition."""
    rows = llama_bench(binary, model, threads, 0, gen, depths=(0, depth), flash_attn="on")
    return {int(r["n_depth"]): float(r["avg_ts"]) for r in rows}


def chatphase_decode(model: Path, gen: int, depth: int, threads: int, peaks, warmup: int) -> tuple[dict, dict]:
    """chatphase's decode at depths 0 and ``depth`` (one counted run each): ({depth: tok/s}, roofline)."""
    info = read_model_info(model)
    cfg = EngineConfig(n_ctx=max(depth, 256) + gen + 64, n_threads=threads, n_threads_batch=threads, flash_attn="on")
    # a 128-token prompt too: whatif --from takes the prefill efficiency from it
    sweep = SweepPlan(prompt_lengths=(128,), depths=(0, depth), gen_tokens=gen, reps=1, warmup=warmup, extend_tokens=1)
    result = None
    for event in SweepRun(info, cfg, sweep, peaks=peaks):
        if isinstance(event, RunDone):
            result = event.result
    assert result is not None
    got = {c.depth: c.decode_tokens_per_s.mean for c in result.results if c.kind == "depth"}
    bounds = {r["depth"]: r["decode_bound_tokens_per_s"] for r in result.roofline["cells"] if r["kind"] == "depth"}
    (model.parent / f"{model.stem}-bench.json").write_text(result.to_json(), encoding="utf-8")  # for whatif --from
    return got, bounds


def part_decode(args, folder: Path, lines: list[str], peaks) -> None:
    rp = int(repack())
    lines += [
        f"## Decode: chatphase vs llama-bench, and the roofline (Q4_0, tg{args.gen}, depths 0 and {args.depth}, "
        f"{args.threads} threads, flash attention on, {args.reps} interleaved reps)",
        "",
        f"llama-bench with `--repack {rp}` (weight repacking {'on' if rp else 'off'}, as chatphase decides it "
        "on this CPU and build).",
        "",
        f"Peaks (measured once before, no engine running): read {peaks.bandwidth_bytes_per_s / 1e9:.1f} GB/s "
        f"(kernel {peaks.bandwidth_kernel or '?'} won), matmul {peaks.flops_per_s / 1e9:.0f} GFLOP/s "
        f"({peaks.bandwidth_method}; {peaks.conditions}).",
        "",
        "| model | depth | llama-bench tok/s | chatphase tok/s | ratio | roofline tok/s | measured / roofline |",
        "| --- | --: | --: | --: | --: | --: | --: |",
    ]
    for key in args.shapes.split(","):
        model = ensure(key, "Q4_0", folder)
        lb: dict[int, list[float]] = {0: [], args.depth: []}
        cp: dict[int, list[float]] = {0: [], args.depth: []}
        bounds: dict = {}
        for rep in range(args.reps):
            for who in rotation(("lb", "cp"), rep):
                if who == "lb":
                    for d, v in bench_tg(args.llama_bench, model, args.gen, args.depth, args.threads).items():
                        lb[d].append(v)
                else:
                    got, bounds = chatphase_decode(
                        model, args.gen, args.depth, args.threads, peaks, warmup=int(rep == 0)
                    )
                    for d, v in got.items():
                        cp[d].append(v)
            print(f"levers: {key} rep {rep + 1}: llama-bench {lb}, chatphase {cp}", file=sys.stderr, flush=True)
        for d in (0, args.depth):
            r = ratio(cp[d], lb[d])
            a, b = statistics.median(lb[d]), statistics.median(cp[d])
            bound = bounds[d]
            lines.append(
                f"| {SHAPES[key].name} (synthetic) | {d} | {a:.2f} | {b:.2f} | {r.of_medians:.3f} | {bound:.2f} | "
                f"{vs_bound(b, bound)} |"
            )
    lines += [
        "",
        "Ratios are of medians over the reps; the roofline is chatphase's (`chatphase/bench/roofline.py`).",
        "",
    ]
    first = ensure(args.shapes.split(",")[0], "Q4_0", folder)
    whatif = subprocess.run(
        [sys.executable, "-m", "chatphase", "whatif", "--from", str(first.parent / f"{first.stem}-bench.json"),
         "--device", "rtx-4090,m2,rpi5", "--depths", f"0,{args.depth},8192", "--prompt-lengths", "512,2048,8192"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    lines += [
        f"## What-if from the last chatphase run of {SHAPES[args.shapes.split(',')[0]].name}",
        "",
        "```",
        whatif.stdout.strip() or whatif.stderr.strip(),
        "```",
        "",
    ]


def part_kv(args, folder: Path, lines: list[str], peaks) -> None:
    model = ensure(args.kv_shape, "Q4_0", folder)
    info = read_model_info(model)
    grid = LeverGrid({"type_k": ("f16", "q8_0"), "type_v": ("f16", "q8_0")})
    points = [p for p in grid.points()[0] if p.values["type_k"] == p.values["type_v"]]  # f16/f16 and q8_0/q8_0
    cfg = EngineConfig(n_ctx=args.kv_depth + args.gen + 64, n_threads=args.threads, n_threads_batch=args.threads,
                       flash_attn="on")  # fmt: skip
    sweep = SweepPlan(
        prompt_lengths=(), depths=(args.kv_depth,), gen_tokens=args.gen, reps=args.reps, warmup=args.warmup
    )
    result = None
    for event in GridRun(points, {None: info}, cfg, sweep, peaks={args.threads: peaks}):
        if isinstance(event, GridDone):
            result = event.result
    assert result is not None
    lines += [
        f"## KV cache q8_0 vs f16: synthetic {SHAPES[args.kv_shape].name} Q4_0 at depth {args.kv_depth} "
        f"({args.gen} tokens, {args.reps} interleaved reps + {args.warmup} warm-up, flash attention on)",
        "",
        "| K/V | KV B/token | KV cache as llama.cpp printed it | formula | decode tok/s | roofline tok/s | measured / roofline |",
        "| --- | --: | --: | --: | --: | --: | --: |",
    ]
    for c in result.cells:
        p = c.prediction
        printed = "–" if c.llama_kv_cache_bytes is None else f"{c.llama_kv_cache_bytes / 2**20:.2f} MiB"
        lines.append(
            f"| {c.levers['type_k']}/{c.levers['type_v']} | {c.kv_bytes_per_token:,} | {printed} | "
            f"{c.kv_capacity_bytes / 2**20:.2f} MiB | {c.cell.decode_tokens_per_s.mean:.2f} | "
            f"{p.decode_tokens_per_s:.2f} | {vs_bound(c.cell.decode_tokens_per_s.mean, p.decode_tokens_per_s)} |"
        )
    if len(result.cells) == 2:
        f16, q8 = result.cells
        measured = q8.cell.decode_tokens_per_s.mean / f16.cell.decode_tokens_per_s.mean
        predicted = q8.prediction.decode_tokens_per_s / f16.prediction.decode_tokens_per_s
        lines += [
            "",
            f"q8_0 / f16 decode: measured **{measured:.3f}×**, roofline **{predicted:.3f}×** (step bytes "
            f"{f16.prediction.step_bytes / 2**20:.0f} → {q8.prediction.step_bytes / 2**20:.0f} MiB: weights "
            f"{f16.weight_bytes_per_token / 2**20:.0f} MiB + KV at depth {args.kv_depth}).",
        ]
    lines += [""] + lever_lines(result.cells) + [""] + [f"note: {n}" for n in result.notes] + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "llama_bench",
        nargs="?",
        default=None,
        help="llama.cpp's llama-bench (default: scripts/llama_build.sh's build)",
    )
    ap.add_argument("--dir", help="where the synthetic GGUFs are kept (default: chatphase's user cache)")
    ap.add_argument("--parts", default="write,decode,kv")
    ap.add_argument("--shapes", default="llama-3.2-1b,qwen3-4b")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--depth", type=int, default=1024)
    ap.add_argument("--kv-depth", type=int, default=2048)
    ap.add_argument("--kv-shape", default="qwen3-0.6b", help="the synthetic shape of the kv part")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="uncounted runs per cell of the KV grid")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / f"levers-{datetime.now(UTC):%Y-%m-%d}.md"))
    args = ap.parse_args()
    folder = Path(args.dir) if args.dir else cache_dir() / "synthetic"
    folder.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    if "decode" in parts:
        args.llama_bench = tool("llama-bench", args.llama_bench)
    lines = [
        "# Levers on real-size synthetic models",
        "",
        f"- run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: `python -m benchmarks.levers {' '.join(sys.argv[1:])}`",
        f"- machine before: {machine_line()}",
        "- the machine is shared with other jobs: absolute rates are noisy, ratios measured side by side are the result",
        "",
    ]
    if "write" in parts:
        part_write(folder, lines)
    peaks = None
    if parts & {"decode", "kv"}:
        for key in args.shapes.split(",") if "decode" in parts else []:
            ensure(key, "Q4_0", folder)  # written before the peaks, so the writes do not disturb them
        if "kv" in parts:
            ensure(args.kv_shape, "Q4_0", folder)
        peaks = measure_peaks(threads=args.threads, threads_batch=args.threads)
    if "decode" in parts:
        part_decode(args, folder, lines, peaks)
    if "kv" in parts:
        part_kv(args, folder, lines, peaks)
    lines.append(f"- load after: {load_note()}")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"levers: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
