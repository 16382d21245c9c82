"""The speculative loop's steps against a scripted llama.cpp (no model): the thread policy sees steps, not the
tokens of one verified batch; the speed-up compares steps with plain steps at the same thread count; ``auto``
stops drafting when the measured speed-up says drafts lose; a draft model that cannot pay is said, before
the first turn and after one. Each step's cost is scripted by its width (positions evaluated) and the decode
thread count, so the expected figures are known."""

from __future__ import annotations

import random
import threading
import types

import llama_cpp as lc
import pytest

from chatphase.engine.events import SamplingParams, TurnRequest
from chatphase.engine.local import speculative
from chatphase.engine.local.drafters import JUDGE_STEPS, PROBE_EVERY, AutoPolicy, draft_wont_pay
from chatphase.engine.local.generation import Model
from chatphase.engine.local.kv_context import KvContext
from chatphase.engine.local.llama_params import batch_positions
from chatphase.engine.local.speculative import SpecGenerated, Speculator, generate_speculative
from chatphase.engine.prompting.vocab import Vocab
from chatphase.engine.spec_modes import SPEC_WARNING
from chatphase.engine.threads.governor import ThreadGovernor

MS = 1_000_000
#: a plain step on 2 threads (ms); each drafted position adds a third of it; 1 thread is 1.6× slower.
PLAIN_MS, PER_DRAFT, ONE_THREAD = 7.0, 0.33, 1.6


def step_ms(width: int, threads: int) -> float:
    return PLAIN_MS * (1 + PER_DRAFT * (width - 1)) * (ONE_THREAD if threads == 1 else 1.0)


class FakeLlama:
    """The C calls of the speculative loop: the target's reply is ``seq`` (a prompt of ``n_prompt`` tokens,
    then the reply); ``llama_decode`` advances the clock by ``cost(width, threads)``, each sample by 20 µs."""

    def __init__(self, seq, n_prompt, cost=step_ms):
        self.seq, self.cost = seq, cost
        self.cache = list(seq[:n_prompt])
        self.now_ns = 0
        self.threads = 2
        self.positions: list[int] = []
        self.thread_calls: list[int] = []

    def install(self, monkeypatch):
        for name, fn in {
            "llama_sampler_sample": self.sample,
            "llama_decode": self.decode,
            "llama_sampler_free": lambda s: None,
            "llama_memory_seq_rm": lambda *a: True,
            "llama_vocab_is_eog": lambda v, t: False,
            "llama_n_threads": lambda ctx: self.threads,
            "llama_n_threads_batch": lambda ctx: self.threads,
        }.items():
            monkeypatch.setattr(lc, name, fn)
        monkeypatch.setattr(speculative, "sampler_chain", lambda sp: None)
        monkeypatch.setattr(speculative, "time", types.SimpleNamespace(perf_counter_ns=lambda: self.now_ns))

    def set_threads(self, n, n_batch):
        self.threads = n
        self.thread_calls.append(n)

    def sample(self, sampler, ctx, i):
        self.now_ns += 20_000
        return self.seq[len(self.cache)] if i < 0 else self.seq[self.positions[i] + 1]

    def decode(self, ctx, b):
        pos = batch_positions(b)
        self.positions = [pos[i] for i in range(b.n_tokens)]
        self.now_ns += int(self.cost(b.n_tokens, self.threads) * MS)
        return 0


def text(n, period=24, noise=0.0, seed=1):
    """Tokens that repeat every ``period`` (lookup drafts them), a share ``noise`` replaced at random."""
    rng = random.Random(seed)
    return [rng.randrange(1000, 2000) if rng.random() < noise else 100 + i % period for i in range(n)]


def run_turn(monkeypatch, kind, seq, on_token, n_prompt=48, max_tokens=240, cost=step_ms, threads=None):
    fake = FakeLlama(seq, n_prompt, cost)
    fake.install(monkeypatch)
    gov = None
    if on_token is None:  # the real thread policy, on a quiet machine of two cores
        gov = ThreadGovernor(2, threads, None, fake.set_threads, lambda: 0.0)
        gov.start_turn()
        on_token = gov.on_token
    elif callable(on_token) and hasattr(on_token, "bind"):
        on_token = on_token.bind(fake)
    kv = KvContext(None, None, None, Vocab(None), 100_000, 512, tokens=fake.cache)
    m = Model(kv, threading.Event(), lambda t: b"a", lambda s: [], on_token)
    spec = Speculator(kind)
    out = SpecGenerated()
    req = TurnRequest(1, (), SamplingParams(max_tokens=max_tokens, temperature=0))
    try:
        list(generate_speculative(m, spec, req, 0, (), None, False, out))
    finally:
        spec.close()
    assert out.spec is not None
    return out.spec, fake


class SlowProbes:
    """An ``on_token`` (called before each target step) that gives lookup's plain probe steps (every 32nd) one
    decode thread and every other step two: the plain steps the speed-up was priced at ran slower than the
    drafted ones, as under ``--threads auto`` when the policy flipped the count."""

    def __init__(self):
        self.calls, self.fake = 0, None

    def bind(self, fake):
        self.fake = fake
        return self

    def __call__(self, t_ns, width=1):
        self.calls += 1
        n = 1 if self.calls % PROBE_EVERY == 1 else 2
        if self.fake.threads != n:
            self.fake.set_threads(n, n)


