"""``SyncJobsClient``: the enqueue calls for synchronous code, on psycopg."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
import structlog.testing
from psycopg.conninfo import make_conninfo
from psycopg.types.datetime import TimestamptzLoader
from pydantic import BaseModel

from taskq import EnqueueItem, actor
from taskq.actor import Actor
from taskq.errors import (
    ConfigurationError,
    EnqueueError,
    MaxPendingExceededError,
    PayloadValidationError,
    SingletonCollisionError,
)
from taskq.models import EnqueueArgs, JobFilter, JobRow, JobStatus
from taskq_postgres import (
    BackendUnavailableError,
    PostgresBackend,
    ReadOnlyDatabaseError,
    SyncJobsClient,
    TransactionAbortedError,
    wake_channel,
)
from taskq_postgres._enqueue import singleton_lock_key
from taskq_testing.postgres import PgSchema, migrated_schema, throwaway_database

pytestmark = pytest.mark.postgres


class Item(BaseModel):
    n: int


@actor(name="sync.item")
async def item(payload: Item) -> None:
    return None


@actor(name="sync.capped", max_pending=2)
async def capped(payload: dict[str, Any]) -> None:
    return None


ACTORS: list[Actor[..., Any]] = [item, capped]


@pytest.fixture
def client(pg_pooled_schema: PgSchema) -> Iterator[SyncJobsClient]:
    with SyncJobsClient(pg_pooled_schema.dsn, actors=ACTORS, schema=pg_pooled_schema.name) as c:
        yield c


def _stored(pg: PgSchema, job_id: UUID | None = None) -> list[JobRow]:
    """What the asyncpg backend reads back: one job, or all of them."""

    async def read() -> list[JobRow]:
        backend = PostgresBackend(pg.dsn, schema=pg.name)
        await backend.open()
        try:
            if job_id is not None:
                row = await backend.get(job_id)
                return [] if row is None else [row]
            return await backend.list_jobs(JobFilter(limit=1000))
        finally:
            await backend.close()

    return asyncio.run(read())


@pytest.mark.parametrize("options", [{}, {"delay": 60, "tags": ["a"], "metadata": {"k": 1}}])
def test_enqueue_returns_the_row_as_stored(
    client: SyncJobsClient, pg_pooled_schema: PgSchema, options: dict[str, Any]
) -> None:
    row = client.enqueue(item, {"n": 1}, identity_key="i-1", **options)
    assert row.payload == {"n": 1} and row.identity_key == "i-1"
    assert row.status is (JobStatus.SCHEDULED if options else JobStatus.PENDING)
    assert row.created_at.tzinfo is UTC
    assert _stored(pg_pooled_schema, row.id) == [row]


def test_jobs_join_the_callers_transaction(pg_pooled_schema: PgSchema) -> None:
    # The caller's session is in a zone with DST: rows still come back in UTC.
    dsn = pg_pooled_schema.dsn
    with (
        psycopg.connect(dsn, options="-c TimeZone=America/New_York") as conn,
        psycopg.connect(dsn, autocommit=True) as listener,
    ):
        listener.execute(f"LISTEN {wake_channel(pg_pooled_schema.name)}")
        client = SyncJobsClient(conn, actors=ACTORS, schema=pg_pooled_schema.name)
        dropped = client.enqueue(item, {"n": 1})
        conn.rollback()
        kept = client.enqueue(item, {"n": 2})
        assert dropped.created_at.tzinfo is UTC
        assert _stored(pg_pooled_schema) == []  # not committed yet
        assert list(listener.notifies(timeout=0.2)) == []
        conn.commit()
        assert list(listener.notifies(timeout=5, stop_after=1))  # woken at commit
        assert _stored(pg_pooled_schema) == [kept]
        client.close()  # the caller's connection stays open
        assert not conn.closed


@pytest.mark.parametrize("call", ["singleton", "copy", "batch"])
def test_every_call_joins_a_callers_transaction_it_opens(
    pg_pooled_schema: PgSchema, call: str
) -> None:
    # The caller's connection has no transaction yet: the call opens it, as any first
    # statement does, and leaves it to the caller (not one of its own, committed).
    with psycopg.connect(pg_pooled_schema.dsn) as conn:
        client = SyncJobsClient(conn, actors=ACTORS, schema=pg_pooled_schema.name)
        for outcome in ("rollback", "commit"):
            if call == "singleton":
                client.enqueue(item, {"n": 1}, identity_key="only", singleton=True)
            elif call == "copy":
                assert client.enqueue_batch_fast([(item, {"n": 1})]) == 1
            else:
                client.enqueue_batch([(item, {"n": 1}), (item, {"n": 2})])
            assert _stored(pg_pooled_schema) == []
            getattr(conn, outcome)()
        assert _stored(pg_pooled_schema) != []


class _NaiveTimes(TimestamptzLoader):
    """What Django registers without USE_TZ: naive times in the session's zone."""

    def load(self, data: Any) -> datetime:
        loaded: datetime = super().load(data)
        return loaded.replace(tzinfo=None)


def test_rows_are_in_utc_whatever_the_callers_connection_loads(pg_pooled_schema: PgSchema) -> None:
    with psycopg.connect(pg_pooled_schema.dsn, options="-c TimeZone=Asia/Tokyo") as conn:
        conn.adapters.register_loader("timestamptz", _NaiveTimes)
        client = SyncJobsClient(conn, actors=ACTORS, schema=pg_pooled_schema.name)
        row = client.enqueue(item, {"n": 1}, delay=60)
        conn.commit()
        assert row.created_at.tzinfo is UTC
        assert _stored(pg_pooled_schema) == [row]
        # The caller's own loading is left as it was.
        naive = conn.execute("SELECT now()").fetchone()
        assert naive is not None and naive[0].tzinfo is None


def test_enqueue_batch_mixes_new_rows_and_idempotent_hits_in_order(
    client: SyncJobsClient, pg_pooled_schema: PgSchema
) -> None:
    existing = client.enqueue(item, {"n": 0}, idempotency_key="k")
    rows = client.enqueue_batch(
        [
            (item, {"n": 1}),
            EnqueueItem(actor="sync.item", payload={"n": 2}, options={"idempotency_key": "k"}),
            (item, {"n": 3}),
        ]
    )
    assert rows[1] == existing
    assert [r.payload for r in rows] == [{"n": 1}, {"n": 0}, {"n": 3}]
    assert len(_stored(pg_pooled_schema)) == 3
    assert client.enqueue_batch([]) == []


