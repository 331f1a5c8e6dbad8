"""Deep queues: the latency of one dispatch of 100 with N jobs pending.

The backlog is written by one ``INSERT … SELECT … FROM generate_series`` (the
columns a plain enqueue writes; the rest take their defaults), then
``VACUUM ANALYZE``: loading a million jobs through the client would take
minutes and measure nothing of interest here. The jobs are spread over
``ACTORS`` actors of the ``default`` queue, registered uncapped as a worker
registers its actors, in FIFO order (actor ``g % ACTORS`` for the ``g``-th job).
The round-robin variant makes ``default`` a round-robin queue and gives the
``g``-th job the fairness key ``tenant_<g % TENANTS>``: a multi-tenant backlog.

Each sample times ``PostgresBackend.dispatch_batch`` (the queue-settings
lookup and the dispatch statement) on the client's clock, then puts the
dispatched jobs back to pending and deletes their events, untimed, so the
depth and the number of running jobs stay constant from sample to sample.
"""

from __future__ import annotations

import gc
import json
import time
from datetime import timedelta
from typing import Any, Final
from uuid import uuid4

import asyncpg
from bench._common import NAP_PAYLOAD, Result
from bench.latency import latency_figures

from taskq.identifiers import check_identifier
from taskq.models import ActorConfig, QueueConfig
from taskq_postgres import PostgresBackend

ACTORS: Final = 50
BATCH: Final = 100
TENANTS: Final = 1_000
_WARMUP: Final = 3
_LEASE: Final = timedelta(minutes=5)


def scenario_name(depth: int, *, round_robin: bool = False) -> str:
    """``taskq_dispatch100_at_10k``, ``taskq_dispatch100_rr1000_at_10k`` and the like."""
    label = f"{depth // 1_000_000}m" if depth % 1_000_000 == 0 else f"{depth // 1_000}k"
    mode = f"_rr{TENANTS}" if round_robin else ""
    return f"taskq_dispatch{BATCH}{mode}_at_{label}"


def _actor(i: int) -> str:
    return f"nap_{i:02d}"


async def _load(
    conn: asyncpg.Connection[Any], schema: str, depth: int, tenants: int, seconds: float
) -> None:
    s = check_identifier(schema)
    # Bounded like the rest of the scenario: a load that would outlast the limit fails.
    await conn.execute(f"SET statement_timeout = {max(1, int(seconds * 1000))}")
    await conn.execute(
        f"""
        INSERT INTO {s}.jobs (actor, queue, payload, scheduled_at, created_at, enqueued_at,
                              fairness_key)
        SELECT 'nap_' || lpad((g % {ACTORS})::text, 2, '0'), 'default', $1::jsonb,
               t.start + g * interval '1 microsecond', t.start, t.start,
               CASE WHEN $3::int > 0 THEN 'tenant_' || (g % $3::int) END
        FROM (SELECT clock_timestamp() - interval '1 hour' AS start) t,
             generate_series(1, $2::int) AS g
        """,
        json.dumps(NAP_PAYLOAD),
        depth,
        tenants,
    )
    await conn.execute("RESET statement_timeout")
    await conn.execute(f"VACUUM ANALYZE {s}.jobs")
    # The load dirtied the whole table: written out now, not during the samples.
    await conn.execute("CHECKPOINT")


async def dispatch_latency(
    dsn: str, schema: str, depth: int, samples: int, time_limit: float, *, round_robin: bool
) -> Result:
    """``samples`` timed dispatches of ``BATCH`` on a backlog of ``depth`` pending jobs
    (``round_robin``: of ``TENANTS`` fairness keys, in a round-robin queue)."""
    deadline = time.monotonic() + time_limit
    name = scenario_name(depth, round_robin=round_robin)
    s = check_identifier(schema)
    conn = await asyncpg.connect(dsn)
    backend = PostgresBackend(dsn, schema=schema, min_pool_size=1, max_pool_size=1)
    extra: dict[str, Any] = {"pending": depth, "actors": ACTORS, "batch": BATCH}
    tenants = TENANTS if round_robin else 0
    if round_robin:
        extra["fairness_keys"] = tenants
    latencies: list[float] = []
    try:
        await _load(conn, schema, depth, tenants, deadline - time.monotonic())
        await backend.open()
        await backend.register_actors([ActorConfig(actor=_actor(i)) for i in range(ACTORS)])
        if round_robin:
            await backend.configure_queue(QueueConfig(queue="default", mode="round_robin"))
        restore = await conn.prepare(
            f"""
            WITH back AS (
                UPDATE {s}.jobs
                SET status = 'pending', attempt = attempt - 1, locked_by_worker = NULL,
                    lock_expires_at = NULL, started_at = NULL
                WHERE id = ANY($1::uuid[]) AND status = 'running'
                RETURNING id
            )
            DELETE FROM {s}.job_events e USING back WHERE e.job_id = back.id
            """
        )
        try:
            await _sample(backend, restore, samples, deadline, latencies, extra)
        finally:
            gc.unfreeze()  # frozen by _sample after its warm-up
    finally:
        await backend.close()
        await conn.close()
    extra["samples"] = len(latencies)
    if latencies:
        extra.update(latency_figures(latencies))
    return Result(name, depth, None, extra)


async def _sample(
    backend: PostgresBackend,
    restore: asyncpg.prepared_stmt.PreparedStatement[Any],
    samples: int,
    deadline: float,
    latencies: list[float],
    extra: dict[str, Any],
) -> None:
    """Time ``samples`` dispatches (after ``_WARMUP`` untimed ones, then a collection
    and a freeze of the heap, which the caller undoes) into ``latencies``, each
    dispatch's jobs put back by ``restore``; a failure or the deadline ends it with
    ``extra["error"]``."""
    worker_id = uuid4()
    for i in range(_WARMUP + samples):
        if i == _WARMUP:
            # As taskq-worker does once started: what lives on by now (here the
            # bench's own objects and the warm-up's caches too) is kept out of the
            # cyclic collector, the warm-up's garbage collected first rather than
            # frozen with it. Otherwise the collector's full passes, 14-22 ms each over
            # this process's objects, fell in about one sample in 130 and made the p99
            # (the 298th of 300) the collector's, not the dispatch's.
            gc.collect()
            gc.freeze()
        if time.monotonic() > deadline:
            extra["error"] = f"timed out after {len(latencies)} of {samples} samples"
            break
        started = time.perf_counter()
        rows = await backend.dispatch_batch(worker_id, ["default"], BATCH, _LEASE)
        elapsed_ms = (time.perf_counter() - started) * 1000
        await restore.fetch([row.id for row in rows])
        if len(rows) != BATCH:
            extra["error"] = f"a dispatch returned {len(rows)} jobs, not {BATCH}"
            break
        if i >= _WARMUP:
            latencies.append(elapsed_ms)
