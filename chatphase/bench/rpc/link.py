"""An emulated network link: a TCP proxy on loopback that delays each direction and caps its bandwidth.

This machine's kernel has no ``netem`` qdisc, so the RPC experiment puts one :class:`LinkProxy` between the
client and each ``rpc-server`` instead. Each direction is a pipe of its own, modelled as a link with a
serialisation rate and a propagation delay: a chunk read at ``t`` starts leaving when the link is free
(``max(t, free)``), takes ``bytes × 8 / bits_per_s`` to leave (``free`` moves on), and arrives ``rtt_ms / 2``
later. Chunks keep their order; the delay is added to what loopback already costs.

The proxy also counts what the link carried, for the prediction (:mod:`chatphase.bench.rpc.network`): bytes
each way and **round trips**, the times the server answered after the client had sent (the direction of the
traffic on a connection turned from client→server to server→client). A request the client does not wait on
(ggml's RPC ``set_tensor``) turns nothing; each answer it waits for costs one round trip of latency.

Loopback only: the proxy listens on 127.0.0.1 and forwards only to a loopback address; it closes itself after
``lifetime_s`` at the latest.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass

#: the most seconds a proxy lives (a benchmark's bound; :meth:`LinkProxy.close` ends it sooner).
DEFAULT_LIFETIME_S = 1800.0
_CHUNK = 1 << 16


@dataclass(frozen=True)
class LinkShape:
    """The emulated link: ``rtt_ms`` added round-trip time (half each way), ``mbit_per_s`` each direction's
    rate in megabits/s (``None``: as fast as loopback)."""

    rtt_ms: float = 0.0
    mbit_per_s: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rtt_ms <= 10_000:
            raise ValueError(f"an emulated RTT is 0 to 10,000 ms (got {self.rtt_ms:g})")
        if self.mbit_per_s is not None and not 0 < self.mbit_per_s <= 1_000_000:
            raise ValueError(f"an emulated link rate is above 0 and at most 1,000,000 Mbit/s (got {self.mbit_per_s:g})")

    def label(self) -> str:
        """``"RTT 5 ms"``, ``"RTT 1 ms, 100 Mbit/s"``."""
        rate = f", {self.mbit_per_s:g} Mbit/s" if self.mbit_per_s else ""
        return f"RTT {self.rtt_ms:g} ms{rate}"


@dataclass(frozen=True)
class LinkCounters:
    """What a link carried since it started: bytes client→server (``bytes_up``) and back (``bytes_down``), and
    round trips (see the module docstring)."""

    bytes_up: int = 0
    bytes_down: int = 0
    round_trips: int = 0

    def __sub__(self, other: LinkCounters) -> LinkCounters:
        return LinkCounters(
            self.bytes_up - other.bytes_up, self.bytes_down - other.bytes_down, self.round_trips - other.round_trips
        )

    def __add__(self, other: LinkCounters) -> LinkCounters:
        return LinkCounters(
            self.bytes_up + other.bytes_up, self.bytes_down + other.bytes_down, self.round_trips + other.round_trips
        )


def check_loopback(host: str) -> None:
    """Raises ValueError unless ``host`` is a loopback address (the emulation never leaves the machine)."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ValueError(f"the emulated link forwards to loopback only (got {host!r})")


class _Pipe:
    """One direction of one connection: a reader thread queues chunks with their arrival time, a writer thread
    sends each when the link model says it arrives."""

    def __init__(self, link: LinkProxy, src: socket.socket, dst: socket.socket, up: bool) -> None:
        self.link, self.src, self.dst, self.up = link, src, dst, up
        self.queue: deque[tuple[float, bytes] | None] = deque()
        self.ready = threading.Condition()
        self.free_at = 0.0
        threading.Thread(target=self._read, daemon=True, name="link-read").start()
        threading.Thread(target=self._write, daemon=True, name="link-write").start()

    def _read(self) -> None:
        try:
            while data := self.src.recv(_CHUNK):
                self.link.carried(self, len(data))
                with self.ready:
                    self.queue.append((time.perf_counter(), data))
                    self.ready.notify()
        except OSError:
            pass
        with self.ready:
            self.queue.append(None)
            self.ready.notify()

    def _write(self) -> None:
        try:
            while True:
                with self.ready:
                    while not self.queue:
                        self.ready.wait()
                    item = self.queue.popleft()
                if item is None:
                    break
                arrived, data = item
                shape = self.link.shape
                start = max(arrived, self.free_at)
                self.free_at = start + (len(data) * 8 / (shape.mbit_per_s * 1e6) if shape.mbit_per_s else 0.0)
                wait = self.free_at + shape.rtt_ms / 2000 - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                self.dst.sendall(data)
        except OSError:
            pass
        finally:  # the other side sees this direction end
            for sock in (self.dst, self.src):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class LinkProxy:
    """A TCP proxy from ``127.0.0.1:<port>`` to ``target`` (loopback) shaped by ``shape``; :attr:`shape` may be
    changed while it runs (the next chunk sees it). Start with :meth:`start` (returns the port), read
    :meth:`counters`, end with :meth:`close` (or a ``with`` block).

    Raises:
        ValueError: a target that is not a loopback address.
    """

    def __init__(
        self, target: tuple[str, int], shape: LinkShape | None = None, lifetime_s: float = DEFAULT_LIFETIME_S
    ) -> None:
        check_loopback(target[0])
        self.target, self.shape, self.lifetime_s = target, shape or LinkShape(), lifetime_s
        self._lock = threading.Lock()
        self._bytes = [0, 0]  # up, down
        self._round_trips = 0
        self._last_up: dict[int, bool] = {}  # per connection: was the last chunk client→server
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._closed = threading.Event()
        self.port = 0

    def start(self) -> int:
        """Listen on a free loopback port and return it."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.2)
        self._listener, self.port = listener, listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="link-accept").start()
        timer = threading.Timer(self.lifetime_s, self.close)
        timer.daemon = True
        timer.start()
        return self.port

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:<port>``, what the client connects to."""
        return f"127.0.0.1:{self.port}"

    def counters(self) -> LinkCounters:
        """A snapshot of what the link carried so far."""
        with self._lock:
            return LinkCounters(self._bytes[0], self._bytes[1], self._round_trips)

    def carried(self, pipe: _Pipe, n_bytes: int) -> None:
        """Count ``n_bytes`` read by ``pipe``; a server→client chunk after client→server data is a round trip."""
        key = id(pipe.src) if pipe.up else id(pipe.dst)  # the client's socket names the connection
        with self._lock:
            self._bytes[0 if pipe.up else 1] += n_bytes
            if not pipe.up and self._last_up.get(key, False):
                self._round_trips += 1
            self._last_up[key] = pipe.up

    def close(self) -> None:
        """Stop accepting and close every connection (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in [*sockets, *([self._listener] if self._listener else [])]:
            try:  # shutdown wakes a thread blocked in recv on it; close alone does not
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> LinkProxy:
        if not self.port:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            client.settimeout(None)
            for sock in (client, server):  # as ggml's RPC client does: no Nagle delay on small messages
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            _Pipe(self, client, server, up=True)
            _Pipe(self, server, client, up=False)