def test_singletons_collide(client: SyncJobsClient) -> None:
    client.enqueue(item, {"n": 1}, identity_key="only", singleton=True)
    with pytest.raises(SingletonCollisionError, match="identity_key 'only'"):
        client.enqueue(item, {"n": 2}, identity_key="only", singleton=True)


def test_singletons_on_a_server_defaulting_to_repeatable_read_still_collide(
    pg_pooled_schema: PgSchema,
) -> None:
    # The client's own transactions state their isolation: under the server's default
    # of REPEATABLE READ the check's snapshot would predate the lock.
    dsn = (
        f"{pg_pooled_schema.dsn}?options=-c%20default_transaction_isolation%3Drepeatable%5C%20read"
    )
    with SyncJobsClient(dsn, actors=ACTORS, schema=pg_pooled_schema.name) as client:
        client.enqueue(item, {"n": 1}, identity_key="only", singleton=True)
        with pytest.raises(SingletonCollisionError):
            client.enqueue(item, {"n": 2}, identity_key="only", singleton=True)


def test_a_singleton_in_a_callers_repeatable_read_transaction_is_refused(
    pg_pooled_schema: PgSchema,
) -> None:
    with psycopg.connect(pg_pooled_schema.dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        caller = SyncJobsClient(conn, actors=ACTORS, schema=pg_pooled_schema.name)
        with pytest.raises(EnqueueError, match="needs a READ COMMITTED transaction"):
            caller.enqueue(item, {"n": 1}, identity_key="only", singleton=True)
        conn.rollback()
    assert _stored(pg_pooled_schema) == []


def test_bad_input_writes_nothing(client: SyncJobsClient, pg_pooled_schema: PgSchema) -> None:
    with pytest.raises(PayloadValidationError, match="sync.item"):
        client.enqueue_batch([(item, {"n": 1}), (item, {"n": "not a number"})])
    taken = client.enqueue(item, {"n": 1})
    with pytest.raises(ValueError, match="a job with that id already exists"):
        client.enqueue(item, {"n": 2}, job_id=taken.id)
    assert _stored(pg_pooled_schema) == [taken]


def test_max_pending_is_enforced(client: SyncJobsClient) -> None:
    client.enqueue_batch([(capped, {}), (capped, {})])
    with pytest.raises(MaxPendingExceededError, match="max_pending=2"):
        client.enqueue(capped, {})


def test_max_pending_counts_a_backlog_only_up_to_the_limit(pg_pooled_schema: PgSchema) -> None:
    # As the async client: a refused enqueue reads the limit's worth of the backlog.
    @actor(name="sync.capped")  # the limit not yet set: five jobs wait
    async def uncapped(payload: dict[str, Any]) -> None:
        return None

    dsn, schema = pg_pooled_schema.dsn, pg_pooled_schema.name
    with SyncJobsClient(dsn, actors=[uncapped], schema=schema) as before:
        before.enqueue_batch([(uncapped, {})] * 5)
    with (
        SyncJobsClient(dsn, actors=ACTORS, schema=schema) as client,
        pytest.raises(MaxPendingExceededError) as refused,
    ):
        client.enqueue(capped, {})
    assert "already has 2 or more waiting jobs (max_pending=2)" in str(refused.value)


def test_an_idempotent_retry_at_max_pending_gets_its_job_back(client: SyncJobsClient) -> None:
    first = client.enqueue(capped, {}, idempotency_key="order-7")
    client.enqueue(capped, {})
    assert client.enqueue(capped, {}, idempotency_key="order-7").id == first.id
    with pytest.raises(MaxPendingExceededError):
        client.enqueue(capped, {}, idempotency_key="order-8")
    # A batch too, when every item's key is stored: nothing is inserted.
    keyed = [EnqueueItem(actor="sync.capped", payload={}, options={"idempotency_key": "order-7"})]
    assert [r.id for r in client.enqueue_batch(keyed)] == [first.id]
    with pytest.raises(MaxPendingExceededError):
        client.enqueue_batch(
            [
                *keyed,
                EnqueueItem(actor="sync.capped", payload={}, options={"idempotency_key": "o9"}),
            ]
        )


def test_a_batch_retried_at_max_pending_counts_a_repeated_new_key_once(
    client: SyncJobsClient,
) -> None:
    # As JobsClient: past the limit, only the items whose key is not stored count, and
    # two items with one new key make one job (one of two places is taken).
    stored = client.enqueue(capped, {}, idempotency_key="a")

    def keyed(key: str) -> EnqueueItem:
        return EnqueueItem(actor="sync.capped", payload={}, options={"idempotency_key": key})

    rows = client.enqueue_batch([keyed("a"), keyed("b"), keyed("b")])
    assert rows[0].id == stored.id and rows[1].id == rows[2].id != stored.id


def test_enqueue_batch_fast_copies_and_fails_whole(
    client: SyncJobsClient, pg_pooled_schema: PgSchema
) -> None:
    assert client.enqueue_batch_fast([(item, {"n": i}) for i in range(500)]) == 500
    with pytest.raises(PayloadValidationError):
        client.enqueue_batch_fast([*[(item, {"n": i}) for i in range(300)], (item, {"n": "x"})])
    stored = _stored(pg_pooled_schema)
    assert len(stored) == 500
    assert all(r.created_at.tzinfo is UTC and r.status is JobStatus.PENDING for r in stored)
    assert (
        client.enqueue_batch_fast(
            [(item, {"n": 1})],
        )
        == 1
    )


def test_a_delay_of_days_is_exact(client: SyncJobsClient) -> None:
    row = client.enqueue(item, {"n": 1}, delay=timedelta(days=200))
    assert row.scheduled_at - row.created_at == timedelta(days=200)


def test_a_copy_on_a_connection_in_a_dst_zone_adds_exact_days(pg_pooled_schema: PgSchema) -> None:
    # The clock came back in the session's zone, and days added to a zoned time are
    # calendar days: across a DST change, 200 of them were 199 days and 23 hours.
    with psycopg.connect(pg_pooled_schema.dsn, options="-c TimeZone=America/New_York") as conn:
        client = SyncJobsClient(conn, actors=ACTORS, schema=pg_pooled_schema.name)
        days = timedelta(days=200)
        item_options = {"delay": days, "schedule_to_close": 2 * days}
        assert (
            client.enqueue_batch_fast(
                [EnqueueItem(actor=item.name, payload={"n": 1}, options=item_options)]
            )
            == 1
        )
        conn.commit()
    [row] = _stored(pg_pooled_schema)
    assert row.scheduled_at - row.created_at == days
    assert row.deadline_at is not None
    assert row.deadline_at - row.created_at == 2 * days


def test_threads_share_one_client(client: SyncJobsClient, pg_pooled_schema: PgSchema) -> None:
    def enqueue_some() -> None:
        for i in range(20):
            client.enqueue(item, {"n": i})

    threads = [threading.Thread(target=enqueue_some) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(_stored(pg_pooled_schema)) == 80


def _race(clients: list[SyncJobsClient], identity: str) -> list[str]:
    """Each client enqueues the same singleton at once; what each got."""
    start = threading.Barrier(len(clients))
    outcomes: list[str] = []

    def enqueue(c: SyncJobsClient) -> None:
        start.wait()
        try:
            c.enqueue(item, {"n": 1}, identity_key=identity, singleton=True)
            outcomes.append("admitted")
        except SingletonCollisionError:
            outcomes.append("refused")

    threads = [threading.Thread(target=enqueue, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(outcomes)


def test_concurrent_singletons_admit_exactly_one(pg_pooled_schema: PgSchema) -> None:
    clients = [
        SyncJobsClient(pg_pooled_schema.dsn, actors=ACTORS, schema=pg_pooled_schema.name)
        for _ in range(2)
    ]
    try:
        for round_no in range(5):
            assert _race(clients, f"race-{round_no}") == ["admitted", "refused"]
    finally:
        for c in clients:
            c.close()


def _terminate_sync_sessions(pg: PgSchema, application_name: str = "taskq-sync/%") -> None:
    """End this database's sessions of ``application_name`` and wait until they are gone
    (other xdist workers have databases of their own)."""
    with psycopg.connect(pg.dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE %s",
            (application_name,),
        )
        for _ in range(200):
            left = admin.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name LIKE %s",
                (application_name,),
            ).fetchone()
            if left is not None and left[0] == 0:
                return
            time.sleep(0.01)
        raise AssertionError("the sessions did not end")


@pytest.mark.parametrize("cache_ttl", [5.0, 0.0], ids=["limits-cached", "limits-read"])
def test_a_connection_of_its_own_ended_while_idle_is_replaced_before_the_call(
    pg_pooled_schema: PgSchema, cache_ttl: float
) -> None:
    # A restart, an idle_session_timeout or a proxy's idle cut: the first call after it
    # failed (the async client's did not), with a misleading warning that the limits
    # could not be read when they were read first.
    with SyncJobsClient(
        pg_pooled_schema.dsn,
        actors=ACTORS,
        schema=pg_pooled_schema.name,
        max_pending_cache_ttl=cache_ttl,
    ) as client:
        first = client.enqueue(capped, {})
        _terminate_sync_sessions(pg_pooled_schema)
        with structlog.testing.capture_logs() as logs:
            second = client.enqueue(capped, {})
    assert not [e for e in logs if e["event"] == "taskq.max-pending-read-failed"]
    assert {r.id for r in _stored(pg_pooled_schema)} == {first.id, second.id}


def test_a_connection_past_descriptor_1024_is_kept_between_calls(
    pg_pooled_schema: PgSchema,
) -> None:
    # select() refuses descriptors from FD_SETSIZE on (a web server with many files
    # open): every call took that for a dropped connection and opened a new one.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the process may open {hard} files; the test needs 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with SyncJobsClient(
            pg_pooled_schema.dsn, actors=ACTORS, schema=pg_pooled_schema.name
        ) as client:
            assert client._conn.fileno() >= 1024
            pid = client._conn.info.backend_pid
            for n in range(3):
                client.enqueue(item, {"n": n})
                assert client._conn.info.backend_pid == pid
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the platform does not fork")
def test_a_forked_process_enqueues_on_a_session_of_its_own(pg_pooled_schema: PgSchema) -> None:
    # gunicorn --preload: a client made at import served every worker process on the
    # one session ("prepared statement already exists", one's answer read by another,
    # an enqueue that had committed failing); a lock a thread held at the fork was
    # held for good in the child.
    with SyncJobsClient(
        pg_pooled_schema.dsn, actors=ACTORS, schema=pg_pooled_schema.name
    ) as client:
        client.enqueue(item, {"n": 0})
        session = client._conn.info.backend_pid
        read, write = os.pipe()
        with client._lock:  # as a thread of the parent mid-call
            child = os.fork()
            if child == 0:  # pragma: no cover - the child reports through the pipe
                told = "lock held"
                try:
                    if not client._lock.locked():
                        rows = [client.enqueue(item, {"n": n}) for n in range(1, 4)]
                        pid = client._conn.info.backend_pid
                        told = f"{[r.payload['n'] for r in rows]} {pid}"
                        client.close()
                except BaseException as exc:  # noqa: BLE001 - reported to the parent
                    told = repr(exc)
                finally:
                    os.write(write, told.encode())
                    os._exit(0)
        os.close(write)
        os.waitpid(child, 0)
        with os.fdopen(read) as pipe:
            told = pipe.read()
        assert told.startswith("[1, 2, 3] "), told
        assert int(told.split()[-1]) != session
        # The child's goodbye on the inherited connection did not end the parent's session.
        client.enqueue(item, {"n": 4})
        assert client._conn.info.backend_pid == session
    assert sorted(r.payload["n"] for r in _stored(pg_pooled_schema)) == [0, 1, 2, 3, 4]


def test_a_connection_lost_mid_call_fails_that_call_and_is_replaced_after(
    client: SyncJobsClient, pg_pooled_schema: PgSchema
) -> None:
    # Whether its statement committed cannot be known: no blind retry.
    first = client.enqueue(item, {"n": 1})
    holder = psycopg.connect(pg_pooled_schema.dsn, autocommit=True)
    try:
        key = singleton_lock_key(pg_pooled_schema.name, "sync.item", "only")
        holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
        failed: list[BaseException] = []

        def blocked_enqueue() -> None:
            try:
                client.enqueue(item, {"n": 2}, singleton=True, identity_key="only")
            except BaseException as exc:  # noqa: BLE001 - recorded for the test
                failed.append(exc)

        thread = threading.Thread(target=blocked_enqueue)
        thread.start()
        # It waits on the singleton's lock (a fixed 0.3 s could end before its call
        # began: its connection, ended idle, was replaced and the call went through).
        deadline = time.monotonic() + 30
        while holder.execute(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            (holder.info.backend_pid,),
        ).fetchone() != (True,):
            assert time.monotonic() < deadline, "the enqueue never waited for the lock"
            time.sleep(0.02)
        _terminate_sync_sessions(pg_pooled_schema)
        thread.join(10)
    finally:
        holder.close()
    assert len(failed) == 1 and isinstance(failed[0], psycopg.OperationalError)
    after = client.enqueue(item, {"n": 3})
    assert {r.id for r in _stored(pg_pooled_schema)} == {first.id, after.id}


def test_a_lost_callers_connection_fails_with_the_loss_not_a_limits_warning(
    pg_pooled_schema: PgSchema,
) -> None:
    conn = psycopg.connect(pg_pooled_schema.dsn, autocommit=True, application_name="caller-x")
    client = SyncJobsClient(
        conn, actors=ACTORS, schema=pg_pooled_schema.name, max_pending_cache_ttl=0
    )
    try:
        _terminate_sync_sessions(pg_pooled_schema, "caller-x")
        with structlog.testing.capture_logs() as logs, pytest.raises(psycopg.OperationalError):
            client.enqueue(capped, {})  # the caller's: its loss is the caller's to handle
        assert not [e for e in logs if e["event"] == "taskq.max-pending-read-failed"]
        conn.close()
        with pytest.raises(BackendUnavailableError, match="was given is closed"):
            client.enqueue(capped, {})
    finally:
        conn.close()
    assert _stored(pg_pooled_schema) == []


@pytest.mark.parametrize("call", ["enqueue", "batch", "copy"])
def test_a_callers_transaction_aborted_by_an_earlier_error_is_named_and_nothing_written(
    pg_pooled_schema: PgSchema, call: str, caplog: pytest.LogCaptureFixture
) -> None:
    # It logged a max-pending-read-failed warning, psycopg's "error ignored in rollback
    # ... savepoint does not exist", then raised a raw InFailedSqlTransaction.
    enqueue: Callable[[SyncJobsClient], object] = {
        "enqueue": lambda c: c.enqueue(capped, {}),
        "batch": lambda c: c.enqueue_batch([(capped, {})]),
        "copy": lambda c: c.enqueue_batch_fast([(capped, {})]),
    }[call]
    with psycopg.connect(pg_pooled_schema.dsn) as conn:
        client = SyncJobsClient(
            conn, actors=ACTORS, schema=pg_pooled_schema.name, max_pending_cache_ttl=0
        )
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with (
            structlog.testing.capture_logs() as logs,
            pytest.raises(TransactionAbortedError, match=r"roll it back \(conn.rollback\(\)\)"),
        ):
            enqueue(client)
        assert logs == []
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        assert _stored(pg_pooled_schema) == []
        conn.rollback()  # as told: then it works
        enqueue(client)
        conn.commit()
    assert len(_stored(pg_pooled_schema)) == 1


def test_an_empty_batch_writes_nothing_and_answers_so_on_an_aborted_transaction(
    pg_pooled_schema: PgSchema,
) -> None:
    # enqueue_batch([]) raised TransactionAbortedError where enqueue_batch_fast([]) and
    # JobsClient's enqueue_batch([], connection=...) answer that nothing was written.
    with psycopg.connect(pg_pooled_schema.dsn) as conn:
        client = SyncJobsClient(conn, actors=ACTORS, schema=pg_pooled_schema.name)
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        assert client.enqueue_batch([]) == []
        assert client.enqueue_batch_fast([]) == 0
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR


def test_a_closed_client_says_so(pg_pooled_schema: PgSchema) -> None:
    client = SyncJobsClient(pg_pooled_schema.dsn, actors=ACTORS, schema=pg_pooled_schema.name)
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.enqueue(item, {"n": 1})


def test_a_read_only_server_refusing_the_write_is_read_only_database_error(
    pg_pooled_schema: PgSchema,
) -> None:
    # As PostgresBackend raises it (a standby, default_transaction_read_only): the sync
    # client raised psycopg's ReadOnlySqlTransaction, which said nothing of what to do.
    separator = "&" if "?" in pg_pooled_schema.dsn else "?"
    read_only = f"{pg_pooled_schema.dsn}{separator}options=-c%20default_transaction_read_only%3Don"
    with (
        SyncJobsClient(read_only, actors=ACTORS, schema=pg_pooled_schema.name) as client,
        pytest.raises(ReadOnlyDatabaseError) as info,
    ):
        client.enqueue(item, {"n": 1})
    message = str(info.value)
    assert "cannot execute INSERT in a read-only transaction" in message
    assert message.endswith(
        "point the DSN (--dsn, TASKQ_DSN) at the primary, or have the setting reset"
    )
    assert _stored(pg_pooled_schema) == []


@pytest.mark.parametrize("call", ["enqueue", "enqueue_batch", "enqueue_batch_fast"])
def test_a_write_refused_by_a_session_begun_read_only_is_made_on_a_new_one(call: str) -> None:
    # A provider sets default_transaction_read_only while its disk is full and resets it
    # once there is space: the client's session, begun read-only, stays so, and every
    # enqueue failed until the process restarted; then the first after the reset still
    # did. (A database of its own: the setting would reach every other test's sessions.)
    with throwaway_database() as dsn, migrated_schema(dsn) as schema:
        base, _, name = dsn.rpartition("/")
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
            try:
                client = SyncJobsClient(dsn, actors=ACTORS, schema=schema.name)
            finally:
                admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        with client:
            if call == "enqueue":
                client.enqueue(item, {"n": 1})
            elif call == "enqueue_batch":
                client.enqueue_batch([(item, {"n": 1})])
            else:
                assert client.enqueue_batch_fast([(item, {"n": 1})]) == 1
        assert [row.payload for row in _stored(schema)] == [{"n": 1}]


@pytest.mark.parametrize("told_by", ["argument", "environment"])
def test_poll_only_sends_no_wake(
    pg_pooled_schema: PgSchema, monkeypatch: pytest.MonkeyPatch, told_by: str
) -> None:
    dsn, schema = pg_pooled_schema.dsn, pg_pooled_schema.name
    waking = SyncJobsClient(dsn, actors=ACTORS, schema=schema)
    if told_by == "environment":  # the fleet's setting, as an application's backend takes it
        monkeypatch.setenv("TASKQ_POLL_ONLY", "true")
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        SyncJobsClient(dsn, actors=ACTORS, schema=schema, poll_only=told_by == "argument") as quiet,
        waking,
    ):
        listener.execute(f"LISTEN {wake_channel(schema)}")
        quiet.enqueue(item, {"n": 1})
        quiet.enqueue_batch([(item, {"n": 2}), (item, {"n": 3})])
        assert quiet.enqueue_batch_fast([(item, {"n": 4})]) == 1
        assert list(listener.notifies(timeout=0.3)) == []
        waking.enqueue(item, {"n": 5})  # the listener does hear a wake
        assert list(listener.notifies(timeout=5, stop_after=1))
    assert len(_stored(pg_pooled_schema)) == 5


def test_a_failed_limits_read_fails_open_and_keeps_the_callers_transaction(
    pg_schema: PgSchema,
) -> None:
    # A hiccup: the table the limits are read from is locked by another session for
    # longer than the caller's lock_timeout. (A missing table is no hiccup: an
    # unmigrated schema, which fails the enqueue.)
    with psycopg.connect(pg_schema.dsn) as holder, psycopg.connect(pg_schema.dsn) as conn:
        holder.execute(f"LOCK TABLE {pg_schema.name}.actor_config IN ACCESS EXCLUSIVE MODE")
        conn.execute("SET lock_timeout = '200ms'")  # the caller's transaction is open
        client = SyncJobsClient(conn, actors=ACTORS, schema=pg_schema.name)
        with structlog.testing.capture_logs() as logs:
            kept = client.enqueue_batch([(capped, {}), (capped, {})])
        assert [e["event"] for e in logs] == ["taskq.max-pending-read-failed"]
        assert "LockNotAvailable" in logs[0]["error"]
        # The decorator's literal still applies, counted on the jobs table.
        with pytest.raises(MaxPendingExceededError, match="max_pending=2"):
            client.enqueue(capped, {})
        conn.commit()
    assert {r.id for r in _stored(pg_schema)} == {r.id for r in kept}


def test_a_mixed_case_schema_name_shares_the_backends_singleton_locks(
    pg_pooled_schema: PgSchema,
) -> None:
    # "T_ABC" and "t_abc" are one schema: both clients must lock the same identity key.
    dsn, spelled = pg_pooled_schema.dsn, pg_pooled_schema.name.upper()
    outcome: list[BaseException | JobRow] = []

    async def backend_enqueue() -> JobRow:
        backend = PostgresBackend(dsn, schema=spelled)
        await backend.open()
        try:
            args = EnqueueArgs(actor="sync.item", payload={"n": 2}, identity_key="one")
            return await backend.enqueue(args.model_copy(update={"singleton": True}))
        finally:
            await backend.close()

    def run() -> None:
        try:
            outcome.append(asyncio.run(backend_enqueue()))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    with psycopg.connect(dsn) as conn:
        client = SyncJobsClient(conn, actors=ACTORS, schema=spelled.lower().title())
        client.enqueue(item, {"n": 1}, identity_key="one", singleton=True)  # not committed
        racer = threading.Thread(target=run)
        racer.start()
        racer.join(0.5)
        assert racer.is_alive()  # waiting on the identity's lock
        conn.commit()
        racer.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], SingletonCollisionError), outcome


