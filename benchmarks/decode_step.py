"""Decode per token, broken down and compared fairly: chatphase against llama.cpp's own tools, in one run.

Run: ``python -m benchmarks.decode_step [--llama-bench PATH] [--llama-completion PATH] [--llama-batched-bench PATH]
[--reps 4] [--depths 1024,4096] [--gen 128] [--pp 512] [--output FILE]``
(the tools: by default ``scripts/llama_tools_build.sh``'s build, :func:`benchmarks.harness.tool`)

Arms, interleaved rep by rep (the order rotating), all with 2 threads (``--threads``) on the same model:

- ``chatphase`` — the engine in its child process (:class:`benchmarks.harness.EngineTurns`, chatphase's
  defaults otherwise), ``TurnRequest(prompt_token_ids=..., reset_cache=True, ignore_eos=True)``; decode rate
  = (tokens − 1) / (t_last − t_first), the engine's own clock. Greedy and with chatphase's default sampler
  chain (top-k 40, top-p 0.95, min-p 0.05, temperature 0.7, seeded), at depth 0 and at each of ``--depths``
  (one engine whose ``n_ctx`` holds the deepest with room, as a chat's context has). At each depth also with
  ``n_ctx`` = depth + ``--gen``, as llama-bench sizes its context: llama.cpp attends over the used cells rounded
  up to 256 (``llama_kv_cache::get_n_kv``, so that a step's graph stays the same and is reused), at most
  ``n_ctx``, so only an engine sized as llama-bench's attends over the same cells a step.
- ``llama-completion`` — llama.cpp's completion tool with the same sampler chain in the same order
  (``--samplers top_k;top_p;min_p;temperature``) or greedy (``--temp 0``), ``--ignore-eos``. It samples
  every token as chatphase does, so it is the fair reference for decode at depth 0. Its rate is taken
  from its own perf lines: (n_eval) / (total − prompt-eval time), i.e. llama_decode + sampling + the
  rest of its loop, as chatphase's clock counts.
- ``llama-bench`` — ``pp512`` and ``tg128`` at depth 0 and each depth (no sampling at all: a bound);
  ``--pp`` and ``--gen`` change the 512 and 128 (and every arm's 128 tokens).
- ``llama-batched-bench`` — one sequence (``-npl 1``) after a prompt of each depth, with the ``n_ctx`` of
  chatphase's deep engine: llama.cpp's own decode over the same padded cells as that engine (its TG speed, no
  sampling).

The breakdown (``--breakdown``, default on): chatphase's engine in this process, its turn timed by the
engine's clock, llama.cpp's own counters read after it: ``llama_perf_context`` (time inside
``llama_decode`` for the decode steps) and the sampler chain's cost per call on the turn's last logits;
what remains of the TPOT is chatphase's Python per token (piece lookup, UTF-8, stop check, the thread
policy, the event).

Each ratio is judged by the median of its per-rep ratios (the two arms run in the same rep), which a
shared machine's drift from one minute to the next moves less than the ratio of the arms' medians.

On AMX CPUs whose llama.cpp build fails chatphase's AMX probe, the tools get ``--repack 0`` / ``-nr``, as
chatphase turns extra buffer types off. Results name the CPU and the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks.harness import (
    EngineTurns,
    batched_bench,
    greedy,
    llama_bench,
    llama_completion,
    machine_line,
    pp_tg,
    ratio,
    rotation,
    tool,
)
from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.logfile import default_log_path
from chatphase.engine.prompting.vocab import VocabFile
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model


def sampled(gen: int) -> SamplingParams:
    """chatphase's default sampler chain, seeded, ``gen`` tokens."""
    return SamplingParams(max_tokens=gen, temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, seed=1)


FIRST_TOKEN = SamplingParams(max_tokens=1, temperature=0.0)


def host(info, n_ctx: int, threads: int | None) -> EngineTurns:
    """chatphase's engine in its child process with ``n_ctx`` and ``threads`` (prefill and decode)."""
    return EngineTurns(info, EngineConfig(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads))


def bench_d(exe: str, model: str, threads: int, depth: int, n_pp: int, n_tg: int) -> tuple[float, float]:
    """pp ``n_pp`` and tg ``n_tg`` at ``depth`` (``-r 1``): (prompt tok/s, decode tok/s)."""
    return pp_tg(llama_bench(exe, model, threads, n_pp, n_tg, depths=(depth,), timeout_s=600))


