"""The LISTEN side of the wake-ups: one dedicated connection, opened on first use.

``subscribe_wake`` / ``subscribe_cancel_wake`` register an ``asyncio.Event``;
a notification on the schema's wake channel sets every wake event, a cancel
notification on its events channel every cancel event. The LISTEN runs before
the subscriber gets its event, so nothing committed after that is missed.

Deliberately simple: no health checks or reconnect loop (a later concern of
the worker's listener service). If the connection drops, every subscriber is
woken (so it polls instead of waiting for a wake that cannot come) and the
next subscription opens a new connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

__all__ = ["NotifyListener"]

Connect = Callable[[], Awaitable["asyncpg.Connection[Any]"]]


class NotifyListener:
    """Wake and cancel subscribers of one schema, fed by one LISTEN connection."""

    def __init__(self, connect: Connect, wake_channel: str, events_channel: str) -> None:
        self._connect = connect
        self._wake_channel = wake_channel
        self._events_channel = events_channel
        self._wake: set[asyncio.Event] = set()
        self._cancel: set[asyncio.Event] = set()
        self._conn: asyncpg.Connection[Any] | None = None
        self._lock = asyncio.Lock()

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
    async def _subscribe(self, subscribers: set[asyncio.Event]) -> AsyncIterator[asyncio.Event]:
        await self._listening()
        event = asyncio.Event()
        subscribers.add(event)
        try:
            yield event
        finally:
            subscribers.discard(event)

    async def _listening(self) -> None:
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return
            conn = await self._connect()
            try:
                await conn.add_listener(self._wake_channel, self._on_wake)
                await conn.add_listener(self._events_channel, self._on_event)
            except BaseException:
                await conn.close()
                raise
            conn.add_termination_listener(self._on_terminated)
            self._conn = conn

    async def close(self) -> None:
        """Stop listening and close the connection. Idempotent."""
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is None or conn.is_closed():
                return
            conn.remove_termination_listener(self._on_terminated)
            await conn.close()

    def _on_wake(self, conn: object, pid: int, channel: str, payload: object) -> None:
        _set_all(self._wake)

    def _on_event(self, conn: object, pid: int, channel: str, payload: object) -> None:
        try:
            message = json.loads(str(payload))
        except ValueError:
            return  # not ours to interpret; the events channel may carry other producers
        if isinstance(message, dict) and message.get("type") == "cancel":
            _set_all(self._cancel)

    def _on_terminated(self, conn: object) -> None:
        self._conn = None
        _set_all(self._wake)
        _set_all(self._cancel)


def _set_all(events: set[asyncio.Event]) -> None:
    for event in events:
        event.set()
