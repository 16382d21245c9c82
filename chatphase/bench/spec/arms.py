"""Speculative decoding, side by side: decode modes as arms on two prompt kinds, and the verify-step cost.

Arms (``--spec off,lookup,auto,draft:MODEL``) each hold one loaded engine (the same settings but the mode);
every repetition runs each prompt on every arm, the arm order rotating, so that no arm always runs first
on a warm machine (interleaved, as ``llama-bench`` reps are not, but shared machines need). Each run is one
greedy turn from a cleared KV cache, so every arm writes the same reply (checked: ``identical``).

Prompt kinds (:data:`PROMPTS`): *input-grounded* (rewrite a given code block with one change; summarise a
given text quoting it: the reply copies from the prompt, so drafts from the prompt get accepted) and
*open-ended* (a story: little to copy). Per arm and kind: decode tok/s (median over reps and prompts of the
kind), its ratio to ``off`` measured in the same reps, acceptance, tokens per step, and the speed-up each turn
measured against its own plain steps (``spec_speedup``: interleaved within the turn, so the least disturbed
by a shared machine's changing load).

:func:`verify_cost`: the ms of one target step evaluating ``k`` tokens (k = 1…16) at a given depth, logits
at every position as verification needs: a step of ``k + 1`` tokens pays when more than
``cost(k + 1) / cost(1)`` tokens are accepted on average.

The Experiments screen runs the same through :mod:`chatphase.bench.spec.run` (:func:`iter_runs`, :func:`collect`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, Message, ModelLoaded, SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.spec_modes import parse_spec
from chatphase.errors import EngineError, UsageError

CODE_BLOCK = """import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Task:
    title: str
    done: bool = False
    tags: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"title": self.title, "done": self.done, "tags": list(self.tags)}


class TaskList:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.tasks: list[Task] = []

    def load(self) -> None:
        if not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        self.tasks = [Task(item["title"], item["done"], item["tags"]) for item in data]

    def save(self) -> None:
        self.path.write_text(json.dumps([task.to_dict() for task in self.tasks], indent=2))

    def add(self, title: str, tags: list[str] | None = None) -> Task:
        task = Task(title, tags=tags or [])
        self.tasks.append(task)
        return task

    def finish(self, title: str) -> bool:
        for task in self.tasks:
            if task.title == title and not task.done:
                task.done = True
                return True
        return False

    def open_tasks(self) -> list[Task]:
        return [task for task in self.tasks if not task.done]
"""
ARTICLE = (
    "The town of Marrow Bay sits at the mouth of the Ell river, where the water slows and drops the silt it "
    "carried down from the hills. For three hundred years the town lived on that silt: the salt marshes it "
    "built fed sheep, and the sheep fed a wool trade that reached as far as Flanders. In 1787 a storm broke "
    "the sea wall, and the marshes flooded for a whole winter. The wool trade never came back. Instead the "
    "town turned to oysters, which grow well in brackish water, and by 1850 Marrow Bay shipped two million "
    "oysters a year to London by rail. The beds failed in 1921, killed by a parasite, and the town shrank to "
    "a village. Today the marshes are a nature reserve, and the old oyster sheds on the quay are a museum."
)
#: (kind, prompt) pairs: ``grounded`` replies copy from the prompt, ``open`` ones do not.
PROMPTS: tuple[tuple[str, str], ...] = (
    (
        "grounded",
        f"Here is some code:\n\n{CODE_BLOCK}\nCopy the code above exactly, but rename the method finish to complete.",
    ),
    ("grounded", f"{ARTICLE}\n\nQuote the first three sentences of this text word for word, then summarise the rest."),
    ("open", "Write a story about a lighthouse keeper who finds a message in a bottle."),
)
KINDS = ("grounded", "open")


@dataclass
class ArmResult:
    """One arm's runs: per kind, decode tok/s and spec figures of each run, and the reply of each prompt."""

    spec: str
    rates: dict[str, list[float]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)
    acceptance: dict[str, list[float]] = field(default_factory=dict)
    tokens_per_step: dict[str, list[float]] = field(default_factory=dict)
    speedup: dict[str, list[float]] = field(default_factory=dict)
    identical: bool = True


