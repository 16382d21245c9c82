"""The comparison as one run: two chat controllers, one per side, each with the ordinary engine of its settings
(:func:`chatphase.engine.factory.make_engine`: the local model in its child process, a server, RPC devices),
loaded one after the other, then the turns.

Each user turn goes to both sides, one after the other, never at once (on a shared CPU each would slow the
other, and both measurements would be wrong); the side that goes first alternates (A first on odd turns), so
neither always runs on a warmer machine. Each side keeps its own conversation, as a chat would: its own replies
are in its next prompts, and its KV cache is reused between turns. Before the first measured turn each side runs
one short warm-up turn, not counted (:data:`WARMUP_TEXT`, :data:`WARMUP_TOKENS` tokens): a process's first
evaluation after a load pays for what later ones find ready (the weights paged in, buffers and threads set up), and
without it the side that goes first on turn 1 paid it in its TTFT. The figures are the turns' own
(:class:`~chatphase.engine.metrics.TurnMetrics`), the resident memory of the side's engine process read after
each turn (psutil; ``None`` for a server).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from typing_extensions import override

from chatphase.bench.compare.plan import ComparePlan
from chatphase.bench.compare.result import CompareResult, CompareSide, CompareTurn
from chatphase.bench.core.contract import validate_plan
from chatphase.bench.core.events import BenchStatus, RunDone
from chatphase.bench.core.run import model_record
from chatphase.chat.controller import ChatController
from chatphase.chat.dispatch import InlineDispatcher
from chatphase.chat.listener import ChatListener
from chatphase.chat.turn import Turn
from chatphase.engine.base import Engine
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, LoadedModel, Message, SamplingParams, TurnFinished, TurnRequest
from chatphase.errors import EngineError, UsageError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.settings.schema import Settings, with_values

SIDES = ("A", "B")
#: the warm-up turn each side runs once loaded, before the first measured one (a fresh conversation of its own,
#: greedy, :data:`WARMUP_TOKENS` tokens at most; its reply is kept nowhere)
WARMUP_TEXT = "Hi."
WARMUP_TOKENS = 4
#: ``(model, settings) -> Engine``: how a side gets its engine.
EngineFactory = Callable[[ModelInfo, Settings], Engine]


def ordinary_engine(info: ModelInfo, settings: Settings) -> Engine:
    """The engine ``settings`` ask for (:func:`chatphase.engine.factory.make_engine`: a server's, or the local
    model in its own process). In the Experiments screen's job, itself a daemonic child process that may start no
    process of its own, the local model runs in the job's process instead (a crash still ends only the job)."""
    import multiprocessing

    if not settings.server and multiprocessing.current_process().daemon:
        from chatphase.engine.local.llama import LlamaEngine

        return LlamaEngine(info, settings.engine)
    from chatphase.engine.factory import make_engine

    return make_engine(info, settings.engine, settings.server, settings.api_key_env, settings.remote_model)


@dataclass(frozen=True)
class CompareProgress:
    """One side's turn ended (:class:`~chatphase.bench.core.contract.Progress`)."""

    turn: CompareTurn
    done_runs: int
    total_runs: int
    counted: bool = True

    def line(self) -> tuple[str, str]:
        t = self.turn
        ttft = "–" if t.ttft_ms is None else f"{t.ttft_ms:,.0f} ms"
        rate = "–" if t.decode_tokens_per_s is None else f"{t.decode_tokens_per_s:,.1f} tok/s"
        return f"turn {t.turn + 1} side {t.side}", f"TTFT {ttft}, decode {rate}"


