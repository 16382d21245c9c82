"""What does the TUI cost the model? Decode tokens/s and TTFT of the same turns, engine alone vs. through the TUI.

Method (one run, side by side, interleaved):

- One :class:`~chatphase.engine.process.host.EngineHost` (the model in its child process) is loaded once and shared by
  both arms through :class:`SharedEngine`, so the only difference between the arms is the TUI. Every turn
  starts from a cleared KV cache (``reset_cache=True``) and decodes greedily (temperature 0), so both arms
  compute exactly the same tokens.
- Arm **engine**: the turn is driven straight through ``EngineHost.run_turn()`` (no UI process work).
- Arm **tui**: a fresh headless ``ChatPhaseApp`` (``app.run_test()``, 150×45 so the side panel and the
  dashboard are shown and rendered) sends the prompt as a user would; the app streams the Markdown reply,
  the phase indicator, the panel and the dashboard as it does in a terminal.
- The arms alternate, and their order flips every repetition (engine→tui, tui→engine, ...), so drift in
  machine load hits both alike. Reported: the median over repetitions per arm and the ratio tui/engine.

Figures:

- ``decode_tokens_per_s`` and ``ttft_ms`` as the engine measures them (docs/metrics.md): the UI process
  competes with the engine for CPU, so this is where a costly UI shows up.
- ``client_ttft_ms``: from the submit call to the first token *received by the consumer* (the loop over
  ``run_turn`` for the engine arm; the app's ``FirstTokenArrived`` handler for the TUI arm): adds the pipe
  hop and, for the TUI, the worker thread and Textual's message queue.
- ``UI CPU ms/token``: CPU time of the benchmark's own process (all its threads: the app, its worker, the
  pipe reader) during decode, per decoded token after the first. It hardly depends on what else the machine runs, so it is the figure to
  trust on a busy machine; the engine arm's is the bare consumer loop. On a machine with spare cores the
  UI's CPU does not slow the engine; on a machine whose cores the engine uses (n_threads = physical cores)
  it does, roughly in proportion.
- Long Markdown reply (``--long-tokens``, code blocks, ``ignore_eos=True``): the engine's decode rate in
  the first and the last quarter of the reply (from the engine timestamps carried by ``TokensDecoded``),
  the UI's lag (handler time − token time, p95) and its CPU per token in each quarter: a UI that re-renders
  the whole reply per update would fall behind, spend more per token, or slow the engine as the reply grows.

Targets: the TUI costs ≤ 3 % of decode tokens/s and ≤ 5 ms of TTFT; the long reply's last
quarter decodes at ≥ 97 % of the first quarter's rate in the TUI arm relative to the engine arm.

Run: ``python -m benchmarks.tui_overhead`` (``--help`` for options; ``--quick`` for a smoke run).
Timing claims belong here, never in the unit tests.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from typing_extensions import override

from benchmarks.harness import machine_line, rotation
from benchmarks.harness import ratio as rate_ratio
from chatphase.chat.listener import ChatListener
from chatphase.engine.events import (
    EngineFailed,
    Event,
    FirstToken,
    Message,
    ModelLoaded,
    SamplingParams,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.process.host import EngineHost
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.resolve import resolve_model
from chatphase.settings.schema import Settings
from chatphase.ui.app import ChatPhaseApp

# Replies of about a hundred tokens: a decode rate over a handful of tokens (a one-line answer) measures
# scheduling noise, not the TUI.
SHORT_PROMPTS = (
    "Give three tips for writing clear Python code, one sentence each.",
    "Explain in a short paragraph why the sky looks blue.",
)
LONG_PROMPT = (
    "Write Python functions that sort, filter and group a list of numbers, each in its own ```python code "
    "block, then explain each one with a bulleted list."
)
TUI_SIZE = (150, 45)
DECODE_TARGET = 0.97  # tui/engine decode tokens/s
TTFT_TARGET_MS = 5.0  # tui - engine TTFT
SETTLE_S = 0.5  # idle time between the app's start-up and the prompt


class SharedEngine:
    """One loaded :class:`EngineHost` behind the ``Engine`` protocol, for both arms.

    ``load()`` replays the host's ``ModelLoaded`` (no reload); ``run_turn`` clears the KV cache first and
    optionally forces ``ignore_eos``; ``close()`` leaves the host running (the benchmark closes it).
    """

    def __init__(self, host: EngineHost, loaded: ModelLoaded) -> None:
        self.host = host
        self.loaded = loaded
        self.ignore_eos = False

    def load(self) -> Iterator[Event]:
        yield self.loaded

    def run_turn(self, request: TurnRequest) -> Iterator[Event]:
        yield from self.host.run_turn(replace(request, reset_cache=True, ignore_eos=self.ignore_eos))

    def watch(self) -> Iterator[Event]:
        """Nothing: the benchmark watches the host itself."""
        return iter(())

    def cancel(self) -> None:
        self.host.cancel()

    def close(self) -> None:
        """Nothing: the shared host outlives each app."""


@dataclass
class ArmResult:
    """One turn of one arm: engine metrics, client TTFT (ms), ``(t_ns, decode_tokens, t_seen_ns,
    process_cpu_s)`` for each ``TokensDecoded`` the consumer saw, the reply, and the consumer process's CPU
    seconds and wall seconds from the first token seen to the end of the turn (the decode phase)."""

    metrics: TurnMetrics
    client_ttft_ms: float
    decoded: list[tuple[int, int, int, float]] = field(default_factory=list)
    reply: str = ""
    ui_cpu_s: float = 0.0
    wall_s: float = 0.0


class TurnTimes(ChatListener):
    """Records, on the app's thread, when the chat view is told of the first token and each decoded
    batch (the listener runs just before the view draws them)."""

    def __init__(self) -> None:
        self.t_first_seen_ns: int | None = None
        self.cpu_first_s = 0.0
        self.decoded: list[tuple[int, int, int, float]] = []
        self.finished: TurnFinished | None = None

    @override
    def first_token(self, turn, event) -> None:
        if self.t_first_seen_ns is None:
            self.t_first_seen_ns = time.perf_counter_ns()
            self.cpu_first_s = time.process_time()

    @override
    def tokens_decoded(self, turn, event) -> None:
        self.decoded.append((event.t_ns, event.decode_tokens, time.perf_counter_ns(), time.process_time()))

    @override
    def turn_finished(self, turn, event) -> None:
        self.finished = event


def engine_arm(shared: SharedEngine, request: TurnRequest) -> ArmResult:
    """Drive one turn straight through the host; the consumer does nothing but record times."""
    decoded: list[tuple[int, int, int, float]] = []
    t0 = time.perf_counter_ns()
    cpu_first = 0.0
    t_first = None
    finished = None
    for event in shared.run_turn(request):
        now = time.perf_counter_ns()
        if isinstance(event, FirstToken) and t_first is None:
            t_first, cpu_first = now, time.process_time()
        elif isinstance(event, TokensDecoded):
            decoded.append((event.t_ns, event.decode_tokens, now, time.process_time()))
        elif isinstance(event, TurnFinished):
            finished = event
        elif isinstance(event, EngineFailed):
            raise SystemExit(f"engine failed: {event.message}")
    assert finished is not None and t_first is not None
    return ArmResult(
        finished.metrics,
        (t_first - t0) / 1e6,
        decoded,
        finished.reply,
        time.process_time() - cpu_first,
        (time.perf_counter_ns() - t_first) / 1e9,
    )


async def _tui_turn(shared: SharedEngine, settings: Settings, prompt: str) -> ArmResult:
    app = ChatPhaseApp(settings, shared.host.info, lambda info, current: shared, save_sessions=False)
    times = TurnTimes()
    app.chat.listeners.insert(0, times)
    async with app.run_test(size=TUI_SIZE) as pilot:
        while not app.chat.ready:
            await pilot.pause(0.01)
        # Nobody sends in the instant the model is ready: let the start-up paint (the dashboard, its plots)
        # finish first, so that it is not counted as the turn's cost.
        await pilot.pause(SETTLE_S)
        t0 = time.perf_counter_ns()
        app.chat.send(prompt)
        while times.finished is None:
            await asyncio.sleep(0.005)
        await pilot.pause()
        assert times.t_first_seen_ns is not None
        cpu_s = time.process_time() - times.cpu_first_s
        wall_s = (time.perf_counter_ns() - times.t_first_seen_ns) / 1e9
        return ArmResult(
            times.finished.metrics,
            (times.t_first_seen_ns - t0) / 1e6,
            times.decoded,
            times.finished.reply,
            cpu_s,
            wall_s,
        )


def tui_arm(shared: SharedEngine, settings: Settings, prompt: str) -> ArmResult:
    """One turn through a fresh headless app (startup is outside the measured turn)."""
    return asyncio.run(_tui_turn(shared, settings, prompt))


@dataclass
class Quarters:
    """First vs last quarter of a long reply: engine decode tok/s, UI lag p95 (ms: when the consumer saw a
    batch minus the engine's time of its last token), and consumer-process CPU ms per token."""

    first_tps: float
    last_tps: float
    first_lag_p95_ms: float
    last_lag_p95_ms: float
    first_cpu_ms_per_token: float
    last_cpu_ms_per_token: float


def quarters(decoded: list[tuple[int, int, int, float]], total: int) -> Quarters:
    """:class:`Quarters` from the coalesced ``TokensDecoded`` batches of one turn.

    A quarter spans from the first batch at or past its first token to the first batch at or past its last;
    rates and CPU per token are taken between those two batches.
    """

    def at(target: float) -> tuple[int, int, int, float]:
        return next((d for d in decoded if d[1] >= target), decoded[-1])

    def span(lo: float, hi: float) -> tuple[float, float, float]:
        (t0, n0, _, c0), (t1, n1, _, c1) = at(lo), at(hi)
        lags = [(seen - t) / 1e6 for t, n, seen, _ in decoded if n0 <= n <= n1]
        lag = statistics.quantiles(lags, n=20)[-1] if len(lags) >= 2 else float("nan")
        tps = (n1 - n0) / ((t1 - t0) / 1e9) if t1 > t0 else float("nan")
        cpu = 1000 * (c1 - c0) / (n1 - n0) if n1 > n0 else float("nan")
        return tps, lag, cpu

    q = total / 4
    (tps1, lag1, cpu1), (tps4, lag4, cpu4) = span(1, q), span(3 * q, total)
    return Quarters(tps1, tps4, lag1, lag4, cpu1, cpu4)


def median(xs) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model spec (default: the bundled SmolLM2-135M)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per arm and prompt (default 3)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per short reply (default 128)")
    p.add_argument("--long-tokens", type=int, default=2200, help="tokens of the long reply (0 = skip; default 2200)")
    p.add_argument("--long-reps", type=int, default=1, help="repetitions of the long case per arm (default 1)")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=None, help="engine decode threads (default: physical cores)")
    p.add_argument("--no-short", action="store_true", help="only the long-reply case")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 rep, 32 tokens, 300-token long reply")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.max_tokens, args.long_tokens = 1, 32, 300

    settings = Settings(
        model=args.model, sampling=SamplingParams(max_tokens=args.max_tokens, temperature=0.0, seed=0)
    ).with_overrides(n_ctx=args.n_ctx, n_threads=args.threads)
    info = read_model_info(resolve_model(settings.model))
    host = EngineHost(info, settings.engine)
    try:
        loaded = next(e for e in host.load() if isinstance(e, (ModelLoaded, EngineFailed)))
        if isinstance(loaded, EngineFailed):
            print(f"engine failed to load: {loaded.message}", file=sys.stderr)
            return 1
        shared = SharedEngine(host, loaded)
        s = loaded.model.settings
        print(
            f"model {info.name} · n_threads {s.n_threads} · n_ctx {s.n_ctx} · "
            f"reps {args.reps} · max_tokens {args.max_tokens} · TUI {TUI_SIZE[0]}×{TUI_SIZE[1]} headless · "
            f"{machine_line()}"
        )
        engine_arm(
            shared, TurnRequest(0, (Message("user", "Hi"),), replace(settings.sampling, max_tokens=8))
        )  # warm-up

        rows = []
        ok = True
        for prompt in () if args.no_short else SHORT_PROMPTS:
            runs: dict[str, list[ArmResult]] = {"engine": [], "tui": []}
            request = TurnRequest(1, (Message("user", prompt),), settings.sampling)
            for rep in range(args.reps):
                for arm in rotation(("engine", "tui"), rep):
                    runs[arm].append(
                        engine_arm(shared, request) if arm == "engine" else tui_arm(shared, settings, prompt)
                    )
            rows.append((prompt, runs))

        if rows:
            print(
                "\n| prompt | arm | decode tok | decode tok/s | TTFT ms (engine) | TTFT ms (client) | UI CPU ms/token |"
            )
            print("|---|---|---:|---:|---:|---:|---:|")
            for prompt, runs in rows:
                for arm in ("engine", "tui"):
                    r = runs[arm]
                    print(
                        f"| {prompt[:28]}… | {arm} | {median(x.metrics.decode_tokens for x in r):.0f} | "
                        f"{median(x.metrics.decode_tokens_per_s for x in r):.1f} | "
                        f"{median(x.metrics.ttft_ms for x in r):.1f} | {median(x.client_ttft_ms for x in r):.1f} | "
                        f"{median(1000 * x.ui_cpu_s / max(1, x.metrics.decode_tokens - 1) for x in r):.2f} |"
                    )
            print(
                "\n| prompt | decode tok/s tui/engine (≥ 0.97) | TTFT Δ engine-clock ms (≤ 5) | TTFT Δ client ms (≤ 5) | result |"
            )
            print("|---|---:|---:|---:|---|")
            for prompt, runs in rows:
                e, t = runs["engine"], runs["tui"]
                ratio = rate_ratio(
                    [x.metrics.decode_tokens_per_s for x in t], [x.metrics.decode_tokens_per_s for x in e]
                ).of_medians
                d_ttft = median(x.metrics.ttft_ms for x in t) - median(x.metrics.ttft_ms for x in e)
                d_client = median(x.client_ttft_ms for x in t) - median(x.client_ttft_ms for x in e)
                passed = ratio >= DECODE_TARGET and d_ttft <= TTFT_TARGET_MS and d_client <= TTFT_TARGET_MS
                ok &= passed
                print(
                    f"| {prompt[:28]}… | {ratio:.3f} | {d_ttft:+.1f} | {d_client:+.1f} | {'PASS' if passed else 'FAIL'} |"
                )

        if args.long_tokens:
            shared.ignore_eos = True
            long_settings = replace(settings, sampling=replace(settings.sampling, max_tokens=args.long_tokens))
            request = TurnRequest(1, (Message("user", LONG_PROMPT),), long_settings.sampling)
            long_runs: dict[str, list[ArmResult]] = {"engine": [], "tui": []}
            for rep in range(args.long_reps):
                for arm in rotation(("engine", "tui"), rep):
                    long_runs[arm].append(
                        engine_arm(shared, request) if arm == "engine" else tui_arm(shared, long_settings, LONG_PROMPT)
                    )
            shared.ignore_eos = False
            fences = long_runs["tui"][-1].reply.count("```")
            print(
                f"\nlong Markdown reply ({args.long_tokens} tokens, ignore_eos; {fences // 2} code blocks, "
                f"{len(long_runs['tui'][-1].reply):,} characters):"
            )
            print(
                "| arm | decode tok | decode tok/s | tok/s first → last quarter | last/first | "
                "UI lag p95 ms first → last | UI CPU ms/token first → last |"
            )
            print("|---|---:|---:|---:|---:|---:|---:|")
            slow = {}
            for arm in ("engine", "tui"):
                r = long_runs[arm][-1]
                q = quarters(r.decoded, r.metrics.decode_tokens)
                slow[arm] = q.last_tps / q.first_tps
                print(
                    f"| {arm} | {r.metrics.decode_tokens} | {r.metrics.decode_tokens_per_s:.1f} | "
                    f"{q.first_tps:.1f} → {q.last_tps:.1f} | {slow[arm]:.3f} | "
                    f"{q.first_lag_p95_ms:.1f} → {q.last_lag_p95_ms:.1f} | "
                    f"{q.first_cpu_ms_per_token:.2f} → {q.last_cpu_ms_per_token:.2f} |"
                )
            rel = slow["tui"] / slow["engine"]
            long_ok = rel >= DECODE_TARGET
            ok &= long_ok
            print(
                f"\nTUI last/first-quarter slowdown relative to the engine's: {rel:.3f} (≥ {DECODE_TARGET}) "
                f"{'PASS' if long_ok else 'FAIL'}"
            )
        print(f"\noverall: {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1
    finally:
        host.close()


if __name__ == "__main__":
    sys.exit(main())
