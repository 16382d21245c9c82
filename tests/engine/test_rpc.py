"""llama.cpp's RPC servers (``--rpc``) without a real server: the one parser of the list and its trust rule, the
probe against scripted loopback sockets (a server of this protocol, another protocol, a silent one, a refused
port), the registration's refusals, and RPC devices in the load's figures (buffers, placement) from llama.cpp's own
line formats. The real servers: tests/engine/test_rpc_servers.py."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import DeviceInfo, LayerPlacement
from chatphase.engine.local import ggml_devices, rpc
from chatphase.engine.local.ggml_devices import buffer_sizes
from chatphase.engine.rpc_endpoints import RpcEndpoint, parse_rpc
from chatphase.errors import UsageError
from chatphase.settings.schema import BY_KEY

GiB = 2**30


# -- the list and its trust rule -------------------------------------------------------------------------------
def test_a_list_of_servers_is_read_in_its_order():
    got = parse_rpc(" 127.0.0.1:50052, 192.168.1.20:50053 ,gpu-box.lan:1,10.0.0.7:65535")
    assert [str(e) for e in got] == ["127.0.0.1:50052", "192.168.1.20:50053", "gpu-box.lan:1", "10.0.0.7:65535"]
    assert parse_rpc(None) == () and parse_rpc("  ") == ()
    assert parse_rpc("LocalHost:50052") == (RpcEndpoint("localhost", 50052),)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("127.0.0.1", "is not HOST:PORT"),
        ("127.0.0.1:", "is not HOST:PORT"),
        (":50052", "is not HOST:PORT"),
        ("127.0.0.1:50052,", "'' is not HOST:PORT"),
        ("127.0.0.1:port", "is not HOST:PORT"),
        ("127.0.0.1:-1", "is not HOST:PORT"),
        ("http://127.0.0.1:50052", "is not HOST:PORT"),
        ("bad host:50052", "is not HOST:PORT"),
        ("127.0.0.1:0", "the port must be 1 to 65535"),
        ("127.0.0.1:70000", "the port must be 1 to 65535"),
        ("[::1]:50052", "not IPv6"),
        ("127.0.0.1:50052,127.0.0.1:50052", "lists 127.0.0.1:50052 twice"),
    ],
)
def test_a_bad_list_is_one_line_naming_the_item(text, says):
    with pytest.raises(UsageError) as err:
        parse_rpc(text)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.0.2", "169.254.3.4"])
def test_loopback_private_and_link_local_addresses_are_trusted(address):
    assert parse_rpc(f"{address}:50052") == (RpcEndpoint(address, 50052),)


def test_a_public_address_needs_the_flag_that_says_the_protocol_is_unauthenticated():
    with pytest.raises(UsageError, match=r"no authentication or encryption.*--rpc-unauthenticated-ok"):
        parse_rpc("8.8.8.8:50052")
    assert parse_rpc("8.8.8.8:50052", unauthenticated_ok=True) == (RpcEndpoint("8.8.8.8", 50052),)
    with pytest.raises(UsageError, match=r"8\.8\.8\.8"):
        EngineConfig(rpc="127.0.0.1:1,8.8.8.8:50052").validate()
    assert EngineConfig(rpc="8.8.8.8:50052", rpc_unauthenticated_ok=True).validate().rpc_endpoints()


def test_the_settings_have_a_flag_a_variable_and_a_settings_screen_field():
    rpc_field, ok_field = BY_KEY["rpc"], BY_KEY["rpc_unauthenticated_ok"]
    assert rpc_field.metadata["flags"] == ("--rpc",) and rpc_field.env == "CHATPHASE_RPC"
    assert rpc_field.type is str and rpc_field.optional and rpc_field.reload == "engine"
    assert ok_field.metadata["flags"] == ("--rpc-unauthenticated-ok",) and ok_field.type is bool
    assert "label" in rpc_field.metadata and "label" in ok_field.metadata


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--rpc", "8.8.8.8:50052"], {}, "--rpc-unauthenticated-ok"),
        ([], {"CHATPHASE_RPC": "nohost"}, "'nohost' is not HOST:PORT"),
    ],
)
def test_ask_refuses_a_bad_list_in_one_line_before_loading(args, env, says, tmp_path):
    import os

    environ = {**os.environ, **env, "XDG_CONFIG_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "chatphase", "ask", *args, "--no-save", "hi"],
        capture_output=True, text=True, timeout=60, env=environ,
    )  # fmt: skip
    assert done.returncode == 2
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


# -- the probe, against scripted servers on loopback ---------------------------------------------------------
@contextmanager
def scripted(answer: bytes | None) -> Iterator[tuple[int, list[bytes]]]:
    """A one-connection server on 127.0.0.1: reads the 33-byte HELLO, then sends ``answer`` and closes (``None``:
    sends nothing until the client goes). Yields ``(port, [what it received])``."""
    srv = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(5)
            data = b""
            while len(data) < 33:
                chunk = conn.recv(33 - len(data))
                if not chunk:
                    break
                data += chunk
            got.append(data)
            if answer is not None:
                conn.sendall(answer)
                return
            try:
                conn.recv(1)  # until the client closes
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1], got
    finally:
        srv.close()
        thread.join(5)


def hello_reply(major: int, minor: int, patch: int) -> bytes:
    return struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24)


def test_a_server_of_this_protocol_passes_and_got_llama_cpps_hello():
    with scripted(hello_reply(rpc.PROTO_MAJOR, rpc.PROTO_MINOR, 3)) as (port, got):
        rpc.probe(RpcEndpoint("127.0.0.1", port), timeout_s=5)
    # ggml-rpc.cpp send_rpc_cmd: the command byte 14, the request size as 8 bytes, 24 bytes of conn_caps
    assert got == [bytes([14]) + struct.pack("<Q", 24) + bytes(24)]


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (hello_reply(rpc.PROTO_MAJOR + 1, 0, 0), f"speaks RPC protocol {rpc.PROTO_MAJOR + 1}.0.0"),
        (hello_reply(rpc.PROTO_MAJOR, rpc.PROTO_MINOR + 1, 0), "run the rpc-server built from the same llama.cpp"),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "not as a llama.cpp rpc-server"),
        (struct.pack("<Q", 28) + b"\x07", "cannot connect (the server closed the connection)"),
    ],
)
def test_a_server_that_answers_otherwise_is_one_line(answer, says):
    with scripted(answer) as (port, _):
        with pytest.raises(UsageError) as err:
            rpc.probe(RpcEndpoint("127.0.0.1", port), timeout_s=5)
    assert says in str(err.value) and f"127.0.0.1:{port}" in str(err.value)


def test_a_silent_server_is_one_line_within_the_timeout():
    with scripted(None) as (port, _):
        with pytest.raises(UsageError, match=r"did not answer within 0\.3 s"):
            rpc.probe(RpcEndpoint("127.0.0.1", port), timeout_s=0.3)


def test_a_refused_port_is_one_line():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed when the block ends: nobody listens there
    with pytest.raises(UsageError, match=f"127.0.0.1:{port} refused the connection: is rpc-server running"):
        rpc.probe(RpcEndpoint("127.0.0.1", port))


def test_a_name_is_judged_by_the_address_it_resolves_to(monkeypatch):
    def resolve(host, port, *args):
        if host == "nowhere.lan":
            raise socket.gaierror(-2, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("8.8.4.4", port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with pytest.raises(UsageError, match=r"--rpc far.example:50052 \(8.8.4.4\) is outside loopback"):
        rpc.probe(RpcEndpoint("far.example", 50052))
    with pytest.raises(UsageError, match=r"cannot resolve nowhere\.lan"):
        rpc.probe(RpcEndpoint("nowhere.lan", 50052))


# -- the registration --------------------------------------------------------------------------------------------
def test_a_build_without_the_rpc_backend_says_how_to_get_one():
    if ggml_devices.has_rpc():
        pytest.skip("the loaded llama.cpp has the RPC backend (LLAMA_CPP_LIB_PATH names an RPC build)")
    with pytest.raises(UsageError) as err:
        rpc.register((RpcEndpoint("127.0.0.1", 50052),))
    assert "has none" in str(err.value) and "LLAMA_CPP_LIB_PATH" in str(err.value)
    assert rpc.register(()) == 0  # no servers, nothing asked of the build


def test_nothing_is_registered_unless_every_server_answers(monkeypatch):
    added: list[str] = []
    monkeypatch.setattr(ggml_devices, "has_rpc", lambda: True)
    monkeypatch.setattr(ggml_devices, "add_rpc_server", lambda e: added.append(e) or 1)
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with scripted(hello_reply(rpc.PROTO_MAJOR, 0, 0)) as (good, _):
        with pytest.raises(UsageError, match="refused"):
            rpc.register((RpcEndpoint("127.0.0.1", good), RpcEndpoint("127.0.0.1", port)))
    assert added == []
    with scripted(hello_reply(rpc.PROTO_MAJOR, 0, 0)) as (good, _):
        assert rpc.register((RpcEndpoint("127.0.0.1", good),)) == 1
    assert added == [f"127.0.0.1:{good}"]


# -- RPC devices in the load's figures --------------------------------------------------------------------------
A, B = "127.0.0.1:50052", "127.0.0.1:50053"
# two rpc-servers of one device each: ggml names the devices RPC0, RPC1 in the order added, and each server's
# buffer type after the server's device 0 and its endpoint (ggml-rpc.cpp ggml_backend_rpc_add_server,
# ggml_backend_rpc_buffer_type)
RPC0 = DeviceInfo("RPC0", A, "gpu", 20 * GiB, 24 * GiB, host=A, buffer_type=f"RPC0[{A}]")
RPC1 = DeviceInfo("RPC1", B, "gpu", 20 * GiB, 24 * GiB, host=B, buffer_type=f"RPC0[{B}]")
CPU = DeviceInfo("CPU", "Intel(R) Xeon(R) Processor", "cpu", 23 * GiB, 24 * GiB)
MIB = {
    ("model", "CPU_Mapped"): 28.0,
    ("model", f"RPC0[{A}]"): 40.0,
    ("model", f"RPC0[{B}]"): 41.0,
    ("KV", f"RPC0[{A}]"): 45.0,
    ("KV", f"RPC0[{B}]"): 45.0,
    ("compute", f"RPC0[{A}]"): 3.0,
    ("compute", "CPU"): 1.5,
}


def test_rpc_buffers_are_on_their_device():
    buffers = buffer_sizes(MIB, (RPC0, RPC1, CPU))
    on = {b.buffer for b in buffers if b.on_device}
    assert on == {f"RPC0[{A}]", f"RPC0[{B}]"}


def test_the_placement_names_each_rpc_device_with_its_host_layers_and_bytes():
    from dataclasses import replace

    from dashboard_support import loaded_model

    from chatphase.ui.dashboard.system_figures import device_lines, placement_lines

    places = (
        LayerPlacement("RPC0", tuple(range(15)), False),
        LayerPlacement("RPC1", tuple(range(15, 30)), True),
    )
    model = replace(
        loaded_model(gpu=True),
        devices=(RPC0, RPC1, CPU),
        buffers=buffer_sizes(MIB, (RPC0, RPC1, CPU)),
        placement=places,
    )
    assert placement_lines(model) == [
        f"RPC0 at {A} · layers 0-14 · weights 40.0 MiB · KV 45.0 MiB · compute 3.0 MiB",
        f"RPC1 at {B} · layers 15-29 + output · weights 41.0 MiB · KV 45.0 MiB",
    ]
    assert [line.split(" · ")[:2] for line in device_lines(model)] == [["RPC0", A], ["RPC1", B]]
    assert all("engine holds" in line for line in device_lines(model))
