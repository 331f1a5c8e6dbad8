"""The dispatch statements' plans on a realistic backlog use the intended indexes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
import pytest_asyncio

from taskq_postgres._leader import LeaderStatements
from taskq_postgres._sql import render
from taskq_postgres._sql.prune import EXPIRE_ARCHIVE, PRUNE_TERMINAL_JOBS
from taskq_postgres._statements import statements_for
from taskq_testing.postgres import PgSchema
from tests.postgres.plans import index_rows, rows_handled, seq_scan_rows

pytestmark = pytest.mark.postgres

_EARLIEST = datetime(1, 1, 1, tzinfo=UTC)
"""A prune's first batch starts after this finished_at (every job's is later)."""


@pytest_asyncio.fixture
async def backlog(pg_schema: PgSchema) -> AsyncIterator[asyncpg.Connection[Any]]:
    """100,000 pending jobs over 50 actors (some capped) and two queues, analyzed."""
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    s = pg_schema.name
    await conn.execute(
        f"""
        INSERT INTO {s}.jobs (actor, queue, priority, identity_key, fairness_key)
        SELECT 'actor_' || (g % 50), CASE WHEN g % 10 = 0 THEN 'other' ELSE 'default' END, g % 3,
               CASE WHEN g % 7 = 0 THEN 'user_' || (g % 100) END, 'tenant_' || (g % 20)
        FROM generate_series(1, 100000) AS g
        """
    )
    await conn.execute(
        f"INSERT INTO {s}.actor_config (actor, max_concurrent) "
        f"SELECT 'actor_' || g, 5 FROM generate_series(0, 9) AS g"
    )
    # A few running jobs (one per identity, as the schema allows), so the running-side
    # CTEs have rows to look at.
    await conn.execute(
        f"UPDATE {s}.jobs SET status = 'running', attempt = 1, locked_by_worker = gen_random_uuid(),"
        f" lock_expires_at = clock_timestamp() + interval '5 minutes', started_at = clock_timestamp()"
        f" WHERE id IN (SELECT DISTINCT ON (actor, identity_key) id FROM {s}.jobs"
        f" WHERE id IN (SELECT id FROM {s}.jobs ORDER BY id LIMIT 200))"
    )
    await conn.execute(f"ANALYZE {s}.jobs")
    await conn.execute(f"ANALYZE {s}.actor_config")
    yield conn
    await conn.close()


@pytest_asyncio.fixture
async def conn(pg_schema: PgSchema) -> AsyncIterator[asyncpg.Connection[Any]]:
    """A connection to the test's database (its schema empty)."""
    connection: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    yield connection
    await connection.close()


async def _analyzed(conn: asyncpg.Connection[Any], statement: str, *args: Any) -> dict[str, Any]:
    """The root of ``statement``'s plan with ``args``, run (EXPLAIN ANALYZE runs it)."""
    [plan] = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", *args))
    root: dict[str, Any] = plan["Plan"]
    return root


