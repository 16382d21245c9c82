"""Where the engine's blocking calls run, and how their events come back.

The :class:`~chatphase.engine.base.Engine` API is blocking iterators. The controller wraps each call in
an :class:`EngineJob`; a :class:`Dispatcher` runs ``job.run()`` where its host wants it and calls
``job.deliver(event)`` for each event and ``job.end()`` once, all on the controller's thread. The TUI's
dispatcher (``chatphase/ui/engine_link.py``) uses Textual thread workers and messages;
:class:`InlineDispatcher` runs everything in the caller's thread (``ask``, tests).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from chatphase.engine.base import Engine
from chatphase.engine.events import EngineFailed, Event
from chatphase.engine.logfile import default_log_path
from chatphase.engine.process.host import internal_error_message

JobKind = Literal["load", "turn", "watch"]


@dataclass(eq=False)
class EngineJob:
    """One blocking engine call: ``load()``, ``run_turn()`` or ``watch()`` of ``engine``.

    ``on_event``, ``on_end`` and ``is_current`` are the controller's; a dispatcher calls them through
    :meth:`deliver`, :meth:`end` and :meth:`current`, on the controller's thread. :meth:`current` is
    false once the job's engine was replaced: a dispatcher that defers a start skips such a job.
    """

    kind: JobKind
    engine: Engine
    engine_id: int
    call: Callable[[], Iterator[Event]]
    on_event: Callable[[EngineJob, Event], None] = field(repr=False)
    on_end: Callable[[EngineJob], None] = field(repr=False)
    is_current: Callable[[EngineJob], bool] = field(repr=False)
    turn_id: int | None = None

    def run(self) -> Iterator[Event]:
        """The call's events (blocking); an exception from the engine (a broken contract) becomes one
        ``EngineFailed(fatal=True)`` in plain words, its traceback appended to the engine log."""
        try:
            yield from self.call()
        except Exception as exc:
            log_path = getattr(self.engine, "log_path", None) or default_log_path()
            _append_traceback(log_path, f"chatphase: engine {self.kind} failed in the UI process")
            yield EngineFailed(internal_error_message(exc, log_path), self.turn_id, fatal=True)

    def deliver(self, event: Event) -> None:
        self.on_event(self, event)

    def end(self) -> None:
        self.on_end(self)

    def current(self) -> bool:
        return self.is_current(self)


def _append_traceback(log_path: str | os.PathLike[str], heading: str) -> None:
    """Keep the traceback of the exception being handled in the engine log (the user sees one line)."""
    try:
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(f"{heading}\n{traceback.format_exc()}")
    except OSError:
        pass


class Dispatcher(Protocol):
    """Runs engine jobs off the controller's thread and brings their events back to it."""

    def start(self, job: EngineJob) -> None:
        """Run ``job`` (see the module docstring). The controller starts a ``load`` or ``turn`` job only
        when the one before it has ended; ``watch`` jobs run beside them until their engine is closed."""

    def spawn(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in the background and forget it (closing a replaced engine)."""


class InlineDispatcher:
    """Runs every job to its end in the caller's thread; ``watch`` jobs are not run (without a thread
    of their own they would block: an engine's death is seen at its next call instead)."""

    def start(self, job: EngineJob) -> None:
        if job.kind == "watch":
            return
        for event in job.run():
            job.deliver(event)
        job.end()

    def spawn(self, fn: Callable[[], object]) -> None:
        fn()
