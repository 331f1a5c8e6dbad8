"""Fault injection for tests: a TCP proxy that can cut the line to a server.

Point a client's DSN at :attr:`TcpProxy.port` instead of the server's; then
:meth:`TcpProxy.cut` drops every open connection and refuses new ones (what
a network partition or a dead server looks like from the client), and
:meth:`TcpProxy.restore` lets connections through again. Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future
from types import TracebackType
from typing import Self

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host:target_port`` on a thread of its own."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        if target_host not in {"127.0.0.1", "localhost", "::1"}:
            raise ValueError("TcpProxy targets loopback addresses only")
        self._target = (target_host, target_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._refusing = False  # cut or shutting down: a connection accepted now is dropped
        self._writers: set[asyncio.StreamWriter] = set()
        self._forwarding: set[asyncio.Task[None]] = set()  # the loop keeps only weak references
        self.port = 0

    def __enter__(self) -> Self:
        self._thread.start()
        self._call(self._listen(0))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._call(self._shut_down())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            # Once more, on a thread of its own (the caller may be running a loop): what
            # the loop's last turn scheduled (a transport's close) runs now, not never.
            last = threading.Thread(
                target=self._loop.run_until_complete, args=(self._shut_down(),), daemon=True
            )
            last.start()
            last.join(timeout=5)
        self._loop.close()

    def cut(self) -> None:
        """Drop every connection and refuse new ones until :meth:`restore`."""
        self._call(self._close())

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        self._call(self._listen(self.port))

    def _call(self, coro: object) -> None:
        future: Future[None] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        future.result(timeout=10)

    async def _listen(self, port: int) -> None:
        self._refusing = False
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        self._refusing = True
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _shut_down(self) -> None:
        """Close everything, and end the connections still being set up: their
        sockets would otherwise outlive the loop, unclosed."""
        await self._close()
        current = asyncio.current_task()
        while pending := [task for task in asyncio.all_tasks() if task is not current]:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        # Closing a transport takes one more callback of this loop: run them before it stops.
        for _ in range(2):
            await asyncio.sleep(0)

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback, run as the connection is made: the connection is tracked
        # before anything can cut or cancel it (a task might be cancelled unstarted).
        if self._refusing:  # accepted just before a cut or the shutdown, made after it
            writer.transport.abort()
            return
        self._writers.add(writer)
        task = asyncio.get_running_loop().create_task(self._forward(reader, writer))
        self._forwarding.add(task)
        task.add_done_callback(self._forwarding.discard)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_writer: asyncio.StreamWriter | None = None
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self._target)
            except OSError:
                return
            if writer not in self._writers:  # cut meanwhile
                return
            self._writers.add(up_writer)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:  # also when cancelled at shutdown
            for end in (writer, up_writer):
                if end is not None:
                    end.transport.abort()
                    self._writers.discard(end)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()