async def test_dispatch_uses_indexes_not_a_seq_scan_of_jobs(
    backlog: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    sql = statements_for(pg_schema.name)
    common: list[Any] = [["default", "other"], 100, uuid4(), timedelta(minutes=5), 2, None]
    variants = {
        "strict_fifo": (sql.dispatch_strict_fifo, common),
        "round_robin": (
            sql.dispatch_round_robin,
            [*common[:5], [], [], ["default"], ["k"], [1], 0, 0, None],
        ),
    }
    for name, (statement, args) in variants.items():
        plan = "\n".join(
            row[0] for row in await backlog.fetch(f"EXPLAIN (COSTS OFF) {statement}", *args)
        )
        assert "Seq Scan on jobs" not in plan, f"{name}:\n{plan}"
        assert "jobs_dispatch_idx" in plan, f"{name}:\n{plan}"
        # And the statement behind the plan dispatches a full batch.
        assert len(await backlog.fetch(statement, *args)) == 100, name


async def test_a_round_robin_call_reads_samples_not_backlogs(
    backlog: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # 'other' round robin (10,000 jobs over 5 actors and 2 cohorts each), 'default'
    # strict (90,000 over 45 actors): each strict (queue, actor) is one cohort read to
    # its sample (100 * 2) in index order; each round-robin one reads its cohorts' first
    # jobs. Both used to rank their whole backlog (2.6 s a dispatch at 1,000,000
    # pending in the strict queue; 2.2 s in a round-robin one).
    sql = statements_for(pg_schema.name)
    args: list[Any] = [["default", "other"], 100, uuid4(), timedelta(minutes=5), 2]
    args += [[], [], ["other"], [], [], 0, 0, None]
    [[plan]] = await backlog.fetch(
        f"EXPLAIN (ANALYZE, FORMAT JSON) {sql.dispatch_round_robin}", *args
    )
    root = json.loads(plan)[0]["Plan"]
    # 45 strict samples of at most 200, and one entry per pair for the loose scans.
    assert 45 * 100 <= index_rows(root, "jobs_dispatch_idx") <= 45 * 200 + 100
    # 5 round-robin samples of at most 200 (capped actors less), their keys' probes.
    assert index_rows(root, "jobs_fairness_idx") <= 5 * (200 + 3)


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
async def test_the_plain_head_dispatch_locks_through_the_primary_key(
    pg_schema: PgSchema, plan_cache_mode: str
) -> None:
    # A plain head (no caps, no identities) over 20,000 pending jobs: joining the
    # head's rows to jobs must probe the primary key, not hash a scan of the table.
    conn: asyncpg.Connection[Any] = await asyncpg.connect(
        pg_schema.dsn, server_settings={"plan_cache_mode": plan_cache_mode}
    )
    try:
        s = pg_schema.name
        await conn.execute(
            f"INSERT INTO {s}.jobs (actor, queue) "
            f"SELECT 'actor_' || (g % 50), 'default' FROM generate_series(1, 20000) AS g"
        )
        await conn.execute(f"ANALYZE {s}.jobs")
        statement = statements_for(s).dispatch_plain_head
        args: list[Any] = [["default"], 16, uuid4(), timedelta(minutes=5), 4, None]
        await conn.execute(f"PREPARE plain_head AS {statement}")
        values = ", ".join(_literal(arg) for arg in args)
        plan = "\n".join(
            row[0] for row in await conn.fetch(f"EXPLAIN (COSTS OFF) EXECUTE plain_head ({values})")
        )
        assert "Seq Scan on jobs" not in plan, plan
        assert "jobs_dispatch_head_idx" in plan, plan
        rows = await conn.fetch(statement, *args)
        assert rows[0]["plain_head"] and len(rows) == 16
    finally:
        await conn.close()


def _literal(value: Any) -> str:
    """``value`` as an SQL literal for ``EXECUTE`` (the few types these tests pass)."""
    if value is None:
        return "NULL"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(f"'{v}'" for v in value) + "]::text[]"
    if isinstance(value, timedelta):
        return f"interval '{value.total_seconds()} seconds'"
    if isinstance(value, int):
        return str(value)
    return f"'{value}'"


async def test_a_batchs_children_left_are_found_without_reading_the_finished_ones(
    pg_schema: PgSchema,
) -> None:
    # Asked after every child's end: through jobs_batch_id_idx it read every finished
    # child first (a 20,000-child batch: ~3 ms a child's end).
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    s, batch_id = pg_schema.name, uuid4()
    try:
        await conn.execute(
            f"INSERT INTO {s}.batches (id, queue, expected_size) VALUES ($1, 'q', 20000)", batch_id
        )
        await conn.execute(
            f"""
            INSERT INTO {s}.jobs (actor, queue, status, attempt, finished_at, metadata)
            SELECT 'a', 'q', CASE WHEN g <= 19999 THEN 'succeeded' ELSE 'pending' END::{s}.job_status,
                   CASE WHEN g <= 19999 THEN 1 ELSE 0 END,
                   CASE WHEN g <= 19999 THEN clock_timestamp() END,
                   jsonb_build_object('batch_id', $1::text)
            FROM generate_series(1, 20000) AS g
            """,
            str(batch_id),
        )
        await conn.execute(f"ANALYZE {s}.jobs")
        statement = statements_for(s).batch_has_active_children
        rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", batch_id)
        plan = json.loads(rows[0][0])[0]
        assert "jobs_batch_active_idx" in json.dumps(plan)
        assert plan["Plan"]["Shared Hit Blocks"] + plan["Plan"].get("Shared Read Blocks", 0) < 50
        assert await conn.fetchval(statement, batch_id) is True
    finally:
        await conn.close()


async def test_a_page_of_jobs_turns_only_its_own_rows_json_into_text(
    backlog: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # The casts ran on every matching row before the sort and the limit: `taskq jobs
    # list --json` over 100 jobs of 5 MB results took 2 GB.
    from taskq_postgres._sql.reads import ORDER_TOKEN, WHERE_TOKEN

    sql = (
        statements_for(pg_schema.name)
        .list_jobs.replace(WHERE_TOKEN, "ORDER BY j.created_at, j.id LIMIT 10")
        .replace(ORDER_TOKEN, "ORDER BY page.created_at, page.id")
    )
    [plan] = json.loads(await backlog.fetchval(f"EXPLAIN (VERBOSE, FORMAT JSON) {sql}"))

    def casts_below_the_limit(node: dict[str, Any], below: bool) -> list[str]:
        below = below or node["Node Type"] == "Limit"
        found = [o for o in node.get("Output", []) if "::text" in o] if below else []
        for child in node.get("Plans", []):
            found += casts_below_the_limit(child, below)
        return found

    assert casts_below_the_limit(plan["Plan"], False) == []


async def test_a_page_of_batches_counts_only_its_own_batches_children(
    pg_schema: PgSchema,
) -> None:
    # The limit came after the counting: every matching batch's children were counted.
    from taskq_postgres._sql.reads import WHERE_TOKEN

    s = pg_schema.name
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    try:
        await conn.execute(
            f"INSERT INTO {s}.batches (id, queue, expected_size) "
            "SELECT gen_random_uuid(), 'default', 1 FROM generate_series(1, 30)"
        )
        await conn.execute(
            f"INSERT INTO {s}.jobs (actor, queue, metadata) SELECT 'a', 'default', "
            f"jsonb_build_object('batch_id', b.id::text) FROM {s}.batches b"
        )
        sql = statements_for(s).list_batches.replace(WHERE_TOKEN, "")
        [plan] = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", 5))
    finally:
        await conn.close()

    def loops_of_the_count(node: dict[str, Any]) -> list[int]:
        found = [node["Actual Loops"]] if node["Node Type"] == "Aggregate" else []
        for child in node.get("Plans", []):
            found += loops_of_the_count(child)
        return found

    assert loops_of_the_count(plan["Plan"]) and max(loops_of_the_count(plan["Plan"])) == 5


async def test_the_stranded_check_reads_the_workers_arrays_once_not_once_per_pair(
    pg_schema: PgSchema,
) -> None:
    # Each (actor, queue) pair tested every worker row's arrays with = ANY: 2,000 actors
    # and queues took 0.26 s a worker row, past the leader's bound at 30 rows, in the
    # very case the check is for (every actor's jobs on a queue no worker works).
    s, actors, workers = pg_schema.name, 300, 10
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    try:
        await conn.execute(
            f"INSERT INTO {s}.actor_config (actor, queue) "
            f"SELECT 'act_' || g, 'q_' || g FROM generate_series(1, {actors}) g"
        )
        await conn.execute(
            f"INSERT INTO {s}.jobs (actor, queue) "
            f"SELECT 'act_' || g, 'renamed' FROM generate_series(1, {actors}) g"
        )
        await conn.execute(
            f"INSERT INTO {s}.workers (id, hostname, pid, queues, actors, started_at, last_seen_at) "
            f"SELECT gen_random_uuid(), 'h', w, "
            f"(SELECT array_agg('q_' || g) FROM generate_series(1, {actors}) g), "
            f"(SELECT array_agg('act_' || g) FROM generate_series(1, {actors}) g), now(), now() "
            f"FROM generate_series(1, {workers}) w"
        )
        [plan] = json.loads(
            await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {statements_for(s).stranded_jobs}")
        )
    finally:
        await conn.close()

    def worker_scans(node: dict[str, Any]) -> int:
        own = node["Actual Loops"] if node.get("Relation Name") == "workers" else 0
        return own + sum(worker_scans(child) for child in node.get("Plans", []))

    # The worker rows are read a few times in all (was once per pair: 300), and the
    # rest is linear in the pairs and the arrays' elements.
    assert worker_scans(plan["Plan"]) <= 4, worker_scans(plan["Plan"])
    assert rows_handled(plan["Plan"]) <= 30 * (actors + workers * 2 * actors)


async def test_the_queue_depths_read_the_waiting_and_running_jobs_not_the_history(
    pg_schema: PgSchema,
) -> None:
    # In one pass over the three statuses the planner read the whole table, finished
    # jobs and all: 130 ms at 1,000,000 jobs, every 15 s on the leader.
    s = pg_schema.name
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    try:
        await conn.execute(
            f"INSERT INTO {s}.jobs (actor, queue, status, started_at, finished_at, attempt) "
            "SELECT 'a', 'q' || (g % 20), 'succeeded', now(), now(), 1 "
            "FROM generate_series(1, 50000) g"
        )
        await conn.execute(
            f"INSERT INTO {s}.jobs (actor, queue) SELECT 'a', 'q' || g FROM generate_series(1, 20) g"
        )
        await conn.execute(f"VACUUM ANALYZE {s}.jobs")
        [plan] = json.loads(
            await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {statements_for(s).queue_depths}")
        )
    finally:
        await conn.close()
    assert rows_handled(plan["Plan"]) < 1_000


async def test_a_cron_tick_counts_an_actors_waiting_jobs_up_to_its_max_pending_only(
    pg_schema: PgSchema,
) -> None:
    # Read for every schedule of a capped actor at every tick, where nothing may be
    # consuming its jobs: the backlog it guards against is not counted whole.
    s = pg_schema.name
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    try:
        await conn.execute(
            f"INSERT INTO {s}.jobs (actor, queue) SELECT 'a', 'q' FROM generate_series(1, 20000)"
        )
        await conn.execute(f"INSERT INTO {s}.actor_config (actor, max_pending) VALUES ('a', 10)")
        await conn.execute(f"VACUUM ANALYZE {s}.jobs")
        statement = LeaderStatements(s).cron_max_pending
        [plan] = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", "a"))
        row = await conn.fetchrow(statement, "a")
    finally:
        await conn.close()
    assert row is not None and (row["max_pending"], row["waiting"]) == (10, 10)
    assert rows_handled(plan["Plan"]) < 100


async def _succeeded_with_attempts(
    conn: asyncpg.Connection[Any], s: str, started: str, finished: str
) -> None:
    """30,000 succeeded jobs of ``s``, each with its attempt; ``started`` and ``finished``
    are SQL of ``g``, the job's number from 1."""
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, status, started_at, finished_at, attempt) "
        f"SELECT 'a', 'succeeded', {started}, {finished}, 1 FROM generate_series(1, 30000) g"
    )
    await conn.execute(
        f"INSERT INTO {s}.job_attempts (job_id, attempt, outcome, started_at, finished_at) "
        f"SELECT id, 1, 'succeeded', started_at, finished_at FROM {s}.jobs"
    )


async def test_a_prune_batch_reads_its_own_jobs_not_the_whole_history(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # The status came as a parameter, which does not prove the partial index's predicate:
    # every batch read and sorted all of the status's jobs, and found them again in jobs
    # and job_attempts by reading both tables whole (a quadratic prune over a backlog of
    # 1,000,000 jobs, each batch's 10,000 rows locked for seconds).
    s = pg_schema.name
    await _succeeded_with_attempts(
        conn, s, "now() - interval '9 days'", "now() - interval '8 days' + g * interval '1 ms'"
    )
    await conn.execute(f"VACUUM ANALYZE {s}.jobs")
    await conn.execute(f"VACUUM ANALYZE {s}.job_attempts")
    statement = render(PRUNE_TERMINAL_JOBS, s)
    args = ["succeeded", timedelta(days=7), 500, timedelta(days=365), _EARLIEST]
    plan = await _analyzed(conn, statement, *args)
    archived = await conn.fetch(
        f"SELECT a.finished_at, (SELECT count(*) FROM {s}.job_attempts_archive t "
        f"WHERE t.job_id = a.id) AS attempts FROM {s}.jobs_archive a ORDER BY a.finished_at"
    )
    oldest = await conn.fetch(f"SELECT finished_at FROM {s}.jobs ORDER BY finished_at LIMIT 1")
    # The 500 oldest moved, with their attempts.
    assert len(archived) == 500 and all(r["attempts"] == 1 for r in archived)
    assert archived[-1]["finished_at"] < oldest[0]["finished_at"]
    assert rows_handled(plan) < 40 * 500  # about 22 rows per job moved


async def test_a_prune_batch_starts_past_the_jobs_kept_for_their_results(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # The jobs kept until their results expire lie before the ones to move: each batch
    # starting from the oldest job read them all again (here 50,000, at each of the
    # prune's batches); it starts where the batch before ended.
    s = pg_schema.name
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, status, started_at, finished_at, attempt, "
        "result_expires_at) SELECT 'a', 'succeeded', now() - interval '11 days', "
        "now() - interval '10 days' + g * interval '1 ms', 1, "
        "CASE WHEN g <= 50000 THEN now() + interval '20 days' END "
        "FROM generate_series(1, 52000) g"
    )
    await conn.execute(f"VACUUM ANALYZE {s}.jobs")
    statement = render(PRUNE_TERMINAL_JOBS, s)
    args = ["succeeded", timedelta(days=7), 500, timedelta(days=365)]
    first = await conn.fetchrow(statement, *args, _EARLIEST)
    assert first is not None and first["moved"] == 500
    plan = await _analyzed(conn, statement, *args, first["last_finished"])
    left = await conn.fetchval(f"SELECT count(*) FROM {s}.jobs")
    assert left == 51_000  # the second batch moved its 500 too
    assert rows_handled(plan) < 40 * 500  # about 17 rows per job moved


async def test_an_archive_expiry_batch_reads_its_own_rows_not_the_whole_archive(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # Joined to the batch it picked, the delete read the whole archive (a year of jobs)
    # at every batch of 10,000.
    s = pg_schema.name
    await _succeeded_with_attempts(conn, s, "now()", "now() - g * interval '1 ms'")
    prune = render(PRUNE_TERMINAL_JOBS, s)
    moved = await conn.fetchval(prune, "succeeded", timedelta(0), 30_000, timedelta(0), _EARLIEST)
    assert moved == 30_000
    await conn.execute(f"VACUUM ANALYZE {s}.jobs_archive")
    await conn.execute(f"VACUUM ANALYZE {s}.job_attempts_archive")
    statement = render(EXPIRE_ARCHIVE, s)
    plan = await _analyzed(conn, statement, 500)
    left = await conn.fetchval(f"SELECT count(*) FROM {s}.jobs_archive")
    attempts = await conn.fetchval(f"SELECT count(*) FROM {s}.job_attempts_archive")
    assert (left, attempts) == (29_500, 29_500)
    assert rows_handled(plan) < 10 * 500


async def test_a_promotion_turn_reads_its_own_jobs_not_the_whole_table(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # Joined to the turn's CTE (estimated at a full turn), the update hashed the whole
    # jobs table, finished history and all, at every turn: with millions of jobs kept a
    # week, a backlog of due jobs took seconds a turn, past the leader's bound.
    s = pg_schema.name
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, status, started_at, finished_at, attempt) "
        "SELECT 'a', 'succeeded', now(), now(), 1 FROM generate_series(1, 50000)"
    )
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, status, scheduled_at) "
        "SELECT 'a', 'scheduled', now() - g * interval '1 ms' FROM generate_series(1, 10000) g"
    )
    await conn.execute(f"VACUUM ANALYZE {s}.jobs")
    statement = statements_for(s).scheduled_to_pending
    plan = await _analyzed(conn, statement, None, 5000)
    left = await conn.fetchval(f"SELECT count(*) FROM {s}.jobs WHERE status = 'scheduled'")
    assert left == 5000
    # The turn's 5,000 found by id, not the 60,000 jobs hashed.
    assert seq_scan_rows(plan, "jobs") == 0
    assert index_rows(plan, "jobs_pkey") == 5000


