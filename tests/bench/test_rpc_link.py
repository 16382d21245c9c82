"""The emulated link of the RPC sweep (chatphase/bench/rpc/link.py): delay, rate, counters, loopback only, and
its end. Lower bounds only: a busy machine makes the link slower, never faster than its shape."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from chatphase.bench.rpc.link import LinkCounters, LinkProxy, LinkShape, check_loopback


@pytest.fixture
def echo_server():
    """A loopback server that echoes every byte back; yields its address."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()
    srv.close()


def connect(proxy: LinkProxy) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "the link closed early"
        out += chunk
    return out


def exchange(s: socket.socket, n: int = 100) -> float:
    """One request and its echoed answer; returns the seconds it took."""
    t = time.perf_counter()
    s.sendall(b"x" * n)
    read(s, n)
    return time.perf_counter() - t


def test_each_answer_waited_for_costs_at_least_the_added_rtt(echo_server):
    with LinkProxy(echo_server, LinkShape(rtt_ms=20)) as proxy, connect(proxy) as s:
        times = [exchange(s) for _ in range(5)]
        assert min(times) >= 0.020
        proxy.shape = LinkShape(rtt_ms=60)  # a new shape applies to the next chunk
        assert exchange(s) >= 0.060


def test_the_rate_cap_bounds_the_transfer_time(echo_server):
    # 100 kB each way at 8 Mbit/s: at least 0.1 s to send, the echo pipelined behind it
    with LinkProxy(echo_server, LinkShape(mbit_per_s=8)) as proxy, connect(proxy) as s:
        threading.Thread(target=s.sendall, args=(b"y" * 100_000,), daemon=True).start()
        t = time.perf_counter()
        assert read(s, 100_000) == b"y" * 100_000
        assert time.perf_counter() - t >= 0.1


def test_round_trips_count_answers_after_requests_not_messages(echo_server):
    with LinkProxy(echo_server) as proxy, connect(proxy) as s:
        for _ in range(7):
            exchange(s, 10)
        assert proxy.counters() == LinkCounters(bytes_up=70, bytes_down=70, round_trips=7)
        # four requests sent without waiting, then their answers read: the answers may arrive in one chunk or
        # several, but the direction turned server-to-client once per burst of requests at most
        before = proxy.counters()
        for _ in range(4):
            s.sendall(b"z" * 10)
            time.sleep(0.01)
        read(s, 40)
        carried = proxy.counters() - before
        assert (carried.bytes_up, carried.bytes_down) == (40, 40)
        assert 1 <= carried.round_trips <= 4


def test_each_connection_turns_on_its_own(echo_server):
    with LinkProxy(echo_server) as proxy, connect(proxy) as a, connect(proxy) as b:
        a.sendall(b"1" * 10)
        b.sendall(b"2" * 10)
        read(a, 10)
        read(b, 10)
        assert proxy.counters().round_trips == 2


def test_the_link_forwards_to_loopback_only():
    for host in ("127.0.0.1", "::1", "localhost"):
        check_loopback(host)
    for host in ("10.0.0.2", "192.168.1.5", "example.com"):
        with pytest.raises(ValueError, match="loopback only"):
            LinkProxy((host, 50052))


def test_close_ends_the_connections_and_the_lifetime_bounds_it(echo_server):
    proxy = LinkProxy(echo_server)
    proxy.start()
    s = connect(proxy)
    exchange(s)
    proxy.close()
    s.settimeout(5)
    assert s.recv(10) == b""
    s.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()

    short = LinkProxy(echo_server, lifetime_s=0.2)
    short.start()
    time.sleep(0.6)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", short.port), timeout=2).close()


def test_a_shape_out_of_range_is_refused():
    with pytest.raises(ValueError, match="RTT"):
        LinkShape(rtt_ms=-1)
    with pytest.raises(ValueError, match="rate"):
        LinkShape(mbit_per_s=0)
    assert LinkShape(1, 100).label() == "RTT 1 ms, 100 Mbit/s"
