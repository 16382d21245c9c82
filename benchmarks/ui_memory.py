"""What a chat's old turns cost the UI process: its memory per turn over a long chat.

Method: a headless ``ChatPhaseApp`` (``app.run_test()``, 150×45: chat, side panel and dashboard drawn)
sends ``--turns`` short messages as a user would, one after the other; after each finished turn (and a
``gc.collect()``) it records

- ``rss``: the UI process's resident set (psutil); the engine runs in another process (``--real``) or is
  scripted (the default: the tests' ``FakeEngine`` (``tests/fake_engine.py``) whose replies are a few lines of
  Markdown, as a 40-token reply of the default model is), so this is the UI's alone;
- ``traced``: the Python memory tracemalloc traces, in a second run of its own (tracing slows the app
  and adds to its RSS), with the allocation sites that grew most between turn 10 and the last.

Reported: MiB per turn after turn 10, as the least-squares slope of each series over turns 11.. and as
(last − turn 10) / turns. The first turns are left out: they fill caches of fixed size (styles, glyph
widths, the stylesheet's rules). Each run is a fresh process, so the runs do not share an allocator.

``--real``: the bundled default model in its engine child process (``--max-tokens`` tokens a reply,
greedy); slower (a few seconds a turn), RSS only.

Target: at most 0.1 MiB a turn after turn 10.

Run: ``python -m benchmarks.ui_memory [--turns 100] [--real] [--out results.md]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc

from benchmarks.harness import ROOT, machine_line

#: the scripted reply: about 40 tokens of Markdown (a sentence, bold text, a two-item list).
REPLY = (
    "Prefill reads the whole prompt in one pass; decode then writes one token per step, so its speed is "
    "bound by memory bandwidth. **Short** answers keep the chat quick:\n\n"
    "- the first token waits for prefill\n- each later token waits for one decode step\n"
)
SIZE = (150, 45)
FROM_TURN = 10
MiB = 2**20


def _isolate() -> None:
    """Logs, sessions and config in a temporary folder (no session of the user's is written or read)."""
    base = tempfile.mkdtemp(prefix="chatphase-ui-memory-")
    for name in ("LOG_DIR", "DATA_DIR", "RUNTIME_DIR"):
        os.environ[f"CHATPHASE_{name}"] = os.path.join(base, name.lower())
    os.environ["CHATPHASE_CONFIG"] = os.path.join(base, "config.toml")


def _app(real: bool, max_tokens: int):
    from chatphase.settings.schema import Settings
    from chatphase.ui.app import ChatPhaseApp

    if real:
        from chatphase.commands.server_options import engine_for, model_info_for
        from chatphase.engine.events import SamplingParams

        settings = Settings(sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0))
        info = model_info_for(settings, pull=False, warn=lambda _line: None)
        return ChatPhaseApp(settings, info, lambda i, current: engine_for(current, i), save_sessions=False)
    # the scripted engine is the tests' (tests/fake_engine.py): the product has no use for one
    from tests.fake_engine import FakeEngine, fake_model_info

    settings = Settings().with_overrides(n_ctx=65536)  # the whole chat fits: no turn drops old messages
    return ChatPhaseApp(
        settings, fake_model_info(), lambda i, current: FakeEngine(i, current, replies=[REPLY]), save_sessions=False
    )


