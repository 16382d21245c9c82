"""ThreadGovernor: applies the thread policy (:mod:`chatphase.engine.threads.policy`) to one llama.cpp context.

The engine calls :meth:`ThreadGovernor.start_turn` before a turn's prefill, :meth:`ThreadGovernor.on_token`
with each generated token's sampling time (speculative decoding: once per target step, with the step's width,
since the tokens of one verified batch come microseconds apart), and :meth:`ThreadGovernor.finish_turn` at the end, whose
fields go into the turn's :class:`~chatphase.engine.metrics.TurnMetrics`. Threads change through
``set_threads(n_threads, n_threads_batch)`` (``llama_set_n_threads``), called between sampling a token
and evaluating it, so a gap is always timed at one count.

Cost: one load sample (:class:`chatphase.system.cpu_load.OtherCpuLoad`, ~0.06 ms) before and after each
turn, and during decode only while it runs on fewer threads than cores, at most every ``up_check_s`` —
never per token. Per token, ``on_token`` does a subtraction and a few comparisons unless the gap is slow.
A step up that the gaps undo within :data:`UNDONE_S` doubles the wait before the next one (up to
``up_check_max_s``), so load that the sample cannot see (the chat UI's own, which is not "other") does
not make decode flip-flop. The first wait is short (0.25 s): under real other load the sample says so
and nothing is tried, while after a burst of the UI's (a long Markdown commit) decode gets its thread
back at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace

from chatphase.engine.config import EngineConfig
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.threads.policy import SLOW_FACTOR, WINDOW, ThreadChoice, choose_turn_threads, decode_step
from chatphase.system.cpu_features import usable_cores
from chatphase.system.cpu_load import OtherCpuLoad

#: changes spelled out in a turn's reason; more are counted.
REASON_CHANGES = 3
#: a step down within this many seconds of a step up means the step up did not hold.
UNDONE_S = 1.0
NS_PER_S = 1_000_000_000


class ThreadGovernor:
    """The thread policy's state for one context.

    Args:
        cores: physical cores.
        n_threads / n_threads_batch: pinned decode / prefill counts (``None`` = auto).
        set_threads: ``(n_threads, n_threads_batch) -> None``, e.g. ``llama_set_n_threads`` on the context.
        load: ``() -> cores or None``, other processes' load since the previous call (``OtherCpuLoad.sample``);
            ``None`` = never sampled (auto then starts on every core and adapts from the gaps alone).
        up_check_s / up_check_max_s: seconds of decode on fewer threads than cores before a load sample
            may bring one back, and the most that wait grows to after steps up that did not hold.
        tick: ``() -> None``, the load sampler's snapshot between turns (``OtherCpuLoad.tick``; see :meth:`idle`).
    """

    def __init__(
        self,
        cores: int,
        n_threads: int | None,
        n_threads_batch: int | None,
        set_threads: Callable[[int, int], None],
        load: Callable[[], float | None] | None = None,
        up_check_s: float = 0.25,
        up_check_max_s: float = 8.0,
        tick: Callable[[], None] | None = None,
    ) -> None:
        self.cores = max(1, cores)
        self.n_threads, self.n_threads_batch = n_threads, n_threads_batch
        self.adaptive = n_threads is None  # decode threads follow the gaps
        self._load = load if n_threads is None else None  # a pinned --threads pins prefill too
        self._set = set_threads
        self._tick = tick if self._load is not None else None
        self._up_base_ns = self._up_ns = int(up_check_s * NS_PER_S)
        self._up_max_ns = int(up_check_max_s * NS_PER_S)
        self.choice = choose_turn_threads(self.cores, None, n_threads, n_threads_batch)
        self.n_decode = self.choice.n_threads_decode
        self._reset_turn()

    @classmethod
    def for_config(cls, config: EngineConfig, set_threads: Callable[[int, int], None]) -> ThreadGovernor:
        """The governor of an :class:`~chatphase.engine.config.EngineConfig`'s context: the usable cores
        (:func:`~chatphase.system.cpu_features.usable_cores`), other load sampled with
        :class:`~chatphase.system.cpu_load.OtherCpuLoad` (this process and its parent, the UI or ``ask``,
        are chatphase's own)."""
        load = OtherCpuLoad()
        return cls(usable_cores(), config.n_threads, config.n_threads_batch, set_threads, load.sample, tick=load.tick)

    def idle(self) -> None:
        """Between turns, about once a second (the engine's child process calls it while it waits): a load
        snapshot, so that the next turn's choice reflects the last second rather than all the idle time."""
        if self._tick is not None:
            self._tick()

    def _reset_turn(self) -> None:
        self._gaps: deque[float] = deque(maxlen=WINDOW)  # each gap as a multiple of the fastest at its width
        self._fastest: dict[int, float] = {}  # the fastest gap (ns) at the current count, per step width
        self._last_t: int | None = None
        self._tokens = 0
        self._changes: list[str] = []
        self._check_at = 0  # when a load sample may next bring a thread back (ns)
        self._up_at: int | None = None  # when the last step up happened (ns)

    def start_turn(self) -> ThreadChoice:
        """Choose the turn's threads from the load now and apply them; returns the choice."""
        self._reset_turn()
        other = self._load() if self._load is not None else None
        self.choice = choose_turn_threads(self.cores, other, self.n_threads, self.n_threads_batch)
        self.n_decode = self.choice.n_threads_decode
        self._set(self.n_decode, self.choice.n_threads_prefill)
        return self.choice

    def on_token(self, t_ns: int, width: int = 1) -> None:
        """A generated token was sampled at ``t_ns`` (``time.perf_counter_ns()``); may change decode threads.

        ``width``: the positions the step before it evaluated (1 in plain decode; speculative decoding calls
        once per step with the drafted tokens + 1). A gap is judged against the fastest gap of the same width,
        so that a verify step, which costs more than a plain one, does not read as preemption."""
        if not self.adaptive:
            return
        self._tokens += 1
        last, self._last_t = self._last_t, t_ns
        if last is None:
            self._check_at = t_ns + self._up_ns
            return
        gap = t_ns - last
        fastest = self._fastest.get(width)
        if fastest is None or gap < fastest:
            fastest = self._fastest[width] = max(gap, 1)
        ratio = gap / fastest
        self._gaps.append(ratio)
        if ratio > SLOW_FACTOR:  # the window's mean turns slow on a slow gap (near enough)
            step = decode_step(self.n_decode, self.cores, self._scaled(fastest), fastest)
        elif self.n_decode < self.cores and t_ns >= self._check_at and self._load is not None:
            self._check_at = t_ns + self._up_ns
            step = decode_step(self.n_decode, self.cores, self._scaled(fastest), fastest, self._load())
        else:
            return
        if step is not None:
            self._change(t_ns, *step)

    def _scaled(self, fastest_ns: float) -> list[float]:
        """The window's gaps in ns at the current step's width (each gap's multiple × ``fastest_ns``)."""
        return [r * fastest_ns for r in self._gaps]

    def _change(self, t_ns: int, n: int, why: str) -> None:
        if n > self.n_decode:
            self._up_at = t_ns
        else:
            soon = self._up_at is not None and t_ns - self._up_at < max(UNDONE_S * NS_PER_S, 2 * self._up_base_ns)
            self._up_ns = min(2 * self._up_ns, self._up_max_ns) if soon else self._up_base_ns
            self._up_at = None
        self._changes.append(f"{self.n_decode} → {n} at token {self._tokens}: {why}")
        old, self.n_decode = self.n_decode, n
        self._set(n, self.choice.n_threads_prefill)
        self._gaps.clear()  # the next gap is timed at the new count (the change precedes the next decode)
        # until a gap at the new count is seen: fewer threads at worst slow each token in proportion, more
        # threads should not make it slower at all (so preemption right after a step up still shows)
        self._fastest = {w: f * max(1, old / n) for w, f in self._fastest.items()}
        self._check_at = t_ns + self._up_ns

    def finish_turn(self, metrics: TurnMetrics) -> TurnMetrics:
        """``metrics`` with the turn's thread fields filled (``n_threads_prefill``, ``n_threads_decode``,
        ``decode_thread_changes``, ``threads_reason``); also samples the load, so that the next turn's
        sample covers the time between turns."""
        if self._load is not None:
            self._load()
        changes = self._changes
        shown = changes if len(changes) <= REASON_CHANGES else [changes[0], f"… {len(changes) - 2} more", changes[-1]]
        return replace(
            metrics,
            n_threads_prefill=self.choice.n_threads_prefill,
            n_threads_decode=self.n_decode,
            decode_thread_changes=len(changes),
            threads_reason="; ".join([self.choice.reason, *shown]),
        )
