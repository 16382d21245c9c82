"""Decode per token, broken down and compared fairly: chatphase against llama.cpp's own tools, in one run.

Run: ``python benchmarks/decode_step.py --llama-bench PATH --llama-completion PATH [--reps 4] [--output FILE]``

Arms, interleaved rep by rep (the order rotating), all with 2 threads (``--threads``) on the same model:

- ``chatphase`` — the engine in its child process (:class:`chatphase.engine.process.host.EngineHost`, chatphase's
  defaults otherwise), ``TurnRequest(prompt_token_ids=..., reset_cache=True, ignore_eos=True)``; decode rate
  = (tokens − 1) / (t_last − t_first), the engine's own clock. Greedy and with chatphase's default sampler
  chain (top-k 40, top-p 0.95, min-p 0.05, temperature 0.7, seeded), at depth 0 and at ``--depth``.
  At ``--depth`` also with ``n_ctx`` = depth + 128, as llama-bench sizes its context (llama.cpp attends
  over the used cells rounded up to 256, at most ``n_ctx``: the same cells a step as llama-bench).
- ``llama-completion`` — llama.cpp's completion tool with the same sampler chain in the same order
  (``--samplers top_k;top_p;min_p;temperature``) or greedy (``--temp 0``), ``--ignore-eos``. It samples
  every token as chatphase does, so it is the fair reference for decode at depth 0. Its rate is taken
  from its own perf lines: (n_eval) / (total − prompt-eval time), i.e. llama_decode + sampling + the
  rest of its loop, as chatphase's clock counts.
- ``llama-bench`` — ``pp512`` and ``tg128`` at depth 0 and ``--depth`` (no sampling at all: a bound).

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
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine_speed import load_note

from chatphase.bench.prompts import EngineTokenizer, PromptBuilder
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.local.llama_params import offload_plan
from chatphase.engine.logfile import default_log_path
from chatphase.engine.prompting.vocab import VocabFile
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model
from chatphase.system.cpu_features import cpu_name

SAMPLED = SamplingParams(max_tokens=128, temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, seed=1)
GREEDY = SamplingParams(max_tokens=128, temperature=0.0)
FIRST_TOKEN = SamplingParams(max_tokens=1, temperature=0.0)
_PERF = re.compile(
    r"(?:llama_perf_context_print|common_perf_print):\s+(?P<what>[a-z ]+?) time =\s+(?P<ms>[\d.]+) ms(?: /\s+(?P<n>\d+))?"
)


class Host:
    """chatphase's engine in its child process; ``tg`` returns decode tokens/s, ``pp`` prompt tokens/s."""

    def __init__(self, info, n_ctx: int, threads: int | None) -> None:
        from chatphase.engine.process.host import EngineHost

        cfg = EngineConfig(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads)
        self.host = EngineHost(info, cfg)
        for ev in self.host.load():
            if isinstance(ev, EngineFailed):
                raise SystemExit(f"chatphase engine failed to load: {ev.message}")
            self.loaded = ev.model
        self._turn = 0

    def metrics(self, prompt: list[int], sampling: SamplingParams):
        self._turn += 1
        req = TurnRequest(
            self._turn, prompt_token_ids=tuple(prompt), reset_cache=True, ignore_eos=True, sampling=sampling
        )
        for ev in self.host.run_turn(req):
            if isinstance(ev, EngineFailed):
                raise SystemExit(f"chatphase engine failed: {ev.message}")
            if isinstance(ev, TurnFinished):
                m = ev.metrics
        return m

    def close(self) -> None:
        self.host.close()


def llama_bench(exe: str, model: str, threads: int, depth: int, repack: bool) -> dict[str, float]:
    """pp512 and tg128 at ``depth`` (``-r 1``): ``{"pp512": tok/s, "tg128": tok/s}``."""
    cmd = [exe, "-m", model, "-t", str(threads), "-p", "512", "-n", "128", "-d", str(depth), "-r", "1", "-o", "json"]
    cmd += ["--repack", "1" if repack else "0"]
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout)
    out = {}
    for row in rows:
        key = "pp512" if row.get("n_prompt") and not row.get("n_gen") else "tg128"
        out[key] = float(row["avg_ts"])
    return out