async def _wait(pilot, condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not get there in time")
        await pilot.pause(0.02)


async def _drive(turns: int, real: bool, max_tokens: int, trace: bool) -> dict:
    import psutil

    from chatphase.ui.transcript.chat_log import ChatLog

    app = _app(real, max_tokens)
    chat = app.chat
    process = psutil.Process()
    rss, traced, widgets, top = [], [], [], []
    snapshot = None
    timeout = 300 if real else 30

    def idle() -> bool:
        return chat.loaded is not None and not chat.busy and chat.active_turn is None

    async with app.run_test(size=SIZE) as pilot:
        await _wait(pilot, idle, 120 if real else 10)
        if trace:
            tracemalloc.start()
        for i in range(1, turns + 1):
            app.prompt.set_text(f"Question {i}: what do prefill and decode cost here?")
            await pilot.press("enter")
            await _wait(pilot, lambda i=i: len(chat.conversation) == 2 * i and idle(), timeout)
            await pilot.pause(0.05)  # the turn's last redraw
            gc.collect()
            rss.append(process.memory_info().rss / MiB)
            widgets.append(sum(1 for _ in app.query_one(ChatLog).walk_children()))
            if trace:
                traced.append(tracemalloc.get_traced_memory()[0] / MiB)
                if i == FROM_TURN:
                    snapshot = tracemalloc.take_snapshot()
        if trace and snapshot is not None:
            grew = tracemalloc.take_snapshot().compare_to(snapshot, "lineno")
            for stat in grew[:12]:
                frame = stat.traceback[0]
                where = frame.filename.split("site-packages/")[-1].split("chatphase/")[-1]
                top.append((f"{where}:{frame.lineno}", stat.size_diff / 1024 / (turns - FROM_TURN)))
    return {"rss": rss, "traced": traced, "widgets": widgets, "top": top}


def slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` (one a turn) over turns ``FROM_TURN + 1`` .. (units a turn)."""
    ys = values[FROM_TURN:]
    xs = range(len(ys))
    mx, my = (len(ys) - 1) / 2, sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def per_turn(values: list[float]) -> tuple[float, float]:
    """(slope, (last − turn 10) / turns) of a series in MiB, one value a turn."""
    return slope(values), (values[-1] - values[FROM_TURN - 1]) / (len(values) - FROM_TURN)


def _child(args: argparse.Namespace, trace: bool) -> dict:
    """One run in a fresh process (its own allocator and caches); returns its figures."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.ui_memory",
        "--child",
        "--turns",
        str(args.turns),
        "--max-tokens",
        str(args.max_tokens),
    ]
    cmd += ["--real"] * args.real + ["--trace"] * trace
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"ui_memory: the run failed: {out.stderr.strip().splitlines()[-1:] or out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(args: argparse.Namespace, runs: dict[str, dict]) -> str:
    mode = f"default model, --max-tokens {args.max_tokens}" if args.real else "FakeEngine (scripted Markdown replies)"
    lines = [
        f"# UI memory per turn — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"`python -m benchmarks.ui_memory --turns {args.turns}{' --real' if args.real else ''}` · {mode} · "
        f"{SIZE[0]}×{SIZE[1]} · {machine_line()}",
        "",
        f"| series | turn 1 | turn {FROM_TURN} | turn {args.turns} | MiB/turn after turn {FROM_TURN} (slope) "
        "| (last − turn 10) / turns |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, values in (("RSS (MiB)", runs["rss"]["rss"]), ("traced (MiB)", runs.get("trace", {}).get("traced"))):
        if values:
            fit, span = per_turn(values)
            first, tenth = values[0], values[FROM_TURN - 1]
            lines.append(f"| {name} | {first:.1f} | {tenth:.1f} | {values[-1]:.1f} | {fit:.3f} | {span:.3f} |")
    widgets = runs["rss"]["widgets"]
    lines += ["", f"Widgets in the chat log: {widgets[0]} after turn 1, {widgets[-1]} after turn {args.turns}."]
    top = runs.get("trace", {}).get("top")
    if top:
        lines += ["", f"Allocation sites that grew most from turn {FROM_TURN} (KiB a turn):", ""]
        lines += [f"- `{where}`: {kib:.1f}" for where, kib in top]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--real", action="store_true", help="the bundled default model instead of the FakeEngine")
    parser.add_argument("--max-tokens", type=int, default=40, help="tokens a reply with --real (default 40)")
    parser.add_argument("--no-trace", action="store_true", help="skip the tracemalloc run")
    parser.add_argument("--out", help="also write the Markdown report here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.turns <= FROM_TURN + 1:
        parser.error(f"--turns must be more than {FROM_TURN + 1}")
    if args.child:
        _isolate()
        print(json.dumps(asyncio.run(_drive(args.turns, args.real, args.max_tokens, args.trace))))
        return 0
    runs = {"rss": _child(args, trace=False)}
    if not args.no_trace and not args.real:
        runs["trace"] = _child(args, trace=True)
    text = report(args, runs)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
