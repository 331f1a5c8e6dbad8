"""Upgrading a schema that holds live data: an older release's schema, filled with rows
in every state that release could write (through plain SQL, with that release's
columns only), migrated to HEAD by the real migrator. Nothing may be lost or changed,
every new column must read its documented default, and the current backend must work
the old rows: dispatch and complete them, reclaim an expired lease, promote a due
scheduled job, fire a due schedule, read every row back.

An older release's schema is made with the migrator's own path: ``migrate`` with
``source=`` a directory holding that release's files only (the bundled files, byte for
byte, so the ledger records the checksums HEAD expects).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from taskq.backend import JobStatus
from taskq.models import BatchFilter, EnqueueArgs, JobFilter, ScheduleRecord
from taskq_postgres import PostgresBackend
from taskq_postgres._migrate import (
    MigrationError,
    bundled_migrations,
    load_migrations,
    migrate,
    migration_status,
)
from taskq_testing.postgres import unique_schema_name
from tests.postgres.schema_shape import describe_schema

pytestmark = pytest.mark.postgres

BUNDLED = load_migrations()
SNAPSHOT = Path(__file__).with_name("schema_snapshot.txt")
LEASE = timedelta(minutes=5)

# Columns added since 01.00.00, with what a row stored before them reads (the comments
# of the migrations that add them). A column added later must be listed here, else the
# test fails: say what the old rows hold in it.
NEW_COLUMN_DEFAULTS: dict[str, dict[str, Any]] = {
    "jobs": {"singleton": False},  # 01.00.07
    "jobs_archive": {"singleton": False},  # 01.00.07
    "actor_config": {"queue": None, "job_defaults": None},  # 01.00.05, 01.00.10
    "workers": {"actors": None},  # 01.00.08
}

# Fixed ids, so that a failure names the row.
PENDING = UUID("00000000-0000-4000-8000-000000000001")
SCHEDULED = UUID("00000000-0000-4000-8000-000000000002")
RUNNING = UUID("00000000-0000-4000-8000-000000000003")
SUCCEEDED = UUID("00000000-0000-4000-8000-000000000004")
FAILED = UUID("00000000-0000-4000-8000-000000000005")
CANCELLED = UUID("00000000-0000-4000-8000-000000000006")
CRASHED = UUID("00000000-0000-4000-8000-000000000007")
ABANDONED = UUID("00000000-0000-4000-8000-000000000008")
FUTURE = UUID("00000000-0000-4000-8000-000000000009")  # scheduled, not due
ARCHIVED = UUID("00000000-0000-4000-8000-00000000000a")
BATCH = UUID("00000000-0000-4000-8000-0000000000b1")
OLD_WORKER = UUID("00000000-0000-4000-8000-0000000000f1")  # gone silent, lease lapsed
LIVE_WORKER = UUID("00000000-0000-4000-8000-0000000000f2")
SCHEDULE = UUID("00000000-0000-4000-8000-0000000000c1")
IDLE_SCHEDULE = UUID("00000000-0000-4000-8000-0000000000c2")

ACTOR = "upgrade.work"

# What a 01.00.00 worker and client wrote, with that release's columns only (every
# later release adds columns with a default or NULL, so these statements fit every
# schema since). JSON shapes as that release's SQL wrote them.
_SEED_SQL = """
INSERT INTO {s}.queues (name, mode, max_concurrent) VALUES
    ('upg-rr', 'round_robin', 10), ('upg', 'strict_fifo', NULL);

INSERT INTO {s}.actor_config (actor, max_concurrent, max_pending)
VALUES ('upgrade.work', 4, 1000);

INSERT INTO {s}.workers (id, hostname, pid, queues, started_at, last_seen_at) VALUES
    ('{old_worker}', 'old-host', 101, '{{upg,upg-rr}}',
     clock_timestamp() - interval '2 hours', clock_timestamp() - interval '1 hour'),
    ('{live_worker}', 'live-host', 202, '{{upg,upg-rr}}',
     clock_timestamp() - interval '1 hour', clock_timestamp());

INSERT INTO {s}.maintenance_leader (worker_id, acquired_at, last_seen_at)
VALUES ('{live_worker}', clock_timestamp() - interval '1 hour', clock_timestamp());

