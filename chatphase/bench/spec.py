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
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, Message, ModelLoaded, SamplingParams, TurnFinished, TurnRequest

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


def run_arms(
    info,
    config: EngineConfig,
    specs: Sequence[str],
    reps: int = 3,
    max_tokens: int = 160,
    progress: Callable[[str], None] = lambda text: None,
) -> dict[str, ArmResult]:
    """Run every prompt of :data:`PROMPTS` on every arm of ``specs``, ``reps`` times interleaved (see the
    module docstring). ``off`` is added first when missing (the ratios are to it).

    Raises:
        RuntimeError: an arm whose engine failed to load or run (its message).
    """
    from chatphase.engine.llama import LlamaEngine

    specs = list(dict.fromkeys(["off", *specs]))
    engines = {}
    try:
        for spec in specs:
            engine = LlamaEngine(info, replace(config, spec=spec))
            events = list(engine.load())
            if not isinstance(events[-1], ModelLoaded):
                engine.close()
                raise RuntimeError(f"{spec}: {getattr(events[-1], 'message', events[-1])}")
            engines[spec] = engine
        results = {spec: ArmResult(spec) for spec in specs}
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0)
        for rep in range(reps):
            order = specs[rep % len(specs) :] + specs[: rep % len(specs)]
            for n, (kind, prompt) in enumerate(PROMPTS):
                replies, rates = {}, {}
                for spec in order:
                    progress(f"rep {rep + 1}/{reps} · prompt {n + 1}/{len(PROMPTS)} · {spec}")
                    req = TurnRequest(1, (Message("user", prompt),), sampling, reset_cache=True)
                    fin = None
                    for event in engines[spec].run_turn(req):
                        if isinstance(event, EngineFailed):
                            raise RuntimeError(f"{spec}: {event.message}")
                        if isinstance(event, TurnFinished):
                            fin = event
                    m = fin.metrics
                    replies[spec], rates[spec] = fin.reply, m.decode_tokens_per_s or 0.0
                    r = results[spec]
                    r.rates.setdefault(kind, []).append(rates[spec])
                    if m.spec_acceptance is not None:
                        r.acceptance.setdefault(kind, []).append(m.spec_acceptance)
                    if m.spec_tokens_per_step is not None:
                        r.tokens_per_step.setdefault(kind, []).append(m.spec_tokens_per_step)
                    if m.spec_speedup is not None:
                        r.speedup.setdefault(kind, []).append(m.spec_speedup)
                for spec in specs:
                    results[spec].ratios.setdefault(kind, []).append(rates[spec] / rates["off"] if rates["off"] else 0)
                    results[spec].identical &= replies[spec] == replies["off"]
        return results
    finally:
        for engine in engines.values():
            engine.close()


def verify_cost(info, config: EngineConfig, depth: int = 256, ks: Sequence[int] = range(1, 17), reps: int = 5) -> dict:
    """Median ms of one step evaluating ``k`` tokens after ``depth`` cached ones, logits at every position, for
    each ``k`` (the order interleaved over ``reps``); also ``k = 1``'s, for the ratios."""
    import llama_cpp as lc

    from chatphase.engine.llama import LlamaEngine

    engine = LlamaEngine(info, replace(config, spec="off"))
    try:
        events = list(engine.load())
        if not isinstance(events[-1], ModelLoaded):
            raise RuntimeError(getattr(events[-1], "message", str(events[-1])))
        ctx, mem = engine._ctx, engine._mem
        tokens = (engine.tokenize(CODE_BLOCK) * 4)[: depth + max(ks)]
        for start in range(0, depth, config.n_batch):
            if not engine._decode(tokens[start : min(start + config.n_batch, depth)]):
                raise RuntimeError("llama.cpp could not evaluate the context")
        batch = lc.llama_batch_init(max(ks), 0, 1)
        times: dict[int, list[float]] = {k: [] for k in ks}
        try:
            for _ in range(reps):
                for k in ks:
                    for i in range(k):
                        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tokens[depth + i], depth + i, 1
                        batch.seq_id[i][0], batch.logits[i] = 0, 1
                    batch.n_tokens = k
                    t0 = time.perf_counter_ns()
                    if lc.llama_decode(ctx, batch) != 0:
                        raise RuntimeError(f"llama.cpp could not evaluate a batch of {k}")
                    lc.llama_synchronize(ctx)
                    times[k].append((time.perf_counter_ns() - t0) / 1e6)
                    lc.llama_memory_seq_rm(mem, 0, depth, -1)
        finally:
            lc.llama_batch_free(batch)
        return {k: statistics.median(v) for k, v in times.items()}
    finally:
        engine.close()


def summary_rows(results: dict[str, ArmResult]) -> list[dict]:
    """One row per arm and kind: median decode tok/s, median ratio to ``off``, mean acceptance and tokens per step."""
    rows = []
    for spec, r in results.items():
        for kind in KINDS:
            if kind not in r.rates:
                continue
            acc, tps, own = r.acceptance.get(kind), r.tokens_per_step.get(kind), r.speedup.get(kind)
            rows.append(
                {
                    "spec": spec,
                    "kind": kind,
                    "decode_tokens_per_s": statistics.median(r.rates[kind]),
                    "ratio_to_off": statistics.median(r.ratios[kind]),
                    "acceptance": statistics.fmean(acc) if acc else None,
                    "tokens_per_step": statistics.fmean(tps) if tps else None,
                    "turn_speedup": statistics.median(own) if own else None,
                    "identical": r.identical,
                    "runs": len(r.rates[kind]),
                }
            )
    return rows


def format_rows(rows: list[dict]) -> str:
    """The rows as an aligned text table."""

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    out = [
        f"{'arm':<16} {'prompts':<9} {'tok/s':>7} {'× off':>6} {'accept':>7} {'tok/step':>8} {'× own':>6} {'same':>5}"
    ]
    for r in rows:
        out.append(
            f"{r['spec']:<16} {r['kind']:<9} {r['decode_tokens_per_s']:>7.1f} {r['ratio_to_off']:>6.2f} "
            f"{f(r['acceptance'], '>7.0%')} {f(r['tokens_per_step'], '>8.2f')} {f(r['turn_speedup'], '>6.2f')} "
            f"{'yes' if r['identical'] else 'NO':>5}"
        )
    return "\n".join(out)


def format_costs(costs: dict) -> str:
    """The verify-cost sweep as a table: ms per step of k tokens and its ratio to one token."""
    one = costs[min(costs)]
    lines = [f"{'k':>3} {'ms/step':>8} {'× one':>6}"]
    lines += [f"{k:>3} {ms:>8.2f} {ms / one:>6.2f}" for k, ms in costs.items()]
    return "\n".join(lines)
