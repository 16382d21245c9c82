"""The history database at scale, and what keeping it costs decode.

Run: ``python -m benchmarks.history_db [--turns 100000] [--reps 5] [--decode-reps 6] [--gen 128] [--out FILE.md]``.

1. **Queries**: a generated history of ``--turns`` turns (session files in today's format, ``--per-session`` turns
   each, over three models, two chatphase versions and two machines, with texts to search), in a temporary data
   directory. Timed: the first catch-up (the one-time take-over of every file, as ``logs`` and ``stats`` take it:
   the files read in worker processes), then, ``--reps`` times each (median
   and range), the steps of ``logs`` and ``stats`` in this process (open, catch-up of an unchanged history,
   query) — the default ``logs``, ``logs -q WORD``, ``logs --model``, ``stats``, ``stats --by model,version`` —
   and the commands as the user runs them (``python -m chatphase logs`` / ``stats``: a fresh process, imports
   included). Target: under 1 s each.
2. **Decode with the store on and off**, side by side on the default model (or ``--model``): turns of ``--gen``
   greedy tokens from a cleared KV cache in chatphase's engine process; the *on* arm does what a saved chat does
   around each turn (the session writer's turn start, its streamed text, its end, the history index's update on
   its thread), the *off* arm nothing. Arms alternate by rep (:func:`benchmarks.harness.rotation`); judged by the
   median of the per-rep ratios of decode tokens/s (:func:`benchmarks.harness.ratio`). Target: the store costs
   decode at most 1 %.

Figures taken on a loaded machine mean nothing: run it on a quiet one (the report says the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import ROOT, EngineTurns, greedy, load_note, machine_line, ratio, rotation

MODELS = ("SmolLM2-135M-Instruct-Q4_1", "Qwen3-0.6B-Q8_0", "gemma-3-1b-it-Q4_K_M")
VERSIONS = ("0.1.0", "0.2.0")
MACHINES = (("epyc-box", "AMD EPYC 9454 48-Core Processor"), ("xeon-box", "Intel(R) Xeon(R) Platinum 8480+"))
WORDS = (
    "prefill decode cache token prompt model speed memory thread context reply story dragon knight "
    "question answer python sqlite kernel matrix vector layer attention window budget"
).split()


def _isolate() -> Path:
    """Sessions, history, logs and config in a temporary folder (nothing of the user's is read or written)."""
    base = Path(tempfile.mkdtemp(prefix="chatphase-history-db-"))
    for name in ("LOG_DIR", "DATA_DIR", "RUNTIME_DIR"):
        os.environ[f"CHATPHASE_{name}"] = str(base / name.lower())
    os.environ["CHATPHASE_CONFIG"] = str(base / "config.toml")
    return base


def generate(turns: int, per_session: int, seed: int = 1) -> int:
    """Write ``turns`` turns as session files (the writer's record shapes and line writer); returns the sessions."""
    from chatphase.engine.metrics import compute_turn_metrics
    from chatphase.sessions.store import FORMAT_VERSION, sessions_dir, write_record

    rng = random.Random(seed)
    d = sessions_dir()
    d.mkdir(parents=True, exist_ok=True)
    n_sessions = -(-turns // per_session)
    left = turns
    for s in range(n_sessions):
        k = s % len(MODELS)
        model = {"name": MODELS[k], "architecture": "llama", "quantization": MODELS[k].rsplit("-", 1)[-1]}
        version, (machine, cpu) = VERSIONS[s % 2], MACHINES[(s // 2) % 2]
        day = 1 + s * 28 // n_sessions
        sid = f"202611{day:02d}-{s // 60 % 24:02d}{s % 60:02d}00-{s:04x}"
        with open(d / f"{sid}.jsonl", "w", encoding="utf-8") as fh:
            created = f"2026-11-{day:02d}T{s // 60 % 24:02d}:{s % 60:02d}:00+00:00"
            header = {"type": "session", "version": FORMAT_VERSION, "id": sid, "title": f"session {s}"}
            write_record(fh, {**header, "created": created, "model": model, "settings": {"n_ctx": 4096}}, sync=False)
            context = {"type": "context", "backend": "llama.cpp", "backend_build": "llama-cpp-python 0.3.36"}
            context |= {"machine": machine, "cpu": cpu, "chatphase_version": version, "engine": {"n_ctx": 4096}}
            write_record(fh, context, sync=False)
            depth = 0
            for t in range(1, min(per_session, left) + 1):
                prompt = depth + rng.randint(10, 400)
                cached, ms_per_token = depth, 0.8 + 0.4 * k + (0.1 if version == "0.2.0" else 0.0)
                t0, gen = 1_000_000_000, rng.randint(8, 200)
                first = t0 + int((15 + ms_per_token * (prompt - cached)) * 1e6 * rng.uniform(0.95, 1.1))
                step = int(1e9 / (60 - 10 * k - depth / 400))
                m = compute_turn_metrics(
                    t_submit_ns=t0,
                    t_prefill_start_ns=t0,
                    t_prefill_end_ns=first,
                    token_times_ns=[first + i * step for i in range(min(gen, 16))],
                    prompt_tokens=prompt,
                    cached_tokens=cached,
                    kv_cache_tokens=prompt + gen,
                    kv_bytes_per_token=23_040,
                    kv_capacity_bytes=4096 * 23_040,
                    stop_reason="stop",
                )
                when = f"{created[:14]}{(t // 60) % 60:02d}:{t % 60:02d}+00:00"
                user = " ".join(rng.choices(WORDS, k=12))
                write_record(fh, {"type": "turn_start", "turn": t, "time": when, "user": user}, sync=False)
                reply = " ".join(rng.choices(WORDS, k=40))
                end = {"type": "turn_end", "turn": t, "time": when, "reply": reply, "metrics": m.to_dict()}
                write_record(fh, {**end, "error": None}, sync=False)
                depth = min(prompt + gen, 3500) if t % 20 else 0
            left -= min(per_session, left)
    return n_sessions


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    """``fn``'s wall time in seconds, ``reps`` times."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def query_figures(reps: int) -> dict[str, list[float]]:
    """Each query's times in this process: open the database, catch up (nothing changed), query."""
    from chatphase.history.db import connect
    from chatphase.history.index import catch_up
    from chatphase.history.query import Filters, group_stats, logs

    def run(query):
        def go():
            conn = connect()
            try:
                catch_up(conn)
                return query(conn)
            finally:
                conn.close()

        return go

    cases = {
        "logs": lambda c: logs(c, Filters()),
        "logs -q dragon knight": lambda c: logs(c, Filters(text="dragon knight")),
        "logs --model qwen": lambda c: logs(c, Filters(model="qwen")),
        "stats": lambda c: group_stats(c, Filters()),
        "stats --by model,version": lambda c: group_stats(c, Filters(), ("model", "version")),
    }
    return {name: timed(run(q), reps) for name, q in cases.items()}


def command_figures(reps: int) -> dict[str, list[float]]:
    """``python -m chatphase logs`` and ``stats`` as the user runs them: a fresh process each time."""
    out = {}
    for args in (["logs"], ["stats"]):

        def cli(args=args):
            done = subprocess.run([sys.executable, "-m", "chatphase", *args], cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"chatphase {' '.join(args)} failed: {done.stderr.strip()}")

        out["python -m chatphase " + " ".join(args)] = timed(cli, reps)
    return out


def decode_figures(model: str | None, reps: int, gen: int, prompt_tokens: int) -> dict:
    """Decode tokens/s of the two arms, per rep (see the module docstring)."""
    from chatphase.engine.config import EngineConfig
    from chatphase.engine.events import TokensDecoded
    from chatphase.history.index import LiveIndex
    from chatphase.models.gguf_meta import read_model_info
    from chatphase.models.resolve import resolve_model
    from chatphase.sessions.writer import SessionWriter

    info = read_model_info(resolve_model(model))
    engine = EngineTurns(info, EngineConfig(n_ctx=max(512, prompt_tokens + gen + 16)))
    prompt = [100 + (i * 7919) % 20000 for i in range(prompt_tokens)]
    writer = SessionWriter.create(model=info.to_dict(), settings={"n_ctx": 512})
    index = LiveIndex()

    class Text:
        reply, thinking = "", ""

    def on(sampling):
        text = Text()
        writer.begin_turn("a benchmark turn", {"max_tokens": gen}, text)

        def event(ev):
            if isinstance(ev, TokensDecoded):
                text.reply += ev.text
                writer.stream()

        m = engine.turn(prompt, sampling, on_event=event)
        writer.finish_turn(text.reply, m)
        index.update(writer.path)
        return m

    arms: dict[str, Callable] = {"off": lambda s: engine.turn(prompt, s), "on": on}
    rates: dict[str, list[float]] = {"off": [], "on": []}
    try:
        engine.turn(prompt, greedy(gen))  # warm-up, not counted
        for rep in range(reps):
            for arm in rotation(list(arms), rep):
                rates[arm].append(arms[arm](greedy(gen)).decode_tokens_per_s)
    finally:
        writer.close()
        index.close()
        engine.close()
    return {"model": info.name, "rates": rates, "ratio": ratio(rates["on"], rates["off"])}


def _span(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} s ({min(xs):.3f}–{max(xs):.3f})"


def report(args, sessions: int, take_over_s: float, queries: dict, commands: dict, decode: dict | None) -> str:
    lines = [
        "# History database: logs and stats at scale, decode with the store on and off",
        "",
        f"`python -m benchmarks.history_db {' '.join(sys.argv[1:])}`".replace("  ", " "),
        "",
        f"Machine: {machine_line()}",
        "",
        f"## Queries over {args.turns:,} turns ({sessions:,} sessions); target < 1 s",
        "",
        f"First catch-up (the one-time take-over of every session file): {take_over_s:.2f} s",
        "",
        f"| query | median (min–max) over {args.reps} |",
        "|---|---|",
        *(f"| {name} | {_span(xs)} |" for name, xs in {**queries, **commands}.items()),
        "",
        "In-process rows: open the database, catch up with the (unchanged) session files, query. The `python -m` rows "
        "are the whole command in a fresh process.",
    ]
    if decode is not None:
        r = decode["ratio"]
        on, off = decode["rates"]["on"], decode["rates"]["off"]
        lines += [
            "",
            f"## Decode with the store on vs off ({decode['model']}, {args.gen} tokens, {args.decode_reps} reps); "
            "target ≤ 1 % cost",
            "",
            "| arm | decode tok/s per rep | median |",
            "|---|---|---|",
            f"| off | {', '.join(f'{x:.1f}' for x in off)} | {statistics.median(off):.1f} |",
            f"| on | {', '.join(f'{x:.1f}' for x in on)} | {statistics.median(on):.1f} |",
            "",
            f"on ÷ off: median of per-rep ratios {r.median_of_ratios:.4f} (ratio of medians {r.of_medians:.4f}): "
            f"the store costs decode {100 * (1 - r.median_of_ratios):+.2f} %.",
        ]
    lines += ["", f"Load at the end: {load_note()}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=100_000, help="turns in the generated history (default 100000)")
    ap.add_argument("--per-session", type=int, default=100, help="turns a session (default 100)")
    ap.add_argument("--reps", type=int, default=5, help="times each query runs (default 5)")
    ap.add_argument("--model", help="GGUF path or name for the decode arms (default: the bundled SmolLM2-135M)")
    ap.add_argument("--decode-reps", type=int, default=6, help="reps of each decode arm (default 6; 0: skip)")
    ap.add_argument("--gen", type=int, default=128, help="decoded tokens a turn (default 128)")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens a turn (default 64)")
    ap.add_argument("--out", metavar="FILE", help="also write the Markdown report here")
    args = ap.parse_args(argv)
    if min(args.turns, args.per_session, args.reps, args.prompt) < 1 or args.decode_reps < 0 or args.gen < 2:
        ap.error("--turns, --per-session, --reps and --prompt must be >= 1, --decode-reps >= 0, --gen >= 2")
    base = _isolate()
    try:
        return _run(args)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(args: argparse.Namespace) -> int:
    sessions = generate(args.turns, args.per_session)
    from chatphase.history.db import connect
    from chatphase.history.index import catch_up

    t0 = time.perf_counter()
    conn = connect()
    catch_up(conn, parallel=True)  # as the user's first ``logs`` or ``stats`` takes it over
    indexed = conn.execute("SELECT count(*) FROM turns").fetchone()[0]
    conn.close()
    take_over_s = time.perf_counter() - t0
    if indexed != args.turns:
        raise SystemExit(f"the history holds {indexed} turns, not {args.turns}")
    queries = query_figures(args.reps)
    commands = command_figures(args.reps)
    decode = decode_figures(args.model, args.decode_reps, args.gen, args.prompt) if args.decode_reps else None
    text = report(args, sessions, take_over_s, queries, commands, decode)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if decode is not None:
        print(json.dumps({"decode_on_off_ratio": decode["ratio"].median_of_ratios}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
