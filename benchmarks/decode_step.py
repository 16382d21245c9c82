"""Decode per token, broken down and compared fairly: chatphase against llama.cpp's own tools, in one run.

Run: ``python -m benchmarks.decode_step [--llama-bench PATH] [--llama-completion PATH] [--llama-batched-bench PATH]
[--reps 4] [--samples 3] [--depths 1024,4096] [--gen 128] [--pp 512] [--output FILE]``
(the tools: by default ``scripts/llama_build.sh``'s build, :func:`benchmarks.harness.tool`)

Arms, interleaved rep by rep (the order rotating), all with 2 threads (``--threads``) on the same model:

- ``chatphase`` — the engine in its child process (:class:`benchmarks.harness.EngineTurns`, chatphase's
  defaults otherwise), ``TurnRequest(prompt_token_ids=..., reset_cache=True, ignore_eos=True)``; decode rate
  = (tokens − 1) / (t_last − t_first), the engine's own clock. Greedy and with chatphase's default sampler
  chain (top-k 40, top-p 0.95, min-p 0.05, temperature 0.7, seeded), at depth 0 and at each of ``--depths``
  (an ``n_ctx`` that holds the deepest with room, as a chat's context has). At each depth also with
  ``n_ctx`` = depth + ``--gen``, as llama-bench sizes its context: llama.cpp attends over the used cells rounded
  up to 256 (``llama_kv_cache::get_n_kv``, so that a step's graph stays the same and is reused), at most
  ``n_ctx``, so only an engine sized as llama-bench's attends over the same cells a step. Each deep arm has its
  own engine whose depth is prefilled once, before the first rep; a rep runs ``--samples`` turns that reuse that
  prefix (one prompt token evaluated, as in a chat's next turn; checked) and takes their median.
- ``llama-completion`` — llama.cpp's completion tool with the same sampler chain in the same order
  (``--samplers top_k;top_p;min_p;temperature``) or greedy (``--temp 0``), ``--ignore-eos``. It samples
  every token as chatphase does, so it is the fair reference for decode at depth 0. Its rate is taken
  from its own perf lines: (n_eval) / (total − prompt-eval time), i.e. llama_decode + sampling + the
  rest of its loop, as chatphase's clock counts.
- ``llama-bench`` — ``pp512`` and ``tg128`` at depth 0, ``tg128`` at each depth (no sampling at all: a bound),
  ``-r --samples`` and the median of its reps (it prefills a depth once and restores it before each rep);
  ``--pp`` and ``--gen`` change the 512 and 128 (and every arm's 128 tokens).
- ``llama-batched-bench`` — one sequence (``-npl 1``) after a prompt of each depth, with the ``n_ctx`` of
  chatphase's deep engine: llama.cpp's own decode over the same padded cells as that engine (its TG speed, no
  sampling).

In one process (:func:`in_process`, ``--inproc-reps``): the tools above run as whole processes minutes apart, and
this machine's speed drifts by ±15 % between minutes, which is more than the gap to find. So at depth 0 and each
depth, on the one llama.cpp library the bindings load, turn by turn: chatphase's engine (its ``llama_decode`` and
``llama_sampler_sample`` calls timed, so its TPOT splits into llama.cpp's step, sampling and chatphase's Python
per token: piece lookup, UTF-8, stop check, the thread policy, the event), then llama.cpp's own one-token loop
(llama-bench's ``test_gen``) on a context with the engine's parameters and on llama-bench's context, these two
step by step (A B, B A, …). Their ratios split chatphase ÷ llama-bench into chatphase's own cost per step and the
context's (``n_ctx``, and with it the attended cells); the tool arms add what differs between the two builds.

Each ratio is judged by the median of its per-rep ratios (the two arms run in the same rep), which a
shared machine's drift from one minute to the next moves less than the ratio of the arms' medians.

On AMX CPUs whose llama.cpp build fails chatphase's AMX probe, the tools get ``--repack 0`` / ``-nr``, as
chatphase turns extra buffer types off. Results name the CPU and the load.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness import (
    EngineTurns,
    batched_bench,
    greedy,
    llama_bench,
    llama_completion,
    machine_line,
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


def bench_d(exe: str, model: str, threads: int, depth: int, n_pp: int, n_tg: int, reps: int) -> tuple[float, float]:
    """pp ``n_pp`` (0: none) and tg ``n_tg`` at ``depth``, ``-r reps``: the median of each test's reps
    (prompt tok/s, decode tok/s; ``nan`` where a test is absent)."""
    rows = llama_bench(exe, model, threads, n_pp, n_tg, depths=(depth,), timeout_s=900, reps=reps)
    got = {"pp": float("nan"), "tg": float("nan")}
    for row in rows:
        got["pp" if not row.get("n_gen") else "tg"] = statistics.median(map(float, row["samples_ts"]))
    return got["pp"], got["tg"]


class RawLoop:
    """llama.cpp's own decode loop on a context of its own, llama-bench's ``test_gen`` in Python: one token a
    ``llama_decode`` and ``llama_synchronize``, no sampling, on the model ``model`` (chatphase's parameters for this
    CPU). ``cparams`` is a ``llama_context_params``; ``depth`` prompt tokens are prefilled once."""

    def __init__(self, lc, model, cparams, threads: int, prompt: list[int]) -> None:
        self.lc, self.depth = lc, len(prompt)
        self.ctx = lc.llama_init_from_model(model, cparams)
        if not self.ctx:
            raise SystemExit("benchmarks: llama.cpp could not create a context")
        lc.llama_set_n_threads(self.ctx, threads, threads)
        self.mem = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(max(lc.llama_n_batch(self.ctx), 1), 0, 1)
        step = lc.llama_n_batch(self.ctx)
        for at in range(0, len(prompt), step):
            self._decode(prompt[at : at + step], at)

    def _decode(self, tokens: list[int], start: int) -> None:
        b = self.batch
        pos = ctypes.cast(b.pos, ctypes.POINTER(ctypes.c_int32))
        for i, t in enumerate(tokens):
            b.token[i], pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, int(i == len(tokens) - 1)
            b.seq_id[i][0] = 0
        b.n_tokens = len(tokens)
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise SystemExit("benchmarks: llama_decode failed")
        self.lc.llama_synchronize(self.ctx)

    def reset(self) -> None:
        """Drop the cells past the prefilled depth."""
        self.lc.llama_memory_seq_rm(self.mem, 0, self.depth, -1)

    def step(self, k: int, token: int) -> float:
        """Step ``k`` after the depth (``token`` at position depth + k): its seconds."""
        t0 = time.perf_counter()
        self._decode([token], self.depth + k)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)


def alternating_ms(loops: Sequence[RawLoop], gen: int, token: int) -> list[float]:
    """``gen`` one-token steps on each of ``loops`` (each from its depth), their steps alternated A B, B A, … so
    that the machine's drift within the turn falls alike on each: ms a step, one per loop."""
    for loop in loops:
        loop.reset()
    spent = [0.0] * len(loops)
    for k in range(gen):
        for i in range(len(loops)) if k % 2 == 0 else reversed(range(len(loops))):
            spent[i] += loops[i].step(k, token)
    return [x * 1000 / gen for x in spent]


