"""The TUI's share of the machine, in a real terminal: the chat TUI against ``chatphase ask`` streaming the
same turn to the same terminal (tmux, same size), interleaved, side by side in one run.

Run: ``python -m benchmarks.terminal_share [--reps 4] [--threads 2] [--tokens 300] [--size 150x45]``

Both arms run a fresh ``python -m chatphase`` process with the same greedy turn (``--temperature 0``,
``--max-tokens``), the same ``--threads`` and the config, data and log directories in a temporary folder:

- ``ask``: the reply streams to the pane (stdout); its metrics line (stderr) goes to a file and gives
  the engine's decode tok/s and TTFT;
- ``tui``: the prompt is typed into the chat and sent; when the phase line says DONE the saved session
  gives the turn's metrics (the same engine figures the dashboard shows).

Per arm and rep: decode tok/s, TTFT and the decode tokens (both arms must write the same reply: greedy).
Prints each rep, the medians and spread, and the ratio TUI / ask of each rep's decode rates (its two
arms run back to back) with the target on their median: ≥ 0.95 when the engine's threads take every
core (``--threads`` = CPUs), ≥ 0.97 when one is spare. The per-rep ratio is the figure to judge by on a
shared machine, whose speed drifts by more than the TUI's cost from one minute to the next (seen: ±5 %
between reps, both arms alike); the ratio of the two arms' medians is printed beside it.
The engine's figures are its own clock's, so the ratio is what drawing the screen costs the model.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, load_note, machine_line, ratio, rotation
from benchmarks.startup import Terminal  # the tmux control-mode terminal
from chatphase.sessions.catalog import load_session

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
_ASK_LINE = re.compile(r"TTFT ([\d.,]+) ms .* decode (\d+) tok @ ([\d.,]+) tok/s")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def ask_arm(args, env: dict[str, str], tmp: Path, size: tuple[int, int]) -> dict:
    """One turn of ``chatphase ask`` streaming into the pane; metrics from its stderr line."""
    err = tmp / "ask.err"
    base = [sys.executable, "-m", "chatphase", "ask", "--no-save", *_turn_flags(args), PROMPT]
    command = ["sh", "-c", f"{shlex.join(base)} 2> {shlex.quote(str(err))}; echo ASK-DONE"]
    term = Terminal(command, size, env)
    try:
        deadline = time.monotonic() + args.timeout_s
        while time.monotonic() < deadline and not term.exited:
            term.pump(0.2)
            if term.changed and "ASK-DONE" in term.capture():
                break
    finally:
        term.close()
    m = _ASK_LINE.search(err.read_text() if err.exists() else "")
    if not m:
        raise SystemExit(f"ask gave no metrics line: {err.read_text() if err.exists() else '(no stderr)'}")
    return {"ttft_ms": _num(m[1]), "decode_tokens": int(m[2]), "decode_tokens_per_s": _num(m[3])}


def tui_arm(args, env: dict[str, str], size: tuple[int, int]) -> dict:
    """One turn typed into the chat TUI; metrics from the session it saved."""
    command = [sys.executable, "-m", "chatphase", *_turn_flags(args)]
    term = Terminal(command, size, env)
    try:
        deadline = time.monotonic() + args.timeout_s
        sent = False
        while time.monotonic() < deadline and not term.exited:
            term.pump(0.05)
            if not term.changed:
                continue
            screen = term.capture()
            if not sent and "READY" in screen:
                time.sleep(0.5)  # nobody types in the instant the model is ready; let the start-up paint end
                term.send_key(PROMPT)
                term.send_key("Enter", literal=False)
                sent = True
            elif sent and re.search(r"\bDONE\b", screen):
                break
        term.send_key("C-q", literal=False)
        quit_by = time.monotonic() + 5
        while not term.exited and time.monotonic() < quit_by:
            term.pump(0.1)
    finally:
        term.close()
    turn = load_session("last", Path(env["CHATPHASE_DATA_DIR"]) / "sessions").turns[-1]
    m = turn.metrics
    if m is None:
        raise SystemExit(f"the TUI's turn has no metrics (status {turn.status})")
    return {"ttft_ms": m.ttft_ms, "decode_tokens": m.decode_tokens, "decode_tokens_per_s": m.decode_tokens_per_s}


def _turn_flags(args) -> list[str]:
    return ["--temperature", "0", "--max-tokens", str(args.tokens), "--threads", str(args.threads)]


def summary(rows: list[dict], key: str) -> tuple[float, float, float]:
    xs = [r[key] for r in rows]
    return statistics.median(xs), min(xs), max(xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=4, help="interleaved repetitions per arm (default 4)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="engine threads (default: CPUs)")
    ap.add_argument("--tokens", type=int, default=300, help="--max-tokens of the turn (default 300)")
    ap.add_argument("--size", default="150x45", help="terminal columns x rows (default 150x45)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="give up on a turn after this")
    args = ap.parse_args(argv)
    cols, rows = (int(v) for v in args.size.lower().split("x"))
    spare = (os.cpu_count() or 1) - args.threads >= 1
    target = 0.97 if spare else 0.95
    out: dict[str, list[dict]] = {"ask": [], "tui": []}
    print(
        f"# TUI vs ask in tmux {cols}x{rows}: {args.tokens} tokens, {args.threads} engine threads on "
        f"{os.cpu_count()} CPUs ({'a core spare' if spare else 'no core spare'}); {machine_line()}"
    )
    with tempfile.TemporaryDirectory(prefix="chatphase-share-") as tmp:
        root = Path(tmp)
        for rep in range(args.reps + 1):  # the first round warms the page cache and is not counted
            for arm in rotation(("ask", "tui"), rep):
                env = {
                    "PYTHONPATH": str(ROOT),
                    "CHATPHASE_CONFIG": f"{tmp}/c.toml",
                    "CHATPHASE_DATA_DIR": f"{tmp}/data-{arm}-{rep}",
                    "CHATPHASE_LOG_DIR": f"{tmp}/log",
                }
                r = ask_arm(args, env, root, (cols, rows)) if arm == "ask" else tui_arm(args, env, (cols, rows))
                label = "warm-up" if rep == 0 else f"rep {rep}"
                print(
                    f"{label:>8} {arm}: decode {r['decode_tokens_per_s']:.1f} tok/s over {r['decode_tokens']} tok, "
                    f"TTFT {r['ttft_ms']:.1f} ms",
                    flush=True,
                )
                if rep:
                    out[arm].append(r)
    print("\n| arm | decode tok/s median (min–max) | TTFT ms median (min–max) | decode tokens |\n|---|---:|---:|---:|")
    for arm, rs in out.items():
        d, t = summary(rs, "decode_tokens_per_s"), summary(rs, "ttft_ms")
        tokens = sorted({r["decode_tokens"] for r in rs})
        print(f"| {arm} | {d[0]:.1f} ({d[1]:.1f}–{d[2]:.1f}) | {t[0]:.1f} ({t[1]:.1f}–{t[2]:.1f}) | {tokens} |")
    r = ratio([t["decode_tokens_per_s"] for t in out["tui"]], [a["decode_tokens_per_s"] for a in out["ask"]])
    verdict = "PASS" if r.median_of_ratios >= target else "FAIL"
    print(
        f"\nTUI / ask decode tok/s, per rep (the two arms ran back to back): {' '.join(f'{x:.3f}' for x in r.per_rep)}"
        f"\nmedian of the per-rep ratios: {r.median_of_ratios:.3f} (target ≥ {target}) {verdict}; ratio of the medians "
        f"{r.of_medians:.3f}; {load_note()} at the end"
    )
    return 0 if r.median_of_ratios >= target else 1


if __name__ == "__main__":
    raise SystemExit(main())