def llama_completion(exe: str, model: str, threads: int, prompt: str, sampling: SamplingParams, repack: bool) -> dict:
    """One run of llama-completion; decode tok/s from its perf lines (see the module docstring)."""
    cmd = [exe, "-m", model, "-t", str(threads), "-tb", str(threads), "-n", str(sampling.max_tokens)]
    cmd += ["-p", prompt, "--ignore-eos", "-no-cnv", "--no-display-prompt", "-c", "2048", "-fa", "auto"]
    if sampling.temperature <= 0:
        cmd += ["--temp", "0"]
    else:
        cmd += ["--temp", str(sampling.temperature), "--top-k", str(sampling.top_k), "--top-p", str(sampling.top_p)]
        cmd += ["--min-p", str(sampling.min_p), "-s", str(sampling.seed), "--samplers", "top_k;top_p;min_p;temperature"]
    cmd += [] if repack else ["-nr"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    perf = {}
    for m in _PERF.finditer(done.stderr):
        perf[m["what"].strip()] = (float(m["ms"]), int(m["n"]) if m["n"] else None)
    if "eval" not in perf or "total" not in perf:
        raise SystemExit(f"llama-completion gave no perf lines (exit {done.returncode}): {done.stderr[-400:]}")
    eval_ms, n_eval = perf["eval"]
    decode_wall_ms = perf["total"][0] - perf["prompt eval"][0]
    return {"tok_s": n_eval / (decode_wall_ms / 1000), "eval_ms_per_token": eval_ms / n_eval}


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
    ap.add_argument("--llama-bench", required=True, metavar="PATH")
    ap.add_argument("--llama-completion", required=True, metavar="PATH")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depth", type=int, default=1024, help="the deep arm's context depth (default 1024)")
    ap.add_argument("--output", metavar="FILE", help="write the results as Markdown")
    args = ap.parse_args(argv)
    for exe in (args.llama_bench, args.llama_completion):
        if not Path(exe).is_file():
            ap.error(f"no such file: {exe}")

    import llama_cpp as lc

    info = read_model_info(resolve_model(args.model))
    sysinfo = lc.llama_print_system_info().decode(errors="replace")
    repack = offload_plan({"extra_bufts": "auto", "n_gpu_layers": 0}, sysinfo, False).use_extra_bufts
    with VocabFile(info.path, default_log_path()) as vocab:
        builder = PromptBuilder(EngineTokenizer(vocab))
        short, deep, pp512 = (list(builder.tokens(n)) for n in (16, args.depth, 512))
        text = builder.text(short[len(builder.prefix) :])
    host = Host(info, 2048, args.threads)
    # llama-bench sizes its context to depth + n_gen; llama.cpp attends over the used cells rounded up to 256
    # (at most n_ctx), so at depth 1024 it reads 1152 cells a step where n_ctx 2048 reads 1280: an arm sized
    # as llama-bench's compares the same work
    tight = Host(info, args.depth + 128, args.threads)
    head = (
        f"model {info.name} ({info.quantization}); {args.threads} threads; {args.reps} interleaved reps; "
        f"extra buffer types {'on' if repack else 'off (AMX probe failed)'}; CPU {cpu_name()}"
    )
    print(head + f"; {load_note()}", flush=True)
    arms: dict[str, list[float]] = {}
    loads = []

    def add(key, value):
        arms.setdefault(key, []).append(value)

    steps = [
        ("chatphase greedy d0", lambda: host.metrics(short, GREEDY).decode_tokens_per_s),
        ("chatphase sampled d0", lambda: host.metrics(short, SAMPLED).decode_tokens_per_s),
        (f"chatphase greedy d{args.depth}", lambda: host.metrics(deep, GREEDY).decode_tokens_per_s),
        (
            f"chatphase greedy d{args.depth} n_ctx {args.depth + 128}",
            lambda: tight.metrics(deep, GREEDY).decode_tokens_per_s,
        ),
        ("chatphase pp512", lambda: 512 / (host.metrics(pp512, FIRST_TOKEN).ttft_ms / 1000)),
        (
            "llama-completion greedy d0",
            lambda: llama_completion(args.llama_completion, str(info.path), args.threads, text, GREEDY, repack)[
                "tok_s"
            ],
        ),
        (
            "llama-completion sampled d0",
            lambda: llama_completion(args.llama_completion, str(info.path), args.threads, text, SAMPLED, repack)[
                "tok_s"
            ],
        ),
    ]
    try:
        host.metrics(short, GREEDY)  # warm-up
        tight.metrics(short, GREEDY)
        for rep in range(args.reps):
            loads.append(os.getloadavg()[0])
            order = steps[rep % len(steps) :] + steps[: rep % len(steps)]
            for key, fn in order:
                add(key, fn())
            for depth in (0, args.depth):
                lb = llama_bench(args.llama_bench, str(info.path), args.threads, depth, repack)
                add(f"llama-bench tg128 d{depth}", lb["tg128"])
                if depth == 0:
                    add("llama-bench pp512", lb["pp512"])
            print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in arms.items()), flush=True)
    finally:
        host.close()
        tight.close()
    parts = {k: breakdown(info, args.threads, short, sp, 3) for k, sp in (("greedy", GREEDY), ("sampled", SAMPLED))}

    med = {k: statistics.median(v) for k, v in arms.items()}
    d = args.depth
    ratios = [
        ("decode d0, greedy", "chatphase greedy d0", "llama-completion greedy d0", 0.97),
        ("decode d0, sampled", "chatphase sampled d0", "llama-completion sampled d0", 0.97),
        (f"decode d{d}", f"chatphase greedy d{d}", f"llama-bench tg128 d{d}", 0.97),
        (
            f"decode d{d}, n_ctx as llama-bench's",
            f"chatphase greedy d{d} n_ctx {d + 128}",
            f"llama-bench tg128 d{d}",
            0.97,
        ),
        ("prefill pp512", "chatphase pp512", "llama-bench pp512", 0.97),
        ("decode d0 against llama-bench (no sampling: a bound)", "chatphase greedy d0", "llama-bench tg128 d0", None),
    ]
    lines = [
        f"# Decode per token — {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"`python benchmarks/decode_step.py {' '.join(argv or sys.argv[1:])}`",
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
        r = statistics.median(x / y for x, y in zip(arms[a], arms[b], strict=True))
        verdict = "–" if target is None else ("✅" if r >= target else "❌") + f" ≥ {target}"
        lines.append(f"| {name} ({a} ÷ {b}) | {r:.3f} | {med[a] / med[b]:.3f} | {verdict} |")
    lines += ["", "Decode step breakdown (in-process engine, medians of 3 turns of 128 tokens at depth 0):", ""]
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
