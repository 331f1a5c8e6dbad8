"""Fault injection for tests: a TCP proxy that can cut or stall the line to a server.

Point a client's DSN at :attr:`TcpProxy.port` instead of the server's; then
:meth:`TcpProxy.cut` drops every open connection and refuses new ones (what
a dead server or a refused route looks like from the client),
:meth:`TcpProxy.stall` keeps every connection open and accepts new ones but
carries no byte either way (a black-holed network: packets dropped, no reset,
so only the client's own timeouts end a wait), and :meth:`TcpProxy.restore`
lets traffic through again (what a stall held back is then delivered).
Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

__all__ = ["TcpProxy"]

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host:target_port`` on a thread of its own.

    Sockets are accepted and forwarded by hand (not through ``asyncio.start_server``), so
    that every socket is this object's from the moment it exists: a cut or the shutdown
    closes each one, even a connection accepted in the same instant (asyncio's server
    leaves those to a task of its own that fails once the server is closed, and the
    garbage collector then finds their sockets unclosed).
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        if target_host not in _LOOPBACK:
            raise ValueError("TcpProxy targets loopback addresses only")
        family, _, _, _, address = socket.getaddrinfo(
            target_host, target_port, type=socket.SOCK_STREAM
        )[0]
        self._target_family = family
        self._target: tuple[Any, ...] = address
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()  # every open socket of a forwarded connection
        self._forwarding: set[asyncio.Task[None]] = set()  # the loop keeps only weak references
        self._flowing = asyncio.Event()  # cleared while stalled
        self._flowing.set()
        self.port = 0

    def __enter__(self) -> Self:
        self._thread.start()
        try:
            self._call(self._listen(0))
        except BaseException:
            # No ``with`` body, so no __exit__: the thread and its loop were left running.
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._call(self._close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()

    def through(self, dsn: str) -> str:
        """``dsn`` (a URL naming this proxy's target) pointed at the proxy, which listens
        on 127.0.0.1 (a target of ``[::1]`` kept its host, where nothing listened)."""
        parts = urlsplit(dsn)
        user, at, _ = parts.netloc.rpartition("@")
        return urlunsplit(parts._replace(netloc=f"{user}{at}127.0.0.1:{self.port}"))

    def cut(self) -> None:
        """Drop every connection and refuse new ones until :meth:`restore`."""
        self._call(self._close())

    def stall(self) -> None:
        """Carry no byte either way until :meth:`restore`; connections stay open and new
        ones are accepted (and stall too)."""
        self._call(self._set_flowing(False))

    def restore(self) -> None:
        """After a cut, accept connections again on the same port; after a stall, deliver
        what was held back and carry traffic again."""
        self._call(self._restore())

    async def _set_flowing(self, flowing: bool) -> None:
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _restore(self) -> None:
        await self._set_flowing(True)
        if self._listener is None:
            await self._listen(self.port)

    def _call(self, coro: object) -> None:
        future: Future[None] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        future.result(timeout=10)

    async def _listen(self, port: int) -> None:
        listener = socket.create_server(("127.0.0.1", port))  # SO_REUSEADDR: restore reuses it
        listener.setblocking(False)
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        asyncio.get_running_loop().add_reader(listener.fileno(), self._accept, listener)

    def _accept(self, listener: socket.socket) -> None:
        # A reader callback, run synchronously: each socket is tracked as it is accepted,
        # before anything can cut or cancel (a task cancelled unstarted runs no cleanup).
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionError:  # the client gave up before its connection was accepted
                continue
            except OSError:
                # Out of file descriptors (or memory): asked again on the loop's next turn,
                # which lets the other connections run (and end) meanwhile; looping here
                # would block the proxy's thread for good, a cut or the shutdown included.
                return
            conn.setblocking(False)
            self._sockets.add(conn)
            task = loop.create_task(self._forward(conn))
            self._forwarding.add(task)
            task.add_done_callback(self._forwarding.discard)

    async def _close(self) -> None:
        """Stop accepting, end every forwarding task, close every socket."""
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        tasks = list(self._forwarding)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sock in self._sockets:  # those of tasks cancelled before they started
            sock.close()
        self._sockets.clear()

    async def _forward(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        upstream = socket.socket(self._target_family, socket.SOCK_STREAM)
        upstream.setblocking(False)
        self._sockets.add(upstream)
        pipes: list[asyncio.Task[bool]] = []
        try:
            with contextlib.suppress(OSError):
                await loop.sock_connect(upstream, self._target)
                pipes = [
                    loop.create_task(_pipe(loop, conn, upstream, self._flowing)),
                    loop.create_task(_pipe(loop, upstream, conn, self._flowing)),
                ]
                # A side that closes is passed on as a half-close: the other direction
                # still carries what the peer answers (a reply to a request the client
                # sent before shutting down its writing half was dropped). The
                # connection ends once both directions have ended, or when either fails
                # (a reset, as a cut would).
                pending: set[asyncio.Task[bool]] = set(pipes)
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    if not all(pipe.result() for pipe in done):
                        break
        finally:  # also when cancelled by a cut or the shutdown
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            for sock in (conn, upstream):
                sock.close()
                self._sockets.discard(sock)


async def _pipe(
    loop: asyncio.AbstractEventLoop,
    source: socket.socket,
    sink: socket.socket,
    flowing: asyncio.Event,
) -> bool:
    """Carry ``source``'s bytes to ``sink`` until ``source`` closes its writing half,
    passed on as ``sink``'s (True), or either socket fails (False)."""
    try:
        while True:
            data = await loop.sock_recv(source, 65536)
            # A stall holds what was read, a close included, as a dropped packet is resent.
            await flowing.wait()
            if not data:
                sink.shutdown(socket.SHUT_WR)
                return True
            await loop.sock_sendall(sink, data)
    except OSError:
        return False
