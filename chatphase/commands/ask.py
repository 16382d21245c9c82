"""``chatphase ask``: headless turns on the same engine and metrics as the TUI.

Each PROMPT is the next user turn of one conversation. Without ``--json`` the reply streams to stdout
and one metrics line per turn goes to stderr; with ``--json`` one object goes to stdout:
``{"model": {...}, "settings": {...}, "turns": [{"prompt", "reply", "metrics": {TurnMetrics}, "server_timings"}]}``
(``server_timings``: a remote server's own timings, else ``null``; ``--server`` runs on a remote server).
Exit codes: 0 ok; 2 bad usage or unusable model (one line on stderr); 1 engine failure.
"""

from __future__ import annotations

import argparse
import json
import sys

from chatphase.commands.options import add_model_options, add_sampling_options, settings_from_args
from chatphase.commands.server_options import add_server_options, engine_for, model_info_for
from chatphase.engine.events import (
    EngineFailed,
    FirstToken,
    Message,
    ModelLoaded,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.metrics import TurnMetrics
from chatphase.errors import EngineError, UsageError
from chatphase.sessions.recorder import cli_recorder
from chatphase.units import fmt_bytes, fmt_ms, fmt_rate


def register(sub) -> None:
    p = sub.add_parser(
        "ask", help="run one conversation headless and print replies and metrics", description=__doc__.split("\n\n")[0]
    )
    add_model_options(p)
    add_sampling_options(p)
    add_server_options(p)
    p.add_argument(
        "--json", action="store_true", help="print one JSON object with model, settings and per-turn metrics"
    )
    p.add_argument(
        "--no-save", action="store_true", help="do not save this conversation as a session (see `chatphase sessions`)"
    )
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="user turns, in order")
    p.set_defaults(func=run)


def metrics_line(turn: int, m: TurnMetrics) -> str:
    """One human-readable line of a turn's phase metrics (for stderr)."""
    itl = "–" if m.itl_ms_p50 is None else f"{m.itl_ms_p50:.1f}/{m.itl_ms_p95:.1f} ms"
    n = lambda count: "–" if count is None else count  # noqa: E731 - a count a remote server did not report
    return (
        f"[turn {turn}] prompt {n(m.prompt_tokens)} tok (cached {n(m.cached_tokens)}) · TTFT {fmt_ms(m.ttft_ms)} · "
        f"prefill {n(m.prefill_tokens)} tok @ {fmt_rate(m.prefill_tokens_per_s)} · decode {n(m.decode_tokens)} tok @ "
        f"{fmt_rate(m.decode_tokens_per_s)} · ITL p50/p95 {itl} · KV {n(m.kv_cache_tokens)} tok "
        f"({fmt_bytes(m.kv_cache_bytes)} of {fmt_bytes(m.kv_capacity_bytes)}) · {m.stop_reason}"
    )


def run(args: argparse.Namespace) -> int:
    """Run the turns; see the module docstring for output and exit codes."""
    settings = settings_from_args(args)
    if any(not p.strip() for p in args.prompts):
        raise UsageError("a PROMPT is empty")
    info = model_info_for(settings, pull=args.pull)
    recorder = None if args.no_save else cli_recorder(info.to_dict(), settings.to_dict())
    host = engine_for(settings, info)
    try:
        return _run(args, settings, info, host, recorder)
    finally:
        host.close()
        if recorder is not None:
            recorder.close()
            if recorder.turns_recorded and not recorder.failed:
                print(f"chatphase: saved as session {recorder.id}", file=sys.stderr)


def _run(args, settings, info, host, recorder=None) -> int:
    out = sys.stdout
    loaded = None
    for event in host.load():
        if isinstance(event, EngineFailed):
            raise EngineError(event.message)
        if isinstance(event, ModelLoaded):
            loaded = event.model
    for note in loaded.notes:
        print(f"chatphase: {note}", file=sys.stderr)
    messages: list[Message] = [Message("system", settings.system_prompt)] if settings.system_prompt else []
    turns = []
    for i, prompt in enumerate(args.prompts, start=1):
        messages.append(Message("user", prompt))
        request = TurnRequest(i, tuple(messages), settings.sampling)
        finished, failure = None, None
        if recorder is not None:
            recorder.begin_turn(prompt)
        for event in host.run_turn(request):
            if recorder is not None:
                recorder.observe(event)
            if isinstance(event, (FirstToken, TokensDecoded)) and not args.json:
                out.write(event.text)
                out.flush()
            elif isinstance(event, TurnFinished):
                finished = event
            elif isinstance(event, EngineFailed):
                failure = event
                if event.fatal:
                    _emit_partial(args, loaded, turns)
                    raise EngineError(event.message)
        if finished is None:  # refused before prefill (a message too long for n_ctx)
            _emit_partial(args, loaded, turns)
            raise UsageError(failure.message if failure else "the engine ended the turn without a result")
        if finished.metrics.dropped_messages:
            print(
                f"chatphase: {finished.metrics.dropped_messages} oldest messages left out to fit n_ctx", file=sys.stderr
            )
        if not args.json:
            out.write("\n")
            print(metrics_line(i, finished.metrics), file=sys.stderr)
        messages.append(Message("assistant", finished.reply))
        turns.append(
            {
                "prompt": prompt,
                "reply": finished.reply,
                "metrics": finished.metrics.to_dict(),
                "server_timings": finished.server_timings,
            }
        )
        if failure is not None:
            _emit_partial(args, loaded, turns)
            raise EngineError(failure.message)
    _emit_partial(args, loaded, turns)
    return 0


def _emit_partial(args, loaded, turns) -> None:
    """With ``--json``, print what was done so far (also before failing)."""
    if not args.json:
        return
    model = loaded.info.to_dict()
    model.pop("attention", None)
    from chatphase.system.gpu import gpu_memory_used_bytes

    model.update(
        kv_bytes_per_token=loaded.kv_bytes_per_token,
        load_ms=loaded.load_ms,
        layers_offloaded=loaded.layers_offloaded,
        layers_total=loaded.layers_total,
        gpu_memory_bytes=gpu_memory_used_bytes(loaded.pid),
        notes=list(loaded.notes),
    )
    json.dump({"model": model, "settings": loaded.settings, "turns": turns}, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    sys.stdout.flush()