async def test_a_stale_batch_window_reads_its_own_batches_not_all_active_ones(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # All the active batches in one statement, each probed for a child left: 20,000
    # here, a million outlasted the leader's bound at every call.
    s = pg_schema.name
    await conn.execute(
        f"INSERT INTO {s}.batches (id, queue, expected_size, created_at) "
        "SELECT gen_random_uuid(), 'q', 1, now() - g * interval '1 ms' "
        "FROM generate_series(1, 20000) g"
    )
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, metadata) "
        f"SELECT 'a', jsonb_build_object('batch_id', id::text) FROM {s}.batches"
    )
    await conn.execute(f"VACUUM ANALYZE {s}.jobs")
    await conn.execute(f"VACUUM ANALYZE {s}.batches")
    statement = statements_for(s).complete_stale_batches
    args = [None, timedelta(seconds=10), datetime(1, 1, 1, tzinfo=UTC), UUID(int=0), 500]
    plan = await _analyzed(conn, statement, *args)
    assert rows_handled(plan) < 10 * 500


async def test_a_batch_prune_turn_reads_its_own_window_not_every_batch_after_it(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # With the children's check in the query its limit applied to, the planner read and
    # sorted every finished batch after the turn's key, and all their children, at every
    # turn: a backlog of 1,000,000 pruned in quadratic time. A tenth here keep a child;
    # a turn is the backend's 5,000.
    s = pg_schema.name
    await conn.execute(
        f"INSERT INTO {s}.batches (id, queue, expected_size, status, created_at, "
        "completed_at) SELECT gen_random_uuid(), 'q', 1, 'complete', "
        "now() - interval '30 days', now() - interval '20 days' - g * interval '1 ms' "
        "FROM generate_series(1, 100000) g"
    )
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, metadata) "
        f"SELECT 'a', jsonb_build_object('batch_id', b.id::text) "
        f"FROM (SELECT id, row_number() OVER () AS n FROM {s}.batches) b "
        "WHERE b.n % 10 = 0"
    )
    await conn.execute(f"VACUUM ANALYZE {s}.jobs")
    await conn.execute(f"VACUUM ANALYZE {s}.batches")
    after = await conn.fetchrow(
        f"SELECT completed_at, id FROM {s}.batches ORDER BY completed_at, id OFFSET 25000 LIMIT 1"
    )
    assert after is not None
    after_at, after_id = after
    statement = statements_for(s).prune_old_batches
    cutoff = await conn.fetchval("SELECT now() - interval '7 days'")
    plan = await _analyzed(conn, statement, cutoff, after_at, after_id, 5000)
    left = await conn.fetchval(f"SELECT count(*) FROM {s}.batches")
    assert 95_000 <= left < 100_000
    # The window's 5,000 batches read (and the key's own), not the 75,000 after the key
    # or the whole table.
    assert index_rows(plan, "batches_completed_idx", filtered=True) < 5100
    assert seq_scan_rows(plan, "batches") == 0


