"""A benchmark run in a child process: the non-UI runner API the Experiments screen drives.

Why a child (as for :class:`~chatphase.engine.process.host.EngineHost`, ``docs/architecture.md``): llama.cpp writes to
fds 1/2 (which would draw over a Textual screen), a native crash must not take the app with it, and the
model's memory goes back to the OS when the run ends. The child (:class:`~chatphase.engine.process.child.Child`, as the host's) runs
:class:`~chatphase.bench.sweep.run.BenchRun` (a lever grid's :class:`~chatphase.bench.grid.run.GridRun` for
:class:`GridJob`, decode modes' :class:`~chatphase.bench.spec.run.SpecRun` for :class:`SpecJob`) with fds 1/2
pointed at the engine log and sends its events (picklable dataclasses) over the pipe; a thread in the child
turns the cancel pipe into the run's ``cancel()``.

Usage (blocking; call from a worker thread)::

    job = BenchJob(info, config, plan)        # raises UsageError when the plan does not fit n_ctx
    for event in job.events():                # BenchStatus | SweepProgress | BenchDone | BenchFailed
        ...
    job.cancel()                              # from any thread; the run ends with a partial BenchDone
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from chatphase.bench.core.runner import SweepPlan, SweepProgress
from chatphase.bench.grid.levers import GridPoint
from chatphase.bench.grid.run import GridDone, GridProgress
from chatphase.bench.parallel.sweep import ParallelPlan
from chatphase.bench.spec.run import SpecDone, SpecPlan, SpecProgress
from chatphase.bench.sweep.run import BenchDone, BenchNotice, BenchStatus
from chatphase.engine.config import EngineConfig
from chatphase.engine.process.cancel_pipe import CancelFlag
from chatphase.engine.process.child import Child, quiet, reporting
from chatphase.models.gguf_meta import ModelInfo


@dataclass(frozen=True)
class BenchFailed:
    """The run failed; ``message`` is one line for the user."""

    message: str


JobEvent = (
    BenchStatus
    | BenchNotice
    | SweepProgress
    | GridProgress
    | SpecProgress
    | BenchDone
    | GridDone
    | SpecDone
    | BenchFailed
)


def _bench_run(info: ModelInfo, config: EngineConfig, plan, roofline: bool, log_path: str):
    """The child's run of a :class:`BenchJob`: one model's sweep (:class:`~chatphase.bench.sweep.run.BenchRun`)."""
    from chatphase.bench.sweep.run import BenchRun

    return BenchRun(info, config, plan, roofline=roofline, log_path=log_path)


def _grid_run(points, infos, config: EngineConfig, plan: SweepPlan, notes, roofline: bool, log_path: str):
    """The child's run of a :class:`GridJob`: a lever grid (:class:`~chatphase.bench.grid.run.GridRun`)."""
    from chatphase.bench.grid.run import GridRun

    return GridRun(points, infos, config, plan, notes=notes, roofline=roofline, log_path=log_path)


def _spec_run(info: ModelInfo, config: EngineConfig, plan, log_path: str):
    """The child's run of a :class:`SpecJob`: decode modes side by side (:class:`~chatphase.bench.spec.run.SpecRun`)."""
    from chatphase.bench.spec.run import SpecRun

    return SpecRun(info, config, plan)


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


class BenchJob:
    """One benchmark in a child process.

    Args:
        info: the validated model; config: the engine settings; plan: what to measure (either sweep).
        roofline: measure bandwidth/FLOP/s too; log_path: where the child's fds 1/2 go (engine log).

    Raises:
        UsageError: at construction, when the plan does not fit ``config.n_ctx``.
    """

    def __init__(
        self,
        info: ModelInfo,
        config: EngineConfig,
        plan: SweepPlan | ParallelPlan | SpecPlan,
        roofline: bool = True,
        log_path: str | None = None,
    ) -> None:
        self.info, self.config, self.plan = info, config, plan.validate(config.n_ctx)
        self.roofline, self.log_path = roofline, log_path
        self._child: Child[object, JobEvent] | None = None

    def _run_args(self) -> tuple[Callable, tuple]:
        """What the child builds its run with: a module-level function (picklable) and its arguments."""
        return _bench_run, (self.info, self.config, self.plan, self.roofline)

    @property
    def pid(self) -> int | None:
        """The child process's id while it runs."""
        return self._child.pid if self._child is not None else None

    def events(self) -> Iterator[JobEvent]:
        """Start the child and yield its events until :class:`BenchDone` or :class:`BenchFailed`
        (also yielded when the child dies, naming its exit code). Blocking."""
        child = self._child = Child(
            _child_main, (*self._run_args(), self.log_path), name="chatphase-bench", duplex=False
        )
        try:
            for event in child.messages():
                yield event
                if isinstance(event, (BenchDone, GridDone, SpecDone, BenchFailed)):
                    return
            yield BenchFailed(f"the benchmark process died ({child.exit_reason()}); see the engine log")
        finally:
            self.close()

    def cancel(self) -> None:
        """Stop the run at the next prefill chunk or token; it still ends with a partial ``BenchDone``."""
        if self._child is not None:
            self._child.cancel()

    def close(self) -> None:
        """Stop the child (politely, then by force). Idempotent."""
        child, self._child = self._child, None
        if child is not None:
            child.stop(polite_s=3.0)


class GridJob(BenchJob):
    """A lever grid (:class:`~chatphase.bench.grid.run.GridRun`) in a child process, like :class:`BenchJob`:
    its events are ``BenchStatus``, ``BenchNotice``, ``GridProgress``, then ``GridDone`` or ``BenchFailed``.

    Args:
        points, notes: from :meth:`~chatphase.bench.grid.levers.LeverGrid.points`; infos: each point's model spec
            to its validated model (``None``: the base model); config: the base engine settings; plan: the
            cells every point runs.

    Raises:
        UsageError: at construction, when the plan does not fit ``config.n_ctx``.
    """

    def __init__(
        self,
        points: list[GridPoint],
        infos: dict[str | None, ModelInfo],
        config: EngineConfig,
        plan: SweepPlan,
        notes: list[str] | None = None,
        roofline: bool = True,
        log_path: str | None = None,
    ) -> None:
        super().__init__(infos[points[0].values.get("model")], config, plan, roofline, log_path)
        self.points, self.infos, self.notes = points, infos, list(notes or [])

    def _run_args(self) -> tuple[Callable, tuple]:
        return _grid_run, (self.points, self.infos, self.config, self.plan, self.notes, self.roofline)


class SpecJob(BenchJob):
    """Decode modes side by side (:class:`~chatphase.bench.spec.run.SpecRun`) in a child process, like
    :class:`BenchJob`: its events are ``BenchStatus``, ``SpecProgress``, then ``SpecDone`` or ``BenchFailed``.

    Raises:
        UsageError: at construction, when the plan does not fit ``config``'s n_ctx and n_batch.
    """

    def __init__(self, info: ModelInfo, config: EngineConfig, plan: SpecPlan, log_path: str | None = None) -> None:
        super().__init__(info, config, plan.validate(config.n_ctx, config.n_batch), roofline=False, log_path=log_path)

    def _run_args(self) -> tuple[Callable, tuple]:
        return _spec_run, (self.info, self.config, self.plan)
