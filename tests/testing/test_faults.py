"""taskq_testing.faults.TcpProxy: forwards, cuts, restores, and closes every socket it made."""

from __future__ import annotations

import gc
import socket
import socketserver
import threading
import time
import warnings
from collections.abc import Iterator

import pytest

from taskq_testing.faults import TcpProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _echo_through(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(data)
        return client.recv(4096)


def test_it_forwards_both_ways(echo_port: int) -> None:
    with TcpProxy(echo_port) as proxy:
        assert proxy.port not in {0, echo_port}
        assert _echo_through(proxy.port, b"ping") == b"ping"


class _AnswerAtEnd(socketserver.BaseRequestHandler):
    """Reads the whole request (until the client shuts down its writing half), then
    answers it."""

    def handle(self) -> None:
        request = b""
        while data := self.request.recv(4096):
            request += data
        time.sleep(0.05)  # the proxy has seen the client's end long before
        self.request.sendall(request.upper())


def test_a_half_closed_connection_still_carries_the_answer() -> None:
    # The client's end of writing ended the whole connection: the answer was dropped.
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _AnswerAtEnd)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        with TcpProxy(int(server.server_address[1])) as proxy:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
                client.sendall(b"ping")
                client.shutdown(socket.SHUT_WR)
                answer = b""
                while data := client.recv(4096):
                    answer += data
            assert answer == b"PING"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_cut_drops_open_connections_and_refuses_new_ones_until_restored(echo_port: int) -> None:
    with TcpProxy(echo_port) as proxy:
        port = proxy.port
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        client.sendall(b"one")
        assert client.recv(4096) == b"one"

        proxy.cut()
        with client:
            try:
                dropped = client.recv(4096) == b""
            except ConnectionResetError:
                dropped = True
            assert dropped
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()

        proxy.restore()
        assert proxy.port == port
        assert _echo_through(port, b"two") == b"two"


def test_only_loopback_targets_are_accepted() -> None:
    with pytest.raises(ValueError, match="loopback"):
        TcpProxy(5432, target_host="10.0.0.1")


def _connect_until(port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as client:
                client.sendall(b"x")
        except OSError:
            pass


def test_no_socket_is_left_unclosed_when_it_stops_while_clients_keep_connecting(
    echo_port: int,
) -> None:
    # Connections accepted in the instant of a cut or the shutdown were the leak: their
    # sockets were found unclosed by the garbage collector (a ResourceWarning, which
    # pytest reports as an error in whichever test happens to run the collection).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for round_ in range(6):
            proxy = TcpProxy(echo_port)
            proxy.__enter__()
            stop = threading.Event()
            clients = [
                threading.Thread(target=_connect_until, args=(proxy.port, stop)) for _ in range(4)
            ]
            for client in clients:
                client.start()
            try:
                time.sleep(0.02)
                if round_ % 2:
                    proxy.cut()
                    proxy.restore()
            finally:
                proxy.__exit__(None, None, None)
                stop.set()
                for client in clients:
                    client.join(timeout=5)
            del proxy
            gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert unclosed == []


def test_a_stall_holds_traffic_both_ways_and_new_connections_until_restored(
    echo_port: int,
) -> None:
    with TcpProxy(echo_port) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        client.sendall(b"one")
        assert client.recv(4096) == b"one"

        proxy.stall()
        client.settimeout(0.3)
        client.sendall(b"two")
        with pytest.raises(TimeoutError):
            client.recv(4096)
        # A connection made during the stall is accepted and then hears nothing.
        late = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.3)
        late.sendall(b"three")
        with pytest.raises(TimeoutError):
            late.recv(4096)

        proxy.restore()
        for sock, data in ((client, b"two"), (late, b"three")):
            with sock:
                sock.settimeout(5)
                assert sock.recv(4096) == data


def test_a_proxy_that_cannot_listen_leaves_no_thread_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(*args: object, **kwargs: object) -> socket.socket:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(socket, "create_server", refused)
    before = set(threading.enumerate())
    proxy = TcpProxy(5432)
    with pytest.raises(OSError, match="Too many open files"), proxy:
        pass  # pragma: no cover - it cannot listen
    assert set(threading.enumerate()) <= before
    assert proxy._loop.is_closed()


def test_a_dsn_is_pointed_at_the_proxy() -> None:
    # At 127.0.0.1, where the proxy listens: a target of [::1] (or "localhost", which
    # may resolve to it) kept its host, where nothing listened.
    for target in ("127.0.0.1", "::1"):
        with TcpProxy(5432, target) as proxy:
            assert proxy.through("postgresql://u:p@127.0.0.1:5432/db?x=1") == (
                f"postgresql://u:p@127.0.0.1:{proxy.port}/db?x=1"
            )
            assert proxy.through("postgresql://u:p@[::1]:5432/db") == (
                f"postgresql://u:p@127.0.0.1:{proxy.port}/db"
            )
            assert proxy.through("postgresql://localhost/db") == (
                f"postgresql://127.0.0.1:{proxy.port}/db"
            )
