"""The LISTEN connection survives being killed: it reconnects and wakes again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import pytest

from taskq import EnqueueArgs, JobStatus, TaskQ, WorkerSettings, actor
from taskq.worker import Worker
from taskq_postgres import PostgresBackend
from taskq_postgres._listener import NotifyListener
from taskq_postgres._transient import TRANSIENT_PG_ERRORS
from taskq_postgres.channels import worker_channel
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

LONG = timedelta(hours=1)


@pytest.fixture
async def backend(pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(
        pg_pooled_schema.dsn,
        schema=pg_pooled_schema.name,
        notify_health_check_interval=timedelta(milliseconds=200),
    )
    await backend.open()
    yield backend
    await backend.close()


async def _kill_notify_connection(backend: PostgresBackend) -> int:
    conn = await asyncpg.connect(backend.dsn)
    try:
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = $1",
            f"taskq-notify/{backend.instance_id}",
        )
    finally:
        await conn.close()
    return int(killed)


async def _until(predicate: Any, seconds: float = 10.0) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():  # noqa: ASYNC110 - a counter, not an event, is observed
            await asyncio.sleep(0.02)


async def test_listener_reconnects_after_its_connection_is_terminated(
    backend: PostgresBackend,
) -> None:
    async with backend.subscribe_wake() as wake:
        assert await _kill_notify_connection(backend) == 1
        await _until(lambda: backend.notify_reconnects == 1)
        await asyncio.sleep(0.05)
        wake.clear()
        await backend.enqueue(EnqueueArgs(actor="a"))
        async with asyncio.timeout(5):
            await wake.wait()


async def test_a_workers_own_channel_is_listened_to_again_after_a_reconnect(
    backend: PostgresBackend,
) -> None:
    worker = uuid4()
    await backend.enqueue(EnqueueArgs(actor="a"))
    [job] = await backend.dispatch_batch(worker, ["default"], 1, timedelta(minutes=5))
    async with backend.subscribe_worker_cancel_wake(worker) as cancel_wake:
        assert await _kill_notify_connection(backend) == 1
        await _until(lambda: backend.notify_reconnects == 1)
        assert cancel_wake.is_set()  # woken once for what the outage may have hidden
        cancel_wake.clear()
        assert await backend.write_cancel_request(job.id, "stop")
        async with asyncio.timeout(5):
            await cancel_wake.wait()


async def test_leaving_a_workers_channel_unlistens_it(pg_pooled_schema: PgSchema) -> None:
    # No health check while the test reads the notify connection itself.
    backend = PostgresBackend(
        pg_pooled_schema.dsn, schema=pg_pooled_schema.name, notify_health_check_interval=LONG
    )
    await backend.open()
    try:
        channel = worker_channel(backend.schema, worker := uuid4())
        async with backend.subscribe_wake():  # keeps the LISTEN connection up
            async with backend.subscribe_worker_cancel_wake(worker):
                assert channel in await _listened(backend)
            assert channel not in await _listened(backend)
    finally:
        await backend.close()


async def _listened(backend: PostgresBackend) -> set[str]:
    """The channels the notify connection listens to (read on that connection)."""
    listener = backend._require_listener()
    assert listener is not None and listener._conn is not None
    rows = await listener._conn.fetch("SELECT pg_listening_channels() AS channel")
    return {row["channel"] for row in rows}


async def test_a_worker_run_completes_after_the_notify_connection_dies(
    backend: PostgresBackend,
) -> None:
    @actor(name="noop")
    async def noop(payload: dict[str, Any]) -> str:
        return "done"

    tq = TaskQ(backend.dsn, actors=[noop], backend=backend)
    # Polling every 30 s: only a working LISTEN connection can start jobs quickly.
    settings = WorkerSettings.load(
        # The watchdogs off: in the test's process, a trip ends the whole pytest worker.
        {
            "poll_interval": "30s",
            "heartbeat_interval": "100ms",
            "lock_lease": "2s",
            "watchdog_enabled": False,
        },
        env={},
    )
    worker = Worker(tq, settings)
    run = asyncio.create_task(worker.run())
    try:
        first = await tq.client.enqueue(noop, {})
        assert await tq.client.wait_for_result(first.id, timeout=5) == "done"
        assert await _kill_notify_connection(backend) == 1
        await _until(lambda: backend.notify_reconnects >= 1)
        second = await tq.client.enqueue(noop, {})
        assert await tq.client.wait_for_result(second.id, timeout=5) == "done"
    finally:
        worker.stop()
        await asyncio.wait_for(run, 10)
    row = await tq.client.get(second.id)
    assert row is not None and row.status is JobStatus.SUCCEEDED


async def test_the_listen_connection_keeps_tcp_alive(backend: PostgresBackend) -> None:
    async with backend.subscribe_wake():
        listener = backend._listener
        assert listener is not None and listener._conn is not None
        assert await listener._conn.fetchval("SHOW tcp_keepalives_idle") == "30"


@asynccontextmanager
async def _factory_backend(
    pg: PgSchema,
) -> AsyncIterator[tuple[PostgresBackend, list[asyncpg.Connection[Any]]]]:
    """An open backend whose LISTEN connections come from a factory keeping each one."""
    made: list[asyncpg.Connection[Any]] = []

    async def factory() -> asyncpg.Connection[Any]:
        conn = await asyncpg.connect(pg.dsn)
        made.append(conn)
        return conn

    backend = PostgresBackend(
        pg.dsn,
        schema=pg.name,
        notify_conn_factory=factory,
        notify_health_check_interval=timedelta(milliseconds=100),
    )
    await backend.open()
    try:
        yield backend, made
    finally:
        await backend.close()


async def test_a_connection_factory_is_used_for_every_listen_connection(
    pg_pooled_schema: PgSchema,
) -> None:
    async with _factory_backend(pg_pooled_schema) as (backend, made), backend.subscribe_wake():
        assert len(made) == 1
        listener = backend._listener
        assert listener is not None and listener._conn is made[0]
        await made[0].close()  # the health check notices and reconnects
        await _until(lambda: backend.notify_reconnects == 1)
        assert len(made) == 2


async def test_a_health_check_failing_with_any_error_still_reconnects(
    pg_pooled_schema: PgSchema,
) -> None:
    """asyncpg can raise errors outside the transient tuple on a dying connection."""
    async with (
        _factory_backend(pg_pooled_schema) as (backend, made),
        backend.subscribe_wake() as wake,
    ):
        # The first connection's `SELECT 1` now fails with a plain ValueError.
        await made[0].set_type_codec(
            "int4",
            schema="pg_catalog",
            encoder=str,
            decoder=_undecodable,
            format="text",
        )
        await _until(lambda: backend.notify_reconnects == 1)
        assert len(made) == 2 and made[0].is_closed()
        wake.clear()
        await backend.enqueue(EnqueueArgs(actor="a"))
        async with asyncio.timeout(5):
            await wake.wait()


def _undecodable(text: str) -> int:
    raise ValueError(f"cannot decode {text!r}")


def _listener(connect: Any) -> NotifyListener:
    """A listener on fresh channels, checking its health and reconnecting quickly."""
    wake_channel, events_channel = (f"t_{uuid4().hex}" for _ in range(2))
    return NotifyListener(
        connect,
        wake_channel,
        events_channel,
        health_check_interval=0.1,
        initial_backoff=0.01,
        transient=TRANSIENT_PG_ERRORS,
    )


async def test_subscribing_while_postgres_is_out_of_reach_polls_then_listens(
    pg_pooled_schema: PgSchema,
) -> None:
    # A worker loop subscribing during an outage must not fail (it used to end the
    # worker): its event is set so it polls, and the LISTEN starts once Postgres answers.
    refused = 2

    async def connect() -> asyncpg.Connection[Any]:
        nonlocal refused
        if refused:
            refused -= 1
            raise OSError("connection refused")
        return await asyncpg.connect(pg_pooled_schema.dsn)

    own_channel = f"t_{uuid4().hex}"
    listener = _listener(connect)
    try:
        async with (
            listener.subscribe_wake() as wake,
            listener.subscribe_worker_cancel(own_channel) as own,
        ):
            assert wake.is_set() and own.is_set()
            await _until(lambda: listener.reconnects == 1)
            wake.clear()
            own.clear()
            conn = await asyncpg.connect(pg_pooled_schema.dsn)
            try:
                await conn.execute(
                    "SELECT pg_notify($1, ''), pg_notify($2, '')",
                    listener._wake_channel,
                    own_channel,
                )
            finally:
                await conn.close()
            async with asyncio.timeout(5):
                await wake.wait()
                await own.wait()
    finally:
        await listener.close()


async def test_leaving_a_channel_does_not_wait_for_a_reconnect_to_a_stalled_server(
    pg_pooled_schema: PgSchema,
) -> None:
    # The reconnect held the listener's lock through its connect (connect_timeout, 30 s
    # here), and the unsubscribe in a stopping heartbeat's finally waited for that lock:
    # the worker's stop overran its hard wall.
    from urllib.parse import urlsplit

    from taskq_testing.faults import TcpProxy

    with TcpProxy(urlsplit(pg_pooled_schema.dsn).port or 5432) as proxy:
        backend = PostgresBackend(
            proxy.through(pg_pooled_schema.dsn),
            schema=pg_pooled_schema.name,
            notify_health_check_interval=timedelta(milliseconds=200),
            connect_timeout=timedelta(seconds=30),
        )
        await backend.open()
        try:
            subscription = backend.subscribe_worker_cancel_wake(uuid4())
            await subscription.__aenter__()
            proxy.stall()
            await asyncio.sleep(2.5)  # the health check failed; the reconnect is connecting
            async with asyncio.timeout(5):
                await subscription.__aexit__(None, None, None)
        finally:
            proxy.restore()
            await backend.close()


async def _notify(dsn: str, channel: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_notify($1, '')", channel)
    finally:
        await conn.close()


async def test_a_listen_that_failed_on_a_healthy_connection_is_listened_to_again(
    pg_pooled_schema: PgSchema,
) -> None:
    # The connection answered its health checks, so the keeper never reconnected: the
    # channel stayed deaf, and with the loss still flagged the checks ran back to back.
    listener = _listener(lambda: asyncpg.connect(pg_pooled_schema.dsn))
    own_channel = f"t_{uuid4().hex}"
    try:
        async with listener.subscribe_worker_cancel(own_channel) as own:
            conn = listener._conn
            assert conn is not None
            # What a LISTEN that failed leaves behind (_change_listener).
            await conn.remove_listener(own_channel, listener._on_worker_event)
            listener._lost.set()
            await _until(lambda: listener.reconnects == 1)
            own.clear()
            await _notify(pg_pooled_schema.dsn, own_channel)
            async with asyncio.timeout(5):
                await own.wait()
    finally:
        await listener.close()


async def test_a_connection_factory_failing_its_own_way_does_not_end_the_reconnects(
    pg_pooled_schema: PgSchema,
) -> None:
    made = 0

    async def connect() -> asyncpg.Connection[Any]:
        nonlocal made
        made += 1
        if made == 2:  # the first reconnect: a credentials provider's own error
            raise RuntimeError("secret store unavailable")
        return await asyncpg.connect(pg_pooled_schema.dsn)

    listener = _listener(connect)
    try:
        async with listener.subscribe_wake() as wake:
            assert listener._conn is not None
            listener._conn.terminate()
            await _until(lambda: listener.reconnects == 1)
            assert made == 3
            wake.clear()
            await _notify(pg_pooled_schema.dsn, listener._wake_channel)
            async with asyncio.timeout(5):
                await wake.wait()
    finally:
        await listener.close()


async def test_a_listen_waits_for_a_health_check_in_flight(pg_pooled_schema: PgSchema) -> None:
    # Sent on the same connection while the check's SELECT 1 ran, the LISTEN failed
    # ("another operation is in progress"), which cost a reconnect.
    from urllib.parse import urlsplit

    from taskq_testing.faults import TcpProxy

    with TcpProxy(urlsplit(pg_pooled_schema.dsn).port or 5432) as proxy:
        listener = NotifyListener(
            lambda: asyncpg.connect(proxy.through(pg_pooled_schema.dsn)),
            f"t_{uuid4().hex}",
            f"t_{uuid4().hex}",
            health_check_interval=1.0,
            transient=TRANSIENT_PG_ERRORS,
        )
        checks = 0
        check = listener._healthy

        async def counted() -> bool:
            nonlocal checks
            checks += 1
            return await check()

        listener._healthy = counted  # type: ignore[method-assign]
        own_channel = f"t_{uuid4().hex}"
        try:
            async with listener.subscribe_wake():
                proxy.stall()
                await _until(lambda: checks >= 1, 5)
                await asyncio.sleep(0.05)  # its SELECT 1 is on the wire, stalled
                asyncio.get_running_loop().call_later(0.3, proxy.restore)
                async with listener.subscribe_worker_cancel(own_channel) as own:
                    own.clear()
                    await _notify(pg_pooled_schema.dsn, own_channel)
                    async with asyncio.timeout(5):
                        await own.wait()
                assert listener.reconnects == 0
        finally:
            proxy.restore()
            await listener.close()


async def test_a_hostile_notify_on_the_events_channel_is_ignored(
    backend: PostgresBackend,
) -> None:
    # Any role that may connect may NOTIFY: '[' * 8000 raised RecursionError in the
    # listener's callback (a traceback each time); a real cancel still gets through.
    import structlog.testing

    from taskq_postgres.channels import events_channel

    channel = events_channel(backend.schema)
    sender = await asyncpg.connect(backend.dsn)
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        async with backend.subscribe_cancel_wake() as cancelled:
            await asyncio.sleep(0.1)
            cancelled.clear()
            with structlog.testing.capture_logs():
                await sender.execute("SELECT pg_notify($1, $2)", channel, "[" * 7990)
                await asyncio.sleep(0.1)
            assert not cancelled.is_set()
            await sender.execute("SELECT pg_notify($1, $2)", channel, '{"type": "cancel"}')
            async with asyncio.timeout(5):
                await cancelled.wait()
            # One sender's notifications arrive in order: the hostile one was handled.
            assert errors == []
    finally:
        loop.set_exception_handler(None)
        await sender.close()
