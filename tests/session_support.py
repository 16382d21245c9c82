"""Helpers for the session/export tests: scripted turns with exactly computed metrics."""

from __future__ import annotations

import errno
import io
import os
from dataclasses import dataclass

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


@dataclass
class Streamed:
    """A turn's text as it streams: what the chat's ``Turn`` gives the writer (:class:`TurnText`)."""

    reply: str = ""
    thinking: str = ""


def record_turns(rec: SessionWriter, turns: list[tuple[str, list[str]]]) -> None:
    """Record whole turns ``(user, reply pieces)`` as the chat's recording does: begun with their text,
    streamed piece by piece, finished with the engine's reply and metrics."""
    for user, pieces in turns:
        text = Streamed()
        rec.begin_turn(user, text=text)
        for piece in pieces:
            text.reply += piece
            rec.stream()
        rec.finish_turn(text.reply, scripted_metrics(len(pieces)))


class FullDisk(io.StringIO):
    """A session file on a disk that is full (or fills once :attr:`full` is set): writes are buffered, and
    flushing them (``flush``, ``close``) raises ``OSError(ENOSPC)`` as a real file does; ``close`` still
    closes it."""

    full = True

    def fileno(self) -> int:
        return -1  # no descriptor: a test that lets writes succeed fakes os.fsync

    def flush(self) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self) -> None:
        try:
            self.flush()
        finally:
            super().close()
