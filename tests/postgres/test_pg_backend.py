"""PostgresBackend beyond the conformance suite: Postgres traps, transactions, diagnostics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
import pytest_asyncio

from taskq.backend import JobStatus
from taskq.errors import EnqueueError, SingletonCollisionError
from taskq.models import (
    AttemptRow,
    BatchRow,
    BatchStatus,
    EnqueueArgs,
    JobFilter,
    JobRow,
    QueueConfig,
)
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

LEASE = timedelta(minutes=5)
SHORT = timedelta(milliseconds=100)


@pytest_asyncio.fixture
async def backend(pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(
        pg_pooled_schema.dsn,
        schema=pg_pooled_schema.name,
        cancel_reclaim_headroom=timedelta(milliseconds=600),
        reclaim_event_visibility_delay=timedelta(milliseconds=200),
    )
    await backend.open()
    yield backend
    await backend.close()


async def _running(backend: PostgresBackend, lease: timedelta = LEASE) -> tuple[JobRow, UUID]:
    """A running job (in a queue of its own) and its worker."""
    worker = uuid4()
    queue = f"q-{uuid4().hex[:8]}"
    await backend.enqueue(EnqueueArgs(actor="a", queue=queue))
    [job] = await backend.dispatch_batch(worker, [queue], 1, lease)
    return job, worker


# -- transactions of the caller's -------------------------------------------------------------


async def test_a_connection_of_another_kind_is_refused_naming_what_to_pass(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    # It failed deep in the statement: AttributeError: 'Connection' has no 'fetchrow'.
    import psycopg

    args = EnqueueArgs(actor="a")
    with psycopg.connect(pg_pooled_schema.dsn) as foreign:
        for conn in (foreign, "postgresql://elsewhere"):
            with pytest.raises(TypeError, match=r"asyncpg connection.*SyncJobsClient\(conn"):
                await backend.enqueue_with_conn(conn, args)
            with pytest.raises(TypeError, match="must be an asyncpg connection"):
                await backend.enqueue_batch([args], connection=conn)
            with pytest.raises(TypeError, match="must be an asyncpg connection"):
                await backend.enqueue_batch_fast([args], connection=conn)
            with pytest.raises(TypeError, match="must be an asyncpg connection"):
                await backend.count_batch_non_terminal(uuid4(), connection=conn)
    pool = await asyncpg.create_pool(pg_pooled_schema.dsn, min_size=1, max_size=1)
    try:
        async with pool.acquire() as pooled:  # an asyncpg pool's proxy is one
            await backend.enqueue_with_conn(pooled, args)
    finally:
        await pool.close()
    assert await backend.get(args.id) is not None


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
async def test_enqueue_with_conn_lives_and_wakes_with_the_callers_transaction(
    backend: PostgresBackend, commit: bool
) -> None:
    args = EnqueueArgs(actor="a")
    async with backend.subscribe_wake() as woken, backend.connection() as conn:
        transaction = conn.transaction()
        await transaction.start()
        row = await backend.enqueue_with_conn(conn, args)
        assert row.id == args.id
        await asyncio.sleep(0.2)
        assert not woken.is_set(), "woken before the transaction committed"
        assert await backend.get(args.id) is None
        await (transaction.commit() if commit else transaction.rollback())
        if commit:
            await asyncio.wait_for(woken.wait(), 5)
        else:
            await asyncio.sleep(0.2)
            assert not woken.is_set()
    assert (await backend.get(args.id) is not None) is commit


async def test_concurrent_singletons_admit_exactly_one(backend: PostgresBackend) -> None:
    attempts = [EnqueueArgs(actor="a", identity_key="user-1", singleton=True) for _ in range(8)]
    results = await asyncio.gather(
        *(backend.enqueue(args) for args in attempts), return_exceptions=True
    )
    admitted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, SingletonCollisionError)]
    assert (len(admitted), len(refused)) == (1, 7), results
    assert len(await backend.list_jobs(JobFilter(identity_key="user-1"))) == 1


@pytest.mark.parametrize(
    "isolation", ["repeatable_read", "serializable", "read_committed", "read_uncommitted"]
)
async def test_a_singleton_in_a_callers_transaction_needs_read_committed(
    backend: PostgresBackend, pg_pooled_schema: PgSchema, isolation: str
) -> None:
    # Its snapshot predates the singleton lock: a competing enqueue that committed while
    # it waited went unseen, and the identity had two active jobs. (Postgres runs READ
    # UNCOMMITTED as READ COMMITTED.)
    args = EnqueueArgs(actor="a", identity_key="k", singleton=True)
    conn = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        async with conn.transaction(isolation=isolation):  # type: ignore[arg-type]
            if isolation in ("repeatable_read", "serializable"):
                with pytest.raises(EnqueueError, match="needs a READ COMMITTED transaction"):
                    await backend.enqueue_with_conn(conn, args)
            else:
                await backend.enqueue_with_conn(conn, args)
    finally:
        await conn.close()


async def test_singletons_on_a_server_defaulting_to_repeatable_read_still_collide(
    pg_pooled_schema: PgSchema,
) -> None:
    # The backend's own transactions state their isolation.
    backend = PostgresBackend(
        f"{pg_pooled_schema.dsn}?default_transaction_isolation=repeatable%20read",
        schema=pg_pooled_schema.name,
    )
    await backend.open()
    try:
        args = EnqueueArgs(actor="a", identity_key="k", singleton=True)
        await backend.enqueue(args)
        with pytest.raises(SingletonCollisionError):
            await backend.enqueue(args.model_copy(update={"id": uuid4()}))
        # Its transaction() too, where a worker writes a success with its sub-jobs.
        other = EnqueueArgs(actor="a", identity_key="other", singleton=True)
        async with backend.transaction() as tx:
            await backend.enqueue_with_conn(tx, other)
        with pytest.raises(SingletonCollisionError):
            async with backend.transaction() as tx:
                await backend.enqueue_with_conn(tx, other.model_copy(update={"id": uuid4()}))
    finally:
        await backend.close()


async def test_a_singleton_collision_hints_when_to_retry(backend: PostgresBackend) -> None:
    await backend.enqueue(
        EnqueueArgs(actor="a", identity_key="u", schedule_to_close=timedelta(minutes=10))
    )
    with pytest.raises(SingletonCollisionError) as info:
        await backend.enqueue(EnqueueArgs(actor="a", identity_key="u", singleton=True))
    hint = getattr(info.value, "retry_after", None)
    assert hint is not None and 590 < hint <= 600


# -- dispatch ------------------------------------------------------------------------------


async def test_a_queue_cap_bounds_its_running_jobs(backend: PostgresBackend) -> None:
    await backend.configure_queue(QueueConfig(queue="narrow", max_concurrent=2))
    await backend.enqueue_batch([EnqueueArgs(actor=f"a{i}", queue="narrow") for i in range(5)])
    await backend.enqueue_batch([EnqueueArgs(actor="a0", queue="wide") for _ in range(3)])
    worker = uuid4()
    first = await backend.dispatch_batch(worker, ["narrow", "wide"], 10, LEASE)
    assert sorted(row.queue for row in first) == ["narrow", "narrow", "wide", "wide", "wide"]
    assert await backend.dispatch_batch(worker, ["narrow"], 10, LEASE) == []
    done = next(row for row in first if row.queue == "narrow")
    assert await backend.mark_succeeded(done.id, worker, None)
    assert len(await backend.dispatch_batch(worker, ["narrow"], 10, LEASE)) == 1


async def test_mixed_queue_modes_interleave_only_the_round_robin_queue(
    backend: PostgresBackend,
) -> None:
    await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
    rows = []
    for queue, key in [("rr", "a"), ("rr", "a"), ("fifo", "x"), ("fifo", "y"), ("rr", "b")]:
        rows.append(await backend.enqueue(EnqueueArgs(actor="m", queue=queue, fairness_key=key)))
    dispatched = await backend.dispatch_batch(uuid4(), ["rr", "fifo"], 10, LEASE)
    # Rank 1: rr/a, fifo (one cohort for the strict queue), rr/b; rank 2: rr/a, fifo.
    assert [row.id for row in dispatched] == [rows[i].id for i in (0, 2, 4, 1, 3)]


# -- reclaim -------------------------------------------------------------------------------


async def test_a_cancel_in_progress_gets_the_backend_headroom_before_reclaim(
    pg_pooled_schema: PgSchema,
) -> None:
    # The moments come from the server's clock, and the headroom is 2 s: with 0.6 s and
    # fixed sleeps, the first sweep came after the headroom on a loaded machine.
    headroom = timedelta(seconds=2)
    backend = PostgresBackend(
        pg_pooled_schema.dsn, schema=pg_pooled_schema.name, cancel_reclaim_headroom=headroom
    )
    await backend.open()
    try:
        job, _ = await _running(backend, lease=SHORT)
        assert await backend.write_cancel_request(job.id, "stop")

        async def until_past_the_lease_by(extra: timedelta) -> None:
            async with asyncio.timeout(30), backend.connection() as conn:
                while not await conn.fetchval(  # noqa: ASYNC110 - the server's clock
                    f"SELECT clock_timestamp() > lock_expires_at + $2::interval "
                    f"FROM {backend.schema}.jobs WHERE id = $1",
                    job.id,
                    extra,
                ):
                    await asyncio.sleep(0.02)

        await until_past_the_lease_by(timedelta(0))  # the lease expired, the headroom not
        assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 0
        await until_past_the_lease_by(headroom)
        assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 1
        reclaimed = await backend.get(job.id)
        assert reclaimed is not None and reclaimed.status is JobStatus.CANCELLED
    finally:
        await backend.close()


async def test_a_long_transaction_holding_job_events_is_reported(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    job = await backend.enqueue(EnqueueArgs(actor="a"))
    writer: asyncpg.Connection[Any] = await asyncpg.connect(
        pg_pooled_schema.dsn, server_settings={"application_name": "slow-writer"}
    )
    try:
        transaction = writer.transaction()
        await transaction.start()
        await writer.execute(
            f"INSERT INTO {backend.schema}.job_events (job_id, kind) VALUES ($1, 'reclaimed')",
            job.id,
        )
        assert await backend.check_reclaim_visibility_delay_risk() == []  # not yet too long
        await asyncio.sleep(0.3)
        [risk] = await backend.check_reclaim_visibility_delay_risk()
        assert (risk.pid, risk.application_name) == (writer.get_server_pid(), "slow-writer")
        assert "RowExclusiveLock" in risk.lock_modes
        assert risk.transaction_age >= timedelta(milliseconds=200)
        assert risk.state == "idle in transaction"
        assert await backend.check_reclaim_visibility_delay_risk(timedelta(hours=1)) == []
        await transaction.commit()
        assert await backend.check_reclaim_visibility_delay_risk() == []
    finally:
        await writer.close()


async def test_watch_reclaims_warns_of_a_writer_older_than_its_visibility_delay(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    # Such a writer may commit an event below the feed's cursor: lost to the reader.
    import structlog.testing

    from taskq.reclaims import watch_reclaims

    job = await backend.enqueue(EnqueueArgs(actor="a"))
    writer: asyncpg.Connection[Any] = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        async with writer.transaction():
            await writer.execute(
                f"INSERT INTO {backend.schema}.job_events (job_id, kind) VALUES ($1, 'reclaimed')",
                job.id,
            )
            await asyncio.sleep(0.3)
            feed = watch_reclaims(backend, visibility_delay=timedelta(milliseconds=200))
            assert isinstance(feed, AsyncGenerator)  # typed an AsyncIterator; closed below
            with structlog.testing.capture_logs() as logs, pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(feed), 1.0)  # nothing to read: it waits
            await feed.aclose()
    finally:
        await writer.close()
    [warning] = [e for e in logs if e["event"] == "taskq.watch-reclaims-visibility-delay-at-risk"]
    assert str(writer.get_server_pid()) in warning["writer"]


# -- history ---------------------------------------------------------------------------------


async def test_a_deleted_jobs_history_goes_with_it_and_no_other_jobs(
    backend: PostgresBackend,
) -> None:
    # No foreign key deletes it (their checks cost a fifth of a dispatch): the trigger
    # jobs_delete_history does, for any DELETE on jobs, a prune's or a user's own.
    kept, gone, also_gone = [await backend.enqueue(EnqueueArgs(actor="a")) for _ in range(3)]
    worker = uuid4()
    dispatched = await backend.dispatch_batch(worker, ["default"], 3, timedelta(minutes=1))
    assert len(dispatched) == 3
    for job in (kept, gone, also_gone):
        assert await backend.mark_succeeded(job.id, worker, None)
    s = backend.schema
    count = f"""
        SELECT (SELECT count(*) FROM {s}.job_attempts WHERE job_id = ANY($1::uuid[]))
             + (SELECT count(*) FROM {s}.job_events WHERE job_id = ANY($1::uuid[]))
    """
    async with backend.connection() as conn:
        assert await conn.fetchval(count, [gone.id, also_gone.id]) == 6  # attempt + 2 events
        await conn.execute(
            f"DELETE FROM {s}.jobs WHERE id = ANY($1::uuid[])", [gone.id, also_gone.id]
        )
        assert await conn.fetchval(count, [gone.id, also_gone.id]) == 0
        assert await conn.fetchval(count, [kept.id]) == 3
    assert [a.outcome for a in await backend.get_attempts(kept.id)] == ["succeeded"]


async def test_write_attempt_and_a_late_outcome_write_nothing_for_an_unknown_job(
    backend: PostgresBackend,
) -> None:
    unknown = uuid4()
    with pytest.raises(KeyError):
        await backend.write_attempt(
            AttemptRow(
                job_id=unknown,
                attempt=1,
                worker_id=None,
                started_at=None,
                finished_at=None,
                outcome="interrupted",
            )
        )
    assert not await backend.record_late_outcome(unknown, 1, uuid4(), "succeeded", None)
    s = backend.schema
    async with backend.connection() as conn:
        assert (
            await conn.fetchval(
                f"SELECT (SELECT count(*) FROM {s}.job_attempts) + (SELECT count(*) FROM {s}.job_events)"
            )
            == 0
        )


async def test_write_attempt_keeps_an_attempt_without_times(backend: PostgresBackend) -> None:
    job = await backend.enqueue(EnqueueArgs(actor="a"))
    attempt = AttemptRow(
        job_id=job.id,
        attempt=1,
        worker_id=None,
        started_at=None,
        finished_at=None,
        outcome="interrupted",
    )
    await backend.write_attempt(attempt)
    assert await backend.get_attempts(job.id) == [attempt]


async def test_an_attempt_that_never_ran_stores_no_duration(backend: PostgresBackend) -> None:
    # job_attempts.duration_ms of a hand-back of an unstarted job read as a run from its
    # dispatch to the hand-back; a run a shutdown stopped keeps its duration.
    held, worker = await _running(backend)
    stopped, other = await _running(backend)
    assert await backend.hand_back_unstarted(worker, [(held.id, held.attempt)]) == 1
    await backend.mark_snoozed(stopped.id, other, timedelta(0), outcome="interrupted")
    written = AttemptRow(
        job_id=stopped.id,
        attempt=2,
        worker_id=other,
        started_at=held.started_at,
        finished_at=stopped.started_at,
        outcome="unknown_actor",
    )
    await backend.write_attempt(written)

    async with backend.connection() as conn:
        rows = await conn.fetch(
            f"SELECT job_id, attempt, outcome, duration_ms FROM {backend.schema}.job_attempts"
        )
    durations = {(r["job_id"], r["attempt"], r["outcome"]): r["duration_ms"] for r in rows}
    assert durations[held.id, 1, "unstarted"] is None
    assert durations[stopped.id, 2, "unknown_actor"] is None
    assert durations[stopped.id, 1, "interrupted"] is not None


# -- sweeps in turns ----------------------------------------------------------------------


async def test_the_sweeps_move_a_backlog_in_turns_each_committed(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    # In one statement, 100,000 due jobs outlasted the leader's bound, rolled back, and
    # nothing ever moved. A turn here is 3 jobs; each commits on its own.
    backend._sweep_turn = 3
    soon = timedelta(milliseconds=50)
    late = [EnqueueArgs(actor="a", delay=soon) for _ in range(7)]
    doomed = [
        EnqueueArgs(actor="a", delay=timedelta(hours=1), schedule_to_close=soon) for _ in range(7)
    ]
    await backend.enqueue_batch(late + doomed)
    running = [await _running(backend, SHORT) for _ in range(7)]
    await asyncio.sleep(0.2)
    conn = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        one_turn = await conn.fetchrow(backend._sql.scheduled_to_pending, None, 3)
    finally:
        await conn.close()
    assert one_turn is not None and one_turn["changed"] == 3
    assert await backend.scheduled_to_pending() == 4
    assert await backend.deadline_sweep() == 7
    assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 7
    kept = [await _running(backend) for _ in range(7)]
    for job, worker in kept:
        assert await backend.mark_succeeded(job.id, worker, 1, fallback_result_ttl=SHORT)
    await asyncio.sleep(0.2)
    assert await backend.sweep_expired_results() == 7
    for job, _ in running:
        row = await backend.get(job.id)
        assert row is not None and row.status is JobStatus.PENDING


async def test_a_sweep_call_takes_a_bounded_number_of_turns(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    # One call drained a whole backlog, turn after turn, past the leader's bound: the
    # sweeps after it in the iteration (the reclaim of crashed workers' jobs) waited.
    backend._sweep_turn = 3
    await backend.enqueue_batch(
        [EnqueueArgs(actor="a", delay=timedelta(milliseconds=50)) for _ in range(20)]
    )
    await asyncio.sleep(0.2)
    assert await backend.scheduled_to_pending() == 12  # 4 turns of 3
    assert await backend.scheduled_to_pending() == 8  # the rest, at the next call
    # Result expiry is a loop of its own, every 30 s: a cap of 4 turns per call would
    # have let results pile up faster than it cleared them.
    for _ in range(20):
        job, worker = await _running(backend)
        assert await backend.mark_succeeded(job.id, worker, 1, fallback_result_ttl=SHORT)
    await asyncio.sleep(0.2)
    assert await backend.sweep_expired_results() == 20


async def test_an_abort_cancels_a_large_batchs_children_in_turns(
    backend: PostgresBackend,
) -> None:
    # In one statement, 200,000 children outlasted the worker's command timeout: the
    # abort rolled back at every failure, and the whole batch ran. A turn here is 3.
    from taskq.models import BatchRow

    backend._sweep_turn = 3
    batch_id = uuid4()
    children = await backend.enqueue_batch_atomic(
        [EnqueueArgs(actor="a") for _ in range(7)],
        batch_id=batch_id,
        queue="default",
        batch_row=BatchRow(id=batch_id, queue="default", expected_size=7, failure_threshold=1),
        finalizer_args=EnqueueArgs(actor="fin"),
    )
    assert await backend.abort_batch(batch_id) == 7
    for child in children:
        row = await backend.get(child.id)
        assert row is not None and row.status is JobStatus.CANCELLED
    batch = await backend.get_batch(batch_id)
    assert batch is not None and batch.status == "aborted"
    assert await backend.abort_batch(batch_id) == 0  # a finished batch is left alone


async def test_the_leftovers_sweep_goes_through_the_batches_in_flight_in_windows(
    backend: PostgresBackend,
) -> None:
    # A turn reads one window of the batch ids with a child pending, scheduled or
    # running (here 3), from where the one before left off: every aborted batch's
    # waiting children are cancelled over the calls, those of active batches never.
    backend._sweep_turn = 3

    async def batch(status: BatchStatus, children: int) -> list[JobRow]:
        batch_id = uuid4()
        row = BatchRow(
            id=batch_id,
            queue="q",
            status=status,
            expected_size=children,
            completed_at=None if status == "active" else datetime(2026, 1, 1, tzinfo=UTC),
        )
        return await backend.enqueue_batch_atomic(
            [EnqueueArgs(actor="a", queue="q") for _ in range(children)],
            batch_id=batch_id,
            queue="q",
            batch_row=row,
            finalizer_args=None,
        )

    async def statuses(jobs: list[JobRow]) -> set[JobStatus]:
        return {(await backend.get(job.id) or job).status for job in jobs}

    async def swept_until_cancelled(left: list[JobRow]) -> None:
        for _ in range(10):
            await backend.complete_stale_batches()
            if await statuses(left) == {JobStatus.CANCELLED}:
                return
        raise AssertionError(f"left waiting: {await statuses(left)}")

    active = [job for _ in range(5) for job in await batch("active", 1)]
    left = [job for _ in range(8) for job in await batch("aborted", 2)]
    await swept_until_cancelled(left)
    # Past the end of the ids, the windows start over.
    again = await batch("aborted", 4)
    await swept_until_cancelled(again)
    assert await statuses(active) == {JobStatus.PENDING}


async def test_the_batch_prune_deletes_in_turns_and_skips_a_held_row(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    # In one statement, a million finished batches outlasted the command timeout: the
    # prune rolled back at every run and no batch row was ever deleted. A turn here is 3.
    backend._sweep_turn = 3
    batches = [uuid4() for _ in range(8)]
    for batch_id in batches:
        await backend.create_batch(batch_id, "q", 0, None, None, None)
        await backend.complete_batch(batch_id)
    cutoff = await backend.now()
    *_, held = batches  # the last: the turn below takes the first three
    holder = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        async with holder.transaction():
            await holder.execute(
                f"SELECT 1 FROM {backend.schema}.batches WHERE id = $1 FOR UPDATE", held
            )
            first = datetime(1, 1, 1, tzinfo=UTC)
            one_turn = await holder.fetchrow(
                backend._sql.prune_old_batches, cutoff, first, UUID(int=0), 3
            )
            assert one_turn is not None and one_turn["changed"] == 3
            # Rows another transaction holds (one locked, three being deleted) are left
            # to it, not waited on: the other four go, in three windows.
            assert await backend.prune_old_batches(cutoff) == 4
        assert await backend.get_batch(held) is not None
        assert await backend.prune_old_batches(cutoff) == 1
    finally:
        await holder.close()
    for batch_id in batches:
        assert await backend.get_batch(batch_id) is None


async def test_the_stale_batch_sweep_reads_the_active_batches_in_windows(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    # In one statement, a million active batches outlasted the leader's bound: the sweep
    # rolled back at every call, and no batch whose hook was lost ever completed. A
    # window here is 3 batches; one call goes through them all.
    backend._sweep_turn = 3
    backend.stale_batch_grace = timedelta(0)
    busy, stale = [], []
    for n in range(10):
        batch_id = uuid4()
        await backend.create_batch(batch_id, "q", 0, None, None, None)
        if n % 4 == 1:
            await backend.enqueue(EnqueueArgs(actor="a", metadata={"batch_id": str(batch_id)}))
            busy.append(batch_id)
        else:
            stale.append(batch_id)
    conn = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        first = datetime(1, 1, 1, tzinfo=UTC)
        window = await conn.fetchrow(
            backend._sql.complete_stale_batches, None, timedelta(0), first, UUID(int=0), 3
        )
    finally:
        await conn.close()
    assert window is not None and (window["scanned"], window["completed"]) == (3, 2)
    assert await backend.complete_stale_batches() == len(stale) - 2
    for batch_id in stale:
        row = await backend.get_batch(batch_id)
        assert row is not None and row.status == "complete"
    for batch_id in busy:
        row = await backend.get_batch(batch_id)
        assert row is not None and row.status == "active"
    assert await backend.complete_stale_batches() == 0


class _CutAtSecondWindow:
    """The pool, but the second stale-batch window of each call is cut (as the leader's
    bound cuts a call short)."""

    def __init__(self, db: Any, statement: str) -> None:
        self._db, self._statement, self.windows = db, statement, 0

    async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
        if query == self._statement:
            self.windows += 1
            if self.windows == 2:
                raise asyncpg.QueryCanceledError("canceling statement due to statement timeout")
        return await self._db.fetchrow(query, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


async def test_a_stale_batch_sweep_cut_short_is_taken_up_where_it_left_off(
    backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Started over at each call, a sweep the bound cut short at the same point every
    # time never reached the batches past it. Windows of 3: the first all busy.
    backend._sweep_turn = 3
    backend.stale_batch_grace = timedelta(0)
    batches = [uuid4() for _ in range(6)]
    for n, batch_id in enumerate(batches):
        await backend.create_batch(batch_id, "q", 0, None, None, None)
        if n < 3:
            await backend.enqueue(EnqueueArgs(actor="a", metadata={"batch_id": str(batch_id)}))
    cut = _CutAtSecondWindow(backend._db(), backend._sql.complete_stale_batches)
    monkeypatch.setattr(backend, "_db", lambda conn=None: cut)
    with pytest.raises(asyncpg.QueryCanceledError):
        await backend.complete_stale_batches()
    cut.windows = 0
    # The second call starts at the second window, the stale batches, and completes them
    # before its own second window is cut.
    with pytest.raises(asyncpg.QueryCanceledError):
        await backend.complete_stale_batches()
    statuses = []
    for batch_id in batches:
        row = await backend.get_batch(batch_id)
        assert row is not None
        statuses.append(row.status)
    assert statuses == ["active"] * 3 + ["complete"] * 3


async def test_schedules_list_by_code_point_under_a_linguistic_collation(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    # A database made with an ICU locale orders text linguistically; the conformance
    # suite's databases here use C.UTF-8, so the column is given one to show it.
    from taskq.models import ScheduleCreateArgs

    conn = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        if not await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'en-US-x-icu')"
        ):
            pytest.skip("this server was built without ICU collations")
        await conn.execute(
            f"ALTER TABLE {pg_pooled_schema.name}.schedules "
            f'ALTER COLUMN name TYPE text COLLATE "en-US-x-icu"'
        )
    finally:
        await conn.close()
    for name in ["b-nightly", "Z-last", "a_report", "B-weekly"]:
        await backend.create_schedule(
            ScheduleCreateArgs(name=name, actor="conformance.actor", cron="* * * * *")
        )
    names = [record.name for record in await backend.list_schedules()]
    assert names == ["B-weekly", "Z-last", "a_report", "b-nightly"]
