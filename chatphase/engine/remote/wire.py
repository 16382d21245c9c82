"""What an OpenAI-compatible server says during one streamed chat completion, and the metrics made of it.

Pure functions and plain data (no network): :class:`ServerReport` gathers what a stream's chunks carry —
``usage`` (OpenAI's streaming usage, asked for with ``stream_options.include_usage``), llama-server's
``timings`` (``prompt_n, prompt_ms, predicted_n, predicted_ms, cache_n``) and ``prompt_progress``
(``total, cache, processed, time_ms``), and the ``finish_reason``; :func:`remote_turn_metrics` turns that
plus the client's own arrival clock into the same :class:`~chatphase.engine.metrics.TurnMetrics` the local
engine reports, through the same :func:`~chatphase.engine.metrics.compute_turn_metrics`.

Who measures what:

- Client clock (``time.perf_counter_ns``): ``ttft_ms`` = first content chunk arrival − submit (network
  + queueing + prefill + first sample); ``decode_ms`` = last − first content chunk arrival; ITL = gaps
  between content chunk arrivals (vLLM's serving benchmark measures ITL the same way, on chunks).
- Server: every token count. ``decode_tokens`` is ``usage.completion_tokens`` (else llama-server's
  ``predicted_n``, else the reply's text counted by the server's tokenizer endpoint,
  :mod:`chatphase.engine.remote.tokens`; ``TurnMetrics.decode_tokens_source`` says which), less the
  token the server stopped on where its count includes it (:attr:`ServerReport.counts_stop_token`);
  ``prompt_tokens`` is ``usage.prompt_tokens`` (else ``prompt_n + cache_n``);
  ``cached_tokens`` is ``usage.prompt_tokens_details.cached_tokens`` (else ``cache_n``). Chunks are never
  counted as tokens in the final metrics.
- Server only: ``prefill_ms`` (llama-server's ``prompt_ms``); a server without timings leaves it unknown.

A figure the server does not report is ``None`` (shown as unknown), never zero: that applies to the count
fields of ``TurnMetrics`` too, and to every KV figure (no common server API reports KV bytes per token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from chatphase.engine.metrics import NS_PER_MS, StopReason, TurnMetrics, compute_turn_metrics, spec_counts

#: llama-server ``timings`` keys kept beside the client's view (all numbers; ms or tokens or tokens/s).
TIMING_KEYS = (
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
    "cache_n",
    "draft_n",
    "draft_n_accepted",
)

_FINISH_TO_STOP: dict[str, StopReason] = {
    "stop": "stop",
    "length": "length",
    "eos": "stop",
    "tool_calls": "stop",
    "function_call": "stop",
    "content_filter": "stop",
}

#: finish reasons of a reply that ended on a token the server chose to stop on (an end-of-generation
#: token, or the last token of a stop string), not on a limit: llama-server says ``stop`` (or
#: ``tool_calls``) for its ``STOP_TYPE_EOS`` and ``STOP_TYPE_WORD``, ``length`` for ``STOP_TYPE_LIMIT``;
#: vLLM says ``stop`` for EOS, ``stop_token_ids`` and stop strings.
_STOPPED_ON_TOKEN = frozenset({"stop", "tool_calls"})


@dataclass
class ServerReport:
    """What the server reported during one stream; every field ``None`` until a chunk carries it.

    ``timings`` is the subset of :data:`TIMING_KEYS` the server sent; ``progress`` the latest
    ``prompt_progress`` object; ``finish_reason`` the OpenAI finish reason of choice 0;
    ``tokenized_completion_tokens`` the reply counted afterwards by the server's tokenizer endpoint;
    ``reasoning_tokens`` the thinking tokens of a reasoning model, where the usage reports them
    (``completion_tokens_details.reasoning_tokens``).

    ``counts_stop_token``: the server's ``completion_tokens`` / ``predicted_n`` include the token it
    stopped on, which produced no text. llama-server counts every sampled token (``n_decoded`` is
    ``slot.stats.n_gen``, incremented before the EOG check), the EOG token too; vLLM's
    ``completion_tokens`` is its output token ids, the EOS token too. The local engine never counts that
    token, so :meth:`decode_count` takes it off when the reply stopped on it (:data:`_STOPPED_ON_TOKEN`).
    Servers not known to count it (Ollama, llama-cpp-python's) keep their figure.
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    timings: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    finish_reason: str | None = None
    model: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    tokenized_completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    counts_stop_token: bool = False

    def decode_count(self) -> tuple[int | None, str | None]:
        """``(decode tokens, who counted them)``: usage, else llama-server's timings, else the server's
        tokenizer over the reply (:attr:`tokenized_completion_tokens`); ``(None, None)`` when none did.
        The server's own counts leave out the token it stopped on (see :attr:`counts_stop_token`)."""
        stop_token = int(self.counts_stop_token and self.finish_reason in _STOPPED_ON_TOKEN)
        if self.completion_tokens is not None:
            return max(0, self.completion_tokens - stop_token), "usage"
        predicted = self.timing("predicted_n")
        if predicted is not None:
            return max(0, int(predicted) - stop_token), "timings"
        if self.tokenized_completion_tokens is not None:
            return self.tokenized_completion_tokens, "tokenizer"
        return None, None

    def absorb(self, chunk: dict[str, Any]) -> None:
        """Update from one decoded ``chat.completion.chunk`` (unknown keys ignored)."""
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = _int_or(usage.get("prompt_tokens"), self.prompt_tokens)
            self.completion_tokens = _int_or(usage.get("completion_tokens"), self.completion_tokens)
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                self.cached_tokens = _int_or(details.get("cached_tokens"), self.cached_tokens)
            details = usage.get("completion_tokens_details")
            if isinstance(details, dict):
                self.reasoning_tokens = _int_or(details.get("reasoning_tokens"), self.reasoning_tokens)
        timings = chunk.get("timings")
        if isinstance(timings, dict):
            kept = {k: timings[k] for k in TIMING_KEYS if _is_number(timings.get(k))}
            self.timings = kept or self.timings
        progress = chunk.get("prompt_progress")
        if isinstance(progress, dict):
            self.progress = progress
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0 and choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def timing(self, key: str) -> float | None:
        """One llama-server timing, or ``None`` when not reported."""
        return None if self.timings is None else self.timings.get(key)


def chunk_text(chunk: dict[str, Any]) -> tuple[str, str]:
    """``(content, reasoning)`` text of choice 0 in one chunk: its chat ``delta``, or its ``text`` in a
    ``/v1/completions`` stream (``""`` where absent)."""
    for choice in chunk.get("choices") or ():
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            if isinstance(choice.get("text"), str):
                return choice["text"], ""
            delta = choice.get("delta") or {}
            content = delta.get("content") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            return (content if isinstance(content, str) else ""), (reasoning if isinstance(reasoning, str) else "")
    return "", ""


def progress_tokens(progress: dict[str, Any]) -> tuple[int, int, float] | None:
    """``(done, total, elapsed_ms)`` of the prefill from llama-server's ``prompt_progress``.

    ``processed`` and ``total`` include the ``cache`` tokens reused from the KV cache; the prefill is
    the rest, so both are taken net of ``cache``. ``None`` when the object lacks the counts.
    """
    try:
        total, processed = int(progress["total"]), int(progress["processed"])
    except (KeyError, TypeError, ValueError):
        return None
    cache = int(progress.get("cache") or 0)
    elapsed = progress.get("time_ms")
    return max(0, processed - cache), max(0, total - cache), float(elapsed) if _is_number(elapsed) else 0.0


def stop_reason_of(finish_reason: str | None) -> StopReason:
    """OpenAI ``finish_reason`` -> chatphase ``stop_reason`` (a missing one after ``[DONE]`` is ``stop``)."""
    return _FINISH_TO_STOP.get(finish_reason or "stop", "stop")


@dataclass
class RemoteThinking:
    """A reasoning model's thinking on the client's clock: when its block ended (``None``: the reply
    ended inside it) and when the first answer text arrived."""

    t_end_ns: int | None = None
    t_first_answer_ns: int | None = None


def remote_turn_metrics(
    *,
    t_submit_ns: int,
    arrival_times_ns: list[int],
    report: ServerReport,
    stop_reason: StopReason,
    thinking: RemoteThinking | None = None,
) -> TurnMetrics:
    """Build :class:`TurnMetrics` from client arrival times (ns) and the server's report, through
    :func:`~chatphase.engine.metrics.compute_turn_metrics` like the local engine's.

    ``arrival_times_ns`` are the arrival times of the chunks that carried generated text, in order; the
    token counts and the prefill time come from the server (see the module docstring), so a rate is
    ``None`` when its count is. ``thinking``: the reply had a thinking block (times on the client's clock,
    the token counts the server's: ``thinking_tokens`` its ``reasoning_tokens``).

    Raises:
        ValueError: when arrival times are out of order or precede ``t_submit_ns``.
    """
    prompt, cached, prefill = _prompt_counts(report)
    prompt_ms = report.timing("prompt_ms")
    drafted, accepted = report.timing("draft_n"), report.timing("draft_n_accepted")
    # llama-server sends draft_n / draft_n_accepted only when it drafted; its steps stay unknown
    spec = spec_counts("draft", int(drafted), int(accepted or 0)) if drafted is not None else None
    return compute_turn_metrics(
        t_submit_ns=t_submit_ns,
        t_prefill_start_ns=None,
        t_prefill_end_ns=None,
        prefill_ns=round(prompt_ms * NS_PER_MS) if prompt_ms is not None else None,
        token_times_ns=arrival_times_ns,
        decode_count=report.decode_count(),
        prompt_tokens=prompt,
        cached_tokens=cached,
        evaluated_tokens=prefill,
        kv_cache_tokens=None,
        kv_bytes_per_token=None,
        kv_capacity_bytes=None,
        stop_reason=stop_reason,
        thinking_block=thinking is not None,
        thinking_tokens=report.reasoning_tokens if thinking else None,
        t_thinking_end_ns=thinking.t_end_ns if thinking else None,
        t_first_answer_ns=thinking.t_first_answer_ns if thinking else None,
        spec=spec,
    )


def server_timings_view(report: ServerReport, ttft_ms: float | None) -> dict[str, Any] | None:
    """The server's own timings for ``TurnFinished.server_timings``, or ``None`` when it sent none.

    Adds one derived figure, ``network_queue_ms = ttft_ms − prompt_ms``: the part of the client's TTFT
    that is not the server's prefill (network both ways, HTTP handling, queueing for a slot).
    """
    if not report.timings:
        return None
    view = dict(report.timings)
    prompt_ms = report.timing("prompt_ms")
    if ttft_ms is not None and prompt_ms is not None:
        view["network_queue_ms"] = ttft_ms - prompt_ms
    return view


def _prompt_counts(report: ServerReport) -> tuple[int | None, int | None, int | None]:
    """``(prompt, cached, prefill)`` tokens with ``prefill + cached == prompt`` whenever all three are known.
    A count that cannot be (negative; more cached than the prompt) is unknown."""
    prompt, cached = _count(report.prompt_tokens), _count(report.cached_tokens)
    prefill = _count(_int_or(report.timing("prompt_n"), None))
    if cached is None:
        cached = _count(_int_or(report.timing("cache_n"), None))
    if prompt is not None and cached is not None and cached > prompt:
        cached = None
    if prompt is not None and prefill is not None and prefill > prompt:
        prefill = None
    if prompt is None and prefill is not None and cached is not None:
        prompt = prefill + cached
    if prompt is not None and cached is not None:
        prefill = prompt - cached
    elif prompt is not None and prefill is not None:
        cached = prompt - prefill
    return prompt, cached, prefill


def _count(value: int | None) -> int | None:
    return value if value is not None and value >= 0 else None


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int_or(value: object, default: int | None) -> int | None:
    return int(value) if _is_number(value) else default