async def test_a_leftovers_turn_reads_the_batches_in_flight_not_every_aborted_one(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # Every aborted batch was probed for a waiting child at every stale-batch sweep:
    # the work grew with the history (50,000 aborted batches here, their children
    # ended), where only a batch with a child pending, scheduled or running can have one.
    s = pg_schema.name
    await conn.execute(
        f"INSERT INTO {s}.batches (id, queue, expected_size, status, created_at, "
        "completed_at) SELECT gen_random_uuid(), 'q', 1, 'aborted', now() - interval '2 days', "
        "now() - interval '1 day' - g * interval '1 ms' FROM generate_series(1, 50000) g"
    )
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, status, finished_at, attempt, metadata) "
        f"SELECT 'a', 'cancelled', now() - interval '1 day', 0, "
        f"jsonb_build_object('batch_id', id::text) FROM {s}.batches"
    )
    # In flight: one aborted batch with 100 children left waiting, 200 active batches.
    left = uuid4()
    await conn.execute(
        f"INSERT INTO {s}.batches (id, queue, expected_size, status, completed_at) "
        "VALUES ($1, 'q', 100, 'aborted', now())",
        left,
    )
    await conn.execute(
        f"INSERT INTO {s}.batches (id, queue, expected_size) "
        "SELECT gen_random_uuid(), 'q', 1 FROM generate_series(1, 200)"
    )
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, metadata) "
        f"SELECT 'a', jsonb_build_object('batch_id', id::text) FROM {s}.batches "
        "WHERE status = 'active'"
    )
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, metadata) "
        f"SELECT 'a', jsonb_build_object('batch_id', $1::text) FROM generate_series(1, 100)",
        str(left),
    )
    await conn.execute(f"VACUUM ANALYZE {s}.jobs")
    await conn.execute(f"VACUUM ANALYZE {s}.batches")
    statement = statements_for(s).cancel_aborted_leftovers
    plan = await _analyzed(conn, statement, "", 5000, 5000)
    cancelled = await conn.fetchval(
        f"SELECT count(*) FROM {s}.jobs WHERE metadata ->> 'batch_id' = $1 "
        "AND status = 'cancelled'",
        str(left),
    )
    assert cancelled == 100
    assert seq_scan_rows(plan, "batches") == 0
    # About 20 rows for each of the 201 batches in flight and the 100 children.
    assert rows_handled(plan) < 20 * 301