def test_a_copy_with_a_used_key_or_id_is_a_clear_error(
    client: SyncJobsClient, pg_pooled_schema: PgSchema
) -> None:
    kept = client.enqueue(item, {"n": 1}, idempotency_key="k")
    used_key = EnqueueItem(actor="sync.item", payload={"n": 2}, options={"idempotency_key": "k"})
    with pytest.raises(ValueError, match="idempotency key is already used"):
        client.enqueue_batch_fast([used_key])
    used_id = EnqueueItem(actor="sync.item", payload={"n": 3}, options={"job_id": kept.id})
    with pytest.raises(ValueError, match="already exists"):
        client.enqueue_batch_fast([used_id])
    assert _stored(pg_pooled_schema) == [kept]


@pytest.mark.parametrize(
    "style", ["-c DateStyle=German", "-c DateStyle=SQL,DMY", "-c IntervalStyle=iso_8601"]
)
def test_rows_are_read_in_any_date_and_interval_style(
    pg_pooled_schema: PgSchema, style: str
) -> None:
    # psycopg reads text times and durations only in the default styles: the insert
    # had committed when reading its row raised, and a retry enqueued twice.
    with psycopg.connect(pg_pooled_schema.dsn, options=style, autocommit=True) as conn:
        client = SyncJobsClient(conn, actors=ACTORS, schema=pg_pooled_schema.name)
        row = client.enqueue(item, {"n": 1}, idempotency_key="k", timeout=5, delay=60)
        assert client.enqueue(item, {"n": 1}, idempotency_key="k", timeout=5) == row
        assert client.enqueue_batch([(item, {"n": 2})])[0].status is JobStatus.PENDING
        assert client.enqueue_batch_fast([(item, {"n": 3})]) == 1
    stored = {r.id: r for r in _stored(pg_pooled_schema)}
    assert len(stored) == 3 and stored[row.id] == row
    dsn = make_conninfo(pg_pooled_schema.dsn, options=style)
    with SyncJobsClient(dsn, actors=ACTORS, schema=pg_pooled_schema.name) as own:
        assert own.enqueue(item, {"n": 4}).created_at.tzinfo is UTC