INSERT INTO {s}.batches (id, queue, status, expected_size, consecutive_failures,
                         failure_threshold, metadata)
VALUES ('{batch}', 'upg-rr', 'active', 2, 1, 3, '{{"origin": "old"}}');

INSERT INTO {s}.jobs (id, actor, queue, status, priority, payload, scheduled_at, created_at,
                      enqueued_at, attempt, max_attempts, idempotency_key, identity_key,
                      fairness_key, schedule_to_close_deadline, result_ttl, trace_id, span_id,
                      metadata, tags, timeout)
VALUES ('{pending}', 'upgrade.work', 'upg-rr', 'pending', 5, '{{"n": 1, "s": "é"}}',
        clock_timestamp() - interval '10 minutes', clock_timestamp() - interval '10 minutes',
        clock_timestamp() - interval '10 minutes', 0, 5, 'idem-1', 'ident-1', 'tenant-a',
        clock_timestamp() + interval '1 day', interval '1 hour', 'trace-1', 'span-1',
        '{{"batch_id": "{batch}", "k": [1, 2]}}', '{{red,blue}}', interval '30 seconds');

INSERT INTO {s}.jobs (id, actor, queue, status, payload, scheduled_at, created_at, metadata)
VALUES ('{scheduled}', 'upgrade.work', 'upg', 'scheduled', '{{"n": 2}}',
        clock_timestamp() - interval '1 second', clock_timestamp() - interval '9 minutes',
        '{{"batch_id": "{batch}"}}'),
       ('{future}', 'upgrade.work', 'upg', 'scheduled', '{{"n": 9}}',
        clock_timestamp() + interval '1 day', clock_timestamp() - interval '9 minutes', '{{}}');

INSERT INTO {s}.jobs (id, actor, queue, status, payload, created_at, attempt, max_attempts,
                      locked_by_worker, lock_expires_at, started_at, execution_started_at,
                      identity_key, progress_seq, progress_state)
VALUES ('{running}', 'upgrade.work', 'upg', 'running', '{{"n": 3}}',
        clock_timestamp() - interval '8 minutes', 1, 3, '{old_worker}',
        clock_timestamp() - interval '1 minute', clock_timestamp() - interval '7 minutes',
        clock_timestamp() - interval '7 minutes', 'ident-run', 3, '{{"done": 3}}');

INSERT INTO {s}.jobs (id, actor, queue, status, payload, created_at, attempt, started_at,
                      execution_started_at, finished_at, result, result_ttl,
                      result_expires_at, idempotency_key, progress_seq, progress_state)
VALUES ('{succeeded}', 'upgrade.work', 'upg', 'succeeded', '{{"n": 4}}',
        clock_timestamp() - interval '7 minutes', 1, clock_timestamp() - interval '6 minutes',
        clock_timestamp() - interval '6 minutes', clock_timestamp() - interval '5 minutes',
        '{{"answer": 42, "items": [1, "two", null]}}', interval '1 day',
        clock_timestamp() + interval '1 day', 'idem-done', 2, '{{"done": 2}}');

INSERT INTO {s}.jobs (id, actor, queue, status, payload, created_at, attempt, max_attempts,
                      started_at, finished_at, error_class, error_message, error_traceback)
VALUES ('{failed}', 'upgrade.work', 'upg', 'failed', '{{"n": 5}}',
        clock_timestamp() - interval '6 minutes', 3, 3, clock_timestamp() - interval '5 minutes',
        clock_timestamp() - interval '4 minutes', 'builtins.ValueError', 'bad input',
        'Traceback (most recent call last):\n  ...\nValueError: bad input');

INSERT INTO {s}.jobs (id, actor, queue, status, payload, created_at, finished_at,
                      cancel_requested_at, cancel_reason, cancel_phase)
VALUES ('{cancelled}', 'upgrade.work', 'upg', 'cancelled', '{{"n": 6}}',
        clock_timestamp() - interval '5 minutes', clock_timestamp() - interval '4 minutes',
        clock_timestamp() - interval '4 minutes', 'operator said so', 1);

INSERT INTO {s}.jobs (id, actor, queue, status, payload, created_at, attempt, max_attempts,
                      started_at, finished_at, error_class, error_message)
