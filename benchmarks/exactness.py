""" "The same reply": where a restored or speculative turn parts from a cold one at temperature 0, and why.

Run: ``python -m benchmarks.exactness [--model SPEC] [--lengths 1500,4400] [--prompts 4] [--gen 48]
[--threads 2] [--n-batch 256] [--out FILE.md] [--json FILE.json]``; ``--cost [--reps 3]`` times what exactness
costs instead (below).

One llama.cpp context, driven on its C API with chatphase's model and context parameters for this CPU
(:func:`chatphase.engine.local.llama_params.cpu_auto_plan`, :func:`~chatphase.engine.local.llama_params.context_params`
from :class:`chatphase.engine.config.EngineConfig`'s defaults), so the kernels are the ones a chat runs. Per prompt
(``--prompts`` different documents at each of ``--lengths`` tokens), greedy decoding of ``--gen`` tokens each time:

- ``cold``: the prompt from an empty KV cache in ``n_batch`` chunks from position 0 (a fresh ``ask``), twice: the
  second run says whether the cold path itself is deterministic;
- ``restore``: the KV cells of the prompt's first n − 1 tokens as the cold run left them (the cells the prefix store
  saves and restores, bit for bit), then the last prompt token evaluated alone — what the engine does after a
  restore of n − 1 tokens;
- ``exact``: the cells up to the start of the cold run's last chunk kept, that chunk evaluated again as one batch;
- ``threads``: the cold prefill with one thread instead of ``--threads``;
- ``verify``: the cold run's first four reply tokens evaluated as one batch of four (a speculative verify step),
  each position's logits against the cold run's one-token steps.

``--cost``: what the two ways to the same reply cost, timed in two contexts side by side (flash attention ``auto`` as
chatphase resolves it, and ``off``), their arms rotated by rep: a cold prefill of the prompt (ms), a decode step
(ms a token, over ``--gen`` greedy steps), a fast restore (the cold run's KV state put back from memory with
``llama_state_seq_set_data``, cut to n − 1 cells, the last prompt token evaluated: ``prefix_cache = on``) and an
exact restore (the same state cut at the start of the cold run's last chunk, that chunk evaluated again:
``prefix_cache = exact``). The disk read of a real restore is the same for both and left out. Ratios are medians of
the per-rep ratios (:func:`benchmarks.harness.ratio`): exact ÷ fast per setting, off ÷ auto per arm.

Reported per case: the largest |Δlogit| against the cold run at the first reply token, whether the argmax agrees,
the first reply token where the greedy continuations part (if they do within ``--gen``) and the cold run's gap
between its top two logits there, against the median gap of all its steps. A parting at a gap smaller than the
logit differences the case produces everywhere is a near-tie, measured rather than assumed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import load_note, machine_line, ratio, rotation

WORDS = (
    "amber lumin lumen luminance harbor cinder quartz meadow falcon ember tundra willow prism nectar glacier "
    "orchid saddle lantern copper marble thistle velvet summit canyon breeze pepper walnut raven cobalt maple"
).split()


@dataclass
class Case:
    """One arm against the cold run, for one prompt."""

    arm: str
    prompt_tokens: int
    max_abs_dlogit: float  # at the first reply token (the last prompt position's logits)
    argmax_same: bool
    first_diff: int | None  # reply token index where the greedy continuations part; None: identical
    cold_gap_at_diff: float | None  # the cold run's top-1 minus top-2 logit there
    cold_gap_median: float  # over the cold run's steps
    extra: dict[str, Any] = field(default_factory=dict)


def document(n_words: int, seed: int) -> str:
    """Numbered notes of random words, and a question about one of them (as the issue's `ask -f` case)."""
    rng = random.Random(seed)
    lines, words = [], 0
    note = 1
    while words < n_words:
        k = rng.randint(8, 16)
        lines.append(f"Note {note}: " + " ".join(rng.choice(WORDS) for _ in range(k)) + ".")
        words, note = words + k + 2, note + 1
    target = rng.choice(WORDS)
    return "\n".join(lines) + f'\n\nQuestion: in which note does the word "{target}" appear first? Answer:'


def prompt_of(c: Context, n: int, seed: int) -> list[int]:
    """A document of at most ``n`` tokens (and at least 90 % of it): words scaled by the tokens a word took."""
    words = n
    for _ in range(8):
        tokens = c.tokenize(document(words, seed))
        if 0.9 * n <= len(tokens) <= n:
            return tokens
        words = max(8, int(words * n / len(tokens) * (0.97 if len(tokens) > n else 1.0)))
    return tokens[:n]


class Context:
    """A model and one context on llama.cpp's C API, with chatphase's parameters for this CPU."""

    def __init__(self, path: str, n_ctx: int, n_batch: int, threads: int, flash_attn: str) -> None:
        import llama_cpp as lc
        import numpy as np

        from chatphase.engine.config import EngineConfig
        from chatphase.engine.local.llama_params import context_params, cpu_auto_plan, model_params

        self.lc, self.np = lc, np
        self.fa_enabled: bool | None = {"on": True, "off": False}.get(flash_attn)

        def log(level: int, text: bytes, user_data: object) -> None:
            line = text.decode("utf-8", "replace")
            if "resolve_fused_ops: Flash Attention" in line:
                self.fa_enabled = "enabled" in line

        sink = lc.llama_log_callback(log)
        self._sink = sink  # kept alive: llama.cpp calls it
        lc.llama_log_set(sink, None)
        lc.llama_backend_init()
        self.plan = cpu_auto_plan()
        self.model = lc.llama_model_load_from_file(path.encode(), model_params(self.plan))
        if not self.model:
            raise SystemExit(f"benchmarks: llama.cpp could not load {path}")
        cfg = EngineConfig(
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=flash_attn,
        )
        self.settings = cfg.resolved()
        self.ctx = lc.llama_init_from_model(self.model, context_params(self.settings))
        self.threads = threads
        self.n_batch = lc.llama_n_batch(self.ctx)
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.mem = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(max(self.n_batch, 8), 0, 1)

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        buf = (self.lc.llama_token * (len(raw) + 16))()
        n = self.lc.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, True)
        return list(buf[:n])

    def eval(self, tokens: list[int], start: int, all_logits: bool = False):
        """``tokens`` at positions ``start…`` as one llama_decode; the last position's logits (all with
        ``all_logits``), copied, shape ``(n_vocab,)`` or ``(len(tokens), n_vocab)``."""
        b = self.batch
        pos = ctypes.cast(b.pos, ctypes.POINTER(ctypes.c_int32))
        for i, t in enumerate(tokens):
            b.token[i], pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, int(all_logits or i == len(tokens) - 1)
            b.seq_id[i][0] = 0
        b.n_tokens = len(tokens)
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise SystemExit("benchmarks: llama_decode failed")
        self.lc.llama_synchronize(self.ctx)
        np = self.np
        if all_logits:
            ptr = self.lc.llama_get_logits(self.ctx)
            return np.ctypeslib.as_array(ptr, shape=(len(tokens) * self.n_vocab,)).copy().reshape(len(tokens), -1)
        return np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)).copy()

    def drop_from(self, pos: int) -> None:
        """Remove the KV cells at positions ≥ ``pos`` (``0``: clear)."""
        if pos == 0:
            self.lc.llama_memory_clear(self.mem, True)
        else:
            self.lc.llama_memory_seq_rm(self.mem, 0, pos, -1)

    def prefill(self, tokens: list[int], start: int = 0):
        """``tokens[start:]`` in ``n_batch`` chunks from ``start``; the last position's logits."""
        logits = None
        for at in range(start, len(tokens), self.n_batch):
            logits = self.eval(tokens[at : at + self.n_batch], at)
        return logits

    def greedy(self, first_logits, n_prompt: int, gen: int):
        """``gen`` greedy tokens from ``first_logits``, one llama_decode each; (tokens, logits per step)."""
        np = self.np
        out, steps, logits = [], [first_logits], first_logits
        for k in range(gen):
            tok = int(np.argmax(logits))
            out.append(tok)
            if k == gen - 1:
                break
            logits = self.eval([tok], n_prompt + k)
            steps.append(logits)
        return out, steps

    def set_threads(self, n: int) -> None:
        self.lc.llama_set_n_threads(self.ctx, n, n)

    def state(self) -> bytes:
        """A copy of sequence 0's state (its KV cells), as the prefix store saves it."""
        size = self.lc.llama_state_seq_get_size(self.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        if self.lc.llama_state_seq_get_data(self.ctx, buf, size, 0) != size:
            raise SystemExit("benchmarks: llama.cpp gave a short state")
        return bytes(buf)

    def restore(self, state: bytes, keep: int) -> None:
        """``state`` put back into sequence 0 (cleared first), then cut to its first ``keep`` cells."""
        self.lc.llama_memory_seq_rm(self.mem, 0, -1, -1)
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if self.lc.llama_state_seq_set_data(self.ctx, buf, len(state), 0) != len(state):
            raise SystemExit("benchmarks: llama.cpp refused the state")
        self.lc.llama_memory_seq_rm(self.mem, 0, keep, -1)

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


def gap(logits) -> float:
    top = logits[logits.argsort()[-2:]]
    return float(top[1] - top[0])


def compare(arm, n, cold, first, toks, extra=None) -> Case:
    """``arm``'s first-reply-token logits and greedy tokens against the cold run's."""
    cold_toks, cold_steps = cold
    diff = next((k for k, (a, b) in enumerate(zip(cold_toks, toks, strict=True)) if a != b), None)
    gaps = [gap(s) for s in cold_steps]
    return Case(
        arm,
        n,
        float(abs(first - cold_steps[0]).max()),
        int(first.argmax()) == int(cold_steps[0].argmax()),
        diff,
        gaps[diff] if diff is not None and diff < len(gaps) else None,
        statistics.median(gaps),
        extra or {},
    )


def run_prompt(c: Context, tokens: list[int], gen: int) -> list[Case]:
    n = len(tokens)
    c.set_threads(c.threads)
    c.drop_from(0)
    first = c.prefill(tokens)
    cold = c.greedy(first, n, gen)
    cold_gaps = [gap(s) for s in cold[1]]
    cases = []
    c.drop_from(0)
    again = c.prefill(tokens)
    cases.append(compare("cold again", n, cold, again, c.greedy(again, n, gen)[0]))
    # the cells of the prompt's first n - 1 tokens, computed in the cold run's chunks (the store saves and restores
    # these bit for bit), then the last prompt token alone, as the engine evaluates it after a restore
    c.drop_from(0)
    c.prefill(tokens[:-1])
    restored = c.eval([tokens[-1]], n - 1)
    cases.append(compare("restore (last token alone)", n, cold, restored, c.greedy(restored, n, gen)[0]))
    last_chunk = ((n - 1) // c.n_batch) * c.n_batch
    c.drop_from(last_chunk)
    exact = c.eval(tokens[last_chunk:], last_chunk)
    cases.append(
        compare("exact (last chunk again)", n, cold, exact, c.greedy(exact, n, gen)[0], {"recomputed": n - last_chunk})
    )
    # a speculative verify step: the cold run's reply tokens 1-4 in one batch, each position's logits against the
    # cold run's one-token steps (positions n ... n + 3, whose logits give reply tokens 2-5)
    c.drop_from(n)
    verify = c.eval(cold[0][:4], n, all_logits=True)
    steps = cold[1][1:5]
    dl = [float(abs(v - s).max()) for v, s in zip(verify, steps, strict=True)]
    agree = [int(v.argmax()) == int(s.argmax()) for v, s in zip(verify, steps, strict=True)]
    parted = next((k for k, a in enumerate(agree) if not a), None)
    cases.append(
        Case(
            "verify (batch of 4)",
            n,
            max(dl),
            all(agree),
            None if parted is None else parted + 1,
            None if parted is None else cold_gaps[parted + 1],
            statistics.median(cold_gaps),
            {"max_abs_dlogit_per_position": dl},
        )
    )
    c.set_threads(1)
    c.drop_from(0)
    one = c.prefill(tokens)
    cases.append(compare("cold, 1 thread", n, cold, one, c.greedy(one, n, gen)[0]))
    c.set_threads(c.threads)
    return cases


#: the timed arms of ``--cost``, in the order they are reported.
COST_ARMS = ("prefill ms", "decode ms/token", "fast restore ms", "exact restore ms")


def cost_rep(c: Context, tokens: list[int], gen: int, rep: int) -> dict[str, float]:
    """One rep of ``--cost`` on context ``c``: each arm's ms (the module docstring), the restores in rotated order."""
    n = len(tokens)
    c.drop_from(0)
    t0 = time.perf_counter_ns()
    first = c.prefill(tokens)
    prefill_ms = (time.perf_counter_ns() - t0) / 1e6
    t0 = time.perf_counter_ns()
    c.greedy(first, n, gen)
    decode_ms = (time.perf_counter_ns() - t0) / 1e6 / max(1, gen - 1)
    state = c.state()
    last_chunk = ((n - 1) // c.n_batch) * c.n_batch
    out = {"prefill ms": prefill_ms, "decode ms/token": decode_ms}

    def fast() -> None:
        c.restore(state, n - 1)
        c.eval([tokens[-1]], n - 1)

    def exact() -> None:
        c.restore(state, last_chunk)
        c.prefill(tokens, last_chunk)

    for name, arm in rotation([("fast restore ms", fast), ("exact restore ms", exact)], rep):
        t0 = time.perf_counter_ns()
        arm()
        out[name] = (time.perf_counter_ns() - t0) / 1e6
    return out


def cost_report(
    args, contexts: dict[str, Context], model: str, times: dict[tuple[int, str], dict[str, list[float]]], seconds: float
) -> str:
    """The ``--cost`` tables: per prompt length, each arm's median ms under each flash-attention setting, off ÷ auto,
    and exact ÷ fast per setting (medians of per-rep ratios)."""
    from chatphase import __version__

    c = contexts["auto"]
    fa_auto = "on" if c.fa_enabled else "off" if c.fa_enabled is False else "not said"
    lines = [
        "# What the same reply costs: exact restore against fast, flash attention off against auto",
        "",
        f"`python -m benchmarks.exactness {' '.join(sys.argv[1:])}`",
        "",
        f"Machine: {machine_line()}; chatphase {__version__}; model {model}; n_batch {c.n_batch}, threads "
        f"{c.threads}; flash_attn auto resolved {fa_auto}; {args.reps} reps; {seconds:.0f} s. Restores from memory "
        "(the disk read, the same for both, left out).",
        "",
    ]
    for n in sorted({k[0] for k in times}):
        auto, off = times[(n, "auto")], times[(n, "off")]
        lines += [
            f"## {n:,}-token prompts",
            "",
            "| arm | flash_attn auto | flash_attn off | off ÷ auto |",
            "|---|---:|---:|---:|",
        ]
        for arm in COST_ARMS:
            r = ratio(off[arm], auto[arm])
            lines.append(
                f"| {arm} | {statistics.median(auto[arm]):,.2f} | {statistics.median(off[arm]):,.2f} | "
                f"{r.median_of_ratios:.2f} |"
            )
        exact_auto = ratio(auto["exact restore ms"], auto["fast restore ms"]).median_of_ratios
        exact_off = ratio(off["exact restore ms"], off["fast restore ms"]).median_of_ratios
        lines += ["", f"exact ÷ fast restore: {exact_auto:.2f} (flash_attn auto), {exact_off:.2f} (off)", ""]
    lines += [load_note(), ""]
    return "\n".join(lines)


def run_cost(args, info, lengths: list[int], n_batch: int) -> int:
    """``--cost``: both contexts, every prompt, ``--reps`` reps each, settings rotated by rep."""
    contexts = {
        fa: Context(str(info.path), max(lengths) + args.gen + 64, n_batch, args.threads, fa) for fa in ("auto", "off")
    }
    times: dict[tuple[int, str], dict[str, list[float]]] = {}
    t0 = time.perf_counter()
    try:
        for n in lengths:
            for i in range(args.prompts):
                tokens = prompt_of(contexts["auto"], n, seed=1000 * i + n)
                print(f"cost: prompt {i + 1}/{args.prompts} at {len(tokens):,} tokens", file=sys.stderr, flush=True)
                for rep in range(args.reps):
                    for fa in rotation(["auto", "off"], rep):
                        got = cost_rep(contexts[fa], tokens, args.gen, rep)
                        arms = times.setdefault((n, fa), {arm: [] for arm in COST_ARMS})
                        for arm in COST_ARMS:
                            arms[arm].append(got[arm])
        text = cost_report(args, contexts, info.name, times, time.perf_counter() - t0)
    finally:
        for c in contexts.values():
            c.close()
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        rows = [{"prompt_tokens": n, "flash_attn": fa, **arms} for (n, fa), arms in sorted(times.items())]
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}g}"


def report(args, c: Context, model: str, cases: list[Case], seconds: float) -> str:
    from chatphase import __version__

    lines = [
        "# The same reply: restored and speculative turns against a cold one, at temperature 0",
        "",
        f"`python -m benchmarks.exactness {' '.join(sys.argv[1:])}`",
        "",
        f"Machine: {machine_line()}; chatphase {__version__}; model {model}; n_batch {c.n_batch}, "
        f"threads {c.threads}, flash_attn {c.settings['flash_attn']}, extra buffer types "
        f"{'on' if c.plan.use_extra_bufts else 'off'}; {seconds:.0f} s.",
        "",
        "| arm | prompt tokens | max abs Δlogit (first reply token) | argmax same | first differing reply token |"
        " cold top-2 gap there | cold median top-2 gap |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for k in cases:
        lines.append(
            f"| {k.arm} | {k.prompt_tokens:,} | {_fmt(k.max_abs_dlogit)} | {'yes' if k.argmax_same else 'NO'} | "
            f"{'–' if k.first_diff is None else k.first_diff} | {_fmt(k.cold_gap_at_diff)} | {_fmt(k.cold_gap_median)} |"
        )
    lines += ["", "## Per arm", ""]
    for arm in dict.fromkeys(k.arm for k in cases):
        mine = [k for k in cases if k.arm == arm]
        parted = [k for k in mine if k.first_diff is not None]
        worst = max(k.max_abs_dlogit for k in mine)
        gaps = [k.cold_gap_at_diff for k in parted if k.cold_gap_at_diff is not None]
        lines.append(
            f"- **{arm}**: {len(parted)} of {len(mine)} replies part from the cold one; max |Δlogit| {_fmt(worst)}"
            + (f"; the cold run's top-2 gap where they part: {', '.join(_fmt(g) for g in gaps)}" if gaps else "")
        )
    lines += ["", load_note(), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path or name (default: the bundled SmolLM2-135M)")
    ap.add_argument("--lengths", default="1500,4400", help="prompt lengths in tokens, about (default 1500,4400)")
    ap.add_argument("--prompts", type=int, default=4, help="different documents at each length (default 4)")
    ap.add_argument("--gen", type=int, default=48, help="greedy reply tokens a run (default 48)")
    ap.add_argument("--threads", type=int, default=2, help="threads (default 2)")
    ap.add_argument("--n-batch", type=int, default=None, help="prefill chunk (default: chatphase's)")
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto", help="as chatphase's (default auto)")
    ap.add_argument("--out", metavar="FILE", help="also write the Markdown report here")
    ap.add_argument("--json", metavar="FILE", help="also write every case as JSON here")
    ap.add_argument(
        "--cost",
        action="store_true",
        help="time what exactness costs instead: exact restore against fast, flash_attn off against auto, "
        "for prefill, decode and both restores, ratios side by side",
    )
    ap.add_argument("--reps", type=int, default=3, help="reps of each --cost arm (default 3)")
    args = ap.parse_args(argv)
    from chatphase.engine.config import EngineConfig
    from chatphase.models.gguf_meta import read_model_info
    from chatphase.models.resolve import resolve_model

    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        ap.error("--lengths takes numbers separated by commas")
    if min(lengths) < 16 or args.prompts < 1 or args.gen < 6 or args.threads < 1 or args.reps < 1:
        ap.error("--lengths >= 16, --prompts >= 1, --gen >= 6, --threads >= 1, --reps >= 1")
    info = read_model_info(resolve_model(args.model))
    n_batch = args.n_batch or EngineConfig().n_batch
    if args.cost:
        return run_cost(args, info, lengths, n_batch)
    c = Context(str(info.path), max(lengths) + args.gen + 64, n_batch, args.threads, args.flash_attn)
    t0 = time.perf_counter()
    cases: list[Case] = []
    try:
        for n in lengths:
            for i in range(args.prompts):
                tokens = prompt_of(c, n, seed=1000 * i + n)
                print(f"prompt {i + 1}/{args.prompts} at {len(tokens):,} tokens", file=sys.stderr, flush=True)
                cases += run_prompt(c, tokens, args.gen)
        text = report(args, c, info.name, cases, time.perf_counter() - t0)
    finally:
        c.close()
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(k) for k in cases], indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
