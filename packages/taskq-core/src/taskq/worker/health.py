"""The worker's health endpoints: ``/healthz``, ``/readyz`` and ``/tasks``.

A deliberately tiny HTTP/1.1 responder on asyncio streams: core takes no
web framework for three GET (and HEAD) routes, and the server runs on the worker's own
event loop, so ``/healthz`` answering at all proves the loop is not wedged.

* ``/healthz`` (liveness): 200 while the process serves requests, from its start
  (waiting for its backend too: starting is not dead).
* ``/readyz`` (readiness): 200 when the worker runs, is not shutting down, and the
  backend answered a query within a second; 503 with the reason otherwise (while it
  starts: ``starting``, ``waiting for the backend`` with the attempts so far and
  the last one's error, or ``creating the actors' dependencies``; while it stops,
  ``shutdown_phase``: ``DRAINING``, ``CANCELLING``, ``FORCING`` or ``ABANDONING``).
* ``/tasks``: one line per live asyncio task with its await site, only when
  ``health_tasks_enabled`` (it reveals code structure, never values).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

import structlog

from taskq.errors import ConfigurationError
from taskq.worker._stacks import describe_tasks
from taskq.worker._state import WorkerState
from taskq.worker.shutdown import ShutdownPhase

__all__ = ["HealthServer", "StartupProgress"]

_log = structlog.get_logger("taskq.worker")

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}
_EXCHANGE_SECONDS = 5.0
"""The longest a connection is served, from its accept to the answer's last byte: a
stalled client is dropped."""
_MAX_CONNECTIONS = 32
"""Connections served at once; one more closes the one stalled longest."""
# Readiness probes can be frequent; one backend round trip per second is plenty.
_READINESS_CACHE_SECONDS = 1.0
_READINESS_TIMEOUT_SECONDS = 1.0
"""A probe's answer comes within this, the backend's or not (a 1 s probe timeout is
Kubernetes' default)."""


@dataclass
class StartupProgress:
    """How a worker's start goes, for ``/readyz`` until it runs: the attempts to reach
    its backend that failed, and the last one's error while it waits for the next."""

    attempts: int = 0
    last_error: str | None = None
    """The error's type only: the endpoint is unauthenticated, the message (a host, a
    user) is in the log."""
    creating_dependencies: bool = False
    """The backend reached, the actors' shared values are being created (a sync
    provider blocks the loop meanwhile: no route answers until it returns)."""
    registering: bool = False
    """The worker writes its registry row; ready once its loops run."""

    def failed(self, error: BaseException) -> None:
        self.attempts += 1
        self.last_error = type(error).__name__

    def reached(self) -> None:
        self.last_error = None

    def bootstrapping(self) -> None:
        self.last_error = None
        self.creating_dependencies = True

    def registering_worker(self) -> None:
        self.last_error = None
        self.creating_dependencies = False
        self.registering = True

    def describe(self) -> dict[str, Any]:
        if self.registering:
            return {"reason": "registering the worker"}
        if self.creating_dependencies:
            return {"reason": "creating the actors' dependencies"}
        if self.last_error is None:
            return {"reason": "starting"}
        return {
            "reason": "waiting for the backend",
            "attempt": self.attempts,
            "last_error": self.last_error,
        }


class HealthServer:
    """Serves the health routes for one worker until closed: for its start (``startup``),
    then for its run once :meth:`attach` gave it the worker's state."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tasks_enabled: bool,
        startup: StartupProgress | None = None,
    ) -> None:
        self._state: WorkerState | None = None
        self._startup = startup or StartupProgress()
        self._host = host
        self._port = port
        self._tasks_enabled = tasks_enabled
        self._server: asyncio.Server | None = None
        self._ready_at = 0.0
        self._ready: tuple[bool, str] = (False, "not checked yet")
        self._checking: asyncio.Task[tuple[bool, str]] | None = None
        """The backend check in flight, shared by the probes that come meanwhile."""
        self._open = 0
        """Connections being answered."""
        self._unread: dict[asyncio.StreamWriter, None] = {}
        """The connections whose request has not come in yet, oldest first."""

    @property
    def port(self) -> int:
        """The bound port (useful when 0 asked the OS for a free one)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def serving(self) -> bool:
        return self._server is not None and self._server.is_serving()

    async def start(self) -> None:
        """Listen; a port that cannot be bound is a :class:`ConfigurationError`."""
        try:
            self._server = await asyncio.start_server(self._handle, self._host, self._port)
        except OSError as exc:
            raise ConfigurationError(
                f"health server: cannot listen on {self._host}:{self._port}: {exc.strerror or exc}"
            ) from exc
        _log.info("taskq.health-server-started", host=self._host, port=self.port)

    def attach(self, state: WorkerState) -> None:
        """The worker runs: readiness is its own from now on."""
        self._state = state

    async def close(self) -> None:
        """Stop serving (closing again does nothing)."""
        if self._checking is not None:
            self._checking.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def readiness(self) -> tuple[bool, str]:
        """(ready, reason): running, not shutting down, and the backend reachable."""
        state = self._state
        if state is None:
            return False, self._startup.describe()["reason"]
        if state.stopping.is_set():
            return False, "shutting down"
        if time.monotonic() - self._ready_at < _READINESS_CACHE_SECONDS:
            return self._ready
        if self._checking is None or self._checking.done():
            self._checking = asyncio.ensure_future(self._check_backend(state))
        # Not cancelled at the second: a cancelled query unwinds only once the driver has
        # cleaned up (up to a command timeout through a partition), and a probe waited
        # for that, past its own timeout, where it should have got this 503.
        done, _ = await asyncio.wait({self._checking}, timeout=_READINESS_TIMEOUT_SECONDS)
        if not done:
            return False, f"backend unreachable: no answer within {_READINESS_TIMEOUT_SECONDS:g}s"
        if self._checking.cancelled():  # the server is closing
            return False, "shutting down"
        return self._checking.result()

    async def _check_backend(self, state: WorkerState) -> tuple[bool, str]:
        try:
            await state.backend.count_active_jobs(state.settings.queues)
            self._ready = (True, "ok")
        except Exception as exc:  # noqa: BLE001 - any failure at all means "not ready"
            self._ready = (False, f"backend unreachable: {type(exc).__name__}")
        self._ready_at = time.monotonic()
        return self._ready

    async def _route(self, method: str, path: str) -> tuple[int, str, str]:
        if method not in ("GET", "HEAD"):  # HEAD: what some load balancers probe with
            return 405, "text/plain", "only GET and HEAD\n"
        if path == "/healthz":
            return 200, "application/json", json.dumps({"status": "alive"})
        if path == "/readyz":
            ready, reason = await self.readiness()
            answer = {"ready": ready, "reason": reason}
            if self._state is None:  # starting: the attempts and the last error too
                answer |= self._startup.describe()
            elif self._state.shutdown_phase:  # stopping: where the stop is
                answer["shutdown_phase"] = ShutdownPhase(self._state.shutdown_phase).name
            return (200 if ready else 503), "application/json", json.dumps(answer)
        if path == "/tasks" and self._tasks_enabled:
            return 200, "application/json", json.dumps(describe_tasks(), indent=1)
        return 404, "text/plain", "not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= _MAX_CONNECTIONS:
            # Probes are few and quick: a flood of stalled connections would hold a file
            # descriptor each, until the worker could open no other (its database's).
            # The one stalled longest makes room (a probe sends its request at once and
            # is answered); with none stalled, this one goes unanswered.
            if not self._unread:
                writer.close()
                return
            next(iter(self._unread)).close()
        self._open += 1
        self._unread[writer] = None
        try:
            # One bound for the whole exchange: a client that stops reading a large
            # answer (/tasks) must not hold its connection either.
            async with asyncio.timeout(_EXCHANGE_SECONDS):
                await self._answer(reader, writer)
        except (TimeoutError, ConnectionError):
            pass  # a probe that hung up or stalled: nothing to answer
        finally:
            self._open -= 1
            self._unread.pop(writer, None)
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(1):
                    await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = (await reader.readline()).decode("latin-1").split()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # headers are not needed
            self._unread.pop(writer, None)
        except ValueError:  # a line past the reader's limit (64 KiB): no traceback
            method, status, content_type, body = "GET", 431, "text/plain", "line too long\n"
        else:
            method, path, version = (request_line + ["", "", ""])[:3]
            if len(request_line) != 3 or not version.startswith("HTTP/"):
                # Garbage (a TLS handshake on this plain port, a scanner), or HTTP/0.9's
                # line without a version, whose client cannot read a status line.
                method, status, content_type = "GET", 400, "text/plain"
                body = "bad request line: expected METHOD /path HTTP/1.1\n"
            else:
                status, content_type, body = await self._route(method, path.split("?", 1)[0])
        payload = body.encode()
        allow = "Allow: GET, HEAD\r\n" if status == 405 else ""
        writer.write(
            f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
            f"{allow}Connection: close\r\n\r\n".encode()
            + (b"" if method == "HEAD" else payload)
        )
        await writer.drain()