VALUES ('{crashed}', 'upgrade.work', 'upg', 'crashed', '{{"n": 7}}',
        clock_timestamp() - interval '4 minutes', 2, 2, clock_timestamp() - interval '3 minutes',
        clock_timestamp() - interval '2 minutes', 'taskq.LeaseExpired', 'lease expired'),
       ('{abandoned}', 'upgrade.work', 'upg', 'abandoned', '{{"n": 8}}',
        clock_timestamp() - interval '3 minutes', 1, 3, clock_timestamp() - interval '3 minutes',
        clock_timestamp() - interval '2 minutes', NULL, NULL);

INSERT INTO {s}.job_attempts (job_id, attempt, worker_id, started_at, finished_at, duration_ms,
                              outcome, error_class, error_message, error_traceback) VALUES
    ('{succeeded}', 1, '{old_worker}', clock_timestamp() - interval '6 minutes',
     clock_timestamp() - interval '5 minutes', 60000, 'succeeded', NULL, NULL, NULL),
    ('{failed}', 1, '{old_worker}', clock_timestamp() - interval '5 minutes',
     clock_timestamp() - interval '5 minutes', 12, 'failed', 'builtins.ValueError', 'bad input',
     'Traceback ...'),
    ('{failed}', 2, '{old_worker}', clock_timestamp() - interval '5 minutes',
     clock_timestamp() - interval '5 minutes', 15, 'failed', 'builtins.ValueError', 'bad input',
     'Traceback ...'),
    ('{failed}', 3, '{old_worker}', clock_timestamp() - interval '5 minutes',
     clock_timestamp() - interval '4 minutes', 11, 'failed', 'builtins.ValueError', 'bad input',
     'Traceback ...'),
    ('{crashed}', 1, '{old_worker}', clock_timestamp() - interval '3 minutes',
     clock_timestamp() - interval '3 minutes', 0, 'snoozed', NULL, NULL, NULL),
    ('{crashed}', 2, '{old_worker}', clock_timestamp() - interval '3 minutes',
     clock_timestamp() - interval '2 minutes', NULL, 'crashed', NULL, NULL, NULL),
    ('{abandoned}', 1, '{old_worker}', clock_timestamp() - interval '3 minutes',
     clock_timestamp() - interval '2 minutes', 5, 'abandoned', NULL, NULL, NULL);

INSERT INTO {s}.job_events (job_id, occurred_at, kind, detail) VALUES
    ('{running}', clock_timestamp() - interval '7 minutes', 'state_change',
     '{{"from_state": "pending", "to_state": "running"}}'),
    ('{succeeded}', clock_timestamp() - interval '5 minutes', 'state_change',
     '{{"from_state": "running", "to_state": "succeeded"}}'),
    ('{failed}', clock_timestamp() - interval '4 minutes', 'state_change',
     '{{"from_state": "running", "to_state": "failed"}}'),
    ('{cancelled}', clock_timestamp() - interval '4 minutes', 'cancel_requested',
     '{{"reason": "operator said so"}}'),
    ('{cancelled}', clock_timestamp() - interval '4 minutes', 'state_change',
     '{{"from_state": "pending", "to_state": "cancelled"}}'),
    ('{crashed}', clock_timestamp() - interval '2 minutes', 'reclaimed',
     '{{"from_state": "running", "to_state": "crashed", "worker_id": "{old_worker}"}}');

INSERT INTO {s}.jobs_archive (id, actor, queue, status, priority, payload, created_at,
                              enqueued_at,
                              scheduled_at, attempt, max_attempts, cancel_phase, progress_seq,
                              metadata, tags, updated_at, finished_at, result, archived_at,
                              expire_at)
VALUES ('{archived}', 'upgrade.work', 'upg', 'succeeded', 0, '{{"n": 10}}',
        clock_timestamp() - interval '2 days', clock_timestamp() - interval '2 days',
        clock_timestamp() - interval '2 days', 1, 3, 0, 0, '{{}}', '{{}}',
        clock_timestamp() - interval '2 days', clock_timestamp() - interval '2 days',
        '"done"', clock_timestamp() - interval '1 day', clock_timestamp() - interval '1 hour');

