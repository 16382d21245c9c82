"""A benchmark run in a child process: the non-UI runner API the Experiments screen drives.

Why a child (as for :class:`~chatphase.engine.process.host.EngineHost`, ``docs/architecture.md``): llama.cpp writes to
fds 1/2 (which would draw over a Textual screen), a native crash must not take the app with it, and the
model's memory goes back to the OS when the run ends. The child runs :class:`~chatphase.bench.api.BenchRun`
(a lever grid's :class:`~chatphase.bench.grid_api.GridRun` for :class:`GridJob`, decode modes'
:class:`~chatphase.bench.spec_api.SpecRun` for :class:`SpecJob`) with fds 1/2 pointed at the
engine log and sends its events (picklable dataclasses) over a pipe; cancel travels on a second pipe
(:mod:`chatphase.engine.process.cancel_pipe`: no named semaphores, so no "leaked semaphore" warnings when the UI is
killed) and a thread in the child turns it into the run's ``cancel()``.
The ``spawn`` start method is used (the UI process has threads).

Usage (blocking; call from a worker thread)::

    job = BenchJob(info, config, plan)        # raises UsageError when the plan does not fit n_ctx
    for event in job.events():                # BenchStatus | SweepProgress | BenchDone | BenchFailed
        ...
    job.cancel()                              # from any thread; the run ends with a partial BenchDone
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from chatphase.bench.api import BenchDone, BenchNotice, BenchStatus
from chatphase.bench.grid import GridPoint
from chatphase.bench.grid_api import GridDone, GridProgress
from chatphase.bench.parallel import ParallelPlan
from chatphase.bench.runner import SweepPlan, SweepProgress
from chatphase.bench.spec_api import SpecDone, SpecPlan, SpecProgress
from chatphase.engine.config import EngineConfig
from chatphase.engine.process.cancel_pipe import ALL, CancelFlag, CancelSender
from chatphase.engine.process.host import exit_reason, stop_process
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
    """The child's run of a :class:`BenchJob`: one model's sweep (:class:`~chatphase.bench.api.BenchRun`)."""
    from chatphase.bench.api import BenchRun

    return BenchRun(info, config, plan, roofline=roofline, log_path=log_path)


def _grid_run(points, infos, config: EngineConfig, plan: SweepPlan, notes, roofline: bool, log_path: str):
    """The child's run of a :class:`GridJob`: a lever grid (:class:`~chatphase.bench.grid_api.GridRun`)."""
    from chatphase.bench.grid_api import GridRun

    return GridRun(points, infos, config, plan, notes=notes, roofline=roofline, log_path=log_path)


def _spec_run(info: ModelInfo, config: EngineConfig, plan, log_path: str):
    """The child's run of a :class:`SpecJob`: decode modes side by side (:class:`~chatphase.bench.spec_api.SpecRun`)."""
    from chatphase.bench.spec_api import SpecRun

    return SpecRun(info, config, plan)


def _child_main(conn, cancel_conn, build: Callable, args: tuple, log_path) -> None:
    """Child body: quiet fds, run ``build(*args, log_path)``'s events, send each; never print a traceback."""
    from chatphase.engine.logfile import default_log_path, redirect_stdio

    log_path = str(log_path or default_log_path())
    redirect_stdio(log_path)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C belongs to the UI
    try:
        from chatphase.errors import ChatPhaseError

        run = build(*args, log_path)
        threading.Thread(target=_watch_cancel, args=(CancelFlag(cancel_conn), run), daemon=True).start()
        try:
            for event in run:
                conn.send(event)
        except ChatPhaseError as exc:
            conn.send(BenchFailed(str(exc)))
    except (BrokenPipeError, EOFError):
        pass  # the parent went away
    except Exception:  # the traceback goes to the log (our fd 2), the user gets words
        traceback.print_exc()
        try:
            conn.send(BenchFailed(f"the benchmark stopped on an internal error (details in {log_path})"))
        except Exception:
            pass


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
        self._mp = mp.get_context("spawn")
        self._cancel: CancelSender | None = None
        self._proc: BaseProcess | None = None
        self._conn: Connection[object, JobEvent] | None = None

    def _run_args(self) -> tuple[Callable, tuple]:
        """What the child builds its run with: a module-level function (picklable) and its arguments."""
        return _bench_run, (self.info, self.config, self.plan, self.roofline)

    @property
    def pid(self) -> int | None:
        """The child process's id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def events(self) -> Iterator[JobEvent]:
        """Start the child and yield its events until :class:`BenchDone` or :class:`BenchFailed`
        (also yielded when the child dies, naming its exit code). Blocking."""
        parent, child = self._mp.Pipe(duplex=False)
        cancel_in, cancel_out = self._mp.Pipe(duplex=False)
        proc = self._proc = self._mp.Process(
            target=_child_main,
            name="chatphase-bench",
            daemon=True,
            args=(child, cancel_in, *self._run_args(), self.log_path),
        )
        self._cancel = CancelSender(cancel_out)
        proc.start()
        child.close()
        cancel_in.close()
        self._conn = parent
        try:
            while True:
                try:
                    ready = parent.poll(0.1)
                    event = parent.recv() if ready else None
                except (EOFError, OSError):
                    event, ready = None, False
                if event is not None:
                    yield event
                    if isinstance(event, (BenchDone, GridDone, SpecDone, BenchFailed)):
                        return
                elif not proc.is_alive():
                    yield BenchFailed(f"the benchmark process died ({exit_reason(proc.exitcode)}); see the engine log")
                    return
        finally:
            self.close()

    def cancel(self) -> None:
        """Stop the run at the next prefill chunk or token; it still ends with a partial ``BenchDone``."""
        if self._cancel is not None:
            self._cancel.cancel(ALL)

    def close(self) -> None:
        """Stop the child (politely, then by force). Idempotent."""
        proc, conn, cancel = self._proc, self._conn, self._cancel
        self._proc = self._conn = self._cancel = None
        if proc is None:
            return
        if cancel is not None:
            cancel.cancel(ALL)
        stop_process(proc, conn, polite_s=3.0)
        if cancel is not None:
            cancel.close()


class GridJob(BenchJob):
    """A lever grid (:class:`~chatphase.bench.grid_api.GridRun`) in a child process, like :class:`BenchJob`:
    its events are ``BenchStatus``, ``BenchNotice``, ``GridProgress``, then ``GridDone`` or ``BenchFailed``.

    Args:
        points, notes: from :meth:`~chatphase.bench.grid.LeverGrid.points`; infos: each point's model spec
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
    """Decode modes side by side (:class:`~chatphase.bench.spec_api.SpecRun`) in a child process, like
    :class:`BenchJob`: its events are ``BenchStatus``, ``SpecProgress``, then ``SpecDone`` or ``BenchFailed``.

    Raises:
        UsageError: at construction, when the plan does not fit ``config``'s n_ctx and n_batch.
    """

    def __init__(self, info: ModelInfo, config: EngineConfig, plan: SpecPlan, log_path: str | None = None) -> None:
        super().__init__(info, config, plan.validate(config.n_ctx, config.n_batch), roofline=False, log_path=log_path)

    def _run_args(self) -> tuple[Callable, tuple]:
        return _spec_run, (self.info, self.config, self.plan)
