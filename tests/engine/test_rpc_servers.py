"""``chatphase ask --rpc`` against two real rpc-servers on 127.0.0.1 (``ggml-rpc-server`` of the tools build,
``scripts/llama_build.sh``, whose libraries carry the RPC backend and are given to the bindings with
``LLAMA_CPP_LIB_PATH``), on the default model: the layers split across both servers as llama.cpp's own load lines
say, the greedy reply equals the one without them, and a server killed mid-reply ends the turn with one line and
the partial reply kept. Where the tools are not built (or were built without the RPC backend) these tests skip,
unless ``CHATPHASE_REQUIRE_LLAMA_TOOLS=1`` turns the skip into a failure. The parts without a server:
tests/engine/test_rpc.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from remote_support import free_port, stop_process

from benchmarks import harness
from chatphase.bench.rpc.servers import LocalRpcServers
from chatphase.engine.memory_plan import layer_ranges
from chatphase.errors import UsageError

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

#: the same settings for every run: greedy, a short reply, a small context; flash attention and the extra
#: buffer types (weight repacking) fixed, so that the local run and the split one compute alike.
SAME = ["--temperature", "0", "--n-ctx", "512", "--flash-attn", "off", "--extra-bufts", "off", "--no-save"]
PROMPT = "Name three colours."
#: llama.cpp's lines at the load (src/llama-model.cpp load_tensors; debug level for the layers).
LAYER_LINE = re.compile(r"load_tensors: layer\s+(\d+) assigned to device (\S+),")
BUFFER_LINE = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s*([\d.]+) MiB")


def _tools() -> Path:
    """The tools build's folder, with ggml-rpc-server and RPC libraries (skips, or fails under
    CHATPHASE_REQUIRE_LLAMA_TOOLS=1, where there are none)."""
    folder = harness.tools_dir()
    message = None
    if folder is None or not (folder / "ggml-rpc-server").is_file():
        message = "ggml-rpc-server is not built: run scripts/llama_build.sh"
    elif (
        not list(folder.glob("libggml-rpc.so*"))
        and b"ggml_backend_rpc_add_server" not in (folder / "libggml.so").read_bytes()
    ):
        message = f"the tools build in {folder} has no RPC backend: run scripts/llama_build.sh"
    if message is not None:
        if os.environ.get("CHATPHASE_REQUIRE_LLAMA_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    assert folder is not None
    return folder


@pytest.fixture
def servers(tmp_path) -> Iterator[list[tuple[subprocess.Popen, str]]]:
    """Two rpc-servers on free loopback ports, one CPU thread each (the RPC sweep's own starter,
    :class:`~chatphase.bench.rpc.servers.LocalRpcServers`): ``[(process, "127.0.0.1:PORT")]``; always stopped."""
    log = tmp_path / "rpc.log"
    try:
        with LocalRpcServers(2, threads=1, binary=_tools() / "ggml-rpc-server", log_path=log) as started:
            yield [
                (proc, f"{host}:{port}") for proc, (host, port) in zip(started.procs, started.endpoints, strict=True)
            ]
    except UsageError as exc:
        pytest.fail(f"{exc}: {log.read_text(errors='replace') if log.exists() else ''}")


def _env(tmp_path: Path, name: str) -> dict[str, str]:
    """The environment of one ``ask``: the tools build's libraries, its own log folder, llama.cpp's debug lines."""
    return {
        **os.environ,
        "LLAMA_CPP_LIB_PATH": str(_tools()),
        "CHATPHASE_LOG_DIR": str(tmp_path / name),
        "CHATPHASE_LOG_LEVEL": "debug",
    }


def _ask(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "chatphase", "ask", *SAME, *args],
        capture_output=True, text=True, timeout=180, env=_env(tmp_path, name),
    )  # fmt: skip


def _load_lines(log: Path) -> tuple[dict[int, str], dict[str, float]]:
    """The last load's layer devices and model buffers (MiB) in an engine log."""
    text = log.read_text(errors="replace").rsplit("--- chatphase: loading", 1)[-1]
    layers = {int(m.group(1)): m.group(2) for m in LAYER_LINE.finditer(text)}
    buffers = {m.group(1): float(m.group(2)) for m in BUFFER_LINE.finditer(text)}
    return layers, buffers