def test_the_dsns_own_session_options_are_kept(
    pg_pooled_schema: PgSchema, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TaskQ's options replaced the DSN's (and PGOPTIONS'), which libpq takes as one string.
    read_only = "-c default_transaction_read_only=on"
    dsn = make_conninfo(pg_pooled_schema.dsn, options=read_only)
    for target in (dsn, "PGOPTIONS"):
        if target == "PGOPTIONS":
            monkeypatch.setenv("PGOPTIONS", read_only)
            target = pg_pooled_schema.dsn
        with (
            SyncJobsClient(target, actors=ACTORS, schema=pg_pooled_schema.name) as client,
            pytest.raises(ReadOnlyDatabaseError),
        ):
            client.enqueue(item, {"n": 1})
    assert _stored(pg_pooled_schema) == []


def test_the_services_session_options_are_kept_over_pgoptions(
    pg_pooled_schema: PgSchema, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The options of the service the DSN names were replaced by TaskQ's (joined to
    # PGOPTIONS', which libpq ranks below a service's): psycopg reads no service file.
    services = tmp_path / "pg_service.conf"
    services.write_text("[tq]\noptions=-c default_transaction_read_only=on\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    monkeypatch.setenv("PGOPTIONS", "-c default_transaction_read_only=off")
    monkeypatch.delenv("PGSERVICE", raising=False)
    dsn = make_conninfo(pg_pooled_schema.dsn, service="tq")
    with (
        SyncJobsClient(dsn, actors=ACTORS, schema=pg_pooled_schema.name) as client,
        pytest.raises(ReadOnlyDatabaseError),
    ):
        client.enqueue(item, {"n": 1})
    assert _stored(pg_pooled_schema) == []


def test_a_call_that_waited_on_a_close_does_not_reopen(pg_pooled_schema: PgSchema) -> None:
    # The closed check came before the lock: a call waiting while close() ran then
    # found the connection closed and opened a new one, on a closed client.
    client = SyncJobsClient(pg_pooled_schema.dsn, actors=ACTORS, schema=pg_pooled_schema.name)
    outcome: list[BaseException | JobRow] = []

    def call() -> None:
        try:
            outcome.append(client.enqueue(item, {"n": 1}))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    with client._lock:  # a call in progress; the next one waits for it
        waiting = threading.Thread(target=call)
        waiting.start()
        waiting.join(timeout=0.2)
        client._closed = True  # what close() does once the running call ends
        client._conn.close()
    waiting.join(timeout=10)
    [error] = outcome
    assert isinstance(error, RuntimeError) and "closed" in str(error)
    assert client._conn.closed
    assert _stored(pg_pooled_schema) == []


def test_an_idempotent_hit_at_max_pending_is_in_utc(pg_pooled_schema: PgSchema) -> None:
    with psycopg.connect(pg_pooled_schema.dsn, options="-c TimeZone=Asia/Tokyo") as conn:
        client = SyncJobsClient(conn, actors=ACTORS, schema=pg_pooled_schema.name)
        first = client.enqueue(capped, {}, idempotency_key="order-7")
        client.enqueue(capped, {})
        again = client.enqueue(capped, {}, idempotency_key="order-7")
        assert again == first and again.created_at.tzinfo is UTC


@pytest.mark.parametrize("target", [None, b"postgresql://x", 5432])
def test_a_target_neither_dsn_nor_connection_is_a_clear_error(target: Any) -> None:
    with pytest.raises(TypeError, match="a DSN string or a psycopg.Connection") as refused:
        SyncJobsClient(target, actors=ACTORS)
    # None is a connection not made yet (Django's connection.connection before its
    # first query), not async code: it was sent to "TaskQ's JobsClient".
    assert ("ensure_connection()" in str(refused.value)) is (target is None)
    assert ("TaskQ's JobsClient" in str(refused.value)) is (target is not None)


def test_a_url_in_upper_case_is_taken_as_the_backend_takes_it(pg_pooled_schema: PgSchema) -> None:
    # libpq takes a URL only by its scheme in lower case: "POSTGRESQL://..." was read
    # as a key=value string, refused as 'missing "***" after "***"'.
    scheme, rest = pg_pooled_schema.dsn.split(":", 1)
    with SyncJobsClient(
        f"{scheme.upper()}:{rest}", actors=ACTORS, schema=pg_pooled_schema.name
    ) as client:
        row = client.enqueue(item, {"n": 1})
    assert _stored(pg_pooled_schema) == [row]


@pytest.mark.parametrize("around", [("", "\n"), (" ", ""), ("\t", " \r\n")])
def test_whitespace_around_a_dsn_is_left_out_as_the_backend_leaves_it_out(
    pg_pooled_schema: PgSchema, around: tuple[str, str]
) -> None:
    # A secret's trailing newline went into the database name ('database "... " does
    # not exist'); a leading space made the URL a broken key=value string.
    before, after = around
    with SyncJobsClient(
        f"{before}{pg_pooled_schema.dsn}{after}", actors=ACTORS, schema=pg_pooled_schema.name
    ) as client:
        row = client.enqueue(item, {"n": 1})
    assert _stored(pg_pooled_schema) == [row]


@pytest.mark.parametrize("dsn", ["", "  "])
def test_an_empty_dsn_is_refused_not_read_as_libpqs_defaults(
    pg_pooled_schema: PgSchema, monkeypatch: pytest.MonkeyPatch, dsn: str
) -> None:
    # An unset DATABASE_URL connected to whatever PGHOST and PGDATABASE named.
    parts = psycopg.conninfo.conninfo_to_dict(pg_pooled_schema.dsn)
    for name, key in (("PGHOST", "host"), ("PGPORT", "port"), ("PGDATABASE", "dbname")):
        monkeypatch.setenv(name, str(parts[key]))
    with pytest.raises(ConfigurationError, match="empty DSN.*'postgresql://'"):
        SyncJobsClient(dsn, actors=ACTORS, schema=pg_pooled_schema.name)


@pytest.mark.parametrize(
    ("dsn", "reason"),
    [
        ("postgresql://u@127.0.0.1:1/x?sslmode=sometimes", 'invalid sslmode value: "***"'),
        ("host=127.0.0.1 port=abc", 'value "***" for connection option "port"'),
        ("host=127.0.0.1 hostaddr=nowhere", "could not parse network address"),
    ],
)
def test_an_option_libpq_refuses_is_a_configuration_error(dsn: str, reason: str) -> None:
    # An outage's BackendUnavailableError ("connection is bad: ..."), with the value
    # quoted as given, though nothing had been tried and a retry fails alike.
    with pytest.raises(ConfigurationError, match="invalid DSN") as refused:
        SyncJobsClient(dsn, actors=ACTORS)
    assert reason in str(refused.value) and "connection is bad" not in str(refused.value)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ("-c shared_buffers=64MB", "shared_buffers.*remove it from the DSN"),
        ("-c no_such_setting=1", "no_such_setting.*DSN's options"),
    ],
    ids=["server-wide", "unknown"],
)
def test_a_setting_the_server_refuses_in_the_options_is_a_configuration_error(
    pg_pooled_schema: PgSchema, options: str, said: str
) -> None:
    # As the backend says it (55P02 for a server-wide setting, 42704 for an unknown one;
    # refused at every try): it was an outage's BackendUnavailableError here.
    dsn = make_conninfo(pg_pooled_schema.dsn, options=options)
    with pytest.raises(ConfigurationError, match=said) as info:
        SyncJobsClient(dsn, actors=ACTORS, schema=pg_pooled_schema.name)
    assert not isinstance(info.value, BackendUnavailableError)


def test_a_missing_unix_socket_is_still_backend_unavailable() -> None:
    # libpq refuses it at once too ("connection is bad"), as it does a bad option.
    with pytest.raises(BackendUnavailableError, match="/nonexistent/.s.PGSQL"):
        SyncJobsClient("postgresql:///x?host=/nonexistent", actors=ACTORS)


def test_an_unreachable_server_is_backend_unavailable() -> None:
    # A port nothing listens on (this machine only): the error TaskQ's backend raises.
    with pytest.raises(BackendUnavailableError, match="cannot connect to PostgreSQL at"):
        SyncJobsClient("postgresql://postgres@127.0.0.1:1/none?connect_timeout=2", actors=ACTORS)
    with pytest.raises(ConfigurationError, match="invalid DSN"):
        SyncJobsClient("postgresql://postgres@127.0.0.1:5432/x?nonsense=1", actors=ACTORS)


@pytest.mark.parametrize("own_connection", [True, False], ids=["dsn", "callers-connection"])
def test_an_unmigrated_schema_is_the_backends_configuration_error(
    pg_pooled_schema: PgSchema, own_connection: bool
) -> None:
    # It was the driver's "relation does not exist"; the async client names the fix.
    schema = f"{pg_pooled_schema.name}_none"
    dsn = pg_pooled_schema.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        target: Any = dsn if own_connection else conn
        with SyncJobsClient(target, actors=ACTORS, schema=schema) as client:
            given = f"--dsn '{dsn}'" if own_connection else "--dsn DSN"
            with (
                structlog.testing.capture_logs() as logs,
                pytest.raises(ConfigurationError, match="has no TaskQ tables") as refused,
            ):
                client.enqueue(item, Item(n=1))
    assert f"taskq migrate {given} --schema {schema}" in str(refused.value)
    # Not first a warning that the max_pending limits could not be read: no hiccup.
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == []


def _ledger(pg: PgSchema, sql: str, name: str) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(sql.format(schema=pg.name), (name,))


@pytest.mark.parametrize("own_connection", [True, False], ids=["dsn", "callers-connection"])
def test_a_schema_this_code_cannot_run_on_is_refused_as_the_backend_refuses_it(
    pg_schema: PgSchema, own_connection: bool
) -> None:
    # Only a schema without tables was named: one lacking a migration this code needs
    # took the jobs (or failed with the driver's "column does not exist"), as did one a
    # newer TaskQ's post migration changed; PostgresBackend.open() refuses both.
    needed = "01.00.05_02_pre_actor_config_queue.sql"
    _ledger(pg_schema, "DELETE FROM {schema}.schema_migrations WHERE version = %s", needed)
    hint = f"lacks migrations this version of TaskQ needs ({needed}): run `taskq migrate --dsn"
    with psycopg.connect(pg_schema.dsn) as conn:
        target: Any = pg_schema.dsn if own_connection else conn
        with SyncJobsClient(target, actors=ACTORS, schema=pg_schema.name) as client:
            with pytest.raises(ConfigurationError, match=re.escape(hint)):
                client.enqueue(item, Item(n=1))
            # A caller's transaction stays usable: the check failed, no statement.
            assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.rollback()
    record = (
        "INSERT INTO {schema}.schema_migrations (version, checksum) VALUES (%s, repeat('0', 64))"
    )
    _ledger(pg_schema, record, needed)
    _ledger(pg_schema, record, "99.00.00_50_post_drop_things.sql")
    with psycopg.connect(pg_schema.dsn) as conn:
        target = pg_schema.dsn if own_connection else conn
        with (
            SyncJobsClient(target, actors=ACTORS, schema=pg_schema.name) as client,
            pytest.raises(ConfigurationError, match="migrated by a newer TaskQ .*99.00.00_50_post"),
        ):
            client.enqueue(item, Item(n=1))
    with psycopg.connect(pg_schema.dsn) as conn:  # not the backend: it refuses the schema too
        assert conn.execute(f"SELECT count(*) FROM {pg_schema.name}.jobs").fetchone() == (0,)


def test_a_server_that_never_answers_is_given_up_on_as_the_backend_does() -> None:
    # libpq's wait without a connect_timeout is psycopg's 130 s (a web request, and every
    # thread sharing the client, stalled that long); the backend gives up after 10 s.
    import socket

    with socket.socket() as silent:  # accepts the connection, never answers the login
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError, match="cannot connect to PostgreSQL at"):
            SyncJobsClient(f"postgresql://postgres@127.0.0.1:{port}/none", actors=ACTORS)
        assert time.monotonic() - started < 20
        # A DSN's own connect_timeout is the one libpq takes.
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError):
            SyncJobsClient(
                f"postgresql://postgres@127.0.0.1:{port}/none?connect_timeout=2", actors=ACTORS
            )
        assert time.monotonic() - started < 5


