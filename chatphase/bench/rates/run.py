"""The rate sweep as one run (``chatphase bench --server URL --rates R,R``): per rate, open-loop arrivals for at most
``requests`` requests or ``duration_s`` seconds, then :func:`~chatphase.bench.rates.accounting.summarise`.

Each request in flight holds one of ``max_concurrency`` loaded engines (own connection); a request that arrives while
all are busy is counted ``over_capacity`` and not sent. A token-id prompt of the rate's next length (distinct prompts,
so the server's prompt cache does not answer them), ``max_tokens`` = ``gen_tokens``, the end-of-sequence token ignored.
When a rate's time is up (twice ``duration_s`` from its start, the sends included) the requests still running are hung
up and counted ``cut``; :meth:`RateRun.cancel` (Ctrl+C) does the same at once and keeps every rate measured so far.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from chatphase.bench.core.contract import check_repetitions
from chatphase.bench.core.events import BenchNotice, BenchStatus, RunDone, load_engine
from chatphase.bench.core.experiment import count_list, gen_field, number, plan_field, whole_number
from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder
from chatphase.bench.core.run import ModelRun, model_record, settings_record
from chatphase.bench.rates.accounting import RateSummary, RequestRecord, Slo, arrival_times_s, summarise
from chatphase.bench.rates.result import RateResult
from chatphase.engine.events import (
    EngineFailed,
    FirstToken,
    LoadedModel,
    SamplingParams,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.errors import UsageError
from chatphase.units import DASH

#: the most rates, requests per rate and engines (connections) one run takes.
MAX_RATES, MAX_REQUESTS, MAX_CONCURRENCY = 16, 1000, 256


def rate_list(text: str) -> tuple[float, ...]:
    """``0.5,1,2,4`` -> rates.

    Raises:
        ValueError: anything but comma-separated numbers (its message says so).
    """
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated requests/s like 0.5,1,2,4 (got {text!r})") from None


def parse_slo(text: str) -> Slo:
    """``ttft=500,tpot=50`` (ms) -> :class:`Slo`.

    Raises:
        ValueError: an unknown key or a value that is not a positive number (its message says so).
    """
    values: dict[str, float] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key = key.strip().lower()
        try:
            figure = float(value)
        except ValueError:
            figure = -1.0
        if key not in ("ttft", "tpot") or figure <= 0:
            raise ValueError(f"expected ttft=MS,tpot=MS with positive milliseconds (got {text!r})")
        values[key] = figure
    return Slo(ttft_ms=values.get("ttft"), tpot_ms=values.get("tpot"))


@dataclass(frozen=True)
class RatePlan:
    """``rates`` (requests/s), for each at most ``requests`` requests or ``duration_s`` seconds of sends; prompts of
    ``prompt_lengths`` tokens in turn, ``gen_tokens`` tokens each; ``burstiness`` the Gamma shape of the gaps (1:
    Poisson); ``slo`` for goodput; ``max_concurrency`` requests in flight at most (``None``: twice the server's
    slots, else 8)."""

    rates: tuple[float, ...] = plan_field(
        flag="--rates", metavar="R,R,...", parse=rate_list,
        help="instead, over --server: open-loop arrivals at each rate (requests/s), e.g. 0.5,1,2,4",
    )  # fmt: skip
    prompt_lengths: tuple[int, ...] = plan_field(
        (128,), flag="--prompt-lengths", metavar="N,N,...", parse=count_list, help="prompt lengths in tokens"
    )
    gen_tokens: int = gen_field()
    requests: int = plan_field(16, flag="--requests", metavar="N", parse=whole_number, help="requests per rate")
    duration_s: float = plan_field(
        60.0, flag="--duration", metavar="S", parse=number, help="seconds of arrivals per rate at most"
    )
    burstiness: float = plan_field(
        1.0, flag="--burstiness", metavar="B", parse=number,
        help="Gamma shape of the gaps between requests (1 = Poisson)",
    )  # fmt: skip
    slo: Slo = plan_field(  # noqa: RUF009  # a frozen Slo: immutable
        Slo(), flag="--slo", metavar="ttft=MS,tpot=MS", parse=parse_slo,
        help="the SLO goodput counts",
    )  # fmt: skip
    max_concurrency: int | None = plan_field(
        None, flag="--max-concurrency", metavar="N", parse=whole_number,
        help="requests in flight at most (none: twice the server's slots)",
    )  # fmt: skip
    seed: int = 0
    reps: int = 1
    warmup: int = 0

    @property
    def total_runs(self) -> int:
        return len(self.rates) * self.requests

    def validate(self, n_ctx: int | None, n_batch: int | None = None) -> RatePlan:
        """Raises UsageError (one line naming the flag) for a plan out of range; returns ``self``."""
        check_repetitions(1, 0, self.gen_tokens)
        if not self.rates or len(self.rates) > MAX_RATES or any(not 0 < r <= 1000 for r in self.rates):
            raise UsageError(f"--rates: 1 to {MAX_RATES} rates, each above 0 and at most 1000 requests/s")
        if not 1 <= self.requests <= MAX_REQUESTS:
            raise UsageError(f"--requests must be 1 to {MAX_REQUESTS} per rate (got {self.requests})")
        if not 0 < self.duration_s <= 3600:
            raise UsageError(f"--duration must be above 0 and at most 3600 s (got {self.duration_s:g})")
        if not 0 < self.burstiness <= 100:
            raise UsageError(f"--burstiness must be above 0 and at most 100 (got {self.burstiness:g})")
        if not self.prompt_lengths or min(self.prompt_lengths) < 1:
            raise UsageError("--prompt-lengths: each request's prompt is 1 token or more")
        if self.max_concurrency is not None and not 1 <= self.max_concurrency <= MAX_CONCURRENCY:
            raise UsageError(f"--max-concurrency must be 1 to {MAX_CONCURRENCY} (got {self.max_concurrency})")
        return self

    def to_dict(self) -> dict:
        return {
            "rates": list(self.rates),
            "prompt_lengths": list(self.prompt_lengths),
            "gen_tokens": self.gen_tokens,
            "requests": self.requests,
            "duration_s": self.duration_s,
            "burstiness": self.burstiness,
            "slo": {"ttft_ms": self.slo.ttft_ms, "tpot_ms": self.slo.tpot_ms},
            "max_concurrency": self.max_concurrency,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class RateProgress:
    """A rate ended: the ``done_runs``-th request of ``total_runs`` counted so far; ``summary`` its figures."""

    done_runs: int
    total_runs: int
    summary: RateSummary

    #: every run counts (no warm-ups)
    counted = True

    def line(self) -> tuple[str, str]:
        s = self.summary
        ttft = DASH if s.ttft_ms[0] is None else f"{s.ttft_ms[0]:.0f}/{s.ttft_ms[2]:.0f} ms"
        return (
            f"rate {s.rate:g}/s",
            f"{s.completed}/{s.sent} done, TTFT p50/p99 {ttft}, {s.over_capacity} over capacity",
        )


def make_run(info, config, plan: RatePlan, roofline: bool, log_path: str | None, **options) -> RateRun:
    """The child's run of a rate sweep."""
    return RateRun(info, config, plan, roofline=False, log_path=log_path, **options)


