"""llama.cpp's RPC servers as a setting (``--rpc HOST:PORT[,HOST:PORT…]``): the one reader of the list and the one
rule of which addresses are trusted.

llama.cpp's RPC protocol has no authentication and no encryption (its rpc-server README: "never run the RPC server
on an open network or in a sensitive environment"): whoever reaches a server runs graphs on it, and the weights and
activations cross the wire in the clear. So an address outside loopback, the private ranges and link-local is
refused unless the user says they know (``--rpc-unauthenticated-ok``). A host name is judged by the address it
resolves to, when the engine connects (:mod:`chatphase.engine.local.rpc`); ``localhost`` is loopback.

ggml's client (ggml/src/ggml-rpc/ggml-rpc.cpp ``parse_endpoint``, transport.cpp ``socket_t::connect``) splits an
endpoint at its first ``:`` and resolves the host with ``gethostbyname``: IPv4 only, so a bracketed IPv6 address is
refused here rather than misread there.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from chatphase.errors import UsageError

#: the flag that accepts an address outside the trusted ranges (named in the refusal).
UNAUTHENTICATED_FLAG = "--rpc-unauthenticated-ok"
#: a host name (RFC 1123 labels) or a dotted IPv4 address.
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")  # fmt: skip


@dataclass(frozen=True)
class RpcEndpoint:
    """One rpc-server: ``host`` (a name or an IPv4 address) and TCP ``port``; ``str()`` is ggml's endpoint text."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_rpc(text: str | None, unauthenticated_ok: bool = False) -> tuple[RpcEndpoint, ...]:
    """The servers of ``text`` (``HOST:PORT`` items, comma-separated, spaces around them ignored), in its order;
    ``()`` for ``None`` or empty text. An IPv4 address is checked against the trusted ranges here
    (:func:`untrusted`); a name when it resolves.

    Raises:
        UsageError: an item that is not ``HOST:PORT``, a port outside 1-65535, a server listed twice, or an
            untrusted address without ``unauthenticated_ok``.
    """
    if text is None or not text.strip():
        return ()
    out: list[RpcEndpoint] = []
    for item in (part.strip() for part in text.split(",")):
        host, sep, port = item.rpartition(":")
        if item.startswith("["):
            raise UsageError(f"--rpc {item!r}: llama.cpp's RPC client takes IPv4 addresses and host names, not IPv6")
        if not item or not sep or not _HOST.match(host) or not port.isascii() or not port.isdigit():
            raise UsageError(f"--rpc {item!r} is not HOST:PORT (a comma-separated list, e.g. 192.168.1.20:50052)")
        if not 1 <= int(port) <= 65535:
            raise UsageError(f"--rpc {item!r}: the port must be 1 to 65535")
        endpoint = RpcEndpoint(host.lower(), int(port))
        if endpoint in out:
            raise UsageError(f"--rpc lists {endpoint} twice")
        if _is_ipv4(host) and (why := untrusted(host, unauthenticated_ok)):
            raise UsageError(why)
        out.append(endpoint)
    return tuple(out)


def untrusted(address: str, unauthenticated_ok: bool = False) -> str | None:
    """The one line refusing the IPv4 ``address`` of an rpc-server outside loopback, the private ranges and
    link-local (``None``: trusted, or ``unauthenticated_ok``)."""
    ip = ipaddress.ip_address(address)
    if unauthenticated_ok or ip.is_loopback or ip.is_private or ip.is_link_local:
        return None
    return (
        f"--rpc {address} is outside loopback and private networks, and llama.cpp's RPC protocol has no "
        f"authentication or encryption: use a trusted network, or {UNAUTHENTICATED_FLAG} to accept the risk"
    )


def _is_ipv4(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        return False