INSERT INTO {s}.job_attempts_archive (id, job_id, attempt, worker_id, started_at, finished_at,
                                      duration_ms, outcome)
VALUES (9001, '{archived}', 1, '{old_worker}', clock_timestamp() - interval '2 days',
        clock_timestamp() - interval '2 days', 3, 'succeeded');

INSERT INTO {s}.schedules (id, name, actor, queue, cron, timezone, payload, enabled,
                           next_fire_at, last_fired_at, options)
VALUES ('{schedule}', 'nightly', 'upgrade.work', 'upg', '* * * * *', 'Europe/Paris',
        '{{"from": "cron"}}', true, date_trunc('minute', clock_timestamp()),
        date_trunc('minute', clock_timestamp()) - interval '1 minute',
        '{{"priority": 3, "max_attempts": 2}}'),
       ('{idle_schedule}', 'paused', 'upgrade.work', NULL, '0 3 * * *', 'UTC', '{{}}', false,
        NULL, NULL, '{{}}');

INSERT INTO {s}.rate_limit_buckets (name, tokens) VALUES ('rl-bucket', 3.5);
INSERT INTO {s}.rate_limit_window_entries (name, cost) VALUES ('rl-window', 2);
INSERT INTO {s}.reservation_slots (name, slot, job_id, worker_id, lease_expires_at) VALUES
    ('res', 0, '{running}', '{old_worker}', clock_timestamp() - interval '1 minute'),
    ('res', 1, NULL, NULL, NULL);