class RateRun(ModelRun):
    """The rate sweep on a server's engines (module docstring); iterate to run it, :meth:`cancel` from any thread.

    Raises (while iterating):
        UsageError: the engine is not a server's. EngineError: the server cannot be reached.
    """

    plan: RatePlan

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._summaries: list[RateSummary] = []
        self._records: list[list[RequestRecord]] = []
        self._loaded: LoadedModel | None = None
        self._stop = threading.Event()

    def cancel(self) -> None:
        self._stop.set()
        super().cancel()

    def partial_done(self) -> RunDone | None:
        """The rates measured so far as a cancelled result (``None`` before the server answered)."""
        return None if self._loaded is None else RunDone(self._result(cancelled=True))

    def _result(self, cancelled: bool) -> RateResult:
        loaded = self._loaded
        assert loaded is not None
        return RateResult(
            model=model_record(loaded.info),
            settings=settings_record(loaded, self.plan.to_dict(), ()),
            cancelled=cancelled,
            summaries=list(self._summaries),
            records=[list(r) for r in self._records],
        )

    def __iter__(self) -> Iterator[object]:
        plan = self.plan.validate(None)
        first = self.make_engine()
        if hasattr(first, "run_batch") or not hasattr(first, "run_turn"):
            first.close()
            raise UsageError("--rates measures a server: give --server URL")
        engines = [first]
        try:
            yield BenchStatus(f"connecting to {self.info.name}")
            self.attach(engine=first)
            self._loaded = loaded = load_engine(first)
            if not loaded.settings.remote:
                raise UsageError("--rates measures a server: give --server URL")
            slots = loaded.settings.total_slots
            cap = plan.max_concurrency or (2 * slots if slots else 8)
            yield BenchStatus(f"opening {cap} connections")
            while len(engines) < cap and not self._stop.is_set():
                engines.append(self.make_engine())
                load_engine(engines[-1])
            builder = self.builder or PromptBuilder(EngineTokenizer(first))
            done = 0
            for rate in plan.rates:
                if self._stop.is_set():
                    break
                yield BenchStatus(f"rate {rate:g} requests/s: up to {plan.requests} requests or {plan.duration_s:g} s")
                records = _Rate(self, engines, builder, rate, slots).run()
                self._records.append(records)
                summary = summarise(rate, records, plan.slo)
                self._summaries.append(summary)
                done += len(records)
                if summary.over_capacity:
                    yield BenchNotice(
                        f"rate {rate:g}/s: {summary.over_capacity} requests arrived while {cap} were in flight and "
                        "were not sent (raise --max-concurrency, or the server is past its capacity)"
                    )
                yield RateProgress(done, plan.total_runs, summary)
        finally:
            for e in engines:
                e.close()
        yield RunDone(self._result(cancelled=self._stop.is_set()))