@pytest.mark.parametrize("kind", ["lookup", "auto"])
def test_a_speculative_turn_on_a_quiet_machine_keeps_its_threads(monkeypatch, kind):
    # tokens of one verified batch land 20 µs apart: judged per token they read as preemption (2 → 1)
    figures, fake = run_turn(monkeypatch, kind, text(400, noise=0.05), None)
    assert fake.thread_calls == [2]  # the turn's start only
    assert figures["spec_plain_threads"] == 2
    assert figures["spec_drafted"] > 0


def test_the_speed_up_compares_steps_with_plain_steps_at_the_same_thread_count(monkeypatch):
    seq = text(400)
    steady, _ = run_turn(monkeypatch, "lookup", seq, lambda t, width=1: None)
    # the same turn with its plain probes at one thread (1.6× slower): priced at those, it read ×2.74, not ×1.98
    flipped, fake = run_turn(monkeypatch, "lookup", seq, SlowProbes())
    assert fake.thread_calls.count(1) >= 2
    assert flipped["spec_speedup"] == pytest.approx(steady["spec_speedup"], rel=0.05)
    assert flipped["spec_plain_threads"] == 2  # priced at the plain steps at 2 threads (lookup found no draft)
    assert flipped["spec_plain_step_ms"] == pytest.approx(step_ms(1, 2), rel=0.02)


def test_auto_measures_again_after_a_thread_change():
    auto = AutoPolicy(k_max=3)
    assert [auto.choose() for _ in range(2)] == [0, 0]  # plain steps first, then each draft length
    auto.observe(0, 1, 10.0, threads=2)
    auto.observe(0, 1, 10.0, threads=2)
    assert auto.choose() == 3
    auto.observe(3, 4, 20.0, threads=2)
    assert auto.rate(3) == pytest.approx(0.2) and auto.rate(0) == pytest.approx(0.1)
    auto.observe(3, 4, 32.0, threads=1)  # at another count: nothing measured at 2 threads holds
    assert auto.rate(0) is None and auto.rate(3) == pytest.approx(4 / 32)
    assert auto.choose() == 0


def test_auto_drafts_the_length_whose_steps_made_the_most_tokens_per_ms():
    auto = AutoPolicy(k_max=3)
    made = {0: (1, 10.0), 1: (1, 14.0), 2: (2, 17.0), 3: (4, 20.0)}  # k = 3: 0.2 tok/ms, plain 0.1
    picks = []
    for _ in range(40 + 64):
        picks.append(auto.choose())
        auto.observe(picks[-1], *made[picks[-1]])
    picks = picks[40:]
    assert picks.count(3) >= 56 and set(picks) == {0, 1, 2, 3}  # every length re-measured now and then
    lose = AutoPolicy(k_max=3)
    made = {0: (1, 10.0), 1: (1, 14.0), 2: (1, 17.0), 3: (1, 20.0)}  # drafts rejected: plain wins
    picks = []
    for _ in range(40 + 64):
        picks.append(lose.choose())
        lose.observe(picks[-1], *made[picks[-1]])
    assert picks[40:].count(0) >= 56


def fixed_overhead(width, threads):
    """A verify step that costs 2.5 plain steps whatever its width (a cost that a line through the plain
    step misjudges: two drafted tokens look dearer per token than four)."""
    return PLAIN_MS if width == 1 else 2.5 * PLAIN_MS


@pytest.mark.parametrize("cost", [step_ms, fixed_overhead])
def test_auto_earns_its_name(monkeypatch, cost):
    def speedup(kind, noise):
        seq = text(1200, noise=noise)
        return run_turn(monkeypatch, kind, seq, lambda t, width=1: None, max_tokens=900, cost=cost)[0]["spec_speedup"]

    # text that lookup drafts well: auto drafts too, about as well
    assert speedup("auto", 0.05) > 1.2 and speedup("auto", 0.05) >= 0.93 * speedup("lookup", 0.05)
    # text where drafts are mostly rejected: lookup loses, auto decodes (nearly) plainly
    assert speedup("lookup", 0.5) < 0.97 < speedup("auto", 0.5)


def test_a_draft_model_that_did_not_pay_is_said_after_the_turn():
    def turn(mode, verify_ms):
        steps, t = speculative._Steps(mode), 0
        for i in range(JUDGE_STEPS):
            plain = i % 8 == 0
            end = t + int((10 if plain else verify_ms) * MS)
            steps.add(t, end, 1 if plain else 2, 0 if plain else 3, 0 if plain else 1, plain, 2)
            t = end
        return steps.figures(0)

    note = turn("draft", 40)["spec_note"]  # 2 × 10 ms × (2 + 14 × 2) tokens / (2 × 10 + 14 × 40) ms = ×0.52
    assert note == (
        "the draft model did not pay: this turn decoded at ×0.52 of plain steps (2 threads); "
        "--spec off or lookup is faster"
    )
    assert turn("draft", 15)["spec_note"] is None  # 2 tokens in 15 ms: it pays
    assert turn("lookup", 40)["spec_note"] is None  # lookup's own figures say it (×…) in the phase line


def test_a_draft_model_that_cannot_pay_is_said_before_it_drafts(tmp_path):
    target = tmp_path / "target.gguf"
    target.write_bytes(b"x")
    link = tmp_path / "same.gguf"
    link.symlink_to(target)
    same = draft_wont_pay(str(target), str(link), 100 << 20, 100 << 20)
    assert same is not None and same.startswith(SPEC_WARNING) and "is the target model itself" in same
    big = draft_wont_pay(str(target), str(tmp_path / "big.gguf"), 100 << 20, 60 << 20)
    assert big is not None and "60.0 MiB against 100.0 MiB" in big and "60%" in big
    assert draft_wont_pay(str(target), str(tmp_path / "small.gguf"), 100 << 20, 10 << 20) is None
