"""One turn streamed from an OpenAI-compatible server: its clocks, its text (answer and thinking apart)
and the server's report, turned into the engine's events (:mod:`chatphase.engine.remote.engine` owns the
connection; :mod:`chatphase.engine.remote.wire` holds what is measured where).

Thinking: the server's ``reasoning_content`` / ``reasoning`` deltas are thinking text; a server that does
not split the reasoning out sends its markers in the content, split here (:mod:`chatphase.engine.prompting.thinking`).
The block's times are the client's; its token count is the server's (``reasoning_tokens``), never chunks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import httpx
from httpx_sse import EventSource

from chatphase.engine.events import (
    EngineFailed,
    Event,
    FirstToken,
    Message,
    PrefillProgress,
    PrefillStarted,
    ThinkingEnded,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.metrics import StopReason, ns_to_ms
from chatphase.engine.prompting.thinking import FORMATS, ThinkingSplitter
from chatphase.engine.remote.errors import error_text, http_error_message
from chatphase.engine.remote.wire import (
    RemoteThinking,
    ServerReport,
    chunk_text,
    progress_tokens,
    remote_turn_metrics,
    server_timings_view,
    stop_reason_of,
)

if TYPE_CHECKING:
    from chatphase.engine.remote.slots import Restored, SlotStore
    from chatphase.engine.remote.tokens import ServerTokenizer
    from chatphase.engine.remote.url import ServerURL


class Streaming(Protocol):
    """What a turn uses of its :class:`~chatphase.engine.remote.engine.RemoteEngine` (which imports this
    module, so it is named by shape here)."""

    url: ServerURL
    counts_stop_token: bool
    tokenizer: ServerTokenizer | None
    slots: SlotStore | None

    def prefix_store(self) -> tuple[SlotStore | None, str | None]: ...

    @property
    def cancelled(self) -> bool: ...

    def request_body(self, request: TurnRequest) -> dict[str, Any]: ...

    def open_stream(self, request: TurnRequest, body: dict[str, Any]) -> AbstractContextManager[httpx.Response]: ...

    def lost_connection(self, exc: httpx.HTTPError, mid_stream: bool) -> str: ...


#: the thinking markers looked for in a remote reply's content (``<think>``…``</think>``: the common ones;
#: gpt-oss's channels and the rest are split out by the servers themselves).
_CONTENT_MARKERS = next(f for f in FORMATS if f.name == "think")


class StreamedTurn:
    """One streamed turn on ``engine``: its clocks, its text and the server's report.

    ``engine`` is the :class:`~chatphase.engine.remote.engine.RemoteEngine`; the turn uses its public
    ``url``, ``counts_stop_token``, ``tokenizer``, ``slots``, ``request_body``, ``open_stream``, ``cancelled``
    and ``lost_connection``. A chat turn on a server that saves slots restores a saved prefix first (its time
    is part of TTFT) and queues a save of the slot after a finished reply (:mod:`chatphase.engine.remote.slots`)."""

    def __init__(self, engine: Streaming, request: TurnRequest) -> None:
        self.engine, self.request = engine, request
        self.report = ServerReport(counts_stop_token=engine.counts_stop_token)
        self.times: list[int] = []
        self.parts: list[str] = []
        self.thought: list[str] = []
        self.thinking: RemoteThinking | None = None  # set once the reply shows a thinking block
        self.thinking_chunks = 0  # live view only: the final count is the server's
        # servers that do not split the reasoning out send its markers in the content
        self.splitter = ThinkingSplitter(_CONTENT_MARKERS)
        self.t_submit = 0
        #: the prefix store, for a chat turn (never a token-id prompt or a cold-prefill request: bench)
        self.slots: SlotStore | None = None
        self.slot_note: str | None = None
        if request.prompt_token_ids is None and not request.reset_cache:
            self.slots, self.slot_note = engine.prefix_store()
        self.restored: Restored | None = None

    def run(self) -> Iterator[Event]:
        slots, messages = self.slots, self.request.messages
        finished = None
        try:
            for event in self._run():
                if isinstance(event, TurnFinished):
                    finished = event
                yield event
        finally:
            if slots is not None:  # the slot now holds the request's messages, and the reply of a finished one
                done = finished is not None and finished.metrics.stop_reason in ("stop", "length")
                if finished is None:
                    messages = ()  # nothing was answered: what the slot holds is unknown
                elif done:
                    messages = (*messages, Message("assistant", finished.reply, finished.thinking))
                slots.turn_done(messages, self.report.timings, save=done)

    def _run(self) -> Iterator[Event]:
        engine, rid = self.engine, self.request.turn_id
        body = engine.request_body(self.request)
        self.t_submit = time.perf_counter_ns()
        if self.slots is not None:  # before the prefill, as the local engine's restore: its time is part of TTFT
            self.restored = self.slots.before_turn(self.request.messages)
        note = self.restored.note if self.restored is not None else self.slot_note
        yield PrefillStarted(rid, None, None, None, 0, self.t_submit, restore_note=note)
        error: str | None = None
        done = False
        try:
            with engine.open_stream(self.request, body) as response:
                if response.status_code >= 400:
                    response.read()
                    yield EngineFailed(http_error_message(response, engine.url.display), rid)
                    return
                for sse in EventSource(response).iter_sse():
                    if engine.cancelled:
                        break
                    if sse.data.strip() == "[DONE]":
                        done = True
                        break
                    if not sse.data.strip():
                        continue
                    error = yield from self._chunk(sse.data)
                    if error:
                        break
                else:
                    done = self.report.finish_reason is not None  # some servers omit [DONE]
        except httpx.HTTPError as exc:
            message = engine.lost_connection(exc, mid_stream=bool(self.times))
            if not engine.cancelled:
                error = message
        stop: StopReason
        if engine.cancelled:
            stop = "cancelled"
        elif error is None and not done:
            error = f"the stream from {engine.url.display} ended before the reply was complete"
            stop = "error"
        else:
            stop = "error" if error else stop_reason_of(self.report.finish_reason)
        if error and not self.times:
            yield EngineFailed(error, rid)
            return
        if error:
            yield EngineFailed(f"{error} — the partial reply is kept", rid)
        tail = self.splitter.flush()
        self.parts.append(tail.answer)
        self.thought.append(tail.thinking)
        # the server's tokenizer (set by load()), never a count of chunks
        if self.report.decode_count()[0] is None and engine.tokenizer is not None:
            self.report.tokenized_completion_tokens = engine.tokenizer.count("".join(self.parts + self.thought))
        metrics = remote_turn_metrics(
            t_submit_ns=self.t_submit,
            arrival_times_ns=self.times,
            report=self.report,
            stop_reason=stop,
            thinking=self.thinking,
        )
        restored = self.restored
        if restored is not None and restored.tokens is not None:
            # the server reused ``cache_n`` tokens of the slot just restored: those came from the file
            used = restored.tokens if metrics.cached_tokens is None else min(restored.tokens, metrics.cached_tokens)
            metrics = replace(metrics, restored_tokens=used, restore_ms=restored.ms, restore_bytes=restored.bytes)
        timings = server_timings_view(self.report, metrics.ttft_ms)
        reply, thought = "".join(self.parts), "".join(self.thought)
        yield TurnFinished(rid, reply, metrics, server_timings=timings, thinking=thought)

    def _chunk(self, data: str) -> Generator[Event, None, str | None]:
        """Handle one SSE data payload; yields events, returns an error message or ``None``."""
        now = time.perf_counter_ns()
        try:
            chunk = json.loads(data)
        except ValueError:
            return f"the server at {self.engine.url.display} sent a malformed chunk"
        if not isinstance(chunk, dict):
            return None
        if chunk.get("error"):
            return f"the server reported an error mid-reply: {error_text(chunk['error'])}"
        self.report.absorb(chunk)
        rid = self.request.turn_id
        if "prompt_progress" in chunk and self.report.progress and not self.times:
            progress = progress_tokens(self.report.progress)
            if progress:
                yield PrefillProgress(rid, progress[0], progress[1], progress[2])
        content, reasoning = chunk_text(chunk)
        if not (content or reasoning):
            return None
        split = self.splitter.feed(content)
        answer, thinking = split.answer, reasoning + split.thinking
        th = self.thinking
        if (thinking or self.splitter.thinking) and th is None:
            th = self.thinking = RemoteThinking()
        ended = th is not None and th.t_end_ns is None and (split.closed or (answer and not self.splitter.thinking))
        if ended and th is not None:
            th.t_end_ns = now  # the block closed, or the server's reasoning gave way to content
        if th is not None and answer and th.t_first_answer_ns is None:
            th.t_first_answer_ns = now
        self.thinking_chunks += bool(thinking) or (th is not None and th.t_end_ns in (None, now) and not answer)
        self.parts.append(answer)
        self.thought.append(thinking)
        self.times.append(now)
        if len(self.times) == 1:
            yield FirstToken(rid, answer, ns_to_ms(now - self.t_submit), now, thinking)
        else:
            # live view only: one chunk is one token on llama-server, vLLM and llama-cpp-python; the
            # final TurnMetrics take the server's usage instead.
            yield TokensDecoded(rid, answer, 1, len(self.times), now, thinking, self.thinking_chunks)
        if ended:
            yield ThinkingEnded(rid, self.thinking_chunks, ns_to_ms(now - self.times[0]), now)  # now: its end
        return None