class _Side(ChatListener):
    """One side: its settings, model, controller, and what its engine told it."""

    def __init__(self, name: str, settings: Settings, info: ModelInfo, factory: EngineFactory) -> None:
        self.name, self.settings, self.info = name, settings, info
        self.loaded: LoadedModel | None = None
        self.failure: str | None = None
        self.finished: TurnFinished | None = None
        self.reply = ""
        self.chat = ChatController(settings, info, factory, InlineDispatcher(), [self])

    @override
    def engine_ready(self, loaded: LoadedModel) -> None:
        self.loaded = loaded

    @override
    def engine_stopped(self, message: str) -> None:
        self.failure = message

    @override
    def turn_failed(self, turn: Turn, message: str) -> None:
        self.failure = message

    @override
    def turn_finished(self, turn: Turn, event: TurnFinished) -> None:
        self.finished = event
        self.reply = turn.reply

    def rss_bytes(self) -> int | None:
        """The resident memory of the side's engine process (``None``: a server, or gone)."""
        import psutil

        pid = self.loaded.pid if self.loaded is not None else 0
        if not pid or self.settings.server:
            return None
        try:
            return int(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            return None

    def record(self) -> CompareSide:
        loaded = self.loaded
        return CompareSide(
            name=self.name,
            model=self.info.name,
            settings=self.settings.to_dict(),
            engine=loaded.settings.to_dict() if loaded is not None else {},
            load_ms=loaded.load_ms if loaded is not None else None,
        )


class CompareRun:
    """The comparison (module docstring); iterate to run it (blocking), :meth:`cancel` from any thread.
    ``resolve(spec)`` finds side B's model (default: as the command line does); ``engine_factory`` makes each side's
    engine (default: :func:`ordinary_engine`; tests pass a fake).

    Raises (while iterating):
        UsageError: a plan out of range, two sides with the same settings, side B's model not found.
        EngineError: a side's engine fails to load or a turn fails (the sides and turns so far are kept in
            :meth:`partial_done`).
    """

    def __init__(
        self,
        info: ModelInfo,
        settings: Settings,
        plan: ComparePlan,
        resolve: Callable[[str | None], ModelInfo] | None = None,
        engine_factory: EngineFactory = ordinary_engine,
    ) -> None:
        self.info, self.settings, self.plan = info, settings, plan
        self._resolve, self._factory = resolve, engine_factory
        self._cancel = threading.Event()
        self._sides: list[_Side] = []
        self._turns: list[CompareTurn] = []
        self._running: _Side | None = None

    def cancel(self) -> None:
        self._cancel.set()
        running = self._running
        if running is not None and not running.chat.stop() and running.chat.engine is not None:
            running.chat.engine.cancel()  # its warm-up turn, which is not the controller's

    def side_settings(self) -> tuple[Settings, Settings]:
        """A's and B's settings: greedy, ``gen_tokens`` per reply, the disk prefix store off unless a side's
        overrides name it (a store filled by earlier runs would restore one side's prompts and not the other's),
        then each side's overrides on top.

        Raises:
            UsageError: the two are the same.
        """
        fixed = {"temperature": 0.0, "max_tokens": self.plan.gen_tokens}
        a = with_values(self.settings, {"prefix_cache": "off", **self.plan.a, **fixed}).validate()
        b = with_values(a, {**self.plan.b, **fixed}).validate()
        if a == b:
            raise UsageError("the two sides are the same: give side B a setting that differs from A's")
        return a, b

    def _model(self, settings: Settings) -> ModelInfo:
        if settings.model == self.settings.model:
            return self.info
        if self._resolve is not None:
            return self._resolve(settings.model)
        from chatphase.models.gguf_meta import read_model_info
        from chatphase.models.resolve import resolve_model

        return read_model_info(resolve_model(settings.model, settings.models_dir))

    def __iter__(self) -> Iterator[object]:
        plan = validate_plan(self.plan, None)
        settings = self.side_settings()
        try:
            for name, side_settings in zip(SIDES, settings, strict=True):
                if self._cancel.is_set():
                    break
                side = _Side(name, side_settings, self._model(side_settings), self._factory)
                self._sides.append(side)
                yield BenchStatus(f"side {name}: loading {side.info.name}")
                side.chat.start_engine()
                if side.loaded is None:
                    raise EngineError(f"side {name} ({side.info.name}): {side.failure or 'the engine did not load'}")
            for side in self._sides:
                if self._cancel.is_set():
                    break
                yield BenchStatus(f"side {side.name}: warm-up turn (not counted)")
                self._warm_up(side)
            done = 0
            for k, text in enumerate(plan.turns):
                order = self._sides if k % 2 == 0 else self._sides[::-1]
                for position, side in enumerate(order):
                    if self._cancel.is_set():
                        break
                    turn = self._send(side, k, position, text)
                    done += 1
                    yield CompareProgress(turn, done, plan.total_runs)
            yield RunDone(self.result(cancelled=self._cancel.is_set()))
        finally:
            for side in self._sides:
                side.chat.close()

    def _warm_up(self, side: _Side) -> None:
        """One short turn straight to ``side``'s engine, outside its conversation (module docstring); its KV cache
        keeps the warm-up's prompt, so the first measured turn may reuse the template's start from it, as each
        later turn reuses its own conversation.

        Raises:
            EngineError: the warm-up failed.
        """
        engine = side.chat.engine
        assert engine is not None
        request = TurnRequest(
            turn_id=0,  # the controller's own turns are numbered from 1
            messages=(Message("user", WARMUP_TEXT),),
            sampling=SamplingParams(max_tokens=WARMUP_TOKENS, temperature=0.0),
            reset_cache=True,
        )
        self._running = side
        try:
            for event in engine.run_turn(request):
                if isinstance(event, EngineFailed):
                    raise EngineError(f"side {side.name}, warm-up turn: {event.message}")
        finally:
            self._running = None

    def _send(self, side: _Side, k: int, position: int, text: str) -> CompareTurn:
        side.finished, side.failure = None, None
        self._running = side
        try:
            side.chat.send(text)
        finally:
            self._running = None
        if side.finished is None:
            raise EngineError(f"side {side.name}, turn {k + 1}: {side.failure or 'the turn ended without metrics'}")
        turn = CompareTurn.of(k, side.name, position, side.finished.metrics, side.rss_bytes(), side.reply)
        self._turns.append(turn)
        return turn

    def result(self, cancelled: bool = True) -> CompareResult:
        """What ran so far."""
        return CompareResult(
            model=model_record(self.info),
            settings={"plan": self.plan.to_dict()},
            sides=[s.record() for s in self._sides],
            turns=list(self._turns),
            cancelled=cancelled,
        )

    def partial_done(self) -> RunDone:
        return RunDone(self.result(cancelled=True))


def make_run(
    info: ModelInfo, config: EngineConfig, plan: ComparePlan, roofline: bool, log_path: str | None, **options
) -> CompareRun:
    """The run of a :class:`ComparePlan` from the registry: side A is ``info`` with ``config`` (``options``:
    ``settings``, the whole settings of a command, and ``resolve``, its model resolver)."""
    settings = options.get("settings") or Settings(model=str(info.path), engine=config)
    return CompareRun(info, settings, plan, resolve=options.get("resolve"))