def breakdown(info, threads: int, prompt: list[int], sampling: SamplingParams, reps: int) -> dict:
    """The decode step, in this process: the engine's own loop with its two llama.cpp calls timed
    (``llama_decode``, and ``llama_sampler_sample``, which reads the logits and runs the sampler chain);
    what is left of each step is chatphase's Python. The timers add two clock reads per call."""
    from chatphase.engine.local import generation
    from chatphase.engine.local.llama import LlamaEngine

    lc = generation.lc
    real_decode, real_sample = lc.llama_decode, lc.llama_sampler_sample
    spent: dict[str, list[int]] = {"decode": [], "sample": []}
    clock = time.perf_counter_ns

    def timed(name, fn):
        def call(*args):
            t0 = clock()
            try:
                return fn(*args)
            finally:
                spent[name].append(clock() - t0)

        return call

    eng = LlamaEngine(info, EngineConfig(n_ctx=2048, n_threads=threads, n_threads_batch=threads))
    list(eng.load())
    rows = []
    try:
        for rep in range(reps):
            req = TurnRequest(rep, prompt_token_ids=tuple(prompt), reset_cache=True, ignore_eos=True, sampling=sampling)
            spent.update(decode=[], sample=[])
            # the loop binds both calls when a turn starts (generation.generate), so patch around the turn only
            lc.llama_decode, lc.llama_sampler_sample = timed("decode", real_decode), timed("sample", real_sample)
            try:
                m = next(e for e in eng.run_turn(req) if isinstance(e, TurnFinished)).metrics
            finally:
                lc.llama_decode, lc.llama_sampler_sample = real_decode, real_sample
            decodes = spent["decode"][1:]  # the first call is the prompt's prefill (one chunk)
            rows.append(
                {
                    "tpot_ms": m.decode_ms / (m.decode_tokens - 1),
                    "llama_decode_ms": sum(decodes) / 1e6 / len(decodes),
                    "sample_ms": sum(spent["sample"]) / 1e6 / len(spent["sample"]),
                }
            )
    finally:
        eng.close()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    med["python_ms"] = med["tpot_ms"] - med["llama_decode_ms"] - med["sample_ms"]
    return med


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path or name (default: the bundled SmolLM2-135M)")
    ap.add_argument("--llama-bench", metavar="PATH", help="default: scripts/llama_tools_build.sh's build")
    ap.add_argument("--llama-completion", metavar="PATH", help="default: scripts/llama_tools_build.sh's build")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-batched-bench", metavar="PATH", help="default: scripts/llama_tools_build.sh's build")
    ap.add_argument("--depths", default="1024,4096", help="the deep arms' context depths (default 1024,4096)")
    ap.add_argument("--gen", type=int, default=128, help="decoded tokens a turn (default 128: tg128)")
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens of the prefill arm (default 512: pp512)")
    ap.add_argument("--output", metavar="FILE", help="write the results as Markdown")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.pp < 1 or args.gen < 2:
        ap.error("--reps and --pp must be >= 1 and --gen >= 2")
    gen, n_pp = args.gen, args.pp
    GREEDY, SAMPLED, tg, pp = greedy(gen), sampled(gen), f"tg{gen}", f"pp{n_pp}"
    bench_exe = tool("llama-bench", args.llama_bench)
    completion_exe = tool("llama-completion", args.llama_completion)
    batched_exe = tool("llama-batched-bench", args.llama_batched_bench)
    try:
        depths = sorted({int(x) for x in args.depths.split(",")})
    except ValueError:
        ap.error(f"--depths: comma-separated token counts (got {args.depths!r})")
    if not depths or depths[0] < 1:
        ap.error("--depths must be >= 1")

    info = read_model_info(resolve_model(args.model))
    with VocabFile(info.path, default_log_path()) as vocab:
        builder = PromptBuilder(EngineTokenizer(vocab))
        short, prompt = (list(builder.tokens(n)) for n in (16, n_pp))
        deep = {d: list(builder.tokens(d)) for d in depths}
        text = builder.text(short[len(builder.prefix) :])
    # a chat's context: room past the deepest arm (a multiple of 1024, at least 2048)
    n_ctx = max(2048, -(-(depths[-1] + gen + 256) // 1024) * 1024)
    full = host(info, n_ctx, args.threads)
    # llama-bench sizes its context to depth + n_gen; llama.cpp attends over the used cells rounded up to 256
    # (at most n_ctx), so at depth 1024 it reads 1152 cells a step where a larger n_ctx reads 1280: an arm
    # sized as llama-bench's compares the same work, and llama-batched-bench at chatphase's n_ctx the other way
    tight = {d: host(info, d + gen, args.threads) for d in depths}
    n_batch = full.loaded.settings.n_batch if full.loaded else 512
    n_ubatch = full.loaded.settings.n_ubatch if full.loaded else 512
    head = (
        f"model {info.name} ({info.quantization}); {args.threads} threads; {args.reps} interleaved reps; "
        f"chatphase's deep engine n_ctx {n_ctx}; {machine_line()}"
    )
    print(head, flush=True)
    arms: dict[str, list[float]] = {}
    loads = []

    def add(key, value):
        arms.setdefault(key, []).append(value)

    def batched_tg(d: int) -> float:
        got = batched_bench(batched_exe, str(info.path), args.threads, n_ctx, n_batch, n_ubatch, d, gen, (1,), 900)
        return got[1]["speed_tg"]

    steps = [
        ("chatphase greedy d0", lambda: full.turn(short, GREEDY).decode_tokens_per_s),
        ("chatphase sampled d0", lambda: full.turn(short, SAMPLED).decode_tokens_per_s),
        (f"chatphase {pp}", lambda: n_pp / (full.turn(prompt, FIRST_TOKEN).ttft_ms / 1000)),
        (
            "llama-completion greedy d0",
            lambda: llama_completion(completion_exe, str(info.path), args.threads, text, GREEDY)["tok_s"],
        ),
        (
            "llama-completion sampled d0",
            lambda: llama_completion(completion_exe, str(info.path), args.threads, text, SAMPLED)["tok_s"],
        ),
    ]
    for d in depths:
        steps += [
            (f"chatphase greedy d{d}", lambda d=d: full.turn(deep[d], GREEDY).decode_tokens_per_s),
            (f"chatphase greedy d{d} n_ctx {d + gen}", lambda d=d: tight[d].turn(deep[d], GREEDY).decode_tokens_per_s),
            (f"llama-batched-bench tg{gen} d{d} n_ctx {n_ctx}", lambda d=d: batched_tg(d)),
        ]
    try:
        full.turn(short, GREEDY)  # warm-up
        for engine in tight.values():
            engine.turn(short, GREEDY)
        for rep in range(args.reps):
            loads.append(os.getloadavg()[0])
            for key, fn in rotation(steps, rep):
                add(key, fn())
            for depth in (0, *depths):
                pp_rate, tg_rate = bench_d(bench_exe, str(info.path), args.threads, depth, n_pp, gen)
                add(f"llama-bench {tg} d{depth}", tg_rate)
                if depth == 0:
                    add(f"llama-bench {pp}", pp_rate)
            print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in arms.items()), flush=True)
    finally:
        full.close()
        for engine in tight.values():
            engine.close()
    parts = {k: breakdown(info, args.threads, short, sp, 3) for k, sp in (("greedy", GREEDY), ("sampled", SAMPLED))}

    med = {k: statistics.median(v) for k, v in arms.items()}
    ratios = [
        ("decode d0, greedy", "chatphase greedy d0", "llama-completion greedy d0", 0.97),
        ("decode d0, sampled", "chatphase sampled d0", "llama-completion sampled d0", 0.97),
    ]
    for d in depths:
        ratios += [
            (f"decode d{d}, n_ctx {n_ctx} (more cells than llama-bench's)", f"chatphase greedy d{d}",
             f"llama-bench {tg} d{d}", None),
            (f"decode d{d}, n_ctx as llama-bench's", f"chatphase greedy d{d} n_ctx {d + gen}", f"llama-bench {tg} d{d}",
             0.97),
            (f"decode d{d}, n_ctx as llama-batched-bench's", f"chatphase greedy d{d}",
             f"llama-batched-bench tg{gen} d{d} n_ctx {n_ctx}", 0.97),
        ]  # fmt: skip
    ratios += [
        (f"prefill {pp}", f"chatphase {pp}", f"llama-bench {pp}", 0.97),
        ("decode d0 against llama-bench (no sampling: a bound)", "chatphase greedy d0", f"llama-bench {tg} d0", None),
    ]
    lines = [
        f"# Decode per token — {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"`python -m benchmarks.decode_step {' '.join(argv or sys.argv[1:])}`",
        "",
    ]
    lines += [head + f"; load average before each rep: {'; '.join(f'{x:.1f}' for x in loads)}.", ""]
    lines += ["| arm | tok/s median | range |", "|---|---:|---|"]
    lines += [f"| {k} | {med[k]:.1f} | {min(v):.1f}–{max(v):.1f} |" for k, v in arms.items()]
    lines += [
        "",
        "Ratios: the median of the per-rep ratios (both arms ran in the same rep, a minute apart at most) is the"
        " figure to judge by on a shared machine whose speed drifts from one minute to the next; the ratio of"
        " the two arms' medians is beside it.",
        "",
        "| ratio | chatphase ÷ reference, per rep (median) | ratio of medians | target |",
        "|---|---:|---:|---|",
    ]
    for name, a, b, target in ratios:
        r = ratio(arms[a], arms[b])
        verdict = "–" if target is None else ("✅" if r.median_of_ratios >= target else "❌") + f" ≥ {target}"
        lines.append(f"| {name} ({a} ÷ {b}) | {r.median_of_ratios:.3f} | {r.of_medians:.3f} | {verdict} |")
    lines += ["", f"Decode step breakdown (in-process engine, medians of 3 turns of {gen} tokens at depth 0):", ""]
    lines += [
        "| sampler | TPOT ms | llama_decode ms | sampling ms | chatphase Python ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for k, p in parts.items():
        lines.append(
            f"| {k} | {p['tpot_ms']:.3f} | {p['llama_decode_ms']:.3f} | {p['sample_ms']:.3f} | {p['python_ms']:.3f} |"
        )
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    if args.output:
        Path(args.output).write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