"""

SEEDED = {
    "actor_config": 1,
    "batches": 1,
    "job_attempts": 7,
    "job_attempts_archive": 1,
    "job_events": 6,
    "jobs": 9,
    "jobs_archive": 1,
    "maintenance_leader": 1,
    "queues": 2,
    "rate_limit_buckets": 1,
    "rate_limit_window_entries": 1,
    "reservation_slots": 2,
    "schedules": 2,
    "workers": 2,
}
"""Rows per table: every table of the schema but the ledger holds some."""
_TABLES = tuple(SEEDED)


def _release(directory: Path, version: tuple[int, int, int], *, post: bool = True) -> Path:
    """The bundled files of every release up to ``version``: what ``taskq migrate`` of
    that release applied (without its ``post`` files: what a worker's start-up left)."""
    directory.mkdir()
    for migration in BUNDLED:
        if migration.version <= version and (post or migration.phase == "pre"):
            shutil.copy(
                Path(str(bundled_migrations() / migration.name)), directory / migration.name
            )
    return directory


async def _seed(conn: asyncpg.Connection[Any], schema: str) -> None:
    ids = {
        "pending": PENDING,
        "scheduled": SCHEDULED,
        "running": RUNNING,
        "succeeded": SUCCEEDED,
        "failed": FAILED,
        "cancelled": CANCELLED,
        "crashed": CRASHED,
        "abandoned": ABANDONED,
        "future": FUTURE,
        "archived": ARCHIVED,
        "batch": BATCH,
        "old_worker": OLD_WORKER,
        "live_worker": LIVE_WORKER,
        "schedule": SCHEDULE,
        "idle_schedule": IDLE_SCHEDULE,
    }
    await conn.execute(_SEED_SQL.format(s=schema, **ids))


async def _rows(conn: asyncpg.Connection[Any], schema: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, each as a dict of its columns (JSON: exact values)."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for table in _TABLES:
        rows = await conn.fetch(f"SELECT to_jsonb(t)::text AS row FROM {schema}.{table} t")
        tables[table] = _in_order(json.loads(r["row"]) for r in rows)
    return tables


def _in_order(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda row: json.dumps(row, sort_keys=True))


async def _shape(conn: asyncpg.Connection[Any], schema: str) -> str:
    await conn.execute("SET search_path = pg_catalog")  # as the snapshot test describes it
    try:
        return await describe_schema(conn, schema)
    finally:
        await conn.execute("RESET search_path")


def _without(row: dict[str, Any], columns: set[str]) -> dict[str, Any]:
    return {name: value for name, value in row.items() if name not in columns}


@pytest.fixture
async def conn(pg_database_dsn: str) -> AsyncIterator[asyncpg.Connection[Any]]:
    connection = await asyncpg.connect(pg_database_dsn)
    yield connection
    await connection.close()


@pytest.mark.parametrize(
    ("version", "post"),
    [
        ((1, 0, 0), True),  # the first release: every later file runs over its rows
        ((1, 0, 4), False),  # a worker's start-up applied 01.00.04's pre file, not its post
        ((1, 0, 6), True),  # a release in the middle
    ],
    ids=["from-01.00.00", "from-01.00.04-pre-only", "from-01.00.06"],
)
async def test_an_old_schema_full_of_live_jobs_upgrades_without_loss_and_keeps_working(
    pg_database_dsn: str,
    conn: asyncpg.Connection[Any],
    tmp_path: Path,
    version: tuple[int, int, int],
    post: bool,
) -> None:
    schema = unique_schema_name()
    old = await migrate(
        pg_database_dsn, schema, source=_release(tmp_path / "old", version, post=post)
    )
    assert old and all(m.version <= version for m in BUNDLED if m.name in old)
    await _seed(conn, schema)
    before = await _rows(conn, schema)
    assert {table: len(rows) for table, rows in before.items()} == SEEDED  # landed whole

    # Up to HEAD with the real migrator; a second run finds nothing to do.
    applied = await migrate(pg_database_dsn, schema)
    assert applied == [m.name for m in BUNDLED if m.name not in old]
    ledger = await conn.fetch(f"SELECT version, applied_at FROM {schema}.schema_migrations")
    assert await migrate(pg_database_dsn, schema) == []
    assert await conn.fetch(f"SELECT version, applied_at FROM {schema}.schema_migrations") == ledger
    assert {s.state for s in await migration_status(pg_database_dsn, schema)} == {"applied"}
    # The same schema a fresh install gets (columns, defaults, indexes, constraints).
    assert await _shape(conn, schema) == SNAPSHOT.read_text(encoding="utf-8")

    # Every row is still there with every value; each new column reads its default.
    after = await _rows(conn, schema)
    for table in _TABLES:
        old_columns = set(before[table][0]) if before[table] else set()
        new_columns = set(after[table][0]) - old_columns
        expected_new = {
            name: value
            for name, value in NEW_COLUMN_DEFAULTS.get(table, {}).items()
            if name not in old_columns
        }
        assert new_columns == set(expected_new), f"{table}: new columns not as documented"
        assert _in_order(_without(row, new_columns) for row in after[table]) == before[table], table
        for row in after[table]:
            assert {name: row[name] for name in new_columns} == expected_new, table

    await _current_code_works_the_old_rows(pg_database_dsn, schema)


async def _current_code_works_the_old_rows(dsn: str, schema: str) -> None:
    backend = PostgresBackend(
        dsn,
        schema=schema,
        reclaim_event_visibility_delay=timedelta(milliseconds=1),
        stale_batch_grace=timedelta(0),
    )
    await backend.open()  # the schema fits the code: nothing pending, nothing unknown
    try:
        await _reads(backend)
        await _sweeps_and_dispatch(backend)
        await _admin_and_cron(backend)
    finally:
        await backend.close()


async def _reads(backend: PostgresBackend) -> None:
    """Every old row reads through the public API, with its values."""
    jobs = await backend.list_jobs(JobFilter(limit=100))
    assert {job.id for job in jobs} == {
        PENDING,
        SCHEDULED,
        RUNNING,
        SUCCEEDED,
        FAILED,
        CANCELLED,
        CRASHED,
        ABANDONED,
        FUTURE,
    }
    statuses = {job.id: job.status for job in jobs}
    assert statuses[PENDING] is JobStatus.PENDING
    assert statuses[ABANDONED] is JobStatus.ABANDONED
    for status in JobStatus:  # every status filter reads its rows
        listed = await backend.list_jobs(JobFilter(status=status))
        assert {job.id for job in listed} == {i for i, s in statuses.items() if s is status}
    assert len(await backend.list_jobs(JobFilter(active=True))) == 4
    assert [j.id for j in await backend.list_jobs(JobFilter(tags=("red",)))] == [PENDING]
    assert {j.id for j in await backend.list_jobs(JobFilter(batch_id=BATCH))} == {
        PENDING,
        SCHEDULED,
    }
    assert [j.id for j in await backend.list_jobs(JobFilter(idempotency_key="idem-done"))] == [
        SUCCEEDED
    ]

    pending = await backend.get(PENDING)
    assert pending is not None
    assert pending.payload == {"n": 1, "s": "é"}
    assert (pending.priority, pending.max_attempts, pending.fairness_key) == (5, 5, "tenant-a")
    assert pending.metadata == {"batch_id": str(BATCH), "k": [1, 2]}
    assert pending.timeout == timedelta(seconds=30)
    assert sorted(pending.tags) == ["blue", "red"]
    succeeded = await backend.get(SUCCEEDED)
    assert succeeded is not None
    assert succeeded.result == {"answer": 42, "items": [1, "two", None]}
    assert succeeded.progress_state == {"done": 2}
    failed = await backend.get(FAILED)
    assert failed is not None and failed.error is not None
    assert (failed.error.error_class, failed.error.message) == ("builtins.ValueError", "bad input")
    cancelled = await backend.get(CANCELLED)
    assert cancelled is not None
    assert (cancelled.cancel_reason, int(cancelled.cancel_phase)) == ("operator said so", 1)
    running = await backend.get(RUNNING)
    assert running is not None and running.locked_by_worker == OLD_WORKER

    assert [a.outcome for a in await backend.get_attempts(FAILED)] == ["failed"] * 3
    assert [a.outcome for a in await backend.get_attempts(CRASHED)] == ["snoozed", "crashed"]
    assert [e.kind for e in await backend.get_events(CANCELLED)] == [
        "cancel_requested",
        "state_change",
    ]
    reclaims = await backend.poll_reclaim_events(0)
    assert [e.job_id for e in reclaims] == [CRASHED]

    schedules = await backend.list_schedules()
    assert [s.name for s in schedules] == ["nightly", "paused"]
    assert schedules[0].options == {"priority": 3, "max_attempts": 2}
    assert schedules[0].timezone == "Europe/Paris"
    batch = await backend.get_batch(BATCH)
    assert batch is not None
    assert (batch.status, batch.expected_size, batch.consecutive_failures) == ("active", 2, 1)
    assert batch.metadata == {"origin": "old"}
    [(listed_batch, _counts)] = await backend.list_batches(BatchFilter())
    assert listed_batch == batch
    assert await backend.count_batch_non_terminal(BATCH) == 2
    assert await backend.batch_has_active_children(BATCH)  # through the index 01.00.11 built

    # The new columns' defaults, as the code reads them.
    assert await backend.get_actor_queues() == {}
    assert await backend.get_actor_job_defaults() == {}
    assert await backend.get_actor_max_pending() == {ACTOR: 1000}
    depths = await backend.queue_depths()
    assert depths["upg"] == {"pending": 0, "scheduled": 2, "running": 1}
    assert depths["upg-rr"] == {"pending": 1, "scheduled": 0, "running": 0}
    # The live worker, registered without actors (NULL), counts as running every actor.
    assert await backend.stranded_jobs() == {}


async def _sweeps_and_dispatch(backend: PostgresBackend) -> None:
    """The sweeps and a current worker's dispatch take the old rows up."""
    assert await backend.scheduled_to_pending() == 1  # the due one; FUTURE waits
    assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 1
    reclaimed = await backend.get(RUNNING)
    assert reclaimed is not None
    assert (reclaimed.status, reclaimed.attempt, reclaimed.locked_by_worker) == (
        JobStatus.PENDING,
        1,
        None,
    )
    assert [a.outcome for a in await backend.get_attempts(RUNNING)] == ["crashed"]
    # No visibility delay: the event was written a moment ago (under a millisecond on a
    # fast machine, and a 1 ms delay hid it).
    now_visible = await backend.poll_reclaim_events(0, visibility_delay=timedelta(0))
    assert RUNNING in {e.job_id for e in now_visible}

    worker = uuid4()
    dispatched = await backend.dispatch_batch(worker, ["upg", "upg-rr"], 10, LEASE)
    assert {job.id for job in dispatched} == {PENDING, SCHEDULED, RUNNING}
    for job in dispatched:
        assert await backend.mark_succeeded(
            job.id, worker, {"ran": str(job.id)}, attempt=job.attempt
        )
    for job_id in (PENDING, SCHEDULED, RUNNING):
        done = await backend.get(job_id)
        assert done is not None
        assert (done.status, done.result) == (JobStatus.SUCCEEDED, {"ran": str(job_id)})
    assert await backend.dispatch_batch(worker, ["upg", "upg-rr"], 10, LEASE) == []
    # The old batch's children have all ended: the leader's sweep completes it.
    assert not await backend.batch_has_active_children(BATCH)
    assert await backend.complete_stale_batches() == 1
    batch = await backend.get_batch(BATCH)
    assert batch is not None and batch.status == "complete"


async def _admin_and_cron(backend: PostgresBackend) -> None:
    """Operators' and the leader's other work over the old rows."""
    # A job stored before `singleton` reads False: its retry is not checked.
    assert await backend.retry_job(CANCELLED)
    retried = await backend.get(CANCELLED)
    assert retried is not None and retried.status is JobStatus.PENDING

    def build(schedule: ScheduleRecord, slot: Any) -> EnqueueArgs:
        return EnqueueArgs(
            actor=schedule.actor,
            queue=schedule.queue or "default",
            payload=schedule.payload,
            idempotency_key=f"schedule:{schedule.id}:{slot.isoformat()}",
        )

    assert await backend.fire_due_schedules(build, catch_up=timedelta(minutes=1)) >= 1
    fired = await backend.list_jobs(JobFilter(idempotency_key=None, queue="upg", limit=100))
    assert any(job.payload == {"from": "cron"} for job in fired)
    [nightly] = [s for s in await backend.list_schedules() if s.id == SCHEDULE]
    assert nightly.next_fire_at is not None and nightly.next_fire_at > await backend.now()

    # Sweeps 5 and 6 over old terminal rows and the old archive (the mirrored column).
    assert await backend.expire_archive() == 1  # ARCHIVED was past its expire_at
    moved = await backend.prune_terminal_jobs(
        {"failed": timedelta(0), "abandoned": timedelta(0)}, archive_retention=timedelta(days=1)
    )
    assert moved == 2
    assert await backend.get(FAILED) is None
    assert await backend.cleanup_stale_workers(timedelta(minutes=5)) == 1  # OLD_WORKER


async def test_an_identity_running_twice_stops_the_upgrade_cleanly_until_one_ends(
    pg_database_dsn: str, conn: asyncpg.Connection[Any], tmp_path: Path
) -> None:
    # Before 01.00.04 racing dispatchers could start two jobs of one identity; its
    # unique index cannot be built over them. Documented in the file: the migration
    # fails, changes nothing, and succeeds once one of them has ended.
    schema = unique_schema_name()
    old = await migrate(pg_database_dsn, schema, source=_release(tmp_path / "old", (1, 0, 3)))
    twins = [uuid4(), uuid4()]
    for job_id in twins:
        await conn.execute(
            f"INSERT INTO {schema}.jobs (id, actor, status, attempt, locked_by_worker,"
            " lock_expires_at, started_at, identity_key) VALUES ($1, 'a', 'running', 1, $2,"
            " clock_timestamp() + interval '5 minutes', clock_timestamp(), 'user-1')",
            job_id,
            uuid4(),
        )
    with pytest.raises(MigrationError, match="01.00.04_01_pre_running_identity_unique.sql"):
        await migrate(pg_database_dsn, schema)
    recorded = {
        r["version"] for r in await conn.fetch(f"SELECT version FROM {schema}.schema_migrations")
    }
    assert recorded == set(old)
    assert await conn.fetchval(f"SELECT count(*) FROM {schema}.jobs WHERE status = 'running'") == 2

    # One ends (its old worker's terminal write); the upgrade then goes through.
    await conn.execute(
        f"UPDATE {schema}.jobs SET status = 'succeeded', finished_at = clock_timestamp(),"
        " locked_by_worker = NULL, lock_expires_at = NULL WHERE id = $1",
        twins[0],
    )
    assert await migrate(pg_database_dsn, schema) == [m.name for m in BUNDLED if m.name not in old]
    assert await conn.fetchval(f"SELECT count(*) FROM {schema}.jobs") == 2