class _Rate:
    """One rate's arrivals and requests."""

    def __init__(self, run: RateRun, engines, builder: PromptBuilder, rate: float, slots: int | None) -> None:
        self.run_, self.plan, self.rate, self.slots = run, run.plan, rate, slots
        self.free, self.engines = list(engines), list(engines)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.builder = builder
        self.ids = itertools.count(1)
        self.records: dict[int, RequestRecord] = {}
        self.hang_up = threading.Event()

    def run(self) -> list[RequestRecord]:
        plan, stop = self.plan, self.run_._stop
        times = arrival_times_s(self.rate, plan.requests, plan.burstiness, plan.seed)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(self.free), thread_name_prefix="chatphase-load") as pool:
            for i, at in enumerate(times):
                if at > plan.duration_s:
                    break
                while not stop.is_set() and time.perf_counter() - t0 < at:
                    time.sleep(min(0.005, max(0.0, at - (time.perf_counter() - t0))))
                if stop.is_set():
                    break
                length = plan.prompt_lengths[i % len(plan.prompt_lengths)]
                send_ms = (time.perf_counter() - t0) * 1e3
                with self.lock:
                    engine = self.free.pop() if self.free else None
                    queued = self.slots is not None and self.in_flight >= self.slots
                    self.in_flight += engine is not None
                if engine is None:
                    self.records[i] = RequestRecord(i, length, send_ms, (), None, "over_capacity")
                    continue
                prompt = self.builder.tokens(length, variant=i)
                pool.submit(self._request, engine, i, prompt, t0, send_ms, queued)
            deadline = t0 + 2 * plan.duration_s
            while not stop.is_set() and time.perf_counter() < deadline:
                with self.lock:
                    if self.in_flight == 0:
                        break
                time.sleep(0.01)
            self.hang_up.set()
            with self.lock:
                busy = [e for e in self.engines if e not in self.free]
            for engine in busy:
                engine.cancel()
        return [self.records[i] for i in sorted(self.records)]

    def _request(self, engine, i: int, prompt, t0: float, send_ms: float, queued: bool) -> None:
        request = TurnRequest(
            turn_id=next(self.ids),
            prompt_token_ids=tuple(prompt),
            reset_cache=True,
            ignore_eos=True,
            sampling=SamplingParams(max_tokens=self.plan.gen_tokens, temperature=0.0),
        )
        tokens: list[float] = []
        status, error = "cut", ""
        events = engine.run_turn(request)
        try:
            for event in events:
                if self.hang_up.is_set():
                    engine.cancel()
                    break
                if isinstance(event, FirstToken | TokensDecoded):
                    ms = (event.t_ns / 1e9 - t0) * 1e3
                    tokens.extend([ms] * (event.n_tokens if isinstance(event, TokensDecoded) else 1))
                elif isinstance(event, EngineFailed):
                    status, error = "failed", event.message
                elif isinstance(event, TurnFinished) and status != "failed":
                    status = "cut" if event.metrics.stop_reason == "cancelled" else "ok"
        except Exception as exc:  # a request's failure is its record, never the run's end
            status, error = "failed", str(exc) or type(exc).__name__
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
            end_ms = (time.perf_counter() - t0) * 1e3
            self.records[i] = RequestRecord(i, len(prompt), send_ms, tuple(tokens), end_ms, status, queued, error)
            with self.lock:
                self.free.append(engine)
                self.in_flight -= 1
