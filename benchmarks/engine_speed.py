"""Engine speed, side by side: llama-cpp-python as documented, tuned, chatphase's engine, llama-bench.

Run: ``python -m benchmarks.engine_speed [--model SPEC] [--reps 5] [--threads N] [--llama-bench [PATH]]``

Variants, all on the same model and the same prompt tokens, run interleaved (rep 1 of every variant,
then rep 2, ..., the order rotating each rep so that no variant always runs first on a warm machine):

(a) ``llama-cpp-python defaults`` — ``Llama(model_path, n_ctx=...)`` as its README shows (threads = half
    the cores, flash attention off), streaming ``create_completion``; llama.cpp's extra buffer types as chatphase
    chooses them for this CPU (:func:`benchmarks.harness.llama_cpp_python_as_chatphase`: the defaults fault on an
    AMX CPU whose llama.cpp build fails chatphase's probe), as for every arm;
(b) ``llama-cpp-python tuned`` — the same calls with threads = physical cores and flash attention on;
(c) ``chatphase EngineHost`` — chatphase's engine in its child process with chatphase's default settings,
    driven by ``TurnRequest(prompt_token_ids=..., reset_cache=True, ignore_eos=True)``
    (:class:`benchmarks.harness.EngineTurns`);
(d) ``llama-bench`` (with ``--llama-bench [PATH]``; without PATH, ``scripts/llama_build.sh``'s build) —
    llama.cpp's own tool, ``-p PP -n TG -r 1`` per rep, repacking weights where chatphase does.

Method (llama-bench's test names): ``pp512`` = prompt tokens / time to the first token of a cold
prompt of 512 tokens (cache cleared before each rep: ``Llama.reset()`` / ``reset_cache=True``);
``tg128`` = (tokens − 1) / time from the first to the last of 128 generated tokens after a 1-token
prompt, end of sequence banned (``logit_bias`` / ``ignore_eos``). For (a)/(b) the times are wall-clock
around the stream (what a caller sees); for (c) they are the engine's own TTFT and decode times
(``TurnMetrics.ttft_ms`` / ``decode_ms``, taken inside the child, before the process hop); (d) reports
its own. Prints mean ± sample sd and the median per variant, and the ratios of medians to (d), or to
(b) without it (medians, because on a shared machine other processes' bursts hit single reps).
Timing numbers belong here, never in unit tests (docs/development.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import (
    EngineTurns,
    greedy,
    llama_bench,
    llama_cpp_python_as_chatphase,
    load_note,
    machine_line,
    pp_tg,
    rotation,
    tool,
)
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.engine.config import EngineConfig
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model
from chatphase.system.cpu_features import physical_cores


@dataclass
class Variant:
    """One contender: a name, its settings in words, and the pp/tg rates measured per rep (tokens/s)."""

    key: str
    name: str
    settings: str
    pp: list[float] = field(default_factory=list)
    tg: list[float] = field(default_factory=list)


class LlamaCppPython:
    """(a)/(b): llama-cpp-python's high-level API with streaming completions."""

    def __init__(self, path: str, n_ctx: int, **kwargs) -> None:
        import llama_cpp

        llama_cpp_python_as_chatphase()  # its defaults fault on an AMX CPU whose build fails chatphase's probe
        self.llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, verbose=False, **kwargs)
        self.ban_eos = {self.llm.token_eos(): -float("inf")}

    def pp(self, prompt: list[int]) -> float:
        self.llm.reset()  # cold cache: no prefix reuse from the previous rep
        t0 = time.perf_counter()
        for _ in self.llm.create_completion(prompt, max_tokens=1, temperature=0.0, stream=True):
            break
        return len(prompt) / (time.perf_counter() - t0)

    def tg(self, prompt: list[int], n_gen: int) -> float:
        self.llm.reset()
        times = []
        for _ in self.llm.create_completion(
            prompt, max_tokens=n_gen, temperature=0.0, stream=True, logit_bias=self.ban_eos
        ):
            times.append(time.perf_counter())
        # chunks are not tokens (text is held back for UTF-8/stop strings): count tokens from the context
        generated = self.llm.n_tokens - len(prompt) + 1  # the last sampled token is never evaluated
        return (generated - 1) / (times[-1] - times[0])

    def close(self) -> None:
        self.llm.close()


class ChatphaseHost:
    """(c): chatphase's engine in its child process with chatphase's defaults (flash attention, batch sizes,
    extra buffer types) and the benchmark's thread count (chatphase's default is the same: physical cores)."""

    def __init__(self, info, n_ctx: int, threads: int) -> None:
        self.turns = EngineTurns(info, EngineConfig(n_ctx=n_ctx, n_threads=threads))
        self.loaded = self.turns.loaded

    def pp(self, prompt: list[int]) -> float:
        m = self.turns.turn(prompt, greedy(1))
        return len(prompt) / (m.ttft_ms / 1000)

    def tg(self, prompt: list[int], n_gen: int) -> float:
        m = self.turns.turn(prompt, greedy(n_gen))
        return (m.decode_tokens - 1) / (m.decode_ms / 1000)

    def close(self) -> None:
        self.turns.close()


