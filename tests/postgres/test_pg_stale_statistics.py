"""The sweeps and the dispatch stay bounded when the statistics are stale.

A burst of jobs since the last ANALYZE (below autovacuum's 10 % threshold on a table
of finished jobs) leaves statistics that say no job is scheduled, pending or
running. The statements that join the rows they picked back to ``jobs`` by id let
the planner drive that join from a partial status index then, reading every job of
that status once per picked row: a promotion turn of 5,000 took tens of seconds, past
the leader's bound (so no job was ever promoted), and a dispatch of 100 half a
second. Each test builds such a table and counts the rows the statement's plan
handles (``EXPLAIN ANALYZE``, rolled back): a few dozen per job it moves, not a square.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
import pytest_asyncio

from taskq_postgres._statements import statements_for
from taskq_testing.postgres import PgSchema
from tests.postgres.plans import rows_handled

pytestmark = pytest.mark.postgres

_FINISHED = 100_000
_BURST = 6_000
_PER_ROW = 50
"""Plan rows per job moved allowed: each passes through a dozen nodes or so (scans,
CTEs, the UPDATE, the history INSERTs); compared with every other, it is thousands."""


@pytest_asyncio.fixture
async def stale(pg_schema: PgSchema) -> AsyncIterator[asyncpg.Connection[Any]]:
    """A table of finished jobs, analyzed, then left with statistics that know of no
    job in any other status."""
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    await conn.execute(
        f"INSERT INTO {pg_schema.name}.jobs (actor, queue, status, finished_at) "
        f"SELECT 'nap', 'default', 'succeeded', now() FROM generate_series(1, {_FINISHED})"
    )
    await conn.execute(f"VACUUM ANALYZE {pg_schema.name}.jobs")
    yield conn
    await conn.close()


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in _nodes(child))]


async def _run(
    conn: asyncpg.Connection[Any], statement: str, *args: Any, update_only: bool = False
) -> tuple[int, int]:
    """(rows the statement's plan handled, or its UPDATE's alone, and the jobs that
    UPDATE moved), rolled back."""
    transaction = conn.transaction()
    await transaction.start()
    try:
        [[plan]] = await conn.fetch(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", *args)
    finally:
        await transaction.rollback()
    root = json.loads(plan)[0]["Plan"]
    # The largest UPDATE of jobs: an abort's other one releases the batch's finalizer.
    update = max(
        (n for n in _nodes(root) if n.get("Operation") == "Update"),
        key=lambda n: (n.get("Relation Name") == "jobs", n["Actual Rows"]),
    )
    return rows_handled(update if update_only else root), update["Actual Rows"]


_BATCH = UUID("00000000-0000-4000-8000-00000000ba7c")

# A batch aborted with its children still waiting (an abort cut short between turns).
_ABORTED_BATCH: list[str] = [
    (
        "INSERT INTO {s}.batches (id, queue, status, expected_size, completed_at) "
        f"VALUES ('{_BATCH}', 'default', 'aborted', {{n}}, clock_timestamp())"
    ),
    (
        "INSERT INTO {s}.jobs (actor, queue, metadata) SELECT 'nap', 'default', "
        f"jsonb_build_object('batch_id', '{_BATCH}') FROM generate_series(1, {{n}})"
    ),
]

# (the burst, as SQL on schema {s}; the statement; its arguments)
_TURNS: dict[str, tuple[list[str], str, tuple[Any, ...]]] = {
    "promotion": (
        [
            (
                "INSERT INTO {s}.jobs (actor, queue, status, scheduled_at) SELECT 'nap', "
                "'default', 'scheduled', now() - interval '1 second' FROM generate_series(1, {n})"
            )
        ],
        "scheduled_to_pending",
        (None, _BURST),
    ),
    "deadline": (
        [
            (
                "INSERT INTO {s}.jobs (actor, queue, schedule_to_close_deadline) SELECT 'nap', "
                "'default', now() - interval '1 second' FROM generate_series(1, {n})"
            )
        ],
        "deadline_sweep",
        (_BURST,),
    ),
    "reclaim": (
        [
            (
                "INSERT INTO {s}.jobs (actor, queue, status, attempt, locked_by_worker, "
                "started_at, lock_expires_at) SELECT 'nap', 'default', 'running', 1, "
                "gen_random_uuid(), now() - interval '1 minute', now() - interval '1 second' "
                "FROM generate_series(1, {n})"
            )
        ],
        "reclaim_expired_locks",
        (timedelta(minutes=1), None, None, _BURST),
    ),
    "batch abort": (
        [
            f"INSERT INTO {{s}}.batches (id, queue, expected_size) VALUES ('{_BATCH}', 'default', {{n}})",
            (
                "INSERT INTO {s}.jobs (actor, queue, metadata) SELECT 'nap', 'default', "
                f"jsonb_build_object('batch_id', '{_BATCH}') FROM generate_series(1, {{n}})"
            ),
        ],
        "abort_batch",
        (_BATCH, None, _BURST),
    ),
    "batch abort's next turn": (
        _ABORTED_BATCH,
        "cancel_aborted_children",
        (_BATCH, _BURST),
    ),
    "an interrupted abort's leftovers": (
        _ABORTED_BATCH,
        "cancel_aborted_leftovers",
        ("", _BURST, _BURST),
    ),
}


@pytest.mark.parametrize("case", sorted(_TURNS))
async def test_a_sweep_turn_handles_each_job_a_few_times_not_once_per_job(
    stale: asyncpg.Connection[Any], pg_schema: PgSchema, case: str
) -> None:
    burst, name, args = _TURNS[case]
    for sql in burst:
        await stale.execute(sql.format(s=pg_schema.name, n=_BURST))
    statement = getattr(statements_for(pg_schema.name), name)
    read, moved = await _run(stale, statement, *args)
    assert moved == _BURST
    assert read <= _PER_ROW * _BURST, read


async def test_a_dispatch_writes_each_job_it_locked_by_its_id(
    stale: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    s = pg_schema.name
    # Scheduled, then promoted: the burst as the promotion sweep leaves it, due since
    # before the statistics' last look at the table.
    await stale.execute(
        f"INSERT INTO {s}.jobs (actor, queue, status, scheduled_at) SELECT 'nap', 'default', "
        f"'scheduled', now() - interval '1 second' FROM generate_series(1, {_BURST})"
    )
    await stale.execute(f"UPDATE {s}.jobs SET status = 'pending' WHERE status = 'scheduled'")
    sql = statements_for(s)
    args: list[Any] = [["default"], 100, uuid4(), timedelta(minutes=5), 2, None]
    for statement in (sql.dispatch_plain_head, sql.dispatch_strict_fifo):
        # The lock's own join may still read the burst per candidate until the next
        # ANALYZE (see test_the_jobs_table_is_analyzed_after_a_count_of_changes).
        handled, moved = await _run(stale, statement, *args, update_only=True)
        assert moved == 100
        assert handled <= _PER_ROW * 100, handled


async def test_the_jobs_table_is_analyzed_after_a_count_of_changes(
    stale: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # After a tenth of the table (autovacuum's default), a burst on a table of a
    # million finished jobs went unanalyzed until 100,000 changes; now 21,000.
    options = await stale.fetchval(
        "SELECT reloptions FROM pg_class WHERE oid = $1::regclass", f"{pg_schema.name}.jobs"
    )
    assert {"autovacuum_analyze_scale_factor=0.02", "autovacuum_analyze_threshold=1000"} <= set(
        options
    )