@dataclass(frozen=True)
class SpecSample:
    """One run: arm ``spec`` on prompt ``prompt`` (an index into :data:`PROMPTS`, of ``kind``) in repetition
    ``rep``; its decode tok/s, spec figures (``None`` for ``off``) and reply."""

    spec: str
    kind: str
    rep: int
    prompt: int
    decode_tokens_per_s: float
    acceptance: float | None
    tokens_per_step: float | None
    speedup: float | None
    reply: str


def parse_arms(text: str) -> list[str]:
    """The comma-separated modes of ``--spec`` (each checked).

    Raises:
        UsageError: an unknown mode, or none.
    """
    specs = [part.strip() for part in text.split(",") if part.strip()]
    for spec in specs:
        parse_spec(spec)
    if not specs:
        raise UsageError("--spec needs one or more of off, lookup, auto, draft:MODEL")
    return specs


def with_off(specs: Sequence[str]) -> list[str]:
    """``specs`` with ``off`` first (the ratios are to it), each once."""
    return list(dict.fromkeys(["off", *specs]))


def iter_runs(
    info,
    config: EngineConfig,
    specs: Sequence[str],
    reps: int = 3,
    max_tokens: int = 160,
    stop: Callable[[], bool] = lambda: False,
    engine_factory: Callable | None = None,
) -> Iterator[SpecSample]:
    """Run every prompt of :data:`PROMPTS` on every arm of :func:`with_off` ``(specs)``, ``reps`` times
    interleaved (see the module docstring), yielding each run as it ends; ``stop()`` true ends it between
    runs. ``engine_factory(info, config)`` replaces :class:`~chatphase.engine.local.llama.LlamaEngine` in tests.

    Raises:
        EngineError: an arm whose engine failed to load or run (its message).
    """
    if engine_factory is None:
        from chatphase.engine.local.llama import LlamaEngine

        engine_factory = LlamaEngine
    specs = with_off(specs)
    engines = {}
    try:
        for spec in specs:
            if stop():
                return
            engine = engine_factory(info, replace(config, spec=spec))
            events = list(engine.load())
            if not isinstance(events[-1], ModelLoaded):
                engine.close()
                raise EngineError(f"{spec}: {getattr(events[-1], 'message', events[-1])}")
            engines[spec] = engine
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0)
        for rep in range(reps):
            order = specs[rep % len(specs) :] + specs[: rep % len(specs)]
            for n, (kind, prompt) in enumerate(PROMPTS):
                for spec in order:
                    if stop():
                        return
                    req = TurnRequest(1, (Message("user", prompt),), sampling, reset_cache=True)
                    fin = None
                    for event in engines[spec].run_turn(req):
                        if isinstance(event, EngineFailed):
                            raise EngineError(f"{spec}: {event.message}")
                        if isinstance(event, TurnFinished):
                            fin = event
                    if fin is None:  # the engine's turn ends with TurnFinished or EngineFailed
                        raise EngineError(f"{spec}: the turn ended without its result")
                    m = fin.metrics
                    yield SpecSample(
                        spec, kind, rep, n, m.decode_tokens_per_s or 0.0,
                        m.spec_acceptance, m.spec_tokens_per_step, m.spec_speedup, fin.reply,
                    )  # fmt: skip
    finally:
        for engine in engines.values():
            engine.close()


def collect(samples: Sequence[SpecSample]) -> dict[str, ArmResult]:
    """The arms' results from their runs, arms in first-seen order. A ratio to ``off`` (and the identity check)
    counts only the (rep, prompt) pairs ``off`` ran too, so a cancelled run's partial samples read right."""
    results: dict[str, ArmResult] = {}
    off = {(s.rep, s.prompt): s for s in samples if s.spec == "off"}
    for s in samples:
        r = results.setdefault(s.spec, ArmResult(s.spec))
        r.rates.setdefault(s.kind, []).append(s.decode_tokens_per_s)
        for figures, value in ((r.acceptance, s.acceptance), (r.tokens_per_step, s.tokens_per_step),
                               (r.speedup, s.speedup)):  # fmt: skip
            if value is not None:
                figures.setdefault(s.kind, []).append(value)
        base = off.get((s.rep, s.prompt))
        if base is not None:
            rate = base.decode_tokens_per_s
            r.ratios.setdefault(s.kind, []).append(s.decode_tokens_per_s / rate if rate else 0.0)
            r.identical &= s.reply == base.reply
    return results


