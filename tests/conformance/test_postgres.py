"""The conformance suite on PostgresBackend: the same tests as the in-memory backend,
on a real server with a real clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from taskq.backend import Backend
from taskq_postgres import PostgresBackend
from taskq_testing.conformance import AdvanceTime, BackendConformance
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


async def _sleep(delta: timedelta) -> None:
    await asyncio.sleep(delta.total_seconds())


class TestPostgresBackend(BackendConformance):
    """Each test gets an emptied schema of the session's pool and a backend opened on it;
    time passes for real."""

    @pytest_asyncio.fixture
    async def backend(self, pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
        backend = PostgresBackend(
            pg_pooled_schema.dsn,
            schema=pg_pooled_schema.name,
            min_pool_size=1,
            max_pool_size=4,
            cancel_reclaim_headroom=timedelta(milliseconds=600),
            # Long enough to watch an event being held back, short enough to wait out.
            reclaim_event_visibility_delay=timedelta(milliseconds=500),
            # Wider than the default, so that the wake tests see enqueues coalesced.
            wake_coalesce_window=timedelta(milliseconds=50),
            # Far above a test's next statement, short enough to wait out.
            stale_batch_grace=timedelta(seconds=2),
        )
        await backend.open()
        yield backend
        await backend.close()

    @pytest.fixture
    def advance_time(self) -> AdvanceTime:
        return _sleep

    # pytest-asyncio types its fixture as the bare function, where it returns pytest's
    # fixture definition (as the base's is): the same kind of object, typed apart.
    @pytest_asyncio.fixture
    async def transaction_conn(  # type: ignore[override]
        self, pg_pooled_schema: PgSchema
    ) -> AsyncIterator[Any]:
        # A plain connection of the caller's own, with asyncpg's default codecs.
        conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_pooled_schema.dsn)
        yield conn
        await conn.close()

    # Known gap, kept visible: round robin samples each (queue, actor) to its first
    # residual * oversample jobs by their rank among that actor's own jobs of each
    # cohort, not among the whole cohort (every actor's). A capped actor's jobs that
    # come second in cohorts other actors lead fill its sample, and its first job of
    # a cohort of its own is left out. Strict: once fixed this fails, and goes.
    @pytest.mark.xfail(
        strict=True,
        reason="round robin samples a (queue, actor) by its own cohort ranks (not fixed yet)",
    )
    async def test_round_robin_ranks_a_job_among_its_whole_cohort_not_its_actors_jobs(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        await super().test_round_robin_ranks_a_job_among_its_whole_cohort_not_its_actors_jobs(
            backend, advance_time
        )

    # The same gap, deeper: a capped actor's sample holds residual * oversample jobs,
    # so its backlog in a cohort past them never counts towards another actor's rank.
    @pytest.mark.xfail(
        strict=True,
        reason="round robin counts a capped actor's cohort-mates in its sample only (not "
        "fixed yet)",
    )
    async def test_round_robin_ranks_a_job_behind_a_capped_actors_whole_backlog_in_its_cohort(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        await (
            super().test_round_robin_ranks_a_job_behind_a_capped_actors_whole_backlog_in_its_cohort(
                backend, advance_time
            )
        )

    # The same gap in a strict queue asked for with a round-robin one (one cohort over
    # its actors): the capped actor's sample of it counts its first jobs only.
    @pytest.mark.xfail(
        strict=True,
        reason="round robin counts a capped actor's strict backlog in its sample only (not "
        "fixed yet)",
    )
    async def test_round_robin_ranks_a_strict_job_behind_a_capped_actors_strict_backlog(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        await super().test_round_robin_ranks_a_strict_job_behind_a_capped_actors_strict_backlog(
            backend, advance_time
        )
