"""Textual messages that bring engine events from a worker thread to the app's thread.

Two small messages carry the engine's own (frozen) event objects under their own names, so there is
one event vocabulary (:mod:`chatphase.engine.events`); the app hands them straight to the chat
controller (``job.deliver``). High-rate prefill progress may replace an unprocessed predecessor of the
same job (``can_replace``), so a busy UI never lags behind the engine; decoded text is never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from chatphase.chat.dispatch import EngineJob
from chatphase.engine.events import Event, PrefillProgress


@dataclass
class EngineEventArrived(Message):
    """``job`` produced ``event``."""

    job: EngineJob
    event: Event

    def can_replace(self, message: Message) -> bool:
        return (
            isinstance(self.event, PrefillProgress)
            and isinstance(message, EngineEventArrived)
            and message.job is self.job
            and isinstance(message.event, PrefillProgress)
        )


@dataclass
class EngineJobEnded(Message):
    """``job``'s blocking call returned (after its last event)."""

    job: EngineJob