def test_a_service_files_connect_timeout_is_the_one_the_client_connects_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default was passed whenever the DSN and PGCONNECT_TIMEOUT gave none, over the
    # service's (psycopg times the attempt itself and reads no service file).
    from psycopg.conninfo import conninfo_to_dict

    from taskq_postgres._sync_client import _connect_timeout

    services = tmp_path / "pg_service.conf"
    services.write_text("# ours\n[other]\nconnect_timeout=7\n\n[taskq]\nconnect_timeout=3\n")
    for name in ("PGSERVICE", "PGSERVICEFILE", "PGSYSCONFDIR", "PGCONNECT_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.pg_service.conf
    dsn = "postgresql://postgres@127.0.0.1/none"
    assert _connect_timeout(conninfo_to_dict(dsn)) == {"connect_timeout": 10}
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    monkeypatch.setenv("PGSERVICE", "taskq")
    assert _connect_timeout(conninfo_to_dict(dsn)) == {"connect_timeout": "3"}
    # The service a DSN names; libpq ranks it over the environment's timeout.
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "5")
    assert _connect_timeout(conninfo_to_dict(f"{dsn}?service=other")) == {"connect_timeout": "7"}
    # The system directory's file, when the user's defines no such service.
    monkeypatch.setenv("PGSYSCONFDIR", str(tmp_path))
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "missing.conf"))
    assert _connect_timeout(conninfo_to_dict(dsn)) == {"connect_timeout": "3"}
    # A DSN's own is psycopg's to read; so is PGCONNECT_TIMEOUT with no service's.
    assert _connect_timeout(conninfo_to_dict(f"{dsn}?connect_timeout=4")) == {}
    monkeypatch.setenv("PGSERVICE", "undefined")
    assert _connect_timeout(conninfo_to_dict(dsn)) == {}

    import socket

    monkeypatch.setenv("PGSERVICE", "taskq")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    monkeypatch.delenv("PGCONNECT_TIMEOUT")
    with socket.socket() as silent:  # accepts the connection, never answers the login
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError):
            SyncJobsClient(
                f"postgresql://postgres@127.0.0.1:{silent.getsockname()[1]}/none", actors=ACTORS
            )
        assert 3 <= time.monotonic() - started < 8  # the service's 3 s, not the default 10 s