def test_ask_splits_the_layers_across_two_rpc_servers_and_replies_as_locally(servers, tmp_path):
    (_, a), (_, b) = servers
    split = _ask(tmp_path, "split", "--json", "--max-tokens", "16", "--rpc", f"{a},{b}", PROMPT)
    assert split.returncode == 0, split.stderr
    data = json.loads(split.stdout)
    model = data["model"]
    n_layer = model["n_layer"]
    places = {p["device"]: p for p in model["placement"]}
    assert places["RPC0"]["host"] == a and places["RPC1"]["host"] == b
    assert places["RPC0"]["layers"] and places["RPC1"]["layers"]

    # the placement is llama.cpp's own: its layer lines and its model buffer lines at the load
    layers, mib = _load_lines(tmp_path / "split" / "engine.log")
    assert set(layers) == set(range(n_layer + 1))  # the repeating layers and the output layer
    for device, place in places.items():
        mine = tuple(sorted(i for i, d in layers.items() if d == device and i < n_layer))
        assert place["layers"] == layer_ranges(mine)
        assert place["output_layer"] == (layers[n_layer] == device)
    buffers = {b["buffer"]: b for b in model["buffers"] if b["kind"] == "model"}
    for endpoint in (a, b):
        name = f"RPC0[{endpoint}]"  # each server's device 0 (ggml-rpc.cpp ggml_backend_rpc_buffer_type)
        assert buffers[name]["on_device"] and buffers[name]["bytes"] == round(mib[name] * 2**20)
    devices = {d["name"]: d for d in model["devices"]}
    assert devices["RPC0"]["host"] == a and devices["RPC1"]["host"] == b

    # at temperature 0 the reply is the one without the servers (the same libraries, the same settings)
    local = _ask(tmp_path, "local", "--json", "--max-tokens", "16", PROMPT)
    assert local.returncode == 0, local.stderr
    assert data["turns"][0]["reply"] == json.loads(local.stdout)["turns"][0]["reply"]
    # the network's share: the split turn waited on its devices (every layer is remote), the local one has none
    split_m, local_m = data["turns"][0]["metrics"], json.loads(local.stdout)["turns"][0]["metrics"]
    assert split_m["remote_wait_prefill_ms"] > 0 and split_m["remote_wait_decode_ms"] > 0
    assert local_m["remote_wait_prefill_ms"] is None and local_m["remote_wait_decode_ms"] is None
    assert not any(p["device"].startswith("RPC") for p in json.loads(local.stdout)["model"]["placement"])


def test_a_server_killed_mid_reply_ends_the_turn_in_one_line_and_keeps_the_partial_reply(servers, tmp_path):
    (_, a), (victim, b) = servers
    prompt = "Write a long story about a dragon who learns to bake bread, with many details."
    proc = subprocess.Popen(
        [sys.executable, "-m", "chatphase", "ask", *SAME, "--max-tokens", "400", "--rpc", f"{a},{b}", prompt],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path, "killed"),
    )  # fmt: skip
    out: list[bytes] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        while chunk := os.read(proc.stdout.fileno(), 4096):
            out.append(chunk)
            if b"".join(out).strip():
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(150), "no reply text before the timeout"
        before = b"".join(out).decode(errors="replace").strip()
        victim.send_signal(signal.SIGKILL)
        stderr = proc.communicate(timeout=120)[1].decode(errors="replace")
    finally:
        stop_process(proc)
    reader.join(10)
    if proc.returncode == 0:
        pytest.skip("the reply ended before the server was killed (nothing to test on this run)")
    text = b"".join(out).decode(errors="replace")
    assert proc.returncode != 0
    # one line says the turn ended (notes of the load may come before it); ggml's abort stays in the engine log
    ended = [line for line in stderr.splitlines() if "engine" in line and ("died" in line or "stopped" in line)]
    assert len(ended) == 1 and "Traceback" not in stderr and "GGML" not in stderr, stderr
    assert f"an rpc-server of --rpc {a},{b} may have gone away" in ended[0]
    assert text.strip().startswith(before) and before  # the partial reply stays printed


def test_a_refusing_server_among_the_list_is_one_line_before_the_load(servers, tmp_path):
    (_, a), _ = servers
    closed = free_port()  # nobody listens there
    done = _ask(tmp_path, "refused", "--max-tokens", "4", "--rpc", f"{a},127.0.0.1:{closed}", PROMPT)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"chatphase: --rpc 127.0.0.1:{closed} refused the connection: is rpc-server running there?"
    ]


def test_llama_server_over_rpc_behind_server_shows_its_timings(servers, tmp_path, default_model_path):
    """Remote mode: llama-server (the same tools build) with its layers on an rpc-server, behind ``--server``: the
    turn carries the server's own timings, and llama-server's log shows its weights on the RPC device."""
    from tests.engine.test_remote_slots_server import _start

    (_, a), _ = servers
    log = tmp_path / "llama-server.log"
    server, url = _start(str(default_model_path), log, "--rpc", a, "-ngl", "99", "-lv", "4")
    try:
        done = _ask(tmp_path, "served", "--json", "--max-tokens", "8", "--server", url, PROMPT)
    finally:
        stop_process(server)
    assert done.returncode == 0, done.stderr
    turn = json.loads(done.stdout)["turns"][0]
    timings = turn["server_timings"]
    assert timings and timings["prompt_n"] > 0 and timings["predicted_n"] > 0 and timings["predicted_ms"] > 0, timings
    assert turn["metrics"]["ttft_ms"] > 0 and turn["reply"]
    buffers = dict(BUFFER_LINE.findall(log.read_text(errors="replace")))  # its load lines at -lv 4
    assert float(buffers[f"RPC0[{a}]"]) > 0, buffers
