"""The rpc-servers of ``--rpc`` (:attr:`chatphase.engine.config.EngineConfig.rpc`) registered before the model
loads, so that ``llama_model_load`` splits the layers across their devices and the local ones (RPC devices first,
llama.cpp's src/llama.cpp: "add RPC servers at the front of the list to minimize network transfers").

ggml's client aborts the process where it cannot connect to a server or the handshake fails (ggml-rpc.cpp
``rpc_dispatcher::start``: ``GGML_ABORT("Failed to connect to ...")``), and blocks without a timeout on a server
that accepts but does not answer (one rpc-server serves one client at a time). So each server is probed first,
here: resolve its name (and judge the address, :func:`chatphase.engine.rpc_endpoints.untrusted`), connect, and
exchange the protocol's HELLO within :data:`PROBE_TIMEOUT_S`; each failure is one line. A server that dies after
this (between the probe and the registration, or mid-turn) aborts the engine's process: the engine host reports
that as one line, the conversation stays, and the engine can be started again (without ``--rpc``).
"""

from __future__ import annotations

import socket
import struct

from chatphase.engine.local import ggml_devices
from chatphase.engine.rpc_endpoints import RpcEndpoint, untrusted
from chatphase.errors import UsageError

#: the most seconds the resolution-free part of a probe waits: the TCP connect, then the HELLO's answer.
PROBE_TIMEOUT_S = 3.0
#: the protocol this llama.cpp speaks (ggml/include/ggml-rpc.h ``RPC_PROTO_MAJOR_VERSION`` / ``MINOR``): a server
#: must answer the same major and at most this minor (ggml-rpc.cpp ``negotiate_hello``).
PROTO_MAJOR, PROTO_MINOR = 7, 0
#: ``RPC_CMD_HELLO`` (fixed at 14 across versions) and the request's conn_caps bytes (transport.h
#: ``RPC_CONN_CAPS_SIZE``); the answer is major, minor, patch, one pad byte and the server's caps.
_HELLO, _CAPS = 14, 24
_HELLO_REPLY = 4 + _CAPS
#: how a user gets a build with the RPC backend (docs/rpc.md).
HOW_TO_GET_RPC = (
    "build one with scripts/llama_build.sh and set LLAMA_CPP_LIB_PATH to the folder it prints (docs/rpc.md)"
)


def register(endpoints: tuple[RpcEndpoint, ...], unauthenticated_ok: bool = False) -> int:
    """Probe each server (:func:`probe`), then add their devices to ggml's registry; the count of devices added.
    Nothing is registered unless every server answers.

    Raises:
        UsageError: one line: the build has no RPC backend, a server is unreachable, refuses, answers another
            protocol, has no devices, or resolves to an untrusted address.
    """
    if not endpoints:
        return 0
    if not ggml_devices.has_rpc():
        raise UsageError(f"--rpc needs llama.cpp's RPC backend, and this build has none: {HOW_TO_GET_RPC}")
    for endpoint in endpoints:
        probe(endpoint, unauthenticated_ok)
    added = 0
    for endpoint in endpoints:
        try:
            added += ggml_devices.add_rpc_server(str(endpoint))
        except RuntimeError as exc:  # RpcUnavailable included
            raise UsageError(f"--rpc: {exc}") from None
    return added


def probe(endpoint: RpcEndpoint, unauthenticated_ok: bool = False, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Check that an rpc-server of this protocol answers at ``endpoint``: resolve it (IPv4, as ggml), judge its
    address, connect, and exchange HELLO, each within ``timeout_s``. The server then serves its next client.

    Raises:
        UsageError: one line naming the endpoint and what failed.
    """
    try:
        address = str(socket.getaddrinfo(endpoint.host, endpoint.port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except (OSError, UnicodeError) as exc:
        raise UsageError(f"--rpc {endpoint}: cannot resolve {endpoint.host} ({_why(exc)})") from None
    if why := untrusted(address, unauthenticated_ok):
        raise UsageError(why if address == endpoint.host else why.replace(address, f"{endpoint} ({address})", 1))
    try:
        with socket.create_connection((address, endpoint.port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
            size = struct.unpack("<Q", _read(sock, 8))[0]
            if size != _HELLO_REPLY:
                raise UsageError(f"--rpc {endpoint} answered, but not as a llama.cpp rpc-server of this version")
            major, minor, patch = _read(sock, size)[:3]
    except ConnectionRefusedError:
        raise UsageError(f"--rpc {endpoint} refused the connection: is rpc-server running there?") from None
    except TimeoutError:
        raise UsageError(
            f"--rpc {endpoint} did not answer within {timeout_s:g} s (an rpc-server serves one client at a time: "
            "is another using it?)"
        ) from None
    except OSError as exc:
        raise UsageError(f"--rpc {endpoint}: cannot connect ({_why(exc)})") from None
    if major != PROTO_MAJOR or minor > PROTO_MINOR:
        raise UsageError(
            f"--rpc {endpoint} speaks RPC protocol {major}.{minor}.{patch}, this llama.cpp {PROTO_MAJOR}.{PROTO_MINOR}: "
            "run the rpc-server built from the same llama.cpp version"
        )


def _read(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes, or :class:`ConnectionResetError` where the server closes first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        data += chunk
    return data


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