# (the jobs a sweep's turn moves and jobs its index holds that are not due, as SQL on
# schema {s}; the statement; its arguments; a count of the jobs moved as they should be)
_SWEEP_TURNS: dict[str, tuple[list[str], str, tuple[Any, ...], str]] = {
    "deadline": (
        [
            # The actor names the status each job failed from, for the check below.
            (
                "INSERT INTO {s}.jobs (actor, status, scheduled_at, schedule_to_close_deadline) "
                "SELECT s, s::{s}.job_status, now() - interval '1 hour', "
                "now() - g * interval '1 ms' FROM generate_series(1, 10000) g, "
                "LATERAL (SELECT CASE WHEN g % 2 = 0 THEN 'pending' ELSE 'scheduled' END AS s) x"
            ),
            (
                "INSERT INTO {s}.jobs (actor, schedule_to_close_deadline) "
                "SELECT 'a', now() + interval '1 day' FROM generate_series(1, 30000)"
            ),
        ],
        "deadline_sweep",
        (5000,),
        (
            "SELECT count(*) FROM {s}.jobs j JOIN {s}.job_events e ON e.job_id = j.id "
            "WHERE j.status = 'failed' AND e.detail ->> 'from_state' = j.actor"
        ),
    ),
    "reclaim": (
        [
            # The actor names the job's worker, and its attempts left its fate.
            (
                "INSERT INTO {s}.jobs (actor, status, attempt, max_attempts, locked_by_worker, "
                "started_at, lock_expires_at) SELECT g::text, 'running', 1, 1 + g % 2 * 2, "
                "md5(g::text)::uuid, now() - interval '1 minute', now() - g * interval '1 ms' "
                "FROM generate_series(1, 10000) g"
            ),
        ],
        "reclaim_expired_locks",
        (timedelta(minutes=1), None, None, 5000),
        (
            "SELECT count(*) FROM {s}.jobs j JOIN {s}.job_attempts a ON a.job_id = j.id "
            "JOIN {s}.job_events e ON e.job_id = j.id AND e.kind = 'reclaimed' "
            "WHERE a.worker_id = md5(j.actor)::uuid AND a.started_at = j.started_at "
            "AND e.detail ->> 'worker_id' = md5(j.actor)::uuid::text "
            "AND j.status::text = CASE WHEN j.max_attempts > 1 THEN 'pending' ELSE 'crashed' END "
            "AND e.detail ->> 'to_state' = j.status::text "
            "AND j.error_message LIKE 'worker ' || md5(j.actor)::uuid || ' %'"
        ),
    ),
    "result expiry": (
        [
            (
                "INSERT INTO {s}.jobs (actor, status, finished_at, attempt, result, "
                "result_expires_at) SELECT 'a', 'succeeded', now(), 1, '1'::jsonb, "
                "now() - g * interval '1 ms' FROM generate_series(1, 10000) g"
            ),
            # The history keeps its results a day yet.
            (
                "UPDATE {s}.jobs SET result = '1'::jsonb, "
                "result_expires_at = now() + interval '1 day' "
                "WHERE result IS NULL AND status = 'succeeded'"
            ),
        ],
        "expire_results",
        (5000,),
        "SELECT count(*) FROM {s}.jobs WHERE result IS NULL",
    ),
}


@pytest.mark.parametrize("case", sorted(_SWEEP_TURNS))
async def test_a_sweep_turn_reads_its_own_jobs_not_the_whole_table(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema, case: str
) -> None:
    # Joined to the turn's CTE (estimated at a full turn), the update hashed the whole
    # jobs table, finished history and all, at every turn, as the promotion's did.
    rows, name, args, moved_right = _SWEEP_TURNS[case]
    s = pg_schema.name
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, status, started_at, finished_at, attempt) "
        "SELECT 'a', 'succeeded', now(), now(), 1 FROM generate_series(1, 100000)"
    )
    for sql in rows:
        await conn.execute(sql.format(s=s))
    await conn.execute(f"VACUUM ANALYZE {s}.jobs")
    statement = getattr(statements_for(s), name)
    plan = await _analyzed(conn, statement, *args)
    assert await conn.fetchval(moved_right.format(s=s)) == 5000
    # The turn's 5,000 found by id, not the whole table (110,000 jobs or more) hashed.
    assert seq_scan_rows(plan, "jobs") == 0
    assert index_rows(plan, "jobs_pkey") == 5000
