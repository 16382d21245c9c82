"""ChatController: the one owner of a chat's conversation, its engine and its turns.

It keeps the conversation (a list of :class:`~chatphase.engine.events.Message`) and sends all of it with
every turn; the engine reuses the KV-cache prefix itself. Engines come from ``engine_factory(model_info,
settings)`` (an :class:`~chatphase.engine.process.host.EngineHost` in the CLI, a
scripted ``FakeEngine`` in tests). Each engine gets a new ``engine_id`` and each turn a new ``turn_id``, so the late events of a
replaced engine or an abandoned turn are recognised and dropped here, not by the views.

What an event means is decided here:

- a turn refused or failed before any text (no ``TurnFinished``): its user message leaves the
  conversation and goes back to the user (``turn_failed``);
- an engine that dies mid-reply: the text so far stays as the reply, marked (``turn_abandoned``), and
  the engine is down until :meth:`ChatController.restart_engine`;
- a non-fatal error followed by ``TurnFinished`` (a remote stream cut mid-reply): the partial reply is
  kept with ``stop_reason="error"``.

Listeners (:class:`~chatphase.chat.listener.ChatListener`) are told everything; the blocking engine calls
run in the :class:`~chatphase.chat.dispatch.Dispatcher`. No Textual here: the TUI and ``ask`` drive the
same controller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from chatphase.chat.budget import prediction_of, with_prediction
from chatphase.chat.conversation import Conversation
from chatphase.chat.dispatch import Dispatcher, EngineJob, JobKind
from chatphase.chat.listener import ChatListener, Notice, thinking_ignored
from chatphase.chat.overflow import overflow_text, shift_refusal, unseen_exchanges
from chatphase.chat.ttft_prior import prior_after_load, ttft_predictor
from chatphase.chat.turn import Turn, TurnKind
from chatphase.engine.base import Engine, PromptCounter
from chatphase.engine.events import (
    CountRequest,
    EngineFailed,
    Event,
    FirstToken,
    LoadedModel,
    Message,
    ModelLoaded,
    PrefillProgress,
    PrefillStarted,
    PromptCount,
    ThinkingEnded,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.errors import ChatPhaseError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.settings.schema import Settings
from chatphase.timing.ttft_prediction import TtftPrediction

if TYPE_CHECKING:
    from chatphase.sessions.store import Session

#: the notice titles of turns that reuse the KV cache on purpose.
REGENERATE_NOTE = "Regenerate"
RESEND_NOTE = "Edit and resend"
COLD_PREFILL_NOTE = "Resumed session: cold prefill"
RESTORED_NOTE = "Resumed session: prefix restored from disk"
AFTER_THINKING_NOTE = "After thinking"


class NotNow(ChatPhaseError):
    """The chat cannot do that now; ``str`` says why and what to do (one line for the user).
    ``action``: the id of the user action that would help (``chat.stop``, ``engine.restart``), for a
    view to name its key."""

    def __init__(self, message: str, action: str | None = None) -> None:
        super().__init__(message)
        self.action = action


def dropped_before(session: Session) -> int:
    """The oldest messages ``session``'s conversation had left out to fit at its last turn (its overflow policy's
    drop or shift)."""
    kept = [t for t in session.turns if t.in_conversation and t.metrics is not None]
    return kept[-1].metrics.dropped_messages if kept and kept[-1].metrics else 0


def n_ctx_grew(session: Session, n_ctx: int) -> bool:
    """Whether ``n_ctx`` is larger than the one ``session`` last ran at (unknown: no)."""
    recorded = session.settings.get("n_ctx") if session.settings else None
    return isinstance(recorded, int) and n_ctx > recorded


class ChatController:
    """The conversation, the engine's life and the turn (see the module docstring).

    Args:
        settings: the user's settings; sampling and the system prompt go with each turn.
        model_info: the validated model to start with.
        engine_factory: ``(ModelInfo, Settings) -> Engine``; called to start, restart or switch engines.
        dispatcher: runs the engine's blocking calls.
        listeners: told what happens, in order (more with :meth:`add_listener`).
    """

    def __init__(
        self,
        settings: Settings,
        model_info: ModelInfo,
        engine_factory: Callable[[ModelInfo, Settings], Engine],
        dispatcher: Dispatcher,
        listeners: Iterable[ChatListener] = (),
    ) -> None:
        self.settings = settings
        self.model_info = model_info
        self.engine_factory = engine_factory
        self.dispatcher = dispatcher
        self.listeners: list[ChatListener] = list(listeners)
        self.history = Conversation()
        self.engine: Engine | None = None
        self.engine_id = 0
        self.loaded: LoadedModel | None = None
        self.busy = False  # a load or turn job of the current engine is running
        self.turn: Turn | None = None  # the turn in flight
        self._last_turn_id = 0
        self._reuse_note: str | None = None
        self._change: str | None = None  # what changed since the engine's last turn (a cache miss's reason)
        self._refit = False  # a fresh engine fits the conversation from its first message again (until a prefill)
        self._closed = False
        #: how often the listeners want token events (ms; ``None``: the engine's default): the TUI's redraw interval
        self.events_every_ms: float | None = None
        #: TTFT predictions fitted on this chat's prefills, earlier chats' and saved bench results'
        self.ttft = ttft_predictor(model_info, settings.engine)
        #: the last count (:meth:`count`): when it was asked (engine, turns begun), its messages, its prediction
        self._counted: tuple[tuple[int, int], tuple[Message, ...], TtftPrediction | None] | None = None

    # -- state -------------------------------------------------------------------------------------
    def add_listener(self, listener: ChatListener) -> None:
        self.listeners.append(listener)

    @property
    def ready(self) -> bool:
        """Whether a turn can start now (an engine is loaded and idle)."""
        return self.loaded is not None and self.engine is not None and not self.busy

    @property
    def active_turn(self) -> int | None:
        """The ``turn_id`` of the turn in flight."""
        return self.turn.turn_id if self.turn is not None else None

    @property
    def conversation(self) -> list[Message]:
        """The chat's user and assistant messages, oldest first."""
        return self.history.messages

    @property
    def last_reply(self) -> str:
        """The newest answer ("" when there is none)."""
        return self.history.last_reply

    @property
    def last_thinking(self) -> str:
        """The newest reply's thinking ("" when there is none)."""
        return self.history.last_thinking

    def _tell(self, call: Callable[[ChatListener], None]) -> None:
        """Make ``call`` on each listener, in order: a direct call on the interface (``lambda to:
        to.turn_started(turn)``), so a type checker checks its name and arguments."""
        for listener in list(self.listeners):
            call(listener)

    def _notice(self, notice: Notice) -> None:
        self._tell(lambda to: to.notice(notice))

    # -- the engine's life -------------------------------------------------------------------------
    def start_engine(self) -> None:
        """Create an engine with the factory and load the model (its result arrives as ``engine_ready``
        or ``engine_stopped``)."""
        self.engine_id += 1
        self.loaded = None
        self._tell(lambda to: to.engine_loading(self.model_info))
        try:
            engine = self.engine_factory(self.model_info, self.settings)
        except Exception as exc:  # a factory failure is shown, never a traceback
            self._engine_down(f"cannot start the engine: {exc}")
            return
        self.engine, self.busy = engine, True
        self._start("load", engine, engine.load)

    def restart_engine(self) -> None:
        """Replace the engine with a fresh one (after a crash, or for new engine settings); the
        conversation is kept."""
        self._retire_engine()
        self._fresh_engine("restarted")
        self.start_engine()

    def switch_model(self, info: ModelInfo) -> None:
        """Close the current engine and start ``engine_factory(info)``; the conversation is kept (the
        next turn prefills it on the new model)."""
        self._retire_engine()
        self.model_info = info
        self.ttft = ttft_predictor(info, self.settings.engine)  # another model's prefill predicts nothing here
        self._fresh_engine("model_switch")
        self._notice(Notice("model", "Model", f"Switched model to {info.name}"))
        self.start_engine()

    def _fresh_engine(self, why: str) -> None:
        """The next engine starts with an empty cache: it fits the conversation afresh from its first message (it
        may fit more: another n_ctx), and only what it leaves out beyond ``history.left_out`` is an overflow (the
        transcript's marks stand until its first turn says otherwise); the next turn's miss is ``why``."""
        self._change = why
        self._refit = True

    def _fit_from(self) -> int:
        """The request's ``first_message``: where the engine's fit starts (0 on a fresh engine's first turn)."""
        return 0 if self._refit else self.history.left_out

    def _left_out(self, n_messages: int) -> None:
        """The model no longer sees the conversation's ``n_messages`` oldest messages; the views are told in turns."""
        self.history.left_out = n_messages
        n_turns = unseen_exchanges(self.history.messages, n_messages)
        self._tell(lambda to: to.history_left_out(n_turns))

    def close(self) -> None:
        """Cancel and close the engine now (blocking; at quit); a turn still running ends cancelled, by the user
        (what it measured so far is the session's, :class:`~chatphase.chat.recording.SessionRecording`).
        Idempotent."""
        if self.turn is not None:
            self.turn.ended_by_user = True
        self._closed = True
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.cancel()
            engine.close()

    def _retire_engine(self) -> None:
        if self.turn is not None:
            self.turn.ended_by_user = True  # the user's choice: the turn is cancelled, not failed
        self._drop_turn("cancelled (engine replaced)", "the engine was replaced before the reply began")
        self._let_go()

    def _engine_down(self, message: str) -> None:
        self._let_go()
        self._tell(lambda to: to.engine_stopped(message))

    def _let_go(self) -> None:
        """Drop the current engine: cancelled and closed in the background, its late events ignored."""
        engine, self.engine = self.engine, None
        self.engine_id += 1  # whatever its jobs (the turn, the watch) still send is late now
        self.loaded, self.busy = None, False
        if engine is not None:
            engine.cancel()
            self.dispatcher.spawn(engine.close)

    def _start(
        self, kind: JobKind, engine: Engine, call: Callable[[], Iterator[Event]], turn_id: int | None = None
    ) -> None:
        job = EngineJob(kind, engine, self.engine_id, call, self._deliver, self._job_ended, self._current, turn_id)
        self.dispatcher.start(job)

    def _current(self, job: EngineJob) -> bool:
        """Whether ``job`` belongs to the current engine (a dispatcher that defers a start asks)."""
        return job.engine_id == self.engine_id and not self._closed

    # -- turns -------------------------------------------------------------------------------------
    def _check_ready(self, what: str) -> None:
        if self.ready:
            return
        if self.turn is not None:
            raise NotNow(f"Not {what}: wait for the reply or stop it", "chat.stop")
        if self.engine is None:
            raise NotNow(f"Not {what}: the engine is stopped; restart it", "engine.restart")
        raise NotNow(f"Not {what}: the model is still loading.")

    def send(self, text: str) -> Turn:
        """Add ``text`` as a user message and start a turn.

        Raises:
            NotNow: no engine is ready (loading, stopped, or a turn is running); the text is not kept.
        """
        self._check_ready("sent")
        kind: TurnKind = "resend" if self._reuse_note == RESEND_NOTE else "send"
        self.history.add("user", text)
        return self._begin(kind)

    def regenerate(self) -> Turn:
        """Drop the last reply and generate it again (the same prompt, so the KV cache is reused).

        Raises:
            NotNow: not ready, or there is no reply to regenerate.
        """
        self._check_ready("regenerated")
        removed = self.history.take_back_reply()
        if removed is None:
            raise NotNow("There is no reply to regenerate.")
        rewound = (removed,)
        self._tell(lambda to: to.history_rewound(rewound))
        self._reuse_note, self._change = REGENERATE_NOTE, "regenerated"
        return self._begin("regenerate")

    def take_back_last(self) -> str:
        """Take the last user message (and its reply) out of the conversation for editing; returns its
        text. The next :meth:`send` is an edit-and-resend (it reports the KV cache it reuses).

        Raises:
            NotNow: not ready, or there is no message to edit.
        """
        self._check_ready("edited")
        removed = self.history.take_back_exchange()
        if not removed:
            raise NotNow("There is no message to edit.")
        self._tell(lambda to: to.history_rewound(removed))
        self._reuse_note, self._change = RESEND_NOTE, "edited"
        return removed[0].content

    def stop(self) -> bool:
        """Cancel the running turn (it ends with its partial reply, ``stop_reason="cancelled"``); returns
        whether one was running."""
        if self.turn is None or self.engine is None:
            return False
        self.engine.cancel()
        return True

    def new_chat(self) -> None:
        """Forget the conversation and its turns.

        Raises:
            NotNow: a turn is running (stopping it first keeps its partial reply in the session).
        """
        if self.turn is not None:
            raise NotNow("Not starting a new chat: wait for the reply or stop it", "chat.stop")
        self.history.clear()
        self._reuse_note = self._change = None
        self.ttft.clear()
        if self.loaded is not None and not self.loaded.settings.remote:  # the chats just ended count now too
            prior_after_load(self.ttft, self.loaded.info, self.loaded.settings)
        self._tell(lambda to: to.chat_cleared())

    def restore(self, session: Session) -> None:
        """Continue ``session``'s conversation (its turns taken back stay out). The KV cache does not hold
        it, so the next turn is a cold prefill, and its notice says so.

        Raises:
            NotNow: a turn is running.
        """
        if self.turn is not None:
            raise NotNow("Wait for the reply (Esc stops it), then open the session.")
        self.history.restore(session.history(), max((t.index for t in session.turns), default=0))
        self._reuse_note, self._change = COLD_PREFILL_NOTE, "resumed"
        self._tell(lambda to: to.history_restored(session))
        if dropped := dropped_before(session):
            # the session's overflow stands: the next turn is not an overflow of its own; at a larger n_ctx its
            # fit starts from the first message again, and may bring some back (as a fresh engine's)
            self._left_out(dropped)
            self._refit = n_ctx_grew(session, self.settings.engine.n_ctx_before_load)

    # -- the budget of a draft -----------------------------------------------------------------------
    def draft_request(self, text: str, texts: tuple[str, ...] = ()) -> CountRequest | None:
        """What counting ``text`` as the next user message asks of the engine (on the controller's thread:
        it reads the conversation); ``texts`` are counted alone too (attached files). ``None`` when the
        engine cannot count (none loaded, a remote server)."""
        if self.loaded is None or not isinstance(self.engine, PromptCounter):
            return None
        messages = (*self.history.request_messages(self.settings.system_prompt), Message("user", text))
        thinking = {"on": True, "off": False}.get(self.settings.thinking)
        return CountRequest(
            messages, self.settings.sampling.max_tokens, thinking, texts, self._fit_from(), self.settings.overflow,
            left_out_before=self.history.left_out,
        )  # fmt: skip

    def count(self, request: CountRequest) -> PromptCount | None:
        """The engine's answer to ``request`` (blocking: call it off the UI thread); ``None`` when it cannot
        count now (a turn is running, the engine was replaced or is gone). The turn that sends these messages
        next, on this engine and cache, carries the prediction made for this count
        (:func:`~chatphase.chat.budget.prediction_of`, the budget line's), not one of its own."""
        engine = self.engine
        if self.busy or not isinstance(engine, PromptCounter):
            return None
        stamp = (self.engine_id, self._last_turn_id)
        count = engine.count_prompt(request)
        if count is not None and not self.history.messages:
            # a new chat: the KV cache still holds the last one, which this prompt drops but for a shared
            # prefix; the context it uses now is that prefix (the panel says 0), not all the cache holds
            count = replace(
                count, kv_cache_tokens=min(count.kv_cache_tokens, count.cached_tokens + count.restore_tokens)
            )
        if count is not None:  # predicted now, once: budget_of() finds the same object
            self._counted = (stamp, tuple(request.messages), prediction_of(count, self.ttft))
        return count

    def _begin(self, kind: TurnKind) -> Turn:
        assert self.engine is not None
        stamp = (self.engine_id, self._last_turn_id)
        self._last_turn_id += 1
        messages = self.history.request_messages(self.settings.system_prompt)
        thinking = {"on": True, "off": False}.get(self.settings.thinking)
        request = TurnRequest(
            self._last_turn_id,
            messages,
            self.settings.sampling,
            enable_thinking=thinking,
            events_every_ms=self.events_every_ms,
            overflow=self.settings.overflow,
            first_message=self._fit_from(),
            history_change=self._change,
            prefix_store=True,
            left_out_before=self.history.left_out,
        )
        users = self.history.user_messages()
        turn = Turn(self._last_turn_id, self.history.next_number(), kind, users[-1], len(users) - 1, request)
        counted, self._counted = self._counted, None
        if counted is not None and counted[0] == stamp and counted[1] == tuple(messages):
            turn.ttft_prediction = counted[2]  # the budget line's own
        self.turn, self.busy = turn, True
        self._tell(lambda to: to.turn_started(turn))
        engine = self.engine
        self._start("turn", engine, lambda: engine.run_turn(request), turn.turn_id)
        return turn

    # -- events (on the controller's thread, from the dispatcher) ---------------------------------
    def _deliver(self, job: EngineJob, event: Event) -> None:
        if not self._current(job):
            return  # a replaced engine's late event
        if isinstance(event, ModelLoaded):
            self.loaded = event.model
            if not event.model.settings.remote:  # the prior of the settings the load resolved
                prior_after_load(self.ttft, event.model.info, event.model.settings)
            self._tell(lambda to: to.engine_ready(event.model))
            if (note := thinking_ignored(self.settings, event.model)) is not None:
                self._notice(note)
            if (why := shift_refusal(self.settings.overflow, event.model)) is not None:
                self._notice(Notice("model", "Overflow: shift", why, "warning"))
            self._start("watch", job.engine, job.engine.watch)
            return
        if isinstance(event, EngineFailed):
            self._failed(event)
            return
        turn = self.turn
        if turn is None or getattr(event, "turn_id", None) != turn.turn_id:
            return  # the rest of a turn that was abandoned or dropped
        if isinstance(event, TokensDecoded):
            turn.decoded(event)
            self._tell(lambda to: to.tokens_decoded(turn, event))
        elif isinstance(event, PrefillProgress):
            turn.progress = event
            self._tell(lambda to: to.prefill_progress(turn, event))
        elif isinstance(event, FirstToken):
            turn.first_token(event)
            self._tell(lambda to: to.first_token(turn, event))
        elif isinstance(event, PrefillStarted):
            self._prefill_started(turn, event)
        elif isinstance(event, ThinkingEnded):
            turn.thinking_ended = event
            self._tell(lambda to: to.thinking_ended(turn, event))
        elif isinstance(event, TurnFinished):
            self._finished(turn, event)

    def _prefill_started(self, turn: Turn, ev: PrefillStarted) -> None:
        turn.prefill = ev
        if turn.ttft_prediction is None and ev.prefill_tokens is not None and ev.cached_tokens is not None:
            # not counted before it was sent: predicted now, once (a restore's measured time stands for its estimate)
            from_disk = ev.restored_tokens or 0
            turn.ttft_prediction = self.ttft.predict(ev.prefill_tokens, ev.cached_tokens, from_disk, ev.restore_ms)
        self._tell(lambda to: to.prefill_started(turn, ev))
        before = self.history.left_out
        if ev.dropped_messages != before:
            self._left_out(ev.dropped_messages)
        if ev.overflow is not None:
            self._notice(Notice.overflow(ev))
        elif ev.dropped_messages > before:  # an engine without overflow figures
            self._notice(Notice.dropped(ev.dropped_messages))
        elif ev.dropped_messages < before and self._refit:  # a fresh engine with a larger n_ctx
            self._notice(Notice.back_in_context(before - ev.dropped_messages))
        self._change, self._refit = None, False  # the engine has taken them (a turn refused before keeps them)
        if self._reuse_note and ev.prompt_tokens is not None:
            restored = ev.restored_tokens and self._reuse_note == COLD_PREFILL_NOTE
            self._notice(Notice.reuse(RESTORED_NOTE if restored else self._reuse_note, ev))
        elif ev.cache_miss_reason and ev.overflow is None and ev.prompt_tokens is not None:
            self._notice(Notice.miss(ev))
        if ev.restore_note:
            self._notice(Notice("prefix", "Prefix store", ev.restore_note))
        self._reuse_note = None

    def _finished(self, turn: Turn, ev: TurnFinished) -> None:
        self.turn = None
        m = ev.metrics
        if turn.ttft_prediction is not None:
            ev = replace(ev, metrics=with_prediction(m, turn.ttft_prediction))
        if m.stop_reason != "error" and m.ttft_ms is not None:  # the prefill completed (a turn stopped after it too)
            estimate = turn.ttft_prediction.estimate_ms if turn.ttft_prediction is not None else None
            self.ttft.add(
                m.prefill_tokens, m.cached_tokens, m.prefill_ms, m.ttft_ms, m.restored_tokens, m.restore_ms, estimate
            )
        if ev.metrics.dropped_messages > self.history.left_out:  # the reply went on past n_ctx (shift or drop-oldest)
            self._left_out(ev.metrics.dropped_messages)
            self._notice(Notice("dropped", "Context full", overflow_text(ev.metrics), "warning"))
        self.history.add("assistant", ev.reply, ev.thinking)
        if ev.thinking and self._reuse_note is None:
            self._reuse_note = AFTER_THINKING_NOTE  # the cache holds the thinking; the next prompt may not
        self._tell(lambda to: to.turn_finished(turn, ev))
        if ev.metrics.stop_reason == "context_full":
            self._notice(Notice.context_full())
        if ev.metrics.spec_note:  # drafting did not pay this turn
            self._notice(Notice("spec", "Speculative decoding", ev.metrics.spec_note, "warning"))

    def _failed(self, ev: EngineFailed) -> None:
        turn = self.turn
        if not ev.fatal:
            if turn is not None and ev.turn_id == turn.turn_id:
                turn.error = ev.message  # a TurnFinished may follow (a partial reply); else the job's end decides
                title = "Not sent" if turn.prefill is None else "Turn error"
                self._notice(Notice("turn_error", title, ev.message, "error"))
            return
        self._drop_turn("engine stopped: partial reply kept", ev.message)
        self._engine_down(ev.message)

    def _job_ended(self, job: EngineJob) -> None:
        if not self._current(job) or job.kind == "watch":
            return
        self.busy = False
        turn = self.turn
        if job.kind == "turn" and turn is not None and turn.turn_id == job.turn_id:  # ended without TurnFinished
            why = f"ended early: {turn.error}" if turn.error else "ended early: partial reply kept"
            self._drop_turn(why, turn.error or "the engine ended the turn without a result")

    def _drop_turn(self, why: str, message: str) -> None:
        """End the turn in flight without its result: kept as a partial reply if text streamed, else failed."""
        if self.turn is not None:
            if self.turn.reply or self.turn.thinking:  # what streamed is kept, thinking included
                self._abandon_turn(why)
            else:
                self._fail_turn(message)

    def _fail_turn(self, message: str) -> None:
        """The turn produced no reply: its user message leaves the conversation (to be given back)."""
        turn, self.turn = self.turn, None
        if turn is None:
            return
        self.history.drop_unanswered(give_back_number=turn.prefill is None)  # begun: recorded (failed) under it
        self._tell(lambda to: to.turn_failed(turn, message))

    def _abandon_turn(self, why: str) -> None:
        """Stop following the turn in flight; what streamed so far is kept as its reply."""
        turn, self.turn = self.turn, None
        if turn is None:
            return
        self.history.add("assistant", turn.reply, turn.thinking)
        self._tell(lambda to: to.turn_abandoned(turn, why))
