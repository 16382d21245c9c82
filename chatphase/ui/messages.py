"""Textual messages that carry engine events from the worker thread into the app.

One small message per event kind, each holding the engine's own (frozen, picklable) event, so handlers
are named after what happened (``on_prefill_advanced``). The high-rate progress message may replace an
unprocessed predecessor of the same turn (``can_replace``), so a busy UI never lags behind the engine;
decoded text is never dropped: it is appended to a buffer and flushed at a bounded rate by the app.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from chatphase.engine import events as ev


@dataclass
class EngineReady(Message):
    """The model is loaded (``event.model`` is the :class:`~chatphase.engine.events.LoadedModel`)."""

    event: ev.ModelLoaded
    engine_id: int


@dataclass
class PrefillBegan(Message):
    """Templating and tokenisation are done; prefill of ``event.prefill_tokens`` tokens starts."""

    event: ev.PrefillStarted


@dataclass
class PrefillAdvanced(Message):
    """``event.done_tokens`` of ``event.total_tokens`` prompt tokens evaluated (coalescable)."""

    event: ev.PrefillProgress

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PrefillAdvanced) and message.event.turn_id == self.event.turn_id


@dataclass
class FirstTokenArrived(Message):
    """The first token: TTFT is known and decode begins."""

    event: ev.FirstToken


@dataclass
class TextDecoded(Message):
    """More generated tokens (their text and the running count)."""

    event: ev.TokensDecoded


@dataclass
class TurnDone(Message):
    """The turn is over; ``event.metrics`` holds its :class:`~chatphase.engine.metrics.TurnMetrics`."""

    event: ev.TurnFinished


@dataclass
class EngineError(Message):
    """The engine reported a failure; ``event.fatal`` means it is gone and must be restarted."""

    event: ev.EngineFailed
    engine_id: int


@dataclass
class WorkerEnded(Message):
    """The worker thread of ``kind`` (``"load"`` or ``"turn"``) returned; the engine is free again."""

    kind: str
    engine_id: int


def to_message(event: ev.Event, engine_id: int) -> Message:
    """Wrap an engine event in its Textual message.

    Raises:
        TypeError: for an object that is not an engine event.
    """
    if isinstance(event, ev.TokensDecoded):
        return TextDecoded(event)
    if isinstance(event, ev.PrefillProgress):
        return PrefillAdvanced(event)
    if isinstance(event, ev.FirstToken):
        return FirstTokenArrived(event)
    if isinstance(event, ev.PrefillStarted):
        return PrefillBegan(event)
    if isinstance(event, ev.TurnFinished):
        return TurnDone(event)
    if isinstance(event, ev.ModelLoaded):
        return EngineReady(event, engine_id)
    if isinstance(event, ev.EngineFailed):
        return EngineError(event, engine_id)
    raise TypeError(f"not an engine event: {event!r}")
