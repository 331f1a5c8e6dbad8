"""LISTEN/NOTIFY channels: names that fit, one notify per statement, cancel messages."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
import pytest_asyncio

from taskq.identifiers import MAX_IDENTIFIER_BYTES, MAX_SCHEMA_NAME_BYTES
from taskq.models import EnqueueArgs, JobFilter
from taskq_postgres import PostgresBackend, events_channel, wake_channel, worker_channel
from taskq_postgres._sql.cancel import WORKER_CHANNEL_SQL
from taskq_postgres.channels import worker_channel_prefix
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

LONGEST_SCHEMA = "s" * MAX_SCHEMA_NAME_BYTES
LEASE = timedelta(minutes=5)
SETTLE_S = 0.2
"""How long to keep listening after the last expected notification, to catch extras."""


class Inbox:
    """Notifications received on a plain asyncpg connection, per channel."""

    def __init__(self, conn: asyncpg.Connection[Any]) -> None:
        self.conn = conn
        self.received: dict[str, list[str]] = {}
        self._arrived = asyncio.Event()

    async def listen(self, *channels: str) -> None:
        for channel in channels:
            self.received.setdefault(channel, [])
            await self.conn.add_listener(channel, self._on_notify)

    def _on_notify(self, conn: object, pid: int, channel: str, payload: object) -> None:
        self.received[channel].append(str(payload))
        self._arrived.set()

    async def settle(self) -> dict[str, list[str]]:
        """Wait until notifications stop arriving; what arrived, per channel."""
        while True:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), SETTLE_S)
            except TimeoutError:
                return self.received


@pytest_asyncio.fixture
async def inbox(pg_pooled_schema: PgSchema) -> AsyncIterator[Inbox]:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_pooled_schema.dsn)
    yield Inbox(conn)
    await conn.close()


@pytest_asyncio.fixture
async def backend(pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name)
    await backend.open()
    yield backend
    await backend.close()


# -- names ---------------------------------------------------------------------------


def test_channel_names_follow_the_schema_as_postgres_folds_it() -> None:
    worker = UUID(int=7)
    assert wake_channel("TaskQ") == "taskq_wake_taskq"
    assert events_channel("tenant_a") == "taskq_events_tenant_a"
    assert worker_channel("tq", worker) == f"taskq_worker_tq_{worker.hex}"


@pytest.mark.parametrize("helper", [wake_channel, events_channel])
def test_schema_channels_fit_for_the_longest_schema_name(helper: Any) -> None:
    assert len(helper(LONGEST_SCHEMA).encode()) <= MAX_IDENTIFIER_BYTES


@pytest.mark.parametrize("schema", ["tq", "t_0123456789abcdef", LONGEST_SCHEMA])
def test_worker_channels_fit_and_stay_distinct(schema: str) -> None:
    workers = [uuid4() for _ in range(200)]
    names = [worker_channel(schema, w) for w in workers]
    assert all(len(name.encode()) <= MAX_IDENTIFIER_BYTES for name in names)
    assert len(set(names)) == len(names)
    assert names == [worker_channel(schema, w) for w in workers]  # stable
    assert all(name.startswith("taskq_worker_") for name in names)


@pytest.mark.parametrize("helper", [wake_channel, events_channel])
def test_channel_helpers_refuse_bad_schema_names(helper: Any) -> None:
    with pytest.raises(ValueError):
        helper("x; drop table jobs")


@pytest.mark.parametrize("schema", ["tq", "t_0123456789abcdef", LONGEST_SCHEMA])
async def test_the_sql_derives_the_same_worker_channel(inbox: Inbox, schema: str) -> None:
    worker = uuid4()
    derived = await inbox.conn.fetchval(
        f"SELECT {WORKER_CHANNEL_SQL} "
        f"FROM (SELECT $1::text || replace($2::uuid::text, '-', '') AS full_name) ch",
        worker_channel_prefix(schema),
        worker,
    )
    assert derived == worker_channel(schema, worker)


async def test_a_long_worker_channel_is_one_notify_and_listen_agree_on(
    inbox: Inbox, pg_pooled_schema: PgSchema
) -> None:
    worker = uuid4()
    naive = f"{worker_channel_prefix(LONGEST_SCHEMA)}{worker.hex}"
    # The trap: pg_notify refuses the full name, while LISTEN would truncate it.
    with pytest.raises(asyncpg.PostgresError, match="channel name too long"):
        await inbox.conn.execute("SELECT pg_notify($1, 'x')", naive)
    channel = worker_channel(LONGEST_SCHEMA, worker)
    await inbox.listen(channel)
    sender: asyncpg.Connection[Any] = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        await sender.execute("SELECT pg_notify($1, 'hello')", channel)
    finally:
        await sender.close()
    assert (await inbox.settle())[channel] == ["hello"]


# -- one notify per statement -----------------------------------------------------------


async def test_a_batch_enqueue_sends_one_wake_not_one_per_job(
    backend: PostgresBackend, inbox: Inbox
) -> None:
    # What listeners see. (Postgres also folds identical notifications of one
    # transaction; the statements themselves call pg_notify at most once.)
    await inbox.listen(wake_channel(backend.schema))
    await backend.enqueue_batch([EnqueueArgs(actor="a") for _ in range(50)])
    await backend.enqueue_batch_fast([EnqueueArgs(actor="a") for _ in range(50)])
    assert await backend.enqueue_batch_atomic(
        [EnqueueArgs(actor="a") for _ in range(5)],
        batch_id=uuid4(),
        queue="default",
        batch_row=None,
        finalizer_args=None,
        chunk_size=2,
    )
    assert (await inbox.settle())[wake_channel(backend.schema)] == ["", "", ""]


async def test_an_idempotent_hit_sends_no_wake(backend: PostgresBackend, inbox: Inbox) -> None:
    await backend.enqueue(EnqueueArgs(actor="a", idempotency_key="k"))
    await inbox.listen(wake_channel(backend.schema))
    await backend.enqueue(EnqueueArgs(actor="a", idempotency_key="k"))
    assert (await inbox.settle())[wake_channel(backend.schema)] == []


async def test_sweeps_send_one_wake_per_call(backend: PostgresBackend, inbox: Inbox) -> None:
    await backend.enqueue_batch(
        [EnqueueArgs(actor="a", delay=timedelta(milliseconds=50)) for _ in range(20)]
    )
    worker = uuid4()
    await backend.enqueue_batch([EnqueueArgs(actor="b", queue="r") for _ in range(5)])
    await backend.dispatch_batch(worker, ["r"], 10, timedelta(milliseconds=50))
    await asyncio.sleep(0.1)
    await inbox.listen(wake_channel(backend.schema))
    assert await backend.scheduled_to_pending() == 20
    assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 5
    assert await backend.scheduled_to_pending() == 0
    assert (await inbox.settle())[wake_channel(backend.schema)] == ["", ""]


# -- cancel messages ------------------------------------------------------------------------


async def test_a_cancel_request_tells_the_events_channel_and_the_worker(
    backend: PostgresBackend, inbox: Inbox
) -> None:
    worker = uuid4()
    await backend.enqueue(EnqueueArgs(actor="a", queue="c"))
    [job] = await backend.dispatch_batch(worker, ["c"], 1, LEASE)
    events, mine = events_channel(backend.schema), worker_channel(backend.schema, worker)
    await inbox.listen(events, mine, worker_channel(backend.schema, uuid4()))
    assert await backend.write_cancel_request(job.id, "stop")
    received = await inbox.settle()
    expected = {"type": "cancel", "worker_id": str(worker), "job_id": str(job.id)}
    assert [json.loads(p) for p in received[events]] == [expected]
    assert [json.loads(p) for p in received[mine]] == [expected]
    assert sum(len(payloads) for payloads in received.values()) == 2


async def test_a_bulk_cancel_sends_one_message_per_worker_not_per_job(
    backend: PostgresBackend, inbox: Inbox
) -> None:
    first, second = uuid4(), uuid4()
    await backend.enqueue_batch([EnqueueArgs(actor="a", queue="bulk") for _ in range(6)])
    await backend.dispatch_batch(first, ["bulk"], 4, LEASE)
    await backend.dispatch_batch(second, ["bulk"], 2, LEASE)
    channels = [
        events_channel(backend.schema),
        worker_channel(backend.schema, first),
        worker_channel(backend.schema, second),
    ]
    await inbox.listen(*channels)
    result = await backend.cancel_where(JobFilter(queue="bulk"), None)
    assert len(result.requested) == 6
    received = await inbox.settle()
    senders = sorted(json.loads(p)["worker_id"] for p in received[channels[0]])
    assert senders == sorted([str(first), str(second)])
    assert [len(received[c]) for c in channels[1:]] == [1, 1]


async def test_a_cancel_of_a_waiting_job_tells_no_worker(
    backend: PostgresBackend, inbox: Inbox
) -> None:
    job = await backend.enqueue(EnqueueArgs(actor="a"))
    await inbox.listen(events_channel(backend.schema))
    assert await backend.write_cancel_request(job.id, None)
    assert (await inbox.settle())[events_channel(backend.schema)] == []