def test_psycopgs_async_connection_is_refused_by_either_client_without_sending_to_the_other(
    pg_pooled_schema: PgSchema,
) -> None:
    # Each sent the user to the other: SyncJobsClient to "TaskQ's JobsClient", whose
    # enqueue_with_conn to "SyncJobsClient(conn, ...)" (which refused it first).
    async def both() -> tuple[str, str]:
        conn = await psycopg.AsyncConnection.connect(pg_pooled_schema.dsn)
        backend = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name)
        await backend.open()
        try:
            with pytest.raises(TypeError) as by_sync:
                SyncJobsClient(conn, actors=ACTORS)  # type: ignore[arg-type]
            with pytest.raises(TypeError) as by_async:
                await backend.enqueue_with_conn(conn, EnqueueArgs(actor="a"))
        finally:
            await backend.close()
            await conn.close()
        return str(by_sync.value), str(by_async.value)

    by_sync, by_async = asyncio.run(both())
    for message in (by_sync, by_async):
        assert "psycopg's AsyncConnection has no TaskQ client" in message, message
        assert "asyncpg connection" in message, message
    assert "SyncJobsClient(" not in by_async


def test_the_applications_actors_are_taken_as_jobs_client_takes_them(
    pg_pooled_schema: PgSchema,
) -> None:
    # TaskQ.actors (what JobsClient is built from) is a mapping: iterated, its names were
    # refused as "'sync.item' is not an actor: decorate the function with @actor".
    from taskq import TaskQ

    tq = TaskQ("memory://", actors=ACTORS)
    with SyncJobsClient(
        pg_pooled_schema.dsn, actors=tq.actors, schema=pg_pooled_schema.name
    ) as client:
        row = client.enqueue(item, {"n": 1})
    assert _stored(pg_pooled_schema, row.id) == [row]


