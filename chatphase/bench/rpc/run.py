"""The RPC link sweep (``chatphase bench --rpc-rtt 0,1,5``): prefill and decode over llama.cpp's RPC backend
against the number of RPC devices and the link's latency and bandwidth.

For each count in ``rpc_devices`` the run starts that many ``rpc-server`` processes on this machine
(:class:`~chatphase.bench.rpc.servers.LocalRpcServers`), puts an emulated link
(:class:`~chatphase.bench.rpc.link.LinkProxy`) in front of each, and loads the model with ``--rpc`` naming the
proxies, so llama.cpp splits its layers across the RPC devices and the local one. 0 devices is the plain local
load. With the model loaded once per count, each link shape in turn (:attr:`RpcPlan.links`: the baseline with
nothing added first, then each RTT of ``rpc_rtt_ms`` at ``rpc_mbit``) runs ``warmup`` uncounted and ``reps``
counted turns, each a cold prefill of ``prompt_tokens`` (the KV cache cleared, a fresh prompt per turn) and
``gen_tokens`` greedy tokens.

Each turn's link counters are read at its first token and at its end, so prefill and decode each get the
round trips and bytes they carried; the prediction (:mod:`chatphase.bench.rpc.network`) adds those at the
row's RTT and rate to the same device count's baseline. All servers run on this machine's CPU, so the split
measures the network's share, not more compute.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace

from chatphase.bench.core.contract import check_repetitions, validate_plan
from chatphase.bench.core.events import BenchStatus, RunDone, load_engine, placement_facts, system_facts
from chatphase.bench.core.experiment import (
    count_list,
    gen_field,
    number,
    plan_field,
    reps_field,
    warmup_field,
    whole_number,
)
from chatphase.bench.core.prompts import PromptBuilder, vocab_builder
from chatphase.bench.core.run import ModelRun, model_record, settings_record
from chatphase.bench.rpc.link import LinkCounters, LinkProxy, LinkShape
from chatphase.bench.rpc.network import predicted_ms
from chatphase.bench.rpc.result import RpcResult, RpcRow, RpcSample
from chatphase.bench.rpc.servers import LocalRpcServers
from chatphase.engine.base import Engine
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, FirstToken, SamplingParams, TurnFinished, TurnRequest
from chatphase.errors import EngineError, UsageError
from chatphase.models.gguf_meta import ModelInfo

#: the most RPC devices one run starts (llama.cpp's GGML_RPC_MAX_SERVERS is 16; this machine's cores bound it).
MAX_DEVICES = 4


def rtt_list(text: str) -> tuple[float, ...]:
    """``"0,1,5"`` -> RTTs in ms.

    Raises:
        ValueError: anything but comma-separated numbers from 0 to 1000.
    """
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated milliseconds like 0,1,5 (got {text!r})") from None
    if not values or any(not 0 <= v <= 1000 for v in values):
        raise ValueError(f"each RTT is 0 to 1000 ms (got {text!r})")
    return values


@dataclass(frozen=True)
class RpcPlan:
    """``rpc_rtt_ms`` added round-trip times (the baseline, nothing added, is measured first whether listed or not), ``rpc_devices`` RPC
    device counts (0: local only), ``rpc_mbit`` each link's rate (``None``: loopback's), ``server_threads`` CPU
    threads of each rpc-server; per cell ``warmup`` + ``reps`` turns of ``prompt_tokens`` prompt tokens and
    ``gen_tokens`` generated."""

    FORM = ("rpc_rtt_ms", "rpc_devices", "prompt_tokens", "gen_tokens", "reps")

    rpc_rtt_ms: tuple[float, ...] = plan_field(
        flag="--rpc-rtt", metavar="MS,MS,...", parse=rtt_list, label="RTT ms", form=(0.0, 1.0, 5.0),
        help="instead: the RPC link sweep, the model split over local rpc-servers behind emulated links with these "
        "added round-trip times (ms), prefill and decode against the link with the network term's prediction",
    )  # fmt: skip
    rpc_devices: tuple[int, ...] = plan_field(
        (0, 1, 2), flag="--rpc-devices", metavar="N,N,...", parse=count_list, label="RPC devices",
        help="with --rpc-rtt: RPC device counts (0: the local load alone)",
    )  # fmt: skip
    rpc_mbit: float | None = plan_field(
        None, flag="--rpc-mbit", metavar="MBIT/S", parse=number,
        help="with --rpc-rtt: each emulated link's rate in Mbit/s each way (default: loopback's)",
    )  # fmt: skip
    server_threads: int = plan_field(
        1, flag="--rpc-server-threads", metavar="N", parse=whole_number,
        help="with --rpc-rtt: CPU threads of each rpc-server",
    )  # fmt: skip
    prompt_tokens: int = plan_field(
        256, flag="--prompt-lengths", metavar="N", parse=count_list, single=True, label="Prompt tokens",
        help="prompt lengths in tokens",
    )  # fmt: skip
    gen_tokens: int = gen_field(32)
    reps: int = reps_field(3)
    warmup: int = warmup_field(1)

    @property
    def links(self) -> tuple[LinkShape, ...]:
        """The links each RPC device count runs: the baseline first (nothing added: RTT 0, loopback's rate),
        then each RTT at ``rpc_mbit``."""
        return tuple(dict.fromkeys((LinkShape(), *(LinkShape(rtt, self.rpc_mbit) for rtt in self.rpc_rtt_ms))))

    @property
    def total_runs(self) -> int:
        cells = sum(len(self.links) if n else 1 for n in self.rpc_devices)
        return cells * (self.reps + self.warmup)

    def validate(self, n_ctx: int | None, n_batch: int | None = None) -> RpcPlan:
        """Raises UsageError (one line naming the flag); returns ``self``."""
        check_repetitions(self.reps, self.warmup, self.gen_tokens)
        if self.gen_tokens < 2:
            raise UsageError("--gen must be at least 2 with --rpc-rtt: a decode step follows the first token")
        if not self.rpc_devices or any(not 0 <= n <= MAX_DEVICES for n in self.rpc_devices):
            raise UsageError(f"--rpc-devices: counts from 0 to {MAX_DEVICES}")
        if self.rpc_mbit is not None and not 0 < self.rpc_mbit <= 1_000_000:
            raise UsageError(f"--rpc-mbit must be above 0 and at most 1,000,000 (got {self.rpc_mbit:g})")
        if not 1 <= self.server_threads <= 256:
            raise UsageError(f"--rpc-server-threads must be 1 to 256 (got {self.server_threads})")
        if self.prompt_tokens < 1:
            raise UsageError("--prompt-lengths: a prompt is 1 token or more")
        if n_ctx is not None and self.prompt_tokens + self.gen_tokens > n_ctx:
            raise UsageError(
                f"prompt length {self.prompt_tokens} + {self.gen_tokens} generated tokens exceed n_ctx {n_ctx}"
            )
        return self

    def to_dict(self) -> dict:
        return {
            "rpc_rtt_ms": list(self.rpc_rtt_ms),
            "rpc_devices": list(self.rpc_devices),
            "rpc_mbit": self.rpc_mbit,
            "server_threads": self.server_threads,
            "prompt_tokens": self.prompt_tokens,
            "gen_tokens": self.gen_tokens,
            "reps": self.reps,
            "warmup": self.warmup,
        }


@dataclass(frozen=True)
class RpcProgress:
    """One turn ended (:class:`~chatphase.bench.core.contract.Progress`)."""

    sample: RpcSample
    done_runs: int
    total_runs: int

    @property
    def counted(self) -> bool:
        return not self.sample.warmup

    def line(self) -> tuple[str, str]:
        s = self.sample
        rep = "warm-up" if s.warmup else f"rep {s.rep + 1}"
        step = "–" if s.decode_step_ms is None else f"{s.decode_step_ms:.1f} ms"
        return f"{s.devices} RPC, RTT {s.rtt_ms:g} ms {rep}", f"TTFT {s.ttft_ms or 0:.0f} ms, decode step {step}"


class RpcRun(ModelRun):
    """The sweep (module docstring); iterate to run it (blocking), :meth:`cancel` from any thread.

    Raises (while iterating):
        UsageError: a plan out of range, no rpc-server binary, a server that does not start.
        EngineError: the model fails to load (a build without the RPC backend says so) or a turn fails.
    """

    plan: RpcPlan

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._samples: list[RpcSample] = []
        self._facts: dict = {}

    def __iter__(self) -> Iterator[object]:
        plan = validate_plan(self.plan, self.config.n_ctx_before_load)
        with ExitStack() as outer:
            builder = self.builder or outer.enter_context(vocab_builder(self.info.path))
            yield from self._devices(plan, builder)
        yield RunDone(self.result(cancelled=self._cancel.is_set()))

    def _devices(self, plan: RpcPlan, builder: PromptBuilder) -> Iterator[object]:
        done, total = 0, plan.total_runs
        for devices in plan.rpc_devices:
            if self._cancel.is_set():
                break
            yield BenchStatus(f"{devices} RPC devices: starting, loading {self.info.name}")
            with ExitStack() as stack:
                proxies: list[LinkProxy] = []
                if devices:
                    servers = stack.enter_context(LocalRpcServers(devices, plan.server_threads))
                    proxies = [stack.enter_context(LinkProxy(endpoint)) for endpoint in servers.endpoints]
                config = replace(self.config, rpc=",".join(p.endpoint for p in proxies) or None)
                engine = self.make_engine(config)
                stack.callback(engine.close)
                self.attach(engine=engine)
                loaded = load_engine(engine)
                self._facts.setdefault("system", system_facts(loaded))
                self._facts.setdefault("settings", settings_record(loaded, plan.to_dict(), []))
                self._facts.setdefault("placements", {})[str(devices)] = placement_facts(loaded)
                for shape in plan.links if devices else (LinkShape(),):
                    for proxy in proxies:
                        proxy.shape = shape
                    for i in range(plan.warmup + plan.reps):
                        if self._cancel.is_set():
                            break
                        tokens = builder.tokens(plan.prompt_tokens, variant=len(self._samples) + 1)
                        sample = self._turn(engine, tokens, proxies, devices, shape, i, plan)
                        self._samples.append(sample)
                        done += 1
                        yield RpcProgress(sample, done, total)

    def _turn(
        self,
        engine: Engine,
        tokens: tuple[int, ...],
        proxies: list[LinkProxy],
        devices: int,
        shape: LinkShape,
        i: int,
        plan: RpcPlan,
    ) -> RpcSample:
        def carried() -> LinkCounters:
            return sum((p.counters() for p in proxies), LinkCounters())

        request = TurnRequest(
            turn_id=len(self._samples) + 1,
            prompt_token_ids=tokens,
            reset_cache=True,
            ignore_eos=True,
            sampling=SamplingParams(max_tokens=plan.gen_tokens, temperature=0.0),
        )
        start = first = carried()
        metrics = None
        for event in engine.run_turn(request):
            if isinstance(event, FirstToken):
                first = carried()
            elif isinstance(event, EngineFailed):
                raise EngineError(f"engine failed during the RPC sweep: {event.message}")
            elif isinstance(event, TurnFinished):
                metrics = event.metrics
        if metrics is None:
            raise EngineError("the engine ended a turn of the RPC sweep without its metrics")
        end = carried()
        step_ms = metrics.tpot_ms
        if step_ms is None and metrics.decode_tokens_per_s:
            step_ms = 1000 / metrics.decode_tokens_per_s
        return RpcSample(
            devices=devices, rtt_ms=shape.rtt_ms, mbit_per_s=shape.mbit_per_s, rep=max(0, i - plan.warmup),
            warmup=i < plan.warmup, ttft_ms=metrics.ttft_ms, prefill_tokens_per_s=metrics.prefill_tokens_per_s,
            decode_step_ms=step_ms, decode_steps=max(0, (metrics.decode_tokens or 0) - 1),
            prefill_link=first - start, decode_link=end - first,
        )  # fmt: skip

    def result(self, cancelled: bool = True) -> RpcResult:
        """What ran so far (every sample, and the rows of their cells)."""
        samples = list(self._samples)
        return RpcResult(
            model=model_record(self.info), settings=self._facts.get("settings", {"plan": self.plan.to_dict()}),
            system=self._facts.get("system", {}), placements=self._facts.get("placements", {}),
            cancelled=cancelled, rows=rows_of(samples), samples=samples,
        )  # fmt: skip

    def partial_done(self) -> RunDone:
        return RunDone(self.result(cancelled=True))


def rows_of(samples: list[RpcSample]) -> list[RpcRow]:
    """One row per (devices, RTT, rate): medians of the counted samples, the link's carriage per turn and per
    decode step (means: it hardly varies), and the prediction from the same device count's RTT 0 row."""
    cells: dict[tuple[int, float, float | None], list[RpcSample]] = {}
    for s in samples:
        if not s.warmup:
            cells.setdefault((s.devices, s.rtt_ms, s.mbit_per_s), []).append(s)
    rows: list[RpcRow] = []
    base: dict[int, RpcRow] = {}
    for (devices, rtt, mbit), group in cells.items():
        steps = sum(s.decode_steps for s in group)
        per_turn = sum((s.prefill_link for s in group), LinkCounters())
        per_decode = sum((s.decode_link for s in group), LinkCounters())
        row = RpcRow(
            devices=devices, rtt_ms=rtt, mbit_per_s=mbit, reps=len(group),
            ttft_ms=_median([s.ttft_ms for s in group]),
            prefill_tokens_per_s=_median([s.prefill_tokens_per_s for s in group]),
            decode_step_ms=_median([s.decode_step_ms for s in group]),
            prefill_round_trips=per_turn.round_trips / len(group),
            prefill_bytes=(per_turn.bytes_up + per_turn.bytes_down) / len(group),
            decode_round_trips_per_step=per_decode.round_trips / steps if steps else None,
            decode_bytes_per_step=(per_decode.bytes_up + per_decode.bytes_down) / steps if steps else None,
        )  # fmt: skip
        if devices and rtt == 0 and mbit is None:
            base[devices] = row
        ref = base.get(devices)
        if devices and ref is not None and steps:
            shape = LinkShape(rtt, mbit)
            row = replace(
                row,
                ttft_predicted_ms=predicted_ms(ref.ttft_ms, per_turn, shape, per=len(group)),
                decode_step_predicted_ms=predicted_ms(ref.decode_step_ms, per_decode, shape, per=steps),
            )
        rows.append(row)
    return rows


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def make_run(
    info: ModelInfo, config: EngineConfig, plan: RpcPlan, roofline: bool, log_path: str | None, **options
) -> RpcRun:
    """The run of an :class:`RpcPlan`: the engine of each device count in its own child process (ggml keeps an RPC
    device registered for the life of the process, so a process that loaded through other servers would try to
    reach them again); no roofline peaks: the prediction's baseline is measured."""
    from chatphase.engine.factory import make_engine

    factory = options.pop("engine_factory", None) or (lambda i, c: make_engine(i, c))
    return RpcRun(info, config, plan, engine_factory=factory, roofline=False, log_path=log_path, **options)
