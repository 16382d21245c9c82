"""Thread workers that drive a blocking :class:`~chatphase.engine.base.Engine` and post its events.

The engine API is a set of blocking iterators, so each call runs in a Textual thread worker (one at a
time: ``group="engine", exclusive=True``) and every event crosses into the app as a message from
:mod:`chatphase.ui.messages` (``post_message`` is thread-safe). A worker always ends by posting
:class:`~chatphase.ui.messages.WorkerEnded`, and turns an exception from the engine into an
``EngineFailed(fatal=True)`` so the UI shows it instead of a traceback. ``engine_id`` tags every
message so the app can ignore a replaced engine's late events.
"""

from __future__ import annotations

from textual import work
from textual.worker import get_current_worker

from chatphase.engine.base import Engine
from chatphase.engine.events import EngineFailed, TurnRequest
from chatphase.ui.messages import WorkerEnded, to_message


class EngineWorkers:
    """Mixin for a Textual ``App``: :meth:`load_engine` and :meth:`run_engine_turn` as thread workers."""

    @work(thread=True, exclusive=True, group="engine")
    def load_engine(self, engine: Engine, engine_id: int) -> None:
        """Run ``engine.load()`` and post its events (``EngineReady`` or ``EngineError``)."""
        self._pump("load", engine, engine_id, lambda: engine.load())

    @work(thread=True, exclusive=True, group="engine")
    def run_engine_turn(self, engine: Engine, engine_id: int, request: TurnRequest) -> None:
        """Run ``engine.run_turn(request)`` and post each event as a message."""
        self._pump("turn", engine, engine_id, lambda: engine.run_turn(request), request.turn_id)

    def _pump(self, kind: str, engine: Engine, engine_id: int, start, turn_id: int | None = None) -> None:
        worker = get_current_worker()
        try:
            for event in start():
                self.post_message(to_message(event, engine_id))  # type: ignore[attr-defined]
                if worker.is_cancelled:
                    engine.cancel()
                    break
        except Exception as exc:  # the engine broke its contract: show it, never a traceback
            failed = EngineFailed(f"engine error: {type(exc).__name__}: {exc}", turn_id=turn_id, fatal=True)
            self.post_message(to_message(failed, engine_id))  # type: ignore[attr-defined]
        finally:
            self.post_message(WorkerEnded(kind, engine_id))  # type: ignore[attr-defined]