def test_clients_made_per_request_share_the_max_pending_limits_read(
    pg_pooled_schema: PgSchema,
) -> None:
    # A web app makes a client per request, on the connection of the request (Django
    # opens one per request by default): each read the limits again (a savepoint and a
    # query before every enqueue), where JobsClient reads them once per cache period.
    # Seen here by a lock on actor_config: a read waits on it, and fails open, warning.
    dsn, schema = pg_pooled_schema.dsn, pg_pooled_schema.name
    with psycopg.connect(dsn) as conn:
        SyncJobsClient(conn, actors=ACTORS, schema=schema).enqueue(item, {"n": 1})
        conn.commit()
    with (
        psycopg.connect(dsn) as locker,
        psycopg.connect(dsn, options="-c lock_timeout=100") as conn,
        structlog.testing.capture_logs() as logs,
    ):
        locker.execute(f"LOCK TABLE {schema}.actor_config IN ACCESS EXCLUSIVE MODE")
        SyncJobsClient(conn, actors=ACTORS, schema=schema).enqueue(item, {"n": 2})
        conn.commit()
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == []
    assert len(_stored(pg_pooled_schema)) == 2


@pytest.mark.parametrize("behind_pooler", [False, True], ids=["direct", "pooler"])
def test_the_clients_own_transactions_carry_the_backends_idle_limit(
    pg_pooled_schema: PgSchema, behind_pooler: bool
) -> None:
    # "TaskQ's own transactions set their limit" (the backend's, 60 s): the client's
    # carried none, so a producer frozen inside one (a singleton's, holding its
    # identity's lock) blocked that identity's enqueues for good.
    with (
        SyncJobsClient(
            pg_pooled_schema.dsn,
            actors=ACTORS,
            schema=pg_pooled_schema.name,
            behind_pooler=behind_pooler,
        ) as client,
        client._turn() as cur,
        client._atomic(cur),
    ):
        cur.execute("SHOW idle_in_transaction_session_timeout")
        assert cur.fetchone() == {"idle_in_transaction_session_timeout": "1min"}
