"""Speculative decoding against plain decode, side by side in one run, and the verify-step cost.

Run: ``python -m benchmarks.spec_decode [--model SPEC] [--reps 3] [--threads 2] [--max-tokens 160]
[--arms lookup,auto,draft:default] [--out benchmarks/results]``

Arms and prompts are :mod:`chatphase.bench.spec`'s (the same as ``chatphase bench --spec``): every arm is a
loaded engine with its own decode mode, every rep runs each prompt on every arm (the order rotating), each
a greedy turn from a cleared KV cache. Targets (default model, 2 threads, a quiet machine):

- input-grounded prompts: lookup ≥ 1.5× plain decode tok/s, the reply identical;
- open-ended prompts: auto ≥ 0.97× plain;
- draft mode with the default model drafting for itself: acceptance ≥ 99 %.

Then the verify-cost sweep: ms per step of k = 1…16 tokens (logits at each) after 256 cached tokens.
Writes ``spec_decode-DATE.md`` with the machine (CPU, load before and after) under ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

from benchmarks.harness import ROOT, load_note, machine_line
from chatphase.bench.spec.arms import format_costs, format_rows, run_arms, summary_rows, verify_cost
from chatphase.engine.config import EngineConfig
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--arms", default="lookup,auto,draft:default")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    info = read_model_info(resolve_model(args.model))
    config = EngineConfig(n_ctx=2048, n_threads=args.threads)
    before, t0 = machine_line(), time.time()
    results = run_arms(
        info, config, args.arms.split(","), args.reps, args.max_tokens, lambda s: print(s, file=sys.stderr)
    )
    rows = summary_rows(results)
    costs = verify_cost(info, config)
    after = load_note()
    table, cost_table = format_rows(rows), format_costs(costs)
    print(table, "", cost_table, sep="\n")
    checks = []
    for r in rows:
        if r["spec"] == "lookup" and r["kind"] == "grounded":
            own = "-" if r["turn_speedup"] is None else f"{r['turn_speedup']:.2f}"
            checks.append(
                f"lookup on input-grounded prompts: {r['ratio_to_off']:.2f}× plain, {own}× its own plain steps "
                "(target ≥ 1.5)"
            )
        if r["spec"] == "auto" and r["kind"] == "open":
            checks.append(f"auto on open-ended prompts: {r['ratio_to_off']:.2f}× plain (target ≥ 0.97)")
        if r["spec"].startswith("draft") and r["acceptance"] is not None:
            checks.append(f"{r['spec']} on {r['kind']} prompts: acceptance {r['acceptance']:.1%} (target ≥ 99 %)")
    checks.append("replies identical to plain in every arm: " + ("yes" if all(r["identical"] for r in rows) else "NO"))
    print("", *checks, sep="\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"spec_decode-{dt.date.today().isoformat()}.md"
    path.write_text(
        "# Speculative decoding against plain decode\n\n"
        f"`python -m benchmarks.spec_decode --reps {args.reps} --threads {args.threads} --max-tokens "
        f"{args.max_tokens} --arms {args.arms}` — model {info.name}, {args.threads} threads, greedy, "
        f"{args.reps} interleaved reps, {time.time() - t0:.0f} s.\n\n"
        f"Machine before: {before}; after: {after}.\n\n"
        "Median decode tok/s per arm and prompt kind, the median of each run's ratio to plain decode in the "
        "same rep (× off), mean acceptance and tokens per target step, and the median speed-up of each turn "
        "against its own plain steps (× own, `spec_speedup`, every 32nd step plain):\n\n"
        f"```\n{table}\n```\n\nVerify-step cost (ms per step of k tokens, logits at each, 256 tokens cached):\n\n"
        f"```\n{cost_table}\n```\n\n" + "\n".join(f"- {c}" for c in checks) + "\n",
        encoding="utf-8",
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
