"""Wake coalescing: enqueues that overlap share one trailing NOTIFY, none is lost.

A LISTENing connection of the test counts the wake notifications. To know that
every notification committed so far has arrived, the test commits a marker
NOTIFY of its own and waits for it: notifications reach a listener in commit
order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import pytest

from taskq import EnqueueArgs
from taskq_postgres import PostgresBackend
from taskq_postgres.channels import wake_channel
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

LONG = timedelta(hours=1)
"""A window no test outlives: every enqueue after the first one in it is coalesced."""


class WakeCounter:
    """Counts the wake notifications of one schema on a LISTEN connection of its own."""

    def __init__(self, conn: asyncpg.Connection[Any], schema: str) -> None:
        self.conn = conn
        self.schema = schema
        self.wakes = 0
        self._waited = 0
        self._marker = f"test_marker_{uuid4().hex[:12]}"
        self._markers: asyncio.Queue[str] = asyncio.Queue()
        self._counted: asyncio.Queue[None] = asyncio.Queue()

    async def start(self) -> None:
        await self.conn.add_listener(wake_channel(self.schema), self._on_wake)
        await self.conn.add_listener(self._marker, self._on_marker)

    def _on_wake(self, *_: object) -> None:
        self.wakes += 1
        self._counted.put_nowait(None)

    def _on_marker(self, conn: object, pid: int, channel: str, payload: object) -> None:
        self._markers.put_nowait(str(payload))

    async def settled(self) -> int:
        """The wakes committed before now, all delivered."""
        token = uuid4().hex
        await self.conn.execute("SELECT pg_notify($1, $2)", self._marker, token)
        async with asyncio.timeout(10):
            while await self._markers.get() != token:
                pass
        return self.wakes

    async def wake_number(self, n: int) -> int:
        """Wait for the ``n``-th wake; return how many jobs are committed once it came."""
        async with asyncio.timeout(10):
            while self._waited < n:
                await self._counted.get()
                self._waited += 1
        jobs = await self.conn.fetchval(f"SELECT count(*) FROM {self.schema}.jobs")
        return int(jobs)


@pytest.fixture
async def counter(pg_pooled_schema: PgSchema) -> AsyncIterator[WakeCounter]:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_pooled_schema.dsn)
    counter = WakeCounter(conn, pg_pooled_schema.name)
    await counter.start()
    yield counter
    await conn.close()


Open = Callable[..., Awaitable[PostgresBackend]]


@pytest.fixture
async def open_backend(pg_pooled_schema: PgSchema) -> AsyncIterator[Open]:
    opened: list[PostgresBackend] = []

    async def open_(**options: Any) -> PostgresBackend:
        backend = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name, **options)
        await backend.open()
        opened.append(backend)
        return backend

    yield open_
    for backend in opened:
        await backend.close()


def _args() -> EnqueueArgs:
    return EnqueueArgs(actor="a")


async def _burst(backend: PostgresBackend, n: int) -> None:
    """``n`` enqueues started together: each after the first starts while it runs."""
    await asyncio.gather(*(backend.enqueue(_args()) for _ in range(n)))


async def test_enqueues_one_after_another_each_notify(
    counter: WakeCounter, open_backend: Open
) -> None:
    # None overlaps another: their commits do not contend for NOTIFY's lock, and a
    # trailing NOTIFY would cost the producer a timer per window.
    backend = await open_backend(wake_coalesce_window=LONG)
    for _ in range(3):
        await backend.enqueue(_args())
    assert await counter.settled() == 3
    await backend.close()
    assert await counter.settled() == 3


async def test_an_isolated_enqueue_wakes_at_once_whatever_the_window(
    counter: WakeCounter, open_backend: Open
) -> None:
    backend = await open_backend(wake_coalesce_window=LONG)
    await backend.enqueue(_args())
    assert await counter.wake_number(1) == 1  # not an hour later: the first one notifies itself


async def test_a_burst_sends_one_wake_then_one_trailing_wake_after_its_last_job(
    counter: WakeCounter, open_backend: Open
) -> None:
    backend = await open_backend(wake_coalesce_window=LONG)
    await _burst(backend, 10)
    assert await counter.settled() == 1
    # Closing sends what the window would have sent at its end.
    await backend.close()
    assert await counter.wake_number(2) == 10
    assert await counter.settled() == 2


async def test_the_trailing_wake_comes_at_the_end_of_the_window(
    counter: WakeCounter, open_backend: Open
) -> None:
    backend = await open_backend(wake_coalesce_window=timedelta(seconds=1))
    await _burst(backend, 5)
    # The first enqueue's own wake, then (without closing) the trailing one.
    assert await counter.wake_number(2) == 5


async def test_every_enqueue_path_takes_part(counter: WakeCounter, open_backend: Open) -> None:
    backend = await open_backend(wake_coalesce_window=LONG)
    # Each path starts while the first enqueue runs: each skips its NOTIFY.
    await asyncio.gather(
        backend.enqueue(_args()),
        backend.enqueue_batch([_args(), _args()]),
        backend.enqueue_batch_fast([_args(), _args()]),
        backend.enqueue(_args().model_copy(update={"singleton": True, "identity_key": "k"})),
    )
    assert await counter.settled() == 1
    await backend.close()
    assert await counter.wake_number(2) == 6
    assert await counter.settled() == 2


async def test_an_enqueue_in_a_caller_transaction_notifies_in_it(
    counter: WakeCounter, open_backend: Open, pg_pooled_schema: PgSchema
) -> None:
    # Its commit is the caller's: a trailing NOTIFY could come before it.
    backend = await open_backend(wake_coalesce_window=LONG)
    await backend.enqueue(_args())
    caller: asyncpg.Connection[Any] = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        async with caller.transaction():
            await backend.enqueue_with_conn(caller, _args())
            assert await counter.settled() == 1  # not before the caller commits
    finally:
        await caller.close()
    assert await counter.settled() == 2


async def test_a_failed_enqueue_still_owes_the_skipped_ones_a_wake(
    counter: WakeCounter, open_backend: Open
) -> None:
    backend = await open_backend(wake_coalesce_window=LONG)
    same = _args()
    # The last two start while the first runs, so skip their NOTIFY; one of them
    # fails (a duplicate id) and may have been the one to commit.
    outcomes = await asyncio.gather(
        backend.enqueue(_args()),
        backend.enqueue(same),
        backend.enqueue(same),
        return_exceptions=True,
    )
    [failed] = [o for o in outcomes if isinstance(o, BaseException)]
    assert isinstance(failed, ValueError) and "already exists" in str(failed)
    assert await counter.settled() == 1
    await backend.close()
    assert await counter.wake_number(2) == 2


async def test_a_known_key_leading_a_window_still_owes_the_skipped_ones_a_wake(
    counter: WakeCounter, open_backend: Open
) -> None:
    backend = await open_backend(wake_coalesce_window=timedelta(milliseconds=200))
    keyed = _args().model_copy(update={"idempotency_key": "k"})
    # The keyed one notifies and opens a window; the other, started while it runs, is
    # coalesced: owed a trailing wake at the window's end.
    await asyncio.gather(backend.enqueue(keyed), backend.enqueue(_args()))
    time.sleep(0.3)  # noqa: ASYNC251 - the window ends while the loop is busy, its timer not run
    # Leads the next window, taking over what was owed, and inserts nothing: it
    # notifies nothing either.
    await backend.enqueue(keyed.model_copy(update={"id": uuid4()}))
    assert await counter.wake_number(2) == 2


async def test_a_zero_window_notifies_every_enqueue(
    counter: WakeCounter, open_backend: Open
) -> None:
    backend = await open_backend(wake_coalesce_window=timedelta(0))
    await _burst(backend, 3)
    assert await counter.settled() == 3


def test_a_negative_window_is_refused(pg_pooled_schema: PgSchema) -> None:
    with pytest.raises(ValueError, match="wake_coalesce_window"):
        PostgresBackend(
            pg_pooled_schema.dsn, schema="s", wake_coalesce_window=timedelta(seconds=-1)
        )
