"""EngineHost: runs :class:`~chatphase.engine.local.llama.LlamaEngine` in a child process, same interface.

Why a child process (``docs/architecture.md``): a native crash in llama.cpp (a bad file, a kernel bug, an
out-of-memory abort) must not take the UI and the transcript with it; llama.cpp's output to fd 1/2 must
not draw over a Textual screen (the child points both at the engine log); and cancel, model switch and
memory release become clean (the process ends, the OS takes its memory back).

The child (:class:`~chatphase.engine.process.child.Child`: ``spawn``, a message pipe, a cancel pipe) takes
typed commands (:data:`Command`: ``RunTurn``, ``Count`` between turns, ``Close``) and sends typed replies back
(:data:`Reply`: the engine's events, ``Counted`` and ``TurnDone``); per-token ``TokensDecoded`` events are coalesced in the child for at most
``coalesce_ms`` so that the pipe carries a bounded message rate — the token timestamps are taken before
coalescing, so no measured figure changes. Cancel, on the second pipe, is checked by the engine between
prefill chunks and tokens.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import (
    CountRequest,
    EngineFailed,
    Event,
    FirstToken,
    ModelLoaded,
    PrefillStarted,
    PromptCount,
    ThinkingEnded,
    TokensDecoded,
    TurnRequest,
)
from chatphase.engine.process.cancel_pipe import CancelFlag
from chatphase.engine.process.child import Child, exit_reason, quiet, reporting
from chatphase.models.gguf_meta import ModelInfo

if TYPE_CHECKING:
    from chatphase.engine.local.llama import LlamaEngine

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
class Count:
    """To the child, between turns: answer ``request`` (:meth:`LlamaEngine.count_prompt`) as :class:`Counted`."""

    request: CountRequest
    seq: int


@dataclass(frozen=True)
class Counted:
    """From the child: the answer to :class:`Count` number ``seq`` (``None``: it could not count)."""

    seq: int
    count: PromptCount | None


@dataclass(frozen=True)
class TurnDone:
    """From the child: turn ``turn_id`` has sent all its events (never yielded to callers)."""

    turn_id: int


#: what the parent sends the child, and what the child sends back.
Command: TypeAlias = "RunTurn | Count | Close"
Reply: TypeAlias = "Event | Counted | TurnDone"


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


def coalesced(events: Iterable[Event], every_ns: int) -> Iterator[Event]:
    """``events`` with each run of ``TokensDecoded`` merged (:class:`_Batch`) into one message per ``every_ns``
    of the engine's clock (the tokens' own ``t_ns``, so the rule is the same at any speed): a token at least
    ``every_ns`` after the last message sent goes out with those held before it; any other event first sends
    what is held, then itself. Nothing is dropped or reordered."""
    batch = _Batch()
    sent_ns = 0
    for event in events:
        if isinstance(event, TokensDecoded):
            if not batch and not sent_ns:
                sent_ns = event.t_ns
            batch.add(event)
            if event.t_ns - sent_ns >= every_ns:
                yield batch.take()
                sent_ns = event.t_ns
            continue
        if batch:
            yield batch.take()
        if isinstance(event, (PrefillStarted, FirstToken, ThinkingEnded)):
            sent_ns = event.t_ns
        yield event
    if batch:
        yield batch.take()


def _child_main(
    conn: Connection[Reply, Command],
    cancel_conn: Connection[object, bytes],
    info: ModelInfo,
    config: EngineConfig,
    log_path: str | Path | None,
    coalesce_ms: float,
) -> None:
    """Child process body: load, then serve :class:`RunTurn` commands until :class:`Close`;
    ``cancel_conn`` carries cancel requests (:class:`~chatphase.engine.process.cancel_pipe.CancelFlag`)."""
    log_path = quiet(log_path)
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

    with reporting(conn, lambda exc: EngineFailed(internal_error_message(exc, log_path), fatal=True)):
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
                    engine.idle()  # the prefix store saves the cache when its policy says so
                command = conn.recv()
            except EOFError:
                break
            if isinstance(command, Close):
                break
            if isinstance(command, Count):
                conn.send(Counted(command.seq, _count(engine, command.request)))
                continue
            request = command.request
            cancel.begin(command.seq)
            every_ns = int(request.events_every_ms * 1e6) if request.events_every_ms else coalesce_ns
            for message in coalesced(engine.run_turn(request), every_ns):
                conn.send(message)
            conn.send(TurnDone(request.turn_id))
        engine.close()


def _count(engine: LlamaEngine, request: CountRequest) -> PromptCount | None:
    """The engine's count, ``None`` when it raised (the template on a message it cannot render: the turn
    itself will say why), so that a count never ends the child."""
    try:
        return engine.count_prompt(request)
    except Exception:
        return None


def internal_error_message(exc: BaseException, log_path: str | Path) -> str:
    """One line for an unexpected failure inside the engine: what happened and where its details are, the
    Python details left to the engine log (where :func:`_child_main` printed the traceback). What to do is the
    front end's to say (the TUI's restart key; ``ask`` exits)."""
    what = "ran out of memory" if isinstance(exc, MemoryError) else "stopped on an internal error"
    return f"the engine {what} (details in {log_path})"


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
        self._seq = 0  # turns sent to this child, numbered for cancel
        self._child: Child[Command, Reply] | None = None
        self._fresh = False  # started by start() and not loaded yet
        self._pipe = threading.Lock()  # a count and the start of a turn or load take turns on the pipe
        self._open = True  # a load or turn is reading the pipe: no count now
        self._counts = itertools.count(1)

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def start(self) -> None:
        """Start the child now, without waiting for it: it imports llama.cpp and loads the model while the
        caller does other work (the TUI importing Textual and drawing); :meth:`load` then yields what it
        reports. Does nothing when a started child has not been loaded yet."""
        if self._child is not None and self._fresh:
            return
        self.close()
        self._child = Child(
            _child_main,
            (self.info, self.config, self.log_path, self.coalesce_ms),
            name="chatphase-engine",
            duplex=True,
        )
        self._fresh = True

    def load(self) -> Iterator[Event]:
        """Start the child (unless :meth:`start` just did) and load the model; yields ``ModelLoaded`` or
        ``EngineFailed(fatal=True)``. Called again, it starts a fresh child."""
        with self._pipe:
            self.start()
            self._fresh = False
            self._open = True
        try:
            for event in self._receive():
                if isinstance(event, (TurnDone, Counted)):  # a fresh child has run none: cannot come, not for callers
                    continue
                yield event
                if isinstance(event, (ModelLoaded, EngineFailed)):
                    return
        finally:
            self._open = False

    def run_turn(self, request: TurnRequest) -> Iterator[Event]:
        """Send one turn to the child and yield its events until the turn ends.

        A caller may stop reading early (e.g. at ``TurnFinished``); what is left of that turn is skipped
        here, by ``turn_id``, so give each turn its own id.
        """
        if self._child is None or not self._child.is_alive():
            yield EngineFailed("the engine is not running; restart it", request.turn_id, fatal=True)
            return
        with self._pipe:
            self._seq += 1
            self._open = True
            try:
                self._child.send(RunTurn(request, self._seq))
            except (BrokenPipeError, OSError):
                sent = False
            else:
                sent = True
        try:
            if not sent:
                yield self._death(request.turn_id)
                return
            for event in self._receive(request.turn_id):
                if isinstance(event, Counted):
                    continue  # cannot come while a turn is open; never for callers
                turn_id = request.turn_id if isinstance(event, ModelLoaded) else event.turn_id
                if turn_id != request.turn_id and not (isinstance(event, EngineFailed) and event.fatal):
                    continue  # the rest of an earlier turn whose caller stopped reading before its end
                if isinstance(event, TurnDone):
                    return
                yield event
                if isinstance(event, EngineFailed) and event.fatal:
                    return
        finally:
            self._open = False

    def count_prompt(self, request: CountRequest) -> PromptCount | None:
        """What sending ``request.messages`` would cost (:class:`~chatphase.engine.events.PromptCount`), asked
        of the child between turns; ``None`` while a load or turn runs or when the child is gone. Blocking;
        any thread."""
        with self._pipe:
            child = self._child
            if self._open or child is None or not child.is_alive():
                return None
            seq = next(self._counts)
            try:
                child.send(Count(request, seq))
            except (BrokenPipeError, OSError):
                return None
            for reply in child.messages():  # the rest of a turn whose caller stopped reading is passed over
                if isinstance(reply, Counted) and reply.seq == seq:
                    return reply.count
            return None

    def watch(self) -> Iterator[Event]:
        """Block until the child process ends; yield ``EngineFailed(fatal=True)`` if it died on its own
        (not by :meth:`close`). Waits on the process's sentinel, so it costs no wake-ups."""
        child = self._child
        if child is None:
            return
        child.wait()
        if self._child is child:  # close() clears _child before it stops the child
            child.reap()  # so that its exit code (the signal) is known
            yield self._death(None)

    def cancel(self) -> None:
        """Ask the running turn to stop at the next prefill chunk or token."""
        if self._child is not None:
            self._child.cancel(self._seq)

    def close(self) -> None:
        """Stop the child (politely, then by force) and release its memory. Idempotent."""
        child, self._child = self._child, None
        self._fresh = False
        if child is not None:
            child.stop(polite_s=2.0, farewell=Close())

    def _receive(self, turn_id: int | None = None) -> Iterator[Reply]:
        """The child's messages until it dies, then ``EngineFailed(fatal=True)`` naming how."""
        if self._child is not None:
            yield from self._child.messages()
        yield self._death(turn_id)

    def _death(self, turn_id: int | None) -> EngineFailed:
        why = self._child.exit_reason() if self._child is not None else exit_reason(None)
        where = f"; details in {self.log_path}" if self.log_path else ""
        # ggml's RPC client aborts the process when a server goes away mid-compute (ggml-rpc.cpp RPC_STATUS_ASSERT)
        rpc = (
            f": an rpc-server of --rpc {self.config.rpc} may have gone away"
            if self.config.rpc and why == "SIGABRT"
            else ""
        )
        return EngineFailed(f"the engine process died ({why}{where}){rpc}", turn_id, fatal=True)