def run_arms(
    info,
    config: EngineConfig,
    specs: Sequence[str],
    reps: int = 3,
    max_tokens: int = 160,
    progress: Callable[[str], None] = lambda text: None,
) -> dict[str, ArmResult]:
    """:func:`iter_runs` to the end, then :func:`collect`; ``progress`` gets a line after each run (its tok/s).

    Raises:
        EngineError: an arm whose engine failed to load or run (its message).
    """
    samples = []
    for s in iter_runs(info, config, specs, reps, max_tokens):
        progress(
            f"rep {s.rep + 1}/{reps} · prompt {s.prompt + 1}/{len(PROMPTS)} · {s.spec}: {s.decode_tokens_per_s:.1f} tok/s"
        )
        samples.append(s)
    return collect(samples)


def verify_cost(info, config: EngineConfig, depth: int = 256, ks: Sequence[int] = range(1, 17), reps: int = 5) -> dict:
    """Median ms of one step evaluating ``k`` tokens after ``depth`` cached ones, logits at every position, for
    each ``k`` (the order interleaved over ``reps``); also ``k = 1``'s, for the ratios.

    Raises:
        EngineError: the model fails to load or llama.cpp refuses a batch.
    """
    from chatphase.engine.local.llama import LlamaEngine

    engine = LlamaEngine(info, replace(config, spec="off"))
    try:
        events = list(engine.load())
        if not isinstance(events[-1], ModelLoaded):
            raise EngineError(getattr(events[-1], "message", str(events[-1])))
        tokens = (engine.tokenize(CODE_BLOCK) * 4)[: depth + max(ks)]
        order = [k for _ in range(reps) for k in ks]
        ms = engine.time_verify_steps(tokens[:depth], [tokens[depth : depth + k] for k in order])
        times: dict[int, list[float]] = {k: [] for k in ks}
        for k, t in zip(order, ms, strict=True):
            times[k].append(t)
        return {k: statistics.median(v) for k, v in times.items()}
    finally:
        engine.close()


def summary_rows(results: dict[str, ArmResult]) -> list[dict]:
    """One row per arm and kind: median decode tok/s, median ratio to ``off``, mean acceptance and tokens per
    step, median speed-up against the turn's own plain steps (``None`` where there is none)."""
    rows = []
    for spec, r in results.items():
        for kind in KINDS:
            if kind not in r.rates:
                continue
            acc, tps, own, ratios = (r.acceptance.get(kind), r.tokens_per_step.get(kind), r.speedup.get(kind),
                                     r.ratios.get(kind))  # fmt: skip
            rows.append(
                {
                    "spec": spec,
                    "kind": kind,
                    "decode_tokens_per_s": statistics.median(r.rates[kind]),
                    "ratio_to_off": statistics.median(ratios) if ratios else None,
                    "acceptance": statistics.fmean(acc) if acc else None,
                    "tokens_per_step": statistics.fmean(tps) if tps else None,
                    "turn_speedup": statistics.median(own) if own else None,
                    "identical": r.identical,
                    "runs": len(r.rates[kind]),
                }
            )
    return rows


#: the table's columns, and the width and alignment of each in :func:`format_rows`.
HEADERS = ("arm", "prompts", "tok/s", "× off", "accept", "tok/step", "× own", "same")
_WIDTHS = ("<16", "<9", ">7", ">6", ">7", ">8", ">6", ">5")


def row_cells(row: dict) -> list[str]:
    """A :func:`summary_rows` row as the table's text cells (``-`` where there is no figure)."""

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    return [
        row["spec"], row["kind"], f(row["decode_tokens_per_s"], ".1f"), f(row["ratio_to_off"], ".2f"),
        f(row["acceptance"], ".0%"), f(row["tokens_per_step"], ".2f"), f(row["turn_speedup"], ".2f"),
        "yes" if row["identical"] else "NO",
    ]  # fmt: skip


def format_rows(rows: list[dict]) -> str:
    """The rows as an aligned text table."""
    lines = [HEADERS, *(row_cells(r) for r in rows)]
    return "\n".join(" ".join(format(c, w) for c, w in zip(line, _WIDTHS, strict=True)) for line in lines)


def format_costs(costs: dict) -> str:
    """The verify-cost sweep as a table: ms per step of k tokens and its ratio to one token."""
    one = costs[min(costs)]
    lines = [f"{'k':>3} {'ms/step':>8} {'× one':>6}"]
    lines += [f"{k:>3} {ms:>8.2f} {ms / one:>6.2f}" for k, ms in costs.items()]
    return "\n".join(lines)
