"""EngineHost: runs :class:`~chatphase.engine.local.llama.LlamaEngine` in a child process, same interface.

Why a child process (``docs/architecture.md``): a native crash in llama.cpp (a bad file, a kernel bug, an
out-of-memory abort) must not take the UI and the transcript with it; llama.cpp's output to fd 1/2 must
not draw over a Textual screen (the child points both at the engine log); and cancel, model switch and
memory release become clean (the process ends, the OS takes its memory back).

The child is started with the ``spawn`` method (the UI process has threads; ``fork`` would copy them
half-way). The pipe carries typed messages: :data:`Command` (``RunTurn``, ``Close``) to the child,
:data:`Reply` (the engine's events and ``TurnDone``) back; per-token ``TokensDecoded`` events are
coalesced in the child for at most ``coalesce_ms`` so that the pipe carries a bounded message rate — the
token timestamps are taken before coalescing, so no measured figure changes. Cancel travels on a second
pipe (:mod:`chatphase.engine.process.cancel_pipe`), checked by the engine between prefill chunks and tokens:
no ``multiprocessing`` lock or event, so no named semaphore the resource tracker would report as leaked
when the UI process is killed.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeAlias

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import (
    EngineFailed,
    Event,
    FirstToken,
    ModelLoaded,
    PrefillStarted,
    ThinkingEnded,
    TokensDecoded,
    TurnRequest,
)
from chatphase.engine.process.cancel_pipe import ALL, CancelFlag, CancelSender
from chatphase.models.gguf_meta import ModelInfo

#: seconds between the thread policy's load snapshots while the child waits for a turn
#: (:meth:`chatphase.engine.threads.governor.ThreadGovernor.idle`): one ~0.06 ms wake-up a second.
IDLE_TICK_S = 1.0


@dataclass(frozen=True)
class RunTurn:
    """To the child: run ``request``; ``seq`` numbers the turn for cancel
    (:class:`~chatphase.engine.process.cancel_pipe.CancelFlag`)."""

    request: TurnRequest
    seq: int


@dataclass(frozen=True)
class Close:
    """To the child: close the engine and exit."""


@dataclass(frozen=True)
class TurnDone:
    """From the child: turn ``turn_id`` has sent all its events (never yielded to callers)."""

    turn_id: int


#: what the parent sends the child, and what the child sends back.
Command: TypeAlias = "RunTurn | Close"
Reply: TypeAlias = "Event | TurnDone"


class _Batch:
    """``TokensDecoded`` events held back in the child, merged into one when sent (texts joined, counts
    added, the last one's running totals and time kept)."""

    def __init__(self) -> None:
        self._events: list[TokensDecoded] = []

    def __bool__(self) -> bool:
        return bool(self._events)

    def add(self, event: TokensDecoded) -> None:
        self._events.append(event)

    def take(self) -> TokensDecoded:
        events, self._events = self._events, []
        last = events[-1]
        return TokensDecoded(
            last.turn_id,
            "".join(e.text for e in events),
            sum(e.n_tokens for e in events),
            last.decode_tokens,
            last.t_ns,
            "".join(e.thinking for e in events),
            last.thinking_tokens,
            last.spec,
            _spans(events) if last.spec is not None else (),
        )


def _spans(events: list[TokensDecoded]) -> tuple[tuple[int, int], ...]:
    """The events' ``drafted_spans``, as offsets into their joined text."""
    out: list[tuple[int, int]] = []
    base = 0
    for e in events:
        out.extend((base + a, base + b) for a, b in e.drafted_spans)
        base += len(e.text)
    return tuple(out)


def _child_main(
    conn: Connection[Reply, Command],
    cancel_conn: Connection[object, bytes],
    info: ModelInfo,
    config: EngineConfig,
    log_path: str | os.PathLike[str] | None,
    coalesce_ms: float,
) -> None:
    """Child process body: load, then serve :class:`RunTurn` commands until :class:`Close`;
    ``cancel_conn`` carries cancel requests (:class:`~chatphase.engine.process.cancel_pipe.CancelFlag`)."""
    from chatphase.engine.logfile import default_log_path, redirect_stdio

    log_path = log_path or default_log_path()
    redirect_stdio(log_path)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C belongs to the UI, which cancels and closes us
    # OpenMP waiting: libgomp's defaults stay, by measurement (2 vCPUs, interleaved A/B runs of 2 decode
    # threads; docs/architecture.md). OMP_WAIT_POLICY=PASSIVE decoded at 58 tok/s where the default did
    # 154 on a quiet machine (median of 2 each; a futex sleep and wake at every barrier); ACTIVE spins
    # the workers after each turn (0.7-0.9 cores while idle, ~10 ms by default) and was no faster;
    # GOMP_SPINCOUNT 100 was slower, 1000 and 10000 and OMP_PROC_BIND=close level with the default quiet
    # and no steadier beside busy processes, where one thread beat every 2-thread variant by 1.4x or more. So
    # the thread policy (chatphase.engine.threads.policy), not the wait policy, is the lever, and a value the
    # user set is left alone. The ggml threadpool (llama_attach_threadpool) is in libllama but not in the
    # 0.3.36 bindings, and under this OpenMP build it carries only a CPU mask and a priority, which
    # OMP_PROC_BIND already covers.

    try:
        from chatphase.engine.local.llama import LlamaEngine

        cancel = CancelFlag(cancel_conn)
        engine = LlamaEngine(info, config, cancel_event=cancel, log_path=log_path)
        for event in engine.load():
            conn.send(event)
            if isinstance(event, EngineFailed):
                return
        coalesce_ns = int(coalesce_ms * 1e6)
        while True:
            try:
                while not conn.poll(IDLE_TICK_S):  # waiting for a turn: the thread policy's load snapshot
                    engine.threads.idle()
                command = conn.recv()
            except EOFError:
                break
            if isinstance(command, Close):
                break
            request = command.request
            cancel.begin(command.seq)
            every_ns = int(request.events_every_ms * 1e6) if request.events_every_ms else coalesce_ns
            batch = _Batch()
            sent_ns = 0
            for event in engine.run_turn(request):
                if isinstance(event, TokensDecoded):
                    if not batch and not sent_ns:
                        sent_ns = event.t_ns
                    batch.add(event)
                    if event.t_ns - sent_ns >= every_ns:
                        conn.send(batch.take())
                        sent_ns = event.t_ns
                    continue
                if batch:
                    conn.send(batch.take())
                if isinstance(event, (PrefillStarted, FirstToken, ThinkingEnded)):
                    sent_ns = event.t_ns
                conn.send(event)
            conn.send(TurnDone(request.turn_id))
        engine.close()
    except (BrokenPipeError, EOFError):
        pass  # the parent went away
    except Exception as exc:  # report in words; the traceback goes to the engine log (our fd 2)
        traceback.print_exc()
        try:
            conn.send(EngineFailed(internal_error_message(exc, log_path), fatal=True))
        except Exception:
            pass


def internal_error_message(exc: BaseException, log_path: str | os.PathLike[str]) -> str:
    """One line for an unexpected failure inside the engine: what happened and what to do, the Python
    details left to the engine log (where :func:`_child_main` printed the traceback)."""
    what = "ran out of memory" if isinstance(exc, MemoryError) else "stopped on an internal error"
    return f"the engine {what}; the conversation is kept — restart the engine (details in {log_path})"


def stop_process(proc: BaseProcess, conn: Connection[Any, Any] | None, polite_s: float) -> None:
    """Wait ``polite_s`` seconds for a child process to end, then kill it; close its pipe end."""
    proc.join(polite_s)
    if proc.is_alive():
        proc.kill()
        proc.join(2.0)
    if conn is not None:
        conn.close()


def exit_reason(exitcode: int | None) -> str:
    """A child's ``exitcode`` in words: the signal's name (``SIGSEGV``) or ``exit code N``."""
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class EngineHost:
    """The engine in a child process (implements :class:`chatphase.engine.base.Engine`).

    Args:
        info: the validated model; config: the engine settings; log_path: llama.cpp log file (also
            receives everything the child writes to fd 1/2); coalesce_ms: longest time per-token
            events are held back in the child before crossing the pipe (bounded message rate).

    ``pid`` is the child's process id while it runs (for RSS/CPU figures and crash tests).
    A child that dies (a signal, an abort) makes the running iterator yield
    ``EngineFailed(fatal=True)`` naming the signal; call :meth:`close` and build a new host to restart.
    """

    def __init__(
        self, info: ModelInfo, config: EngineConfig, log_path: str | None = None, coalesce_ms: float = 25.0
    ) -> None:
        self.info = info
        self.config = config
        self.log_path = log_path
        self.coalesce_ms = coalesce_ms
        self._mp = mp.get_context("spawn")
        self._cancel: CancelSender | None = None
        self._seq = 0  # turns sent to this child, numbered for cancel
        self._proc: BaseProcess | None = None
        self._conn: Connection[Command, Reply] | None = None
        self._fresh = False  # started by start() and not loaded yet

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the child now, without waiting for it: it imports llama.cpp and loads the model while the
        caller does other work (the TUI importing Textual and drawing); :meth:`load` then yields what it
        reports. Does nothing when a started child has not been loaded yet."""
        if self._proc is not None and self._fresh:
            return
        self.close()
        parent, child = self._mp.Pipe()
        cancel_in, cancel_out = self._mp.Pipe(duplex=False)
        proc = self._mp.Process(
            target=_child_main,
            name="chatphase-engine",
            daemon=True,
            args=(child, cancel_in, self.info, self.config, self.log_path, self.coalesce_ms),
        )
        proc.start()
        self._proc = proc
        child.close()
        cancel_in.close()
        self._conn, self._cancel = parent, CancelSender(cancel_out)
        self._fresh = True

    def load(self) -> Iterator[Event]:
        """Start the child (unless :meth:`start` just did) and load the model; yields ``ModelLoaded`` or
        ``EngineFailed(fatal=True)``. Called again, it starts a fresh child."""
        self.start()
        self._fresh = False
        for event in self._receive():
            if isinstance(event, TurnDone):  # a fresh child has run no turn: cannot come, not for callers
                continue
            yield event
            if isinstance(event, (ModelLoaded, EngineFailed)):
                return

    def run_turn(self, request: TurnRequest) -> Iterator[Event]:
        """Send one turn to the child and yield its events until the turn ends.

        A caller may stop reading early (e.g. at ``TurnFinished``); what is left of that turn is skipped
        here, by ``turn_id``, so give each turn its own id.
        """
        if self._conn is None or self._proc is None or not self._proc.is_alive():
            yield EngineFailed("the engine is not running; restart it", request.turn_id, fatal=True)
            return
        self._seq += 1
        try:
            self._conn.send(RunTurn(request, self._seq))
        except (BrokenPipeError, OSError):
            yield self._death(request.turn_id)
            return
        for event in self._receive(request.turn_id):
            turn_id = request.turn_id if isinstance(event, ModelLoaded) else event.turn_id
            if turn_id != request.turn_id and not (isinstance(event, EngineFailed) and event.fatal):
                continue  # the rest of an earlier turn whose caller stopped reading before its end
            if isinstance(event, TurnDone):
                return
            yield event
            if isinstance(event, EngineFailed) and event.fatal:
                return

    def watch(self) -> Iterator[Event]:
        """Block until the child process ends; yield ``EngineFailed(fatal=True)`` if it died on its own
        (not by :meth:`close`). Waits on the process's sentinel, so it costs no wake-ups."""
        proc = self._proc
        if proc is None:
            return
        mp.connection.wait([proc.sentinel])
        if self._proc is proc:  # close() clears _proc before it stops the child
            proc.join(1.0)  # reap it, so that its exit code (the signal) is known
            yield self._death(None)

    def cancel(self) -> None:
        """Ask the running turn to stop at the next prefill chunk or token."""
        if self._cancel is not None:
            self._cancel.cancel(self._seq)

    def close(self) -> None:
        """Stop the child (politely, then by force) and release its memory. Idempotent."""
        proc, conn, cancel = self._proc, self._conn, self._cancel
        self._proc = self._conn = self._cancel = None
        self._fresh = False
        if proc is None:
            return
        if cancel is not None:
            cancel.cancel(ALL)
        try:
            if conn is not None:
                conn.send(Close())
        except (BrokenPipeError, OSError):
            pass
        stop_process(proc, conn, polite_s=2.0)
        if cancel is not None:
            cancel.close()

    def _receive(self, turn_id: int | None = None) -> Iterator[Reply]:
        """The child's messages as they come, then ``EngineFailed(fatal=True)`` once it has died."""
        conn, proc = self._conn, self._proc
        if conn is None or proc is None:
            yield self._death(turn_id)
            return
        while True:
            try:
                if conn.poll(0.1):
                    yield conn.recv()
                    continue
            except (EOFError, OSError):
                pass
            if not proc.is_alive():
                # drain what the child sent before it died
                try:
                    while conn.poll(0):
                        yield conn.recv()
                except (EOFError, OSError):
                    pass
                yield self._death(turn_id)
                return

    def _death(self, turn_id: int | None) -> EngineFailed:
        why = exit_reason(self._proc.exitcode if self._proc is not None else None)
        return EngineFailed(
            f"the engine process died ({why}); the conversation is kept — restart the engine", turn_id, fatal=True
        )
