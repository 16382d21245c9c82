"""The parallel sweep over ``--server``: N concurrent streams against a loopback llama-server stand-in started
by each test (:class:`remote_support.SlotServer`): the streams overlap, per-stream TTFT and ITL and the
aggregate come back, a server with fewer slots runs only the N it allows (and says so), a slot too small
for one stream is refused before any request, and cancel hangs every stream up."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from bench_support import CharTokenizer
from fake_engine import fake_model_info
from remote_support import SlotServer

from chatphase.bench.core.events import BenchNotice, RunDone
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.parallel.run import ParallelRun
from chatphase.bench.parallel.sweep import ParallelPlan
from chatphase.engine.config import EngineConfig
from chatphase.engine.remote.engine import RemoteEngine
from chatphase.errors import UsageError

pytestmark = pytest.mark.timeout(60)


def _bench(url: str, plan: ParallelPlan) -> ParallelRun:
    return ParallelRun(
        fake_model_info(),
        EngineConfig(),
        plan,
        engine_factory=lambda info, config: RemoteEngine(url, read_timeout_s=20),
        roofline=False,
        builder=PromptBuilder(CharTokenizer()),
    )


def test_n_concurrent_streams_with_per_stream_ttft_itl_and_the_aggregate():
    plan = ParallelPlan(n_seqs=(1, 4), prompt_lengths=(12,), gen_tokens=6, reps=2, warmup=0)
    with SlotServer(total_slots=4) as srv:
        events = list(_bench(srv.url, plan))
    result = events[-1].result
    assert isinstance(events[-1], RunDone) and not result.cancelled
    assert len(srv.bodies) == 2 * 1 + 2 * 4 and srv.max_active == 4  # the four streams of a rep overlap
    assert all(len(b["prompt"]) == 12 and b["max_tokens"] == 7 and b["ignore_eos"] is True for b in srv.bodies)
    assert len({tuple(b["prompt"]) for b in srv.bodies[2:6]}) == 4  # each stream its own prompt
    one, four = result.parallel
    assert (one.n_seq, four.n_seq) == (1, 4) and four.ttft_ms.n == 8  # every stream of both reps
    for cell in (one, four):
        assert cell.aggregate_decode_tokens_per_s.n == 2 and cell.decode_tokens_per_s.mean > 0
        assert cell.step_ms.mean > 0 and cell.itl_ms_p95.mean >= cell.itl_ms_p50.mean > 0
        assert cell.kv_cache_bytes is None and cell.step_bytes is None  # a server does not report its KV
    assert [s.decode_tokens for s in result.parallel_samples] == [7, 7, 28, 28]  # the server's counts
    assert result.settings["engine"]["backend"] == "remote"
    assert not [t for t in threading.enumerate() if t.name.startswith("chatphase-stream")]


def test_fewer_slots_than_n_runs_what_the_server_allows_and_says_so():
    plan = ParallelPlan(n_seqs=(1, 2, 4, 8), prompt_lengths=(8,), gen_tokens=2, reps=1, warmup=0)
    with SlotServer(total_slots=2) as srv:
        events = list(_bench(srv.url, plan))
    notices = [e.text for e in events if isinstance(e, BenchNotice)]
    assert len(notices) == 1 and "has 2 slots: N = 4, 8 would wait" in notices[0] and "only N = 1, 2 run" in notices[0]
    result = events[-1].result
    assert [c.n_seq for c in result.parallel] == [1, 2] and srv.max_active == 2
    assert notices[0] in result.settings["notes"]


def test_a_slot_too_small_for_one_stream_is_refused_before_any_request():
    plan = ParallelPlan(n_seqs=(2,), prompt_lengths=(500,), gen_tokens=32, reps=1, warmup=0)
    with SlotServer(slot_n_ctx=512) as srv:
        with pytest.raises(UsageError, match=r"one stream needs 533 tokens .* holds 512"):
            list(_bench(srv.url, plan))
    assert srv.bodies == []


def test_cancel_hangs_every_stream_up():
    plan = ParallelPlan(n_seqs=(3,), prompt_lengths=(8,), gen_tokens=4, reps=1, warmup=0)
    with SlotServer(total_slots=4, endless=True) as srv:
        srv.expect = 3
        run = _bench(srv.url, plan)
        out: list = []
        worker = threading.Thread(target=lambda: out.extend(run), daemon=True)
        worker.start()
        assert srv.all_streaming.wait(20)
        time.sleep(0.05)  # the first chunks have arrived
        run.cancel()
        worker.join(10)
        assert not worker.is_alive()
        deadline = time.monotonic() + 5
        while srv.hung_up < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.hung_up == 3
    assert out[-1].result.cancelled and out[-1].result.parallel == []


def test_cli_over_a_server_prints_the_slot_notice_once(default_model_path):
    """As the CLI runs (a fresh process: --model gives the vocabulary)."""
    with SlotServer(total_slots=1) as srv:
        proc = subprocess.run(
            [sys.executable, "-m", "chatphase", "bench", "--server", srv.url, "--model", str(default_model_path)]
            + ["--parallel", "1,2", "--prompt-lengths", "8", "--gen", "2", "--reps", "1", "--warmup", "0"]
            + ["--format", "csv"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("chatphase: warning:")]
    assert len(warnings) == 1 and "has 1 slot: N = 2 would wait" in warnings[0]
    rows = proc.stdout.splitlines()
    assert len(rows) == 2 and rows[1].startswith("parallel,8,1,2,1,")
