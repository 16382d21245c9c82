"""Does the token view stay usable on a long prompt? Open and scroll it at N prompt tokens, the UI's longest block.

Method: a headless ``ChatPhaseApp`` (``app.run_test()`` at each ``--sizes``, the tests' scripted ``FakeEngine``)
is handed one finished turn's :class:`~chatphase.engine.tokens.TurnTokens` of N prompt tokens, made up
(:func:`synthetic_tokens`: a chat template's special tokens every message, English-like pieces with newlines, a
few wide and split-byte pieces; restored, cached and prefilled spans; N/20 tokens an overflow dropped; a reply of
``--reply`` tokens with their times, a stall and speculative drafts). Then, as a user would:

- ``open``: F12 pressed → the token screen's last paint with its grid laid out (the first open of the
  process, which loads the screen's module and its CSS, and a second open after Esc);
- ``page-down``: PageDown from the first token until the selection is on the grid's last line (the whole length);
- ``wheel``: the mouse wheel up from there, ``--wheel`` notches at most (a notch scrolls a few lines);
- ``arrows``: Right, Down, Up, Left 40 times each (the selection moves, the detail line follows);
- ``strip``: Tab to the reply's time strip, Right along it (``--reply`` presses at most), End, Home.

Keys and wheel notches go in as a terminal's driver sends them (not through the test ``Pilot``, whose waits for
an idle process would be most of each step). A step's time is from the key (or notch) until the last paint it
causes has ended (no paint for 50 ms after it; so it includes Textual's update timer, which paints at most 60
times a second). A frame is one run of the
screen's update (layout, the compositor's render of the changed lines and, since a headless app writes no
terminal, the render of that update to the terminal's escape sequences, which a real terminal would get). The
event loop's longest block is the worst lateness of a 5 ms asyncio timer that runs beside the app all the while:
nothing the app does (a key's handler, a layout, a frame, garbage collection) can run longer unseen.

Each (N, size) runs ``--reps`` times, each run in a fresh process (no cache carried over). Reported per size: the
median over reps of each figure for each N side by side, and the median of the per-rep ratios N / smallest N:
that ratio is the verdict (a view that draws only the lines in view scales by ~1), not the absolute times, which
depend on the machine and its load.

``--gc-freeze``: ``gc.freeze()`` again once the turn is there (the app itself freezes its start-up objects once its
first screen is drawn, ``chatphase/ui/app.py``), so that a collection walks only what the view makes.

Target: at 20,000 prompt tokens the event loop never blocks for more than 50 ms (exit 1 where it did).

Run: ``python -m benchmarks.token_view [--tokens 2000,20000,100000] [--sizes 120x40,80x24] [--output FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness import ROOT, machine_line, ratio, rotation

TARGET_TOKENS = 20_000
TARGET_BLOCK_MS = 50.0
TICK_S = 0.005
QUIET_S = 0.05
PHASES = ("open", "page-down", "wheel", "arrows", "strip")

# --- the synthetic turn -------------------------------------------------------------------------------------

#: a chat template's markers (special) and the text pieces of a byte-level BPE vocabulary, newlines included
SPECIALS = ("<|im_start|>", "<|im_end|>")
WORDS = (
    "the of and to in is that for it as with was on be by this are or from at an which but not have "
    "prefill decode token cache model layer batch thread memory bandwidth prompt reply context window"
).split()


def synthetic_tokens(n_prompt: int, n_reply: int = 300, seed: int = 0) -> Any:
    """A made-up turn of ``n_prompt`` prompt tokens (30 % restored, up to 60 % cached, the rest prefilled),
    ``n_prompt // 20`` dropped by an overflow and ``n_reply`` reply tokens sampled ~25 ms apart (the first at a
    TTFT of a prefill at 500 tok/s, one 400 ms stall, accepted drafts in every third 12-token stretch)."""
    from chatphase.engine.tokens import Piece, TurnTokens

    rng = random.Random(seed)
    pieces: dict[int, Piece] = {0: Piece(SPECIALS[0], True), 1: Piece(SPECIALS[1], True)}
    texts = [f" {w}" for w in WORDS] + [w for w in WORDS] + ["\n", ".\n", ",", ".", " 2", "0", "\n\n", "\t"]
    texts += [" 缓存", "预填充", "\\xe2", "\\x80", " café", "  ", "```", "python", "):", " ="]
    for i, text in enumerate(texts, start=2):
        pieces[i] = Piece(text, False)
    ordinary = list(range(2, 2 + len(texts)))

    def message(n: int) -> list[int]:
        body = [rng.choice(ordinary) for _ in range(max(0, n - 4))]
        return [0, rng.choice(ordinary), 2 + texts.index("\n"), *body, 1][:n]

    def stream(n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            out += message(min(n - len(out), rng.randint(40, 400)))
        return out

    prompt = stream(n_prompt)
    restored, cached = int(0.3 * n_prompt), int(0.6 * n_prompt)
    reply = [rng.choice(ordinary) for _ in range(n_reply)]
    t_ns: list[int] = []
    t = int(n_prompt / 500 * 1e9)
    for i in range(n_reply):
        t += 0 if i == 0 else int(rng.gauss(25e6, 4e6)) + (400_000_000 if i == n_reply // 2 else 0)
        t_ns.append(max(t, t_ns[-1] + 1 if t_ns else 0))
    accepted = [i for i in range(n_reply) if (i // 12) % 3 == 1 and i % 12 < 8]
    steps = tuple((first, 12, 8) for first in range(12, n_reply - 12, 36))
    return TurnTokens(
        prompt,
        restored,
        cached,
        n_prompt - cached,
        left_out_ids=stream(n_prompt // 20),
        left_out_how="dropped",
        reply_ids=reply,
        reply_t_ns=t_ns,
        reply_accepted=accepted,
        spec_steps=steps,
        pieces=pieces,
    )


# --- one run --------------------------------------------------------------------------------------------------


def _isolate() -> None:
    """Logs, sessions and config in a temporary folder (no session of the user's is written or read)."""
    base = tempfile.mkdtemp(prefix="chatphase-token-view-")
    for name in ("LOG_DIR", "DATA_DIR", "RUNTIME_DIR"):
        os.environ[f"CHATPHASE_{name}"] = os.path.join(base, name.lower())
    os.environ["CHATPHASE_CONFIG"] = os.path.join(base, "config.toml")


class Probe:
    """What the run records: each paint's end (``perf_counter`` s), each frame's duration (ms) and, per phase,
    the event loop's worst lateness (ms) and the most CPU its thread spent between two ticks (ms: the part of a
    block that is the app's own work, not the machine's other processes)."""

    def __init__(self) -> None:
        self.phase = "start"
        self.paints: list[float] = []
        self.frames: dict[str, list[float]] = {}
        self.block_ms: dict[str, float] = {}
        self.block_cpu_ms: dict[str, float] = {}
        self.gc_ms: dict[str, float] = {}
        self.running = True
        self._gc_t0 = 0.0

    def collected(self, state: str, info: dict[str, int]) -> None:
        """``gc.callbacks``: the longest garbage collection per phase (a pause the app's code does not choose)."""
        if state == "start":
            self._gc_t0 = time.perf_counter()
        else:
            ms = (time.perf_counter() - self._gc_t0) * 1000
            self.gc_ms[self.phase] = max(self.gc_ms.get(self.phase, 0.0), ms)

    def frame(self, ms: float) -> None:
        self.frames.setdefault(self.phase, []).append(ms)

    async def watch(self) -> None:
        """The 5 ms timer: how late each tick comes is how long the loop was busy with something else."""
        last, last_cpu = time.perf_counter(), time.thread_time()
        while self.running:
            await asyncio.sleep(TICK_S)
            now, cpu = time.perf_counter(), time.thread_time()
            late_ms, cpu_ms = (now - last - TICK_S) * 1000, (cpu - last_cpu) * 1000
            self.block_ms[self.phase] = max(self.block_ms.get(self.phase, 0.0), late_ms)
            self.block_cpu_ms[self.phase] = max(self.block_cpu_ms.get(self.phase, 0.0), cpu_ms)
            last, last_cpu = now, cpu


def _instrument(probe: Probe) -> Callable[[], None]:
    """Time every screen update (a frame) and render each to escape sequences as a terminal's driver would; the
    returned function undoes it."""
    from textual.app import App
    from textual.screen import Screen

    on_timer_update, display = Screen._on_timer_update, App._display

    def timed_update(self: Screen) -> None:
        t0 = time.perf_counter()
        on_timer_update(self)
        probe.frame((time.perf_counter() - t0) * 1000)

    def rendered_display(self: App, screen: Screen, renderable: Any) -> None:
        display(self, screen, renderable)
        if renderable is not None and hasattr(renderable, "render_segments"):
            renderable.render_segments(self.console)  # what a real driver writes; headless skips it
            probe.paints.append(time.perf_counter())

    Screen._on_timer_update = timed_update  # type: ignore[method-assign]
    App._display = rendered_display  # type: ignore[method-assign]

    def undo() -> None:
        Screen._on_timer_update = on_timer_update  # type: ignore[method-assign]
        App._display = display  # type: ignore[method-assign]

    return undo


async def _drive(
    n_prompt: int, size: tuple[int, int], n_reply: int, wheel: int, freeze: bool = False
) -> dict[str, Any]:
    from textual import events

    from chatphase.settings.schema import Settings
    from chatphase.ui.app import ChatPhaseApp
    from chatphase.ui.screens.token_grid import GapStrip, TokenGrid
    from tests.fake_engine import FakeEngine, fake_model_info

    tokens = synthetic_tokens(n_prompt, n_reply)
    app = ChatPhaseApp(
        Settings(), fake_model_info(), lambda i, current: FakeEngine(i, current, replies=["Fine"]), save_sessions=False
    )
    probe = Probe()
    undo = _instrument(probe)
    steps: dict[str, list[float]] = {}
    opens: list[float] = []

    async def settle(condition: Callable[[], bool], timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the token view did not get there in time ({probe.phase})")
            await asyncio.sleep(0.002)

    async def step(send: Callable[[], None]) -> float | None:
        """One key or notch, sent as a terminal's driver sends it: ms from then until the last paint of the burst
        it causes has ended (no further paint for :data:`QUIET_S`); ``None`` where it painted nothing."""
        n0 = len(probe.paints)
        t0 = time.perf_counter()
        send()
        deadline = t0 + 2.0
        while len(probe.paints) == n0 and time.perf_counter() < deadline:
            await asyncio.sleep(0.001)
        while len(probe.paints) > n0 and time.perf_counter() - probe.paints[-1] < QUIET_S:
            await asyncio.sleep(0.002)
        if len(probe.paints) == n0:
            return None
        ms = (probe.paints[-1] - t0) * 1000
        steps.setdefault(probe.phase, []).append(ms)
        return ms

    def key(name: str) -> Callable[[], None]:
        return lambda: send(events.Key(name, "\t" if name == "tab" else None))

    def notch() -> None:
        region = grid.region
        x, y = region.x + region.width // 2, region.y + region.height // 2
        send(events.MouseScrollUp(None, x, y, 0, 0, 0, False, False, False, screen_x=x, screen_y=y))

    gc.callbacks.append(probe.collected)
    try:
        _isolate()
        async with app.run_test(size=size):
            driver = app._driver
            assert driver is not None
            send = driver.send_message
            chat = app.chat
            await settle(lambda: chat.loaded is not None and not chat.busy)
            app.view.turn_tokens[1] = tokens  # as if turn 1 had finished with this prompt
            if freeze:
                gc.freeze()  # the app's start-up objects out of every later collection's way
            watcher = asyncio.create_task(probe.watch())
            await asyncio.sleep(0.2)
            probe.phase = "open"
            for again in (False, True):
                opens.append(await step(key("f12")) or 0.0)
                await settle(lambda: bool(app.screen.query(TokenGrid)) and app.screen.query_one(TokenGrid)._width > 0)
                if not again:
                    await step(key("escape"))
                    await settle(lambda: not app.screen.query(TokenGrid))
            steps.pop("open", None)
            grid = app.screen.query_one(TokenGrid)
            last_line = grid.virtual_size.height - 1
            probe.phase = "page-down"
            while grid._entry_line[grid.cursor] < last_line:
                if await step(key("pagedown")) is None:
                    raise RuntimeError("PageDown moved nothing before the grid's last line")
            probe.phase = "wheel"
            for _ in range(wheel):
                if grid.scroll_offset.y == 0:
                    break
                await step(notch)
            probe.phase = "arrows"
            for name in ("right", "down", "up", "left"):
                for _ in range(40):
                    await step(key(name))
            probe.phase = "strip"
            await step(key("tab"))
            strip = app.screen.query_one(GapStrip)
            for _ in range(min(n_reply, len(tokens.reply_ids))):
                await step(key("right"))
            for name in ("end", "home"):
                await step(key(name))
            assert strip.has_focus
            probe.running = False
            await watcher
    finally:
        undo()
        gc.callbacks.remove(probe.collected)
    return {
        "n": n_prompt,
        "lines": last_line + 1,
        "open_ms": opens,
        "steps_ms": steps,
        "frames_ms": probe.frames,
        "block_ms": probe.block_ms,
        "block_cpu_ms": probe.block_cpu_ms,
        "gc_ms": probe.gc_ms,
    }


# --- the report -----------------------------------------------------------------------------------------------


def _child(n: int, size: tuple[int, int], args: argparse.Namespace) -> dict[str, Any]:
    """One run in a fresh process; returns its figures."""
    cmd = [sys.executable, "-m", "benchmarks.token_view", "--child", str(n), "--sizes", f"{size[0]}x{size[1]}"]
    cmd += ["--reply", str(args.reply), "--wheel", str(args.wheel)] + ["--gc-freeze"] * args.gc_freeze
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(
            f"token_view: the run at {n:,} tokens failed: {out.stderr.strip().splitlines()[-1:] or out.returncode}"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def figures(run: dict[str, Any]) -> dict[str, float]:
    """One run's figures (ms): the opens, each phase's median and worst step, the worst frame and block."""
    steps = run["steps_ms"]
    out = {"open (first) ms": run["open_ms"][0], "open (again) ms": run["open_ms"][1]}
    for phase in PHASES[1:]:
        if steps.get(phase):
            out[f"{phase} step median ms"] = statistics.median(steps[phase])
            out[f"{phase} step max ms"] = max(steps[phase])
    out["longest frame ms"] = max(max(v) for v in run["frames_ms"].values() if v)
    for phase in PHASES:
        if phase in run["block_ms"]:
            out[f"event-loop block ms, {phase}"] = run["block_ms"][phase]
    out["longest event-loop block ms"] = max(run["block_ms"][p] for p in PHASES if p in run["block_ms"])
    out["longest garbage collection ms"] = max(run["gc_ms"].values(), default=0.0)
    out["its CPU: most between two ticks ms"] = max(run["block_cpu_ms"][p] for p in PHASES if p in run["block_cpu_ms"])
    return out


def _short(n: int) -> str:
    """``20k`` for 20,000, ``2.5k`` for 2,500, ``400`` for 400."""
    return f"{n / 1000:g}k" if n >= 1000 else str(n)


def table(size: tuple[int, int], runs: dict[int, list[dict[str, Any]]]) -> list[str]:
    ns = sorted(runs)
    base = ns[0]
    per_n = {n: [figures(r) for r in runs[n]] for n in ns}
    head = " | ".join(f"N = {n:,}" for n in ns)
    ratios = " | ".join(f"{_short(n)} ÷ {_short(base)}" for n in ns[1:])
    lines = [
        f"## {size[0]}×{size[1]}",
        "",
        "Grid lines: " + ", ".join(f"{runs[n][0]['lines']:,} at N = {n:,}" for n in ns) + ".",
        "",
        f"| figure (median of {len(runs[base])} runs) | {head} | {ratios} |",
        "|---|" + "---:|" * (2 * len(ns) - 1),
    ]
    names = [k for k in per_n[base][0] if all(k in f for n in ns for f in per_n[n])]
    for name in names:
        values = {n: [f[name] for f in per_n[n]] for n in ns}
        cells = [f"{statistics.median(values[n]):.1f}" for n in ns]
        cells += [f"{ratio(values[n], values[base]).median_of_ratios:.2f}" for n in ns[1:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    steps = {phase: len(runs[ns[-1]][0]["steps_ms"].get(phase, [])) for phase in PHASES[1:]}
    lines += ["", f"Steps at N = {ns[-1]:,}: " + ", ".join(f"{p} {k}" for p, k in steps.items()) + "."]
    return lines


def report(args: argparse.Namespace, results: dict[tuple[int, int], dict[int, list[dict[str, Any]]]]) -> str:
    lines = [
        f"# Token view at long prompts — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"`python -m benchmarks.token_view --tokens {args.tokens} --sizes {args.sizes} --reps {args.reps}` · "
        f"reply {args.reply} tok{' · gc.freeze() after start-up' if args.gc_freeze else ''} · {machine_line()}",
        "",
        "Steps include Textual's update timer (≤ 60 paints a second); the ratio columns are the verdict.",
        "",
    ]
    for size, runs in results.items():
        lines += [*table(size, runs), ""]
    verdict = target_blocks(results)
    if verdict is not None:
        worst = max(verdict)
        met = "met" if worst <= TARGET_BLOCK_MS else "NOT met"
        lines.append(
            f"Target (the event loop never blocked > {TARGET_BLOCK_MS:.0f} ms at {TARGET_TOKENS:,} tokens): {met}; "
            f"longest block {worst:.1f} ms."
        )
    return "\n".join(lines) + "\n"


def target_blocks(results: dict[tuple[int, int], dict[int, list[dict[str, Any]]]]) -> list[float] | None:
    """Every run's longest block at :data:`TARGET_TOKENS` (``None`` where none ran at that N)."""
    blocks = [
        max(r["block_ms"][p] for p in PHASES if p in r["block_ms"])
        for runs in results.values()
        for r in runs.get(TARGET_TOKENS, [])
    ]
    return blocks or None


def _ints(text: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of token counts: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"token counts must be positive: {text!r}")
    return values


def _sizes(text: str) -> list[tuple[int, int]]:
    try:
        sizes = [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of WxH sizes: {text!r}") from None
    if not sizes or any(len(s) != 2 or min(s) < 20 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes are WxH, each at least 20: {text!r}")
    return [(s[0], s[1]) for s in sizes]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="2000,20000,100000", help="prompt sizes N, the first the base")
    parser.add_argument("--sizes", default="120x40,80x24", help="terminal sizes WxH")
    parser.add_argument("--reps", type=int, default=3, help="runs per N and size (default 3)")
    parser.add_argument("--reply", type=int, default=300, help="reply tokens (default 300)")
    parser.add_argument("--wheel", type=int, default=300, help="mouse-wheel notches at most (default 300)")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() once the app has started (what the collector costs)"
    )
    parser.add_argument("--output", help="also write the Markdown report here")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        ns, sizes = _ints(args.tokens), _sizes(args.sizes)
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    if args.reps < 1 or args.reply < 1 or args.wheel < 0:
        parser.error("--reps and --reply must be at least 1, --wheel at least 0")
    if args.child:
        print(json.dumps(asyncio.run(_drive(args.child, sizes[0], args.reply, args.wheel, args.gc_freeze))))
        return 0
    results: dict[tuple[int, int], dict[int, list[dict[str, Any]]]] = {}
    for size in sizes:
        runs: dict[int, list[dict[str, Any]]] = {n: [] for n in ns}
        for rep in range(args.reps):
            for n in rotation(ns, rep):  # no N always runs first
                runs[n].append(_child(n, size, args))
        results[size] = runs
    text = report(args, results)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    blocks = target_blocks(results)
    return 1 if blocks and max(blocks) > TARGET_BLOCK_MS else 0


if __name__ == "__main__":
    sys.exit(main())
