"""The leader's observability row on Postgres: ``maintenance_leader.last_seen_at`` says
the leader is alive, refreshed by each renewal of its lock (one a heartbeat)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

import pytest

from taskq import TaskQ
from taskq_testing import TEST_SETTINGS
from taskq_testing.postgres import PgSchema
from tests.apps import basic
from tests.worker.running import running

pytestmark = pytest.mark.postgres

HEARTBEAT = timedelta(milliseconds=100)
LEASE = timedelta(seconds=1)


async def test_the_leader_refreshes_last_seen_at_at_each_renewal(pg_schema: PgSchema) -> None:
    # Only the election took last_seen_at: a leader that stopped refreshing it looked,
    # to the admin UI and an operator's query, dead a lease after it was elected.
    tq = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=basic.tq.actors.values())
    settings = {**TEST_SETTINGS, "heartbeat_interval": "100ms", "leader_lease": "1s"}
    seen: list[datetime] = []
    ages: list[timedelta] = []
    acquired: set[datetime] = set()
    async with tq, running(tq, settings) as worker:
        given_up = time.monotonic() + 20  # the first election, on a busy machine
        while len(seen) < 6 and time.monotonic() < given_up:
            if len(seen) == 1:  # elected: six renewals take 0.6s, given 30 heartbeats
                given_up = min(given_up, time.monotonic() + 30 * HEARTBEAT.total_seconds())
            async with tq.backend.connection() as conn:  # type: ignore[attr-defined]
                row = await conn.fetchrow(
                    f"SELECT worker_id, acquired_at, last_seen_at, "
                    f"clock_timestamp() - last_seen_at AS age FROM {tq.schema}.maintenance_leader"
                )
            if row is not None:
                assert row["worker_id"] == worker.worker_id
                acquired.add(row["acquired_at"])
                ages.append(row["age"])
                if not seen or row["last_seen_at"] != seen[-1]:
                    seen.append(row["last_seen_at"])
            await asyncio.sleep(HEARTBEAT.total_seconds() / 2)
    assert len(seen) == 6, f"last_seen_at stayed at {seen}"
    assert seen == sorted(seen)
    assert len(acquired) == 1  # renewed, not elected again
    # Whenever read, a renewal of the last few heartbeats: never a lease old (ten of them).
    assert max(ages) < LEASE, ages
