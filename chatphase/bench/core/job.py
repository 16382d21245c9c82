"""Any experiment's run in a child process: the one job the Experiments screen drives.

Why a child (as for :class:`~chatphase.engine.process.host.EngineHost`, ``docs/architecture.md``): llama.cpp writes to
fds 1/2 (which would draw over a Textual screen), a native crash must not take the app with it, and the
model's memory goes back to the OS when the run ends. The child (:class:`~chatphase.engine.process.child.Child`,
as the host's) builds the experiment's run with ``build(info, config, plan, roofline, log_path)`` (a module-level
function of the experiment, e.g. :func:`chatphase.bench.sweep.run.make_run`) with fds 1/2 pointed at the engine log
and sends its events (picklable dataclasses) over the pipe; a thread in the child turns the cancel pipe into the
run's ``cancel()``. The registry (:mod:`chatphase.bench.experiments`) names each experiment's ``build``.

Usage (blocking; call from a worker thread)::

    job = ExperimentJob(info, config, plan, build)   # raises UsageError when the plan does not fit
    for event in job.events():                       # BenchStatus | progress | the experiment's Done | BenchFailed
        ...
    job.cancel()                                     # from any thread; the run ends with a partial Done
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from chatphase.bench.core.contract import Done, validate_plan
from chatphase.engine.config import EngineConfig
from chatphase.engine.process.cancel_pipe import CancelFlag
from chatphase.engine.process.child import Child, quiet, reporting
from chatphase.models.gguf_meta import ModelInfo


@dataclass(frozen=True)
class BenchFailed:
    """The run failed; ``message`` is one line for the user."""

    message: str


#: what a job yields: the run's events (status, notices, progress, its :class:`Done`) or :class:`BenchFailed`.
JobEvent = object

#: ``build(info, config, plan, roofline, log_path)`` -> the run (a module-level function: the child gets it by name).
RunBuilder = Callable[..., object]


def _child_main(conn, cancel_conn, build: Callable, args: tuple, log_path) -> None:
    """Child body: quiet fds, run ``build(*args, log_path)``'s events, send each; never print a traceback."""
    log_path = str(quiet(log_path))
    internal = BenchFailed(f"the benchmark stopped on an internal error (details in {log_path})")
    with reporting(conn, lambda _exc: internal):
        from chatphase.errors import ChatPhaseError

        run = build(*args, log_path)
        threading.Thread(target=_watch_cancel, args=(CancelFlag(cancel_conn), run), daemon=True).start()
        try:
            for event in run:
                conn.send(event)
        except ChatPhaseError as exc:
            conn.send(BenchFailed(str(exc)))


def _watch_cancel(cancel, run) -> None:
    """Poll the cancel pipe (a request for any run, :data:`~chatphase.engine.process.cancel_pipe.ALL`), then cancel."""
    while not cancel.is_set():
        time.sleep(0.05)
    run.cancel()


class ExperimentJob:
    """One experiment in a child process.

    Args:
        info: the validated model (a lever grid's first point's); config: the engine settings; plan: what to
            measure (any experiment's plan); build: the experiment's run builder (see the module docstring).
        roofline: measure bandwidth/FLOP/s too; log_path: where the child's fds 1/2 go (engine log).

    Raises:
        UsageError: at construction, when the plan does not fit ``config``'s n_ctx and n_batch
            (:func:`~chatphase.bench.core.contract.validate_plan`).
    """

    def __init__(
        self,
        info: ModelInfo,
        config: EngineConfig,
        plan,
        build: RunBuilder,
        roofline: bool = True,
        log_path: str | None = None,
    ) -> None:
        self.info, self.config, self.plan = info, config, validate_plan(plan, config.n_ctx_before_load, config.n_batch)
        self.build, self.roofline, self.log_path = build, roofline, log_path
        self._child: Child[object, JobEvent] | None = None

    @property
    def pid(self) -> int | None:
        """The child process's id while it runs."""
        return self._child.pid if self._child is not None else None

    def events(self) -> Iterator[JobEvent]:
        """Start the child and yield its events until a :class:`Done` or :class:`BenchFailed`
        (also yielded when the child dies, naming its exit code). Blocking."""
        args = (self.info, self.config, self.plan, self.roofline)
        child = self._child = Child(
            _child_main, (self.build, args, self.log_path), name="chatphase-bench", duplex=False
        )
        try:
            for event in child.messages():
                yield event
                if isinstance(event, (Done, BenchFailed)):
                    return
            yield BenchFailed(f"the benchmark process died ({child.exit_reason()}); see the engine log")
        finally:
            self.close()

    def cancel(self) -> None:
        """Stop the run at the next prefill chunk or token; it still ends with a partial ``Done``."""
        if self._child is not None:
            self._child.cancel()

    def close(self) -> None:
        """Stop the child (politely, then by force). Idempotent."""
        child, self._child = self._child, None
        if child is not None:
            child.stop(polite_s=3.0)
