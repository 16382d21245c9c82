"""The chat controller's dispatcher in the TUI: engine calls in Textual thread workers.

Each :class:`~chatphase.chat.dispatch.EngineJob` runs in a thread worker; its events cross into the app
as :class:`~chatphase.ui.messages.EngineEventArrived` messages (``post_message`` is thread-safe) and its
end as :class:`~chatphase.ui.messages.EngineJobEnded`; the app's handlers hand them to the job on the
app's thread. With no core to spare for the UI, a turn's start waits until the view has shown the new
reply (:meth:`TextualDispatcher.release_turn`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from textual.app import App
from textual.worker import get_current_worker

from chatphase.chat.dispatch import EngineJob
from chatphase.ui.messages import EngineEventArrived, EngineJobEnded


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker while ``sys.stderr`` is still the real one.

    While a Textual app runs, ``sys.stderr`` is a capture object whose ``fileno()`` is -1, and the
    tracker (started lazily by the first ``multiprocessing`` lock or event, e.g. in ``EngineHost``)
    passes that fd to its child: ``ValueError: bad value(s) in fds_to_keep``. Starting it before the
    app runs avoids that. POSIX only (elsewhere there is no tracker).
    """
    if os.name == "posix":
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()


class TextualDispatcher:
    """Runs engine jobs in ``app``'s thread workers (implements :class:`~chatphase.chat.dispatch.Dispatcher`).

    ``paint_first``: whether a turn waits for :meth:`release_turn` (the view calls it once the new
    reply is laid out and painted). With the engine's threads on every core, the new messages' layout
    and paint would otherwise run during prefill and delay the first token by at least their cost; done
    first, prefill runs undisturbed. The app sets it when the loaded engine's thread count is known.
    """

    def __init__(self, app: App, paint_first: bool = False) -> None:
        _start_resource_tracker()
        self.app = app
        self.paint_first = paint_first
        self._held: EngineJob | None = None

    def start(self, job: EngineJob) -> None:
        if job.kind == "turn" and self.paint_first:
            self._held = job
        else:
            self._run(job)

    def release_turn(self) -> None:
        """The screen shows the turn: start its held job (unless its engine was replaced meanwhile)."""
        job, self._held = self._held, None
        if job is not None:
            self._run_if_current(job)

    def spawn(self, fn: Callable[[], object]) -> None:
        self.app.run_worker(fn, thread=True, group="close", exit_on_error=False)

    def _run_if_current(self, job: EngineJob) -> None:
        if job.current():  # the engine may have been replaced while the screen was painted
            self._run(job)
        else:
            job.end()

    def _run(self, job: EngineJob) -> None:
        group = "watch" if job.kind == "watch" else "engine"
        self.app.run_worker(lambda: self._pump(job), thread=True, group=group, exit_on_error=False)

    def _pump(self, job: EngineJob) -> None:
        worker = get_current_worker()
        post = self.app.post_message
        try:
            for event in job.run():
                post(EngineEventArrived(job, event))
                if worker.is_cancelled:  # the app is shutting down
                    job.engine.cancel()
                    break
        finally:
            post(EngineJobEnded(job))