def mean_sd(xs: list[float]) -> str:
    if not xs:
        return "–"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):8.1f} ± {sd:5.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path or name (default: the bundled SmolLM2-135M)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="threads for (b), (c), (d) (default: physical cores)")
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens (default 512)")
    ap.add_argument("--tg", type=int, default=128, help="generated tokens (default 128)")
    ap.add_argument(
        "--llama-bench",
        nargs="?",
        const="",
        metavar="PATH",
        help="add (d), llama.cpp's llama-bench (PATH, or scripts/llama_build.sh's build when none is given)",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the per-rep rates as JSON")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.pp < 1 or args.tg < 2:
        ap.error("--reps and --pp must be >= 1 and --tg >= 2")
    bench_exe = None if args.llama_bench is None else tool("llama-bench", args.llama_bench or None)

    info = read_model_info(resolve_model(args.model))
    threads = args.threads or physical_cores()
    n_ctx = args.pp + args.tg + 64
    print(
        f"model {info.name} ({info.quantization}), pp{args.pp}/tg{args.tg}, {args.reps} reps interleaved, "
        f"threads {threads} for (b)-(d); {machine_line()}",
        flush=True,
    )

    a = LlamaCppPython(info.path, n_ctx)
    b = LlamaCppPython(info.path, n_ctx, n_threads=threads, n_threads_batch=threads, flash_attn=True)
    c = ChatphaseHost(info, n_ctx, threads)
    builder = PromptBuilder(b.llm)
    prompt, short = list(builder.tokens(args.pp)), list(builder.tokens(1))
    ce = c.loaded.settings
    variants = {
        "a": Variant(
            "a",
            "llama-cpp-python defaults",
            f"threads {a.llm.context_params.n_threads} (batch {a.llm.context_params.n_threads_batch}), flash_attn "
            f"{ {-1: 'auto', 0: 'off', 1: 'on'}.get(a.llm.context_params.flash_attn_type, '?') }",
        ),
        "b": Variant("b", "llama-cpp-python tuned", f"threads {threads}, flash_attn on"),
        "c": Variant(
            "c",
            "chatphase EngineHost",
            f"threads {ce.n_threads}, flash_attn {ce.flash_attn}, n_batch {ce.n_batch}",
        ),
    }
    runners = {"a": a, "b": b, "c": c}
    if bench_exe:
        variants["d"] = Variant("d", "llama-bench", f"threads {threads}")

    for r in runners.values():  # warm-up, not counted
        r.pp(prompt)
        r.tg(short, 8)
    try:
        for rep in range(args.reps):
            for key in rotation(list(variants), rep):
                if key == "d":
                    pp, tg = pp_tg(llama_bench(bench_exe, info.path, threads, args.pp, args.tg))
                else:
                    pp, tg = runners[key].pp(prompt), runners[key].tg(short, args.tg)
                variants[key].pp.append(pp)
                variants[key].tg.append(tg)
            print(
                f"rep {rep + 1}/{args.reps}: "
                + ", ".join(f"({k}) pp {v.pp[-1]:.0f} tg {v.tg[-1]:.0f}" for k, v in variants.items()),
                flush=True,
            )
    finally:
        for r in runners.values():
            r.close()

    ref = variants["d" if "d" in variants else "b"]
    med = statistics.median
    print(
        f"\n{'variant':<32} {'pp' + str(args.pp) + ' tok/s mean ± sd':>24} {'median':>7} "
        f"{'tg' + str(args.tg) + ' tok/s mean ± sd':>24} {'median':>7} {'pp ratio':>9} {'tg ratio':>9}  settings"
    )
    for v in variants.values():
        print(
            f"({v.key}) {v.name:<28} {mean_sd(v.pp):>24} {med(v.pp):>7.1f} {mean_sd(v.tg):>24} {med(v.tg):>7.1f} "
            f"{med(v.pp) / med(ref.pp):>8.2f}x {med(v.tg) / med(ref.tg):>8.2f}x  {v.settings}"
        )
    print(f"ratios: median to median of ({ref.key}) {ref.name} (medians resist other processes' bursts); {load_note()}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "model": info.name,
                    "pp_tokens": args.pp,
                    "tg_tokens": args.tg,
                    "threads": threads,
                    "reference": ref.key,
                    "variants": {
                        k: {"name": v.name, "settings": v.settings, "pp_tokens_per_s": v.pp, "tg_tokens_per_s": v.tg}
                        for k, v in variants.items()
                    },
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
