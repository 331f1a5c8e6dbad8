"""The maintenance leader on Postgres, with real worker processes."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import pytest

from taskq import JobFilter, JobStatus, TaskQ
from taskq.models import EventRow, ScheduleCreateArgs
from taskq_testing.faults import TcpProxy
from taskq_testing.postgres import PgSchema
from tests.apps import basic
from tests.leader.conftest import Spawn, WorkerProc, wait_until

pytestmark = pytest.mark.postgres


@pytest.fixture
async def tq(pg_schema: PgSchema) -> AsyncIterator[TaskQ]:
    app = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=basic.tq.actors.values())
    async with app:
        yield app


async def _leader(tq: TaskQ) -> UUID | None:
    async with tq.backend.connection() as conn:  # type: ignore[attr-defined]
        value: UUID | None = await conn.fetchval(
            f"SELECT worker_id FROM {tq.schema}.maintenance_leader"
        )
        return value


def _worker_id(worker: WorkerProc) -> UUID | None:
    started = worker.events("taskq.worker-started")
    return UUID(started[0]["worker_id"]) if started else None


def _stamp(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["timestamp"]).timestamp()


def _terms(worker: WorkerProc, end: float) -> list[tuple[float, float]]:
    """(start, end) of each stretch this worker believed it led, from its log."""
    terms, start = [], None
    for record in worker.events():
        if record.get("event") == "taskq.leader-elected":
            start = _stamp(record)
        elif record.get("event") in {"taskq.leader-lost", "taskq.leader-stepped-down"}:
            assert start is not None
            terms.append((start, _stamp(record)))
            start = None
    if start is not None:
        terms.append((start, end))
    return terms


async def test_a_killed_leader_is_replaced_within_a_heartbeat_and_a_second(
    tq: TaskQ, spawn: Spawn
) -> None:
    first = spawn("--queues", "other")
    await wait_until(lambda: _leader(tq))
    first_id = await _leader(tq)
    assert first_id == _worker_id(first)
    second = spawn("--queues", "other")
    await wait_until(lambda: asyncio.sleep(0, _worker_id(second)))
    await asyncio.sleep(0.5)  # the second is a follower now
    assert await _leader(tq) == first_id
    killed_wall = time.time()  # noqa: TID251 - compared with the workers' log stamps
    first.proc.kill()

    async def replaced() -> bool:
        return await _leader(tq) == _worker_id(second)

    await wait_until(replaced, seconds=5)
    # Its log line follows its write of the row: read once written.
    await wait_until(lambda: asyncio.sleep(0, second.events("taskq.leader-elected")))
    # One leader at a time: the second's only term began after the first died, within
    # heartbeat_interval (100 ms) + 1 s, by its own log's stamp (the test's polls of the
    # row added their own lag on a loaded machine).
    [(second_start, _)] = _terms(second, time.time())  # noqa: TID251 - log stamps
    assert killed_wall <= second_start <= killed_wall + 1.1


async def test_a_frozen_leader_is_replaced_and_steps_down_when_it_wakes(
    tq: TaskQ, spawn: Spawn
) -> None:
    first = spawn("--queues", "other")
    await wait_until(lambda: _leader(tq))
    second = spawn("--queues", "other")
    await wait_until(lambda: asyncio.sleep(0, _worker_id(second)))
    await asyncio.sleep(0.5)
    assert await _leader(tq) == _worker_id(first)

    stopped_wall = time.time()  # noqa: TID251 - compared with the workers' log stamps
    first.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()

    async def replaced() -> bool:
        return await _leader(tq) == _worker_id(second)

    await wait_until(replaced, seconds=10)
    await wait_until(lambda: asyncio.sleep(0, second.events("taskq.leader-elected")))
    # the leader lease (1 s) + the follower's election tick + slack, by the follower's
    # own log's stamp (the test's polls of the row added their own lag)
    [(second_start, _)] = _terms(second, time.time())  # noqa: TID251 - log stamps
    assert stopped_wall <= second_start <= stopped_wall + 2.5
    await asyncio.sleep(max(0.0, 3.0 - (time.monotonic() - stopped_at)))  # 3 x lease
    first.signal(signal.SIGCONT)
    await wait_until(lambda: asyncio.sleep(0, first.events("taskq.leader-lost")), seconds=5)
    await asyncio.sleep(0.5)
    assert await _leader(tq) == _worker_id(second)
    # Never two leaders sweeping: the woken leader swept nothing before stepping down,
    # and it did not win the lock back.
    lost_at = _stamp(first.events("taskq.leader-lost")[0])
    woke_sweeps = [r for r in first.events("taskq.leader-swept") if _stamp(r) > lost_at - 3.5]
    assert woke_sweeps == []
    assert len(first.events("taskq.leader-elected")) == 1


async def test_a_sigkilled_worker_s_jobs_are_reclaimed_and_reported_once_each(
    tq: TaskQ, spawn: Spawn
) -> None:
    c = tq.client
    # the leader's reclaim: a cancel in progress waits cancel + cleanup grace + headroom
    leader = spawn(
        "--queues",
        "other",
        env={
            "TASKQ_CANCELLATION_GRACE_PERIOD": "200ms",
            "TASKQ_CLEANUP_GRACE_PERIOD": "200ms",
            "TASKQ_CANCEL_RECLAIM_HEADROOM": "200ms",
        },
    )
    await wait_until(lambda: _leader(tq))
    retried = [await c.enqueue(basic.nap, {"seconds": 60}) for _ in range(5)]
    crashed = [await c.enqueue(basic.nap, {"seconds": 60}, max_attempts=1) for _ in range(5)]
    cancelling = [await c.enqueue(basic.nap, {"seconds": 60}) for _ in range(2)]
    ids = {j.id for j in retried + crashed + cancelling}
    victim = spawn("--queues", "default", "--concurrency", "12")

    async def all_running() -> bool:
        rows = await c.list_jobs(JobFilter(status=[JobStatus.RUNNING], limit=100))
        return len(rows) == 12

    await wait_until(all_running)
    for job in cancelling:  # nap ignores cancel_event: still running when the worker dies
        assert await c.cancel(job.id, reason="user asked")
    seen: list[EventRow] = []

    async def consume() -> None:
        async for event in tq.watch_reclaims(0, visibility_delay=timedelta(milliseconds=200)):
            seen.append(event)  # noqa: PERF401 - seen is read while the feed runs

    consumer = asyncio.create_task(consume())
    killed_wall = time.time()  # noqa: TID251 - compared with the server's event stamps
    victim.proc.kill()

    async def reclaimed() -> bool:
        rows = await c.list_jobs(JobFilter(limit=100))
        return all(r.status is not JobStatus.RUNNING for r in rows)

    await wait_until(reclaimed, seconds=10)
    await wait_until(lambda: asyncio.sleep(0, len(seen) >= 12), seconds=5)
    # lock lease (2 s) + the sweep interval (50 ms) + the heartbeat that last renewed,
    # and for a cancel in progress its graces and headroom (0.6 s): by the reclaims'
    # own stamps (the server's clock), not the test's polls, whose lag on a loaded
    # machine counted against the bound
    last_reclaim = max(e.occurred_at for e in seen).timestamp()
    assert last_reclaim - killed_wall <= 2.0 + 0.05 + 0.1 + 0.6 + 0.5
    await asyncio.sleep(0.5)
    consumer.cancel()
    assert sorted(str(e.job_id) for e in seen) == sorted(str(i) for i in ids)
    for job in retried:
        row = await c.get(job.id)
        assert row is not None and row.status is JobStatus.PENDING
    for job in crashed:
        row = await c.get(job.id)
        assert row is not None and row.status is JobStatus.CRASHED
        assert [a.outcome for a in await c.get_attempts(job.id)] == ["crashed"]
    for job in cancelling:  # the user's request is honoured, attempts left or not
        row = await c.get(job.id)
        assert row is not None and row.status is JobStatus.CANCELLED
        assert [a.outcome for a in await c.get_attempts(job.id)] == ["crashed"]
    to_states = {str(e.job_id): e.detail["to_state"] for e in seen}
    assert {to_states[str(j.id)] for j in cancelling} == {"cancelled"}
    assert leader.proc.poll() is None


async def test_an_outage_longer_than_the_lease_runs_no_job_twice(
    tq: TaskQ, spawn: Spawn, pg_schema: PgSchema
) -> None:
    c = tq.client
    jobs = [await c.enqueue(basic.nap, {"seconds": 7}) for _ in range(5)]
    with TcpProxy(urlsplit(pg_schema.dsn).port or 5432) as proxy:
        worker = spawn("--concurrency", "5", env={"TASKQ_DSN": proxy.through(pg_schema.dsn)})

        async def all_running() -> bool:
            rows = await c.list_jobs(JobFilter(status=[JobStatus.RUNNING], limit=100))
            return len(rows) == 5

        await wait_until(all_running)
        proxy.cut()
        await asyncio.sleep(3)  # > the 2 s lock lease: every lease looks expired after
        proxy.restore()

        async def all_done() -> bool:
            rows = [await c.get(j.id) for j in jobs]
            return all(r is not None and r.status is JobStatus.SUCCEEDED for r in rows)

        try:
            await wait_until(all_done, seconds=30)
        except AssertionError:
            rows = [await c.get(j.id) for j in jobs]
            raise AssertionError(
                [(r.status, r.attempt, r.lock_expires_at) for r in rows if r]
            ) from None
    outcomes = [[a.outcome for a in await c.get_attempts(job.id)] for job in jobs]
    # No lease was reclaimed (no crashed attempt): each job ran once. A dispatch the cut
    # caught after it committed loses its reply; the worker hands those jobs back,
    # unstarted, once the database is back (an unstarted attempt before the success).
    assert all(o in (["succeeded"], ["unstarted", "succeeded"]) for o in outcomes), outcomes
    if ["unstarted", "succeeded"] in outcomes:
        assert worker.events("taskq.unheard-jobs-handed-back")
    assert worker.events("taskq.leader-lost")  # the outage did take leadership away


async def test_a_pool_outage_the_leader_rides_out_reclaims_no_live_job(
    tq: TaskQ, spawn: Spawn, pg_schema: PgSchema
) -> None:
    # The pool cut (a pooler restarting), the election session straight to the server:
    # the leader stayed elected through the cut, and its first sweep after it reclaimed
    # every lease that had lapsed meanwhile, before the workers, alive and still running
    # those jobs, could renew them: each job ran twice. A new leader holds reclaims
    # back for reclaim_grace; so does a leader whose sweep could not reach the database
    # for as long.
    c = tq.client
    jobs = [await c.enqueue(basic.nap, {"seconds": 6}) for _ in range(3)]
    with TcpProxy(urlsplit(pg_schema.dsn).port or 5432) as proxy:
        worker = spawn(
            "--concurrency",
            "3",
            env={
                "TASKQ_DSN": proxy.through(pg_schema.dsn),
                "TASKQ_DIRECT_DSN": pg_schema.dsn,
                "TASKQ_LEADER_LEASE": "10s",  # no resignation within the cut
                # A sweep every 50 ms, a renewal every 500 ms: after the cut, the sweep
                # comes first (the grace is two renewals).
                "TASKQ_HEARTBEAT_INTERVAL": "500ms",
            },
        )

        async def all_running() -> bool:
            rows = await c.list_jobs(JobFilter(status=[JobStatus.RUNNING], limit=100))
            return len(rows) == 3

        await wait_until(all_running)
        proxy.cut()
        await asyncio.sleep(3)  # > the 2 s lock lease: every lease looks expired after
        proxy.restore()

        async def all_done() -> bool:
            rows = [await c.get(j.id) for j in jobs]
            return all(r is not None and r.status is JobStatus.SUCCEEDED for r in rows)

        await wait_until(all_done, seconds=30)
    assert not worker.events("taskq.leader-lost")  # the cut left the election alone
    outcomes = [[a.outcome for a in await c.get_attempts(job.id)] for job in jobs]
    assert all(o in (["succeeded"], ["unstarted", "succeeded"]) for o in outcomes), outcomes


async def test_a_stalled_network_is_ridden_out_without_a_watchdog_exit(
    tq: TaskQ, spawn: Spawn, pg_schema: PgSchema
) -> None:
    # A black hole, not a cut: no reset, so every wait runs to its own timeout. Each
    # call a loop makes must end within dispatcher_command_timeout (1 s here), or
    # the loop misses its stale-tick budget (the 5 s floor) and the watchdog ends the
    # worker, running jobs and all: a timed-out statement used to wait as long again
    # for its cancel request, and a reconnect for connect_timeout (10 s).
    c = tq.client
    jobs = [await c.enqueue(basic.nap, {"seconds": 6}) for _ in range(3)]
    with TcpProxy(urlsplit(pg_schema.dsn).port or 5432) as proxy:
        worker = spawn(
            "--concurrency",
            "3",
            env={
                "TASKQ_DSN": proxy.through(pg_schema.dsn),
                "TASKQ_POLL_INTERVAL": "200ms",
                "TASKQ_HEARTBEAT_INTERVAL": "500ms",
                "TASKQ_LOCK_LEASE": "4s",
                "TASKQ_LEADER_LEASE": "2s",
                "TASKQ_DISPATCHER_COMMAND_TIMEOUT": "1s",
                "TASKQ_WATCHDOG_STALE_FLOOR": "5s",
            },
        )

        async def all_running() -> bool:
            rows = await c.list_jobs(JobFilter(status=[JobStatus.RUNNING], limit=100))
            return len(rows) == 3

        await wait_until(all_running)
        proxy.stall()
        await asyncio.sleep(9)  # past the floor, with reconnects tried meanwhile
        alive_through_the_stall = worker.proc.poll() is None
        proxy.restore()

        async def all_done() -> bool:
            rows = [await c.get(j.id) for j in jobs]
            return all(r is not None and r.status is JobStatus.SUCCEEDED for r in rows)

        assert alive_through_the_stall, worker.events("taskq.watchdog-trip")
        await wait_until(all_done, seconds=30)
    assert worker.proc.poll() is None
    assert not worker.events("taskq.watchdog-trip")
    outcomes = [[a.outcome for a in await c.get_attempts(job.id)] for job in jobs]
    assert all(o in (["succeeded"], ["unstarted", "succeeded"]) for o in outcomes), outcomes


async def test_a_stop_during_a_stall_ends_within_its_wall_and_says_what_it_left(
    tq: TaskQ, spawn: Spawn, pg_schema: PgSchema
) -> None:
    # The job's actor returns during the stall, so its success write retries. The
    # stop's last phase used to count its budget from after the drain began, not from
    # the signal, and kept no room for the teardown: the shutdown watchdog ended the
    # process (exit 2). The write cannot land before the process ends: exit 1, saying
    # so (the reclaim takes the job).
    # The nap outlasts any lag between the claim and the stall, so the actor returns
    # only once the proxy is stalled; the signal waits for the write's first retry.
    job = await tq.client.enqueue(basic.nap, {"seconds": 2})
    with TcpProxy(urlsplit(pg_schema.dsn).port or 5432) as proxy:
        worker = spawn(
            env={
                "TASKQ_DSN": proxy.through(pg_schema.dsn),
                "TASKQ_DISPATCHER_COMMAND_TIMEOUT": "1s",
                "TASKQ_WATCHDOG_STALE_FLOOR": "5s",
                "TASKQ_TERMINATION_GRACE_PERIOD": "12s",
                "TASKQ_DRAIN_GRACE_PERIOD": "1s",
                "TASKQ_CANCELLATION_GRACE_PERIOD": "1s",
                "TASKQ_CLEANUP_GRACE_PERIOD": "1s",
            },
        )

        async def running() -> bool:
            row = await tq.client.get(job.id)
            return row is not None and row.status is JobStatus.RUNNING

        await wait_until(running)
        proxy.stall()

        async def write_retrying() -> bool:
            return bool(worker.events("taskq.outcome-write-retry"))

        await wait_until(write_retrying, seconds=10)
        worker.signal(signal.SIGTERM)
        rc = await asyncio.get_running_loop().run_in_executor(None, worker.proc.wait, 30)
        proxy.restore()
    assert rc == 1, [e["event"] for e in worker.events()]
    [left] = worker.events("taskq.stop-left-jobs-unconfirmed")
    assert left["jobs"] == 1


async def test_a_per_second_cron_fires_every_slot_once_across_a_failover(
    tq: TaskQ, spawn: Spawn
) -> None:
    first = spawn("--queues", "other")
    await wait_until(lambda: _leader(tq))
    second = spawn("--queues", "other")
    await wait_until(lambda: asyncio.sleep(0, _worker_id(second)))
    schedule = await tq.client.create_schedule(
        ScheduleCreateArgs(name="tick", actor="nap", cron="*/1 * * * * *", payload={})
    )
    await asyncio.sleep(2.5)
    first.proc.kill()

    async def replaced() -> bool:
        return await _leader(tq) == _worker_id(second)

    await wait_until(replaced, seconds=5)
    await asyncio.sleep(2.5)
    second.proc.kill()  # freeze the state before reading it
    second.proc.wait(timeout=10)
    [current] = await tq.client.list_schedules()
    assert current.id == schedule.id and current.next_fire_at is not None
    fired = await tq.client.list_jobs(JobFilter(actor="nap", limit=1000))
    slots = sorted(datetime.fromisoformat(j.metadata["schedule_slot"]) for j in fired)
    assert len(slots) == len(set(slots))  # never twice for one slot
    assert len(slots) >= 4
    # every second from the first slot to the last fired, none skipped over the failover
    assert slots == [slots[0] + timedelta(seconds=i) for i in range(len(slots))]
    assert slots[-1] + timedelta(seconds=1) == current.next_fire_at


async def test_a_leader_cut_off_from_the_database_but_for_its_election_resigns(
    tq: TaskQ, pg_schema: PgSchema, spawn: Spawn
) -> None:
    # Its pool went through a proxy that was cut (a pooler down), its election session
    # straight to the server: the election went on renewing, the sweep failed at every
    # turn, and no worker promoted or reclaimed a job for as long as the cut lasted.
    with TcpProxy(urlsplit(pg_schema.dsn).port or 5432) as proxy:
        first = spawn(
            "--queues",
            "default",
            env={"TASKQ_DSN": proxy.through(pg_schema.dsn), "TASKQ_DIRECT_DSN": pg_schema.dsn},
        )
        await wait_until(lambda: _leader(tq))
        assert await _leader(tq) == _worker_id(first)
        second = spawn("--queues", "default")
        await wait_until(lambda: asyncio.sleep(0, _worker_id(second)))
        proxy.cut()
        job = await tq.client.enqueue(basic.nap, {"seconds": 0}, delay=timedelta(seconds=0.2))

        async def replaced() -> bool:
            return await _leader(tq) == _worker_id(second)

        await wait_until(replaced, seconds=15)
        await tq.client.wait_for_result(job.id, timeout=15)
        assert first.events("taskq.leader-resigned")
