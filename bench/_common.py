"""What every scenario shares: the result record, the suite's sizes, and server-clock timing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from taskq.identifiers import check_identifier

NAP_PAYLOAD: dict[str, Any] = {"seconds": 0, "tag": ""}
"""The no-op job every scenario runs: ``tests.apps.basic.nap`` with zero sleep."""


@dataclass(frozen=True)
class Sizes:
    """Counts and bounds of one run (``--quick`` or full)."""

    enqueue_one: int
    bulk: int
    drain: int
    drain_concurrencies: tuple[int, ...]
    latency_seconds: float
    latency_rate: float = 200.0
    bulk_chunk: int = 5_000
    timeout_s: float = 600.0


QUICK = Sizes(
    enqueue_one=500,
    bulk=5_000,
    drain=2_000,
    drain_concurrencies=(16,),
    latency_seconds=10,
    timeout_s=180,
)
FULL = Sizes(
    enqueue_one=5_000,
    bulk=50_000,
    drain=20_000,
    drain_concurrencies=(16, 64),
    latency_seconds=30,
)


@dataclass
class Result:
    """One scenario's figures; ``line()`` is its JSON line."""

    scenario: str
    n: int
    seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def per_second(self) -> float | None:
        if not self.seconds or self.extra.get("skipped") or self.extra.get("error"):
            return None
        return self.n / self.seconds

    def line(self) -> dict[str, Any]:
        per_second = self.per_second
        return {
            "scenario": self.scenario,
            "n": self.n,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "per_second": None if per_second is None else round(per_second, 1),
            **self.extra,
        }


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """Yields a one-element list that holds the elapsed seconds after the block."""
    elapsed = [0.0]
    started = time.perf_counter()
    try:
        yield elapsed
    finally:
        elapsed[0] = time.perf_counter() - started


def chunks(total: int, size: int) -> Iterator[int]:
    """Sizes of the consecutive chunks that make up ``total``."""
    for start in range(0, total, size):
        yield min(size, total - start)


async def analyze(dsn: str, schema: str, table: str) -> None:
    """ANALYZE a freshly loaded backlog, as autovacuum would before long: a drain
    should measure the queue, not the planner's plan for a table it has no
    statistics of (a sequential scan and sort per dispatch)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"ANALYZE {check_identifier(schema)}.{check_identifier(table)}")
    finally:
        await conn.close()


async def drain_span(dsn: str, schema: str) -> tuple[int, float]:
    """Succeeded jobs in ``schema.jobs`` and the server-clock seconds from the first
    ``started_at`` to the last ``finished_at``."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            f"""
            SELECT count(*) FILTER (WHERE status = 'succeeded') AS done,
                   extract(epoch FROM max(finished_at) - min(started_at))::float8 AS span
            FROM {check_identifier(schema)}.jobs
            """
        )
    finally:
        await conn.close()
    assert row is not None
    return int(row["done"]), float(row["span"] or 0.0)
