"""``bench --interference`` over ``--server`` against the real llama-server built from the vendored source (the
tools of ``scripts/llama_build.sh``): K streams, a newcomer, the server's batching settings as it exposes them.
Seconds on the bundled model. Where the tools are not built the test skips, unless ``CHATPHASE_REQUIRE_LLAMA_TOOLS=1``
(``.ci/run``, which builds them first) turns the skip into a failure."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from remote_support import free_port, stop_process

from benchmarks import harness
from chatphase.cli import main

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def llama_server(default_model_path):
    """A llama-server with 3 slots (2 streams + the newcomer), ``-b 64``; yields its URL."""
    folder = harness.tools_dir()
    binary = folder / "llama-server" if folder else None
    if binary is None or not binary.is_file():
        message = "llama.cpp's tools are not built: run scripts/llama_build.sh"
        if os.environ.get("CHATPHASE_REQUIRE_LLAMA_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    port = free_port()
    argv = [str(binary), "-m", str(default_model_path), "--host", "127.0.0.1", "--port", str(port), "-np", "3",
            "-c", "1536", "-t", "1", "-b", "64", "-ub", "64"]  # fmt: skip
    argv += harness.repack_args("llama-server", harness.repack())  # off on an AMX CPU whose build faults there
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=harness.tool_env()
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if not harness.wait_ready(proc, url, 60):
            assert proc.poll() is None, f"llama-server exited with {proc.returncode}"
            pytest.fail("llama-server did not answer within 60 s")
        yield url
    finally:
        stop_process(proc)


def test_streams_and_a_newcomer_on_a_real_llama_server(llama_server, default_model_path, tmp_path, capsys):
    out = tmp_path / "remote.json"
    argv = ["bench", "--server", llama_server, "--model", str(default_model_path), "--interference", "2",
            "--prompt-lengths", "160", "--gen", "3", "--reps", "1", "--warmup", "0", "--format", "json",
            "-o", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert data["kind"] == "interference" and data["settings"]["engine"]["backend"] == "remote"
    batching = data["settings"]["server_batching"]
    assert batching["total_slots"] == 3 and batching["n_ctx_per_slot"] == 512 and batching["slots"] == 3
    assert batching["not_exposed"] == ["n_batch", "n_ubatch", "kv_unified"]
    (sample,) = data["samples"]
    assert sample["chunk"] == 0 and sample["newcomer_ttft_ms"] > 0
    assert len(sample["baseline_gaps_ms"]) >= 2 * 3 and sample["window_gaps_ms"]  # both streams, before and during
    assert sample["server_prompt_ms"] is not None and sample["server_prompt_ms"] <= sample["newcomer_ttft_ms"]


def test_more_streams_than_slots_is_one_line(llama_server, default_model_path, capsys):
    argv = ["bench", "--server", llama_server, "--model", str(default_model_path), "--interference", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("has 3 (start it with --parallel 4)") and not any("Traceback" in e for e in err)


def test_a_rate_sweep_on_a_real_llama_server(llama_server, default_model_path, tmp_path, capsys):
    out = tmp_path / "rates.json"
    argv = ["bench", "--server", llama_server, "--model", str(default_model_path), "--rates", "4,16", "--requests",
            "4", "--duration", "10", "--gen", "3", "--prompt-lengths", "24", "--slo", "ttft=60000,tpot=60000",
            "--max-concurrency", "3", "--format", "json", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert data["kind"] == "rates" and [s["rate"] for s in data["summaries"]] == [4.0, 16.0]
    for summary, records in zip(data["summaries"], data["records"], strict=True):
        assert len(records) == 4 and summary["sent"] + summary["over_capacity"] == 4  # none dropped silently
        assert summary["completed"] == summary["sent"] and summary["goodput_requests_per_s"] is not None
        assert all(len(r["token_ms"]) == 3 for r in records if r["status"] == "ok")
        assert summary["ttft_ms"][0] is not None and summary["itl_ms"][0] is not None


def test_cancel_keeps_the_rates_measured_so_far(llama_server, default_model_path):
    import threading

    from chatphase.bench.core.events import RunDone
    from chatphase.bench.rates.run import RatePlan, RateProgress, RateRun
    from chatphase.commands.server_options import remote_bench_options
    from chatphase.models.gguf_meta import read_model_info
    from chatphase.settings.schema import Settings

    settings = Settings().with_overrides(server=llama_server)
    info = read_model_info(default_model_path)
    plan = RatePlan(rates=(8.0, 0.05), prompt_lengths=(16,), gen_tokens=2, requests=2, duration_s=60)
    run = RateRun(info, settings.engine, plan, roofline=False, **remote_bench_options(settings, info))
    events = []
    for event in run:
        events.append(event)
        if isinstance(event, RateProgress):  # the second rate waits 20 s for its first request: cancel it
            threading.Timer(0.3, run.cancel).start()
    done = events[-1]
    assert isinstance(done, RunDone) and done.result.cancelled
    assert [s.rate for s in done.result.summaries] == [8.0, 0.05] and done.result.summaries[0].completed == 2
