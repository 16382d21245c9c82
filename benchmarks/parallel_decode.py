"""Parallel decode, side by side: ``chatphase bench --parallel`` against llama.cpp's own ``llama-batched-bench``.

Run (a quiet machine; the tool is by default the one ``scripts/llama_build.sh`` built from the llama.cpp
that llama-cpp-python vendors)::

    python -m benchmarks.parallel_decode [--llama-batched-bench PATH] [--model SPEC] [--threads N] \\
        [--parallel 1,2,4,8] [--prompt-tokens 128] [--gen 32] [--rounds 5] [--write] [--plot FILE.svg]

Both tools get the same model, threads (``-t``/``-tb`` = ``--threads``), ``n_ctx`` (``-c``; default: the largest
N × (prompt + gen), rounded up to 256), ``n_batch``/``n_ubatch`` (``-b``/``-ub``, chatphase's defaults),
flash attention ``auto``, a non-unified KV cache, and weight repacking where chatphase repacks (``-nr`` where
chatphase turns llama.cpp's extra buffer types off, on Intel AMX CPUs: :func:`benchmarks.harness.repack`). Rounds run interleaved, the order
alternating, so that neither tool always runs first on a warm machine; each round is one fresh process
of each: ``llama-batched-bench -npp L -ntg G -npl N,N,... --output-format jsonl`` (its own 16-token warm-up,
one measurement per N) and ``python -m chatphase bench --parallel N,N,... --prompt-lengths L --gen G --reps 1
--warmup 1 --no-roofline --format json``.

Compared per N: chatphase's ``aggregate_decode_tokens_per_s`` against llama-batched-bench's S_TG (``speed_tg``
= N × TG / t_TG: the same definition, :mod:`chatphase.bench.parallel`), and ``prefill_tokens_per_s`` against
S_PP. The medians over rounds are compared (other processes' bursts hit single rounds); the target is
chatphase ≥ 0.95 × S_TG at every N. Prints a Markdown report; ``--write`` also saves it with the raw
figures under ``benchmarks/results/``. Timing numbers belong here, never in unit tests.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import ROOT, batched_bench, machine_line, rotation, tool
from chatphase.engine.config import EngineConfig
from chatphase.models.resolve import resolve_model
from chatphase.system.cpu_features import physical_cores

TARGET = 0.95


def token_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def run_batched_bench(tool: str, model: str, args, n_ctx: int, cfg: EngineConfig) -> dict[int, dict]:
    """One llama-batched-bench process (repacking where chatphase does); ``{N: {"speed_tg", "speed_pp"}}``."""
    return batched_bench(
        tool, model, args.threads, n_ctx, cfg.n_batch, cfg.n_ubatch, args.prompt_tokens, args.gen, args.parallel,
        timeout_s=args.timeout,
    )  # fmt: skip


def run_chatphase(model: str, args, n_ctx: int) -> tuple[dict[int, dict], dict]:
    """One ``chatphase bench --parallel`` process; ``({N: {"speed_tg", "speed_pp"}}, engine settings)``."""
    cmd = [
        sys.executable,
        "-m",
        "chatphase",
        "bench",
        "--model",
        model,
        "--parallel",
        ",".join(map(str, args.parallel)),
    ]
    cmd += ["--prompt-lengths", str(args.prompt_tokens), "--gen", str(args.gen), "--reps", "1", "--warmup", "1"]
    cmd += ["--threads", str(args.threads), "--n-ctx", str(n_ctx), "--no-roofline", "--format", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"chatphase bench failed ({proc.returncode}): {proc.stderr.strip()}")
    data = json.loads(proc.stdout)
    got = {
        c["n_seq"]: {
            "speed_tg": c["aggregate_decode_tokens_per_s"]["mean"],
            "speed_pp": c["prefill_tokens_per_s"]["mean"],
        }
        for c in data["parallel"]
    }
    return got, data["settings"]["engine"]


def report(args, n_ctx: int, settings: dict, rounds: list[dict], model: str) -> tuple[str, bool]:
    """The Markdown report and whether every N met the target."""
    lines = [
        f"# Parallel decode: chatphase vs llama-batched-bench ({datetime.date.today().isoformat()})",
        "",
        f"Model `{Path(model).name}`; PP {args.prompt_tokens}, TG {args.gen}, N = {', '.join(map(str, args.parallel))}; "
        f"threads {args.threads}, n_ctx {n_ctx}, n_batch {settings.get('n_batch')}, n_ubatch {settings.get('n_ubatch')}, "
        f"flash_attn auto, extra buffer types {'on' if settings.get('use_extra_bufts') else 'off'}; {len(rounds)} rounds, "
        f"interleaved. Medians over rounds (tokens/s). Machine: {machine_line()}.",
        "",
        "| N | llama-batched-bench S_TG | chatphase aggregate | ratio | S_PP | chatphase prefill | ratio |",
        "|--:|--:|--:|--:|--:|--:|--:|",
    ]
    ok = True
    for n in args.parallel:
        ref_tg = statistics.median(r["ref"][n]["speed_tg"] for r in rounds)
        cp_tg = statistics.median(r["chatphase"][n]["speed_tg"] for r in rounds)
        ref_pp = statistics.median(r["ref"][n]["speed_pp"] for r in rounds)
        cp_pp = statistics.median(r["chatphase"][n]["speed_pp"] for r in rounds)
        ok &= cp_tg >= TARGET * ref_tg
        lines.append(
            f"| {n} | {ref_tg:.1f} | {cp_tg:.1f} | {cp_tg / ref_tg:.3f} | {ref_pp:.1f} | {cp_pp:.1f} | {cp_pp / ref_pp:.3f} |"
        )
    lines += ["", f"Target: chatphase aggregate ≥ {TARGET} × S_TG at every N — {'met' if ok else 'NOT met'}.", ""]
    lines += ["Command:", "", "    python " + " ".join(sys.argv), ""]
    return "\n".join(lines), ok


def plot(args, rounds: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    ns = list(args.parallel)
    for key, label, fmt in (("ref", "llama-batched-bench S_TG", "s--"), ("chatphase", "chatphase aggregate", "o-")):
        agg = [statistics.median(r[key][n]["speed_tg"] for r in rounds) for n in ns]
        ax.plot(ns, agg, fmt, label=label)
        if key == "chatphase":
            ax.plot(ns, [a / n for a, n in zip(agg, ns, strict=True)], "o:", label="chatphase per sequence")
    ax.set(title="Decode tok/s vs sequences decoded together", xlabel="N", ylabel="decode tokens/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-batched-bench", metavar="PATH", help="default: scripts/llama_build.sh's build")
    p.add_argument("--model", default=None, help="model spec (default: the bundled model)")
    p.add_argument("--threads", type=int, default=physical_cores())
    p.add_argument("--parallel", type=token_list, default=(1, 2, 4, 8))
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n-ctx", type=int, default=None)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one tool run may take")
    p.add_argument("--write", action="store_true", help="save the report and raw figures under benchmarks/results/")
    p.add_argument("--plot", metavar="FILE", help="draw both tools' aggregate tok/s against N (.svg/.png)")
    args = p.parse_args()
    exe = tool("llama-batched-bench", args.llama_batched_bench)
    model = str(resolve_model(args.model, None))
    need = max(args.parallel) * (args.prompt_tokens + args.gen)
    n_ctx = args.n_ctx or -(-need // 256) * 256
    cfg = EngineConfig()
    rounds, settings = [], {}
    for i in range(args.rounds):
        got: dict = {}
        for who in rotation(("chatphase", "ref"), i):
            if who == "chatphase":
                got["chatphase"], settings = run_chatphase(model, args, n_ctx)
            else:
                got["ref"] = run_batched_bench(exe, model, args, n_ctx, cfg)
        rounds.append(got)
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    text, ok = report(args, n_ctx, settings, rounds, model)
    print(text)
    if args.write:
        out = ROOT / "benchmarks" / "results" / f"parallel_decode-{datetime.date.today().isoformat()}"
        out.with_suffix(".md").write_text(text, encoding="utf-8")
        raw = [{k: {str(n): v for n, v in r[k].items()} for k in r} for r in rounds]
        out.with_suffix(".json").write_text(
            json.dumps({"settings": settings, "rounds": raw}, indent=2), encoding="utf-8"
        )
        print(f"wrote {out}.md and .json", file=sys.stderr)
    if args.plot:
        plot(args, rounds, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
