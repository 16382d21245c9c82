"""Helpers for the session/export tests: scripted turns with exactly computed metrics."""

from __future__ import annotations

from chatphase.engine.events import FirstToken, TokensDecoded, TurnFinished
from chatphase.engine.metrics import TurnMetrics, compute_turn_metrics
from chatphase.sessions.writer import SessionWriter

MODEL = {"name": "TestModel-1M", "architecture": "llama", "quantization": "Q4_1", "path": "/models/test.gguf"}
SETTINGS = {
    "n_ctx": 512,
    "n_batch": 64,
    "system_prompt": "Be brief.",
    "sampling": {"temperature": 0.0, "max_tokens": 16},
}


def scripted_metrics(n_tokens: int = 4, prompt_tokens: int = 20, cached: int = 0, stop: str = "stop") -> TurnMetrics:
    """Metrics of a turn with 1 ms between tokens and a 5 ms prefill (all timestamps scripted)."""
    t0 = 1_000_000_000
    return compute_turn_metrics(
        t_submit_ns=t0,
        t_prefill_start_ns=t0 + 200_000,
        t_prefill_end_ns=t0 + 5_200_000,
        token_times_ns=[t0 + 6_000_000 + i * 1_000_000 for i in range(n_tokens)],
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        kv_cache_tokens=prompt_tokens + n_tokens,
        kv_bytes_per_token=23_040,
        kv_capacity_bytes=512 * 23_040,
        stop_reason=stop,
    )


def turn_events(turn_id: int, pieces: list[str], metrics: TurnMetrics | None = None):
    """The text events of one turn followed by its ``TurnFinished``."""
    metrics = metrics or scripted_metrics(len(pieces))
    yield FirstToken(turn_id, pieces[0], ttft_ms=6.0, t_ns=0)
    for i, p in enumerate(pieces[1:], 2):
        yield TokensDecoded(turn_id, p, 1, i, t_ns=i)
    yield TurnFinished(turn_id, "".join(pieces), metrics)


def record_turns(rec: SessionWriter, turns: list[tuple[str, list[str]]]) -> None:
    """Record whole turns ``(user, reply pieces)`` through :meth:`SessionWriter.observe`."""
    for user, pieces in turns:
        n = rec.begin_turn(user)
        for ev in turn_events(n, pieces):
            rec.observe(ev)
