"""The LISTEN side of the wake-ups: one dedicated connection, kept alive.

``subscribe_wake`` / ``subscribe_cancel_wake`` register an ``asyncio.Event``;
a notification on the schema's wake channel sets every wake event, a cancel
notification on its events channel every cancel event. A worker's own channel
(``subscribe_worker_cancel``) is listened to while someone subscribes to it,
and sets only its subscribers' events. The LISTEN runs before a subscriber
gets its event, so nothing committed after that is missed. When Postgres is out
of reach at that moment, the subscriber gets its event already set (it polls)
instead of an error, and the health-check task connects as below.

A health-check task runs ``SELECT 1`` on the connection every
``health_check_interval``. When the check fails (for any reason) or the server
drops the connection, it reconnects with bounded exponential backoff (up to 30 s),
listens again and then sets every subscriber's event once: whatever was
notified while nobody listened is picked up by one dispatch poll. While the
connection is down subscribers keep working by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import structlog

from taskq_postgres._connect import BackendUnavailableError

__all__ = ["NotifyListener"]

_log = structlog.get_logger("taskq.notify")

Connect = Callable[[], Awaitable["asyncpg.Connection[Any]"]]

MAX_BACKOFF = 30.0


class NotifyListener:
    """Wake and cancel subscribers of one schema, fed by one LISTEN connection."""

    def __init__(
        self,
        connect: Connect,
        wake_channel: str,
        events_channel: str,
        *,
        health_check_interval: float = 5.0,
        initial_backoff: float = 0.1,
        transient: tuple[type[BaseException], ...] = (),
    ) -> None:
        self._connect = connect
        self._wake_channel = wake_channel
        self._events_channel = events_channel
        self._health_check_interval = health_check_interval
        self._initial_backoff = initial_backoff
        # BackendUnavailableError: how a failed reconnect surfaces from _connect.
        self._transient: tuple[type[BaseException], ...] = (
            *transient,
            OSError,
            TimeoutError,
            asyncpg.PostgresError,
            BackendUnavailableError,
        )
        self._wake: set[asyncio.Event] = set()
        self._cancel: set[asyncio.Event] = set()
        self._worker_cancel: dict[str, set[asyncio.Event]] = {}
        """By worker channel: the subscribers of each channel listened to."""
        self._conn: asyncpg.Connection[Any] | None = None
        self._lost = asyncio.Event()
        self._lock = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None
        self.reconnects = 0
        """How many times the connection was re-established (for health and tests)."""

    @property
    def connected(self) -> bool:
        """Whether the LISTEN connection is up."""
        return self._conn is not None and not self._conn.is_closed()

    @asynccontextmanager
    async def subscribe_wake(self) -> AsyncIterator[asyncio.Event]:
        """An event set on every wake notification while inside."""
        async with self._subscribe(self._wake) as event:
            yield event

    @asynccontextmanager
    async def subscribe_cancel(self) -> AsyncIterator[asyncio.Event]:
        """An event set on every cancel notification while inside."""
        async with self._subscribe(self._cancel) as event:
            yield event

    @asynccontextmanager
    async def subscribe_worker_cancel(self, channel: str) -> AsyncIterator[asyncio.Event]:
        """An event set on every notification on ``channel`` (a worker's own) while inside."""
        await self._start()
        event = asyncio.Event()
        async with self._lock:
            subscribers = self._worker_cancel.setdefault(channel, set())
            if not subscribers:
                await self._change_listener(channel, listen=True)
            subscribers.add(event)
        self._poll_while_deaf(event)
        try:
            yield event
        finally:
            async with self._lock:
                subscribers.discard(event)
                if not subscribers:
                    del self._worker_cancel[channel]
                    await self._change_listener(channel, listen=False)

    async def _change_listener(self, channel: str, *, listen: bool) -> None:
        """LISTEN to (or UNLISTEN from) a worker channel on the live connection. When
        the connection is down, or fails now, the reconnect listens to what is subscribed."""
        conn = self._conn
        if conn is None or conn.is_closed():
            return
        try:
            # Bounded: it runs under the lock, and in an unsubscribing task's finally,
            # where a stalled network would hold the worker's stop.
            async with asyncio.timeout(self._health_check_interval):
                if listen:
                    await conn.add_listener(channel, self._on_worker_event)
                else:
                    await conn.remove_listener(channel, self._on_worker_event)
        except self._transient as exc:
            _log.warning("taskq.notify-listen-failed", channel=channel, error=repr(exc))
            self._lost.set()  # the health check decides whether to reconnect

    @asynccontextmanager
    async def _subscribe(self, subscribers: set[asyncio.Event]) -> AsyncIterator[asyncio.Event]:
        await self._start()
        event = asyncio.Event()
        subscribers.add(event)
        self._poll_while_deaf(event)
        try:
            yield event
        finally:
            subscribers.discard(event)

    async def _start(self) -> None:
        async with self._lock:
            if self._keeper is not None:
                return
            try:
                await self._install(await self._connect())
            except self._transient as exc:
                # Postgres is out of reach right now: the keeper connects as soon as it
                # can and wakes everyone then; until that, subscribers poll.
                _log.warning("taskq.notify-listen-failed", error=repr(exc))
                self._lost.set()
            self._keeper = asyncio.create_task(self._keep_alive(), name="taskq-notify-health")

    async def _install(self, conn: asyncpg.Connection[Any]) -> None:
        """LISTEN on a fresh connection to every channel subscribed now and make it the
        live one (under the lock; closed on failure). Bounded, as it holds the lock."""
        try:
            async with asyncio.timeout(self._health_check_interval):
                await conn.add_listener(self._wake_channel, self._on_wake)
                await conn.add_listener(self._events_channel, self._on_event)
                for channel in list(self._worker_cancel):
                    await conn.add_listener(channel, self._on_worker_event)
        except BaseException:
            conn.terminate()
            raise
        conn.add_termination_listener(self._on_terminated)
        self._conn = conn
        self._lost.clear()

    def _poll_while_deaf(self, event: asyncio.Event) -> None:
        """A new subscriber while nothing listens: set its event, so that it polls now
        rather than wait for a wake that cannot come (the reconnect sets it again)."""
        if not self.connected:
            event.set()

    async def _healthy(self) -> bool:
        conn = self._conn
        if conn is None or conn.is_closed():
            return False
        try:
            # Under the lock: a worker channel's LISTEN sent meanwhile on the same
            # connection failed ("another operation is in progress").
            async with self._lock, asyncio.timeout(self._health_check_interval):
                await conn.fetchval("SELECT 1")
        # Any failure means "replace the connection", not only the transient
        # tuple: between a server-side termination and the socket's EOF asyncpg
        # raises InternalClientError ("another operation is in progress"), and a
        # health check that raised would end the keeper and with it every reconnect.
        except Exception as exc:  # noqa: BLE001
            _log.warning("taskq.notify-health-check-failed", error=repr(exc))
            return False
        return True

    async def _keep_alive(self) -> None:
        """Check the connection; on loss reconnect with backoff, then wake everyone once."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._health_check_interval):
                    await self._lost.wait()
            # Set, and the connection healthy: a LISTEN failed on it. Only a reconnect
            # listens to every channel again (and clears it: set, it had the checks
            # run back to back).
            if not self._lost.is_set() and await self._healthy():
                continue
            await self._drop()
            delay = self._initial_backoff
            while True:
                try:
                    # Connected outside the lock: a connect to a stalled server runs to
                    # connect_timeout, and (un)subscribers, a stopping worker's among
                    # them, would wait that long for the lock.
                    conn = await self._connect()
                    async with self._lock:
                        if self.connected:
                            conn.terminate()
                        else:
                            await self._install(conn)
                    break
                except Exception as exc:  # noqa: BLE001 - never give up: see below
                    # Not only the transient tuple: a connection factory's own error (a
                    # credentials provider's) ended the keeper, and NOTIFY never came back.
                    _log.warning("taskq.notify-reconnect-failed", error=repr(exc), retry_in=delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_BACKOFF)
            self.reconnects += 1
            _log.info("taskq.notify-reconnected", reconnects=self.reconnects)
            # Notifications sent while disconnected are gone: poll once for them.
            self._set_everyone()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.remove_termination_listener(self._on_terminated)
            with contextlib.suppress(*self._transient):
                await conn.close(timeout=1)

    async def reconnect(self) -> None:
        """Replace the connection now (credential reload); subscribers keep their events."""
        async with self._lock:
            await self._drop()
        self._lost.set()  # the health-check task reconnects and wakes everyone once

    async def close(self) -> None:
        """Stop the health check, stop listening and close the connection. Idempotent."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await keeper
                except Exception as exc:  # noqa: BLE001 - closing must not fail on it
                    _log.error("taskq.notify-keeper-failed", exc_info=exc)
        async with self._lock:
            await self._drop()

    def _on_wake(self, conn: object, pid: int, channel: str, payload: object) -> None:
        _set_all(self._wake)

    def _on_event(self, conn: object, pid: int, channel: str, payload: object) -> None:
        try:
            message = json.loads(str(payload))
        except (ValueError, RecursionError):
            # Not ours to interpret: any role that may connect may NOTIFY here (a
            # '[' * 8000 payload raised RecursionError in the driver's callback).
            return
        if isinstance(message, dict) and message.get("type") == "cancel":
            _set_all(self._cancel)

    def _on_worker_event(self, conn: object, pid: int, channel: str, payload: object) -> None:
        _set_all(self._worker_cancel.get(channel, set()))

    def _on_terminated(self, conn: object) -> None:
        self._conn = None
        self._lost.set()
        # Until the reconnect, subscribers poll instead of waiting for a wake.
        self._set_everyone()

    def _set_everyone(self) -> None:
        _set_all(self._wake)
        _set_all(self._cancel)
        for subscribers in self._worker_cancel.values():
            _set_all(subscribers)


def _set_all(events: set[asyncio.Event]) -> None:
    for event in events:
        event.set()
