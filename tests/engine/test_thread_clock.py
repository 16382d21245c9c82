"""The engine thread's blocked time (chatphase/engine/local/thread_clock.py): a thread that sleeps is blocked, one
that computes is not (whatever else runs: time waiting for a CPU is the run queue's, not blocked), and the words
of it (chatphase/chat/remote_wait.py)."""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import pytest

from chatphase.chat.remote_wait import decode_share, remote_wait_pairs, remote_wait_words
from chatphase.engine.local.thread_clock import PhaseWaits, blocked_ms, thread_sample
from chatphase.engine.metrics import compute_turn_metrics

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread schedstat is Linux's")


def test_blocked_is_the_wall_less_the_cpu_and_the_run_queue():
    assert blocked_ms((0, 0, 0), (50_000_000, 20_000_000, 10_000_000)) == 20.0
    assert blocked_ms((0, 0, 0), (1_000, 900, 200)) == 0.0  # read a few µs apart: never below 0
    assert blocked_ms(None, (1, 1, 1)) is None


@linux
def test_a_sleeping_thread_is_blocked_and_a_computing_one_is_not():
    assert thread_sample() is not None
    waits = PhaseWaits()
    waits.start()
    time.sleep(0.08)  # as the thread sits in recv for a remote device
    waits.mark()
    end = time.perf_counter() + 0.08
    while time.perf_counter() < end:  # as a local decode computes
        pass
    waits.mark()
    assert waits.prefill_ms() is not None and waits.prefill_ms() >= 75
    assert waits.decode_ms() is not None and waits.decode_ms() < 25


def test_one_mark_has_no_decode_and_before_marks_then_calls():
    waits, calls = PhaseWaits(), []
    waits.start()
    hook = waits.before(lambda *a: calls.append(a))
    hook(5, 2)
    assert calls == [(5, 2)] and waits.decode_ms() is None


def metrics(**fields):
    m = compute_turn_metrics(
        t_submit_ns=0, t_prefill_start_ns=0, t_prefill_end_ns=10**8, token_times_ns=[10**8, 2 * 10**8, 3 * 10**8],
        prompt_tokens=10, cached_tokens=0, evaluated_tokens=10, kv_cache_tokens=13, kv_bytes_per_token=1,
        kv_capacity_bytes=100, stop_reason="length",
    )  # fmt: skip
    return replace(m, **fields)


def test_the_words_say_the_prefill_s_wait_and_the_decode_s_share_only_with_rpc_devices():
    assert remote_wait_pairs(metrics()) == [] and remote_wait_words(metrics()) == ""
    m = metrics(remote_wait_prefill_ms=80.0, remote_wait_decode_ms=150.0)  # decode 200 ms
    assert decode_share(m) == 0.75
    assert remote_wait_pairs(m) == [
        ("RPC wait prefill ms", "80.0"), ("RPC wait decode ms", "150.0"), ("RPC share of decode", "75%"),
    ]  # fmt: skip
    assert remote_wait_words(m) == "waited on RPC devices 80.0 ms of the TTFT, 75% of the decode · "
