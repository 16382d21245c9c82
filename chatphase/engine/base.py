"""The narrow contract every engine implements (local llama.cpp, its child-process host, fakes, remote)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from chatphase.engine.events import CountRequest, Event, PromptCount, TurnRequest


class CancelEvent(Protocol):
    """What the engine's cancel check needs of its flag: a ``threading.Event`` or
    :class:`~chatphase.engine.process.cancel_pipe.CancelFlag`."""

    def is_set(self) -> bool: ...

    def set(self) -> None: ...

    def clear(self) -> None: ...


@runtime_checkable
class Engine(Protocol):
    """Blocking, iterator-based engine API; callers run it in a worker thread.

    - ``load()`` loads the model and yields ``ModelLoaded`` or ``EngineFailed``.
    - ``run_turn(request)`` yields the events of one turn (see :mod:`chatphase.engine.events`).
    - ``cancel()`` may be called from another thread; the running turn ends with
      ``stop_reason="cancelled"`` at the next prefill chunk or token.
    - ``watch()`` blocks while the engine lives and yields ``EngineFailed(fatal=True)`` if it dies on
      its own (a crashed child process), nothing when it is closed; engines with nothing to watch return
      at once. It runs beside the other calls, so a death while idle is noticed at once.
    - ``close()`` releases the model (and the process, for the host). Idempotent.
    """

    def load(self) -> Iterator[Event]: ...

    def run_turn(self, request: TurnRequest) -> Iterator[Event]: ...

    def watch(self) -> Iterator[Event]: ...

    def cancel(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class PromptCounter(Protocol):
    """An engine that can count a conversation before it is sent (the local engine, its host, fakes).

    ``count_prompt(request)`` is blocking and may be called from any thread; it answers ``None`` when it cannot
    count now (a turn is running, the engine is gone)."""

    def count_prompt(self, request: CountRequest) -> PromptCount | None: ...