def bench_cparams(lc, n_ctx: int):
    """The context parameters llama-bench gives a ``tg`` test at a depth (its ``to_llama_cparams``, defaults
    otherwise): ``n_ctx`` = depth + n_gen, n_batch 2048, n_ubatch 512, f16 KV, flash attention auto."""
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, 2048, 512
    cp.type_k = cp.type_v = lc.GGML_TYPE_F16
    cp.flash_attn_type, cp.offload_kqv, cp.op_offload, cp.swa_full = lc.LLAMA_FLASH_ATTN_TYPE_AUTO, True, True, False
    return cp


def in_process(info, threads: int, n_ctx: int, prompts: dict[int, list[int]], gen: int, reps: int) -> dict:
    """Per depth, in this process on one llama.cpp library, two arms alternated turn by turn (the order rotating):
    ``engine`` chatphase's engine with ``n_ctx`` (greedy, the depth's prefix reused), its ``llama_decode`` and
    ``llama_sampler_sample`` calls timed; and llama.cpp's own loop (:class:`RawLoop`) on two contexts, ``raw`` with
    the engine's parameters and ``bench`` with llama-bench's (:func:`bench_cparams`), their steps alternated one by
    one (:func:`alternating_ms`). Medians over ``reps`` of ms a step, and the medians of the per-rep ratios. The
    machine's drift moves whole runs of the tools by ±15 % here; step by step it moves ``raw ÷ bench`` least."""
    import llama_cpp as lc

    from chatphase.engine.local import generation
    from chatphase.engine.local.llama import LlamaEngine
    from chatphase.engine.local.llama_params import context_params, cpu_auto_plan, model_params

    real_decode, real_sample = generation.lc.llama_decode, generation.lc.llama_sampler_sample
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

    config = EngineConfig(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads)
    eng = LlamaEngine(info, config)
    list(eng.load())
    model = lc.llama_model_load_from_file(str(info.path).encode(), model_params(cpu_auto_plan()))
    turn_id = 0

    def engine_turn(prompt: list[int], reset: bool) -> dict[str, float]:
        nonlocal turn_id
        turn_id += 1
        req = TurnRequest(
            turn_id, prompt_token_ids=tuple(prompt), reset_cache=reset, ignore_eos=True, sampling=greedy(gen)
        )
        spent.update(decode=[], sample=[])
        generation.lc.llama_decode = timed("decode", real_decode)
        generation.lc.llama_sampler_sample = timed("sample", real_sample)
        try:
            m = next(e for e in eng.run_turn(req) if isinstance(e, TurnFinished)).metrics
        finally:
            generation.lc.llama_decode, generation.lc.llama_sampler_sample = real_decode, real_sample
        decodes = spent["decode"][-(gen - 1) :]  # the decode steps; the prompt's chunks come first
        return {
            "engine TPOT": m.decode_ms / (m.decode_tokens - 1),
            "engine llama_decode": sum(decodes) / 1e6 / len(decodes),
            "engine sampling": sum(spent["sample"]) / 1e6 / len(spent["sample"]),
        }

    out: dict[int, dict] = {}
    try:
        for d, prompt in prompts.items():
            loops = {
                "raw": RawLoop(lc, model, context_params(config.resolved()), threads, prompt),
                "bench": RawLoop(lc, model, bench_cparams(lc, d + gen), threads, prompt),
            }

            engine_turn(prompt, reset=True)  # the depth prefilled (and a warm-up)
            rows: list[dict[str, float]] = []
            for rep in range(reps):
                row: dict[str, float] = {}
                for arm in rotation(["engine", "loops"], rep):
                    if arm == "engine":
                        row.update(engine_turn(prompt, reset=False))
                    else:  # the two loops step by step, which of them first alternating by rep
                        first, second = ("raw", "bench") if rep % 2 else ("bench", "raw")
                        row[first], row[second] = alternating_ms([loops[first], loops[second]], gen, prompt[-1])
                rows.append(row)
            for loop in loops.values():
                loop.close()
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            per = {
                "engine TPOT ÷ raw": [r["engine TPOT"] / r["raw"] for r in rows],
                "engine llama_decode ÷ raw": [r["engine llama_decode"] / r["raw"] for r in rows],
                "raw ÷ bench": [r["raw"] / r["bench"] for r in rows],
                "engine TPOT ÷ bench": [r["engine TPOT"] / r["bench"] for r in rows],
            }
            out[d] = {"ms": med, "ratios": {k: (statistics.median(v), min(v), max(v)) for k, v in per.items()}}
    finally:
        eng.close()
        lc.llama_model_free(model)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path or name (default: the bundled SmolLM2-135M)")
    ap.add_argument("--llama-bench", metavar="PATH", help="default: scripts/llama_build.sh's build")
    ap.add_argument("--llama-completion", metavar="PATH", help="default: scripts/llama_build.sh's build")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-batched-bench", metavar="PATH", help="default: scripts/llama_build.sh's build")
    ap.add_argument("--depths", default="1024,4096", help="the deep arms' context depths (default 1024,4096)")
    ap.add_argument("--gen", type=int, default=128, help="decoded tokens a turn (default 128: tg128)")
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens of the prefill arm (default 512: pp512)")
    ap.add_argument(
        "--samples", type=int, default=3, help="decode runs of each deep arm and llama-bench arm a rep (default 3)"
    )
    ap.add_argument(
        "--inproc-reps", type=int, default=8, help="reps of the in-process comparison at each depth (default 8)"
    )
    ap.add_argument("--output", metavar="FILE", help="write the results as Markdown")
    args = ap.parse_args(argv)
    if min(args.reps, args.pp, args.samples, args.inproc_reps) < 1 or args.gen < 2:
        ap.error("--reps, --samples, --inproc-reps and --pp must be >= 1 and --gen >= 2")
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
    # sized as llama-bench's compares the same work, and llama-batched-bench at chatphase's n_ctx the other way.
    # One engine per deep arm, its depth prefilled once (the warm-up): each rep's turns reuse that prefix, as a
    # chat's next turn does, so a rep costs its decode only and can hold several samples
    chat = {d: host(info, n_ctx, args.threads) for d in depths}
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

    def at_depth(engine: EngineTurns, d: int) -> float:
        """The median decode rate of ``--samples`` turns on the depth-``d`` prompt, its prefix reused."""
        rates = []
        for _ in range(args.samples):
            m = engine.turn(deep[d], GREEDY, reset_cache=False)
            if m.cached_tokens != d - 1:
                raise SystemExit(f"the d{d} arm reused {m.cached_tokens} cached tokens, not {d - 1}")
            rates.append(m.decode_tokens_per_s)
        return statistics.median(rates)

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
            (f"chatphase greedy d{d}", lambda d=d: at_depth(chat[d], d)),
            (f"chatphase greedy d{d} n_ctx {d + gen}", lambda d=d: at_depth(tight[d], d)),
            (f"llama-batched-bench tg{gen} d{d} n_ctx {n_ctx}", lambda d=d: batched_tg(d)),
        ]
    engines = [full, *chat.values(), *tight.values()]
    try:
        full.turn(short, GREEDY)  # warm-up
        for d in depths:  # warm-up, and each deep engine's depth prefilled once
            chat[d].turn(deep[d], GREEDY)
            tight[d].turn(deep[d], GREEDY)
        for rep in range(args.reps):
            loads.append(os.getloadavg()[0])
            for key, fn in rotation(steps, rep):
                add(key, fn())
            for depth in (0, *depths):
                n = n_pp if depth == 0 else 0
                pp_rate, tg_rate = bench_d(bench_exe, str(info.path), args.threads, depth, n, gen, args.samples)
                add(f"llama-bench {tg} d{depth}", tg_rate)
                if depth == 0:
                    add(f"llama-bench {pp}", pp_rate)
            print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in arms.items()), flush=True)
    finally:
        for engine in engines:
            engine.close()
    local = in_process(info, args.threads, n_ctx, {0: short, **deep}, gen, args.inproc_reps)

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
    lines += [
        "",
        f"In one process, one library, turn by turn ({args.inproc_reps} reps, arms rotated; ms a step, medians):"
        f" chatphase's engine (n_ctx {n_ctx}, greedy, its llama_decode and sampling timed), then llama.cpp's own"
        " loop on a context with the engine's parameters (raw) and on llama-bench's (bench: n_ctx depth + gen),"
        " these two step by step.",
        "",
        "| depth | engine TPOT | llama_decode | sampling | chatphase Python | raw | bench |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d, got in local.items():
        m = got["ms"]
        python_ms = m["engine TPOT"] - m["engine llama_decode"] - m["engine sampling"]
        lines.append(
            f"| {d} | {m['engine TPOT']:.3f} | {m['engine llama_decode']:.3f} | {m['engine sampling']:.3f} |"
            f" {python_ms:.3f} | {m['raw']:.3f} | {m['bench']:.3f} |"
        )
    lines += ["", "| depth | ratio (of ms a step) | median of per-rep ratios | range |", "|---:|---|---:|---|"]
    for d, got in local.items():
        for name, (med_r, lo, hi) in got["ratios"].items():
            lines.append(f"| {d} | {name} | {med_r:.3f} | {lo:.3f}–{hi:.3f} |")
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    if args.output:
        Path(args.output).write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
