"""What every scenario shares: the result record, the suite's sizes, and server-clock timing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

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
    dispatch_depths: tuple[int, ...]
    dispatch_samples: int
    memory_jobs: int
    memory_concurrency: int = 64
    latency_rate: float = 200.0
    bulk_chunk: int = 5_000
    timeout_s: float = 600.0


QUICK = Sizes(
    enqueue_one=500,
    bulk=5_000,
    drain=2_000,
    drain_concurrencies=(16,),
    latency_seconds=10,
    dispatch_depths=(10_000, 100_000),
    dispatch_samples=30,
    memory_jobs=20_000,
    timeout_s=180,
)
FULL = Sizes(
    enqueue_one=5_000,
    bulk=50_000,
    drain=20_000,
    drain_concurrencies=(16, 64),
    latency_seconds=30,
    dispatch_depths=(10_000, 100_000, 1_000_000),
    dispatch_samples=300,
    memory_jobs=200_000,
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


FIGURES: Final = (
    "client_cpu_us",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "max_ms",
    "rss_warm_mb",
    "rss_end_mb",
    "rss_peak_mb",
    "rss_growth_pct",
)
"""The measured values of ``Result.extra`` that ``--repeat`` reports the median of."""


def median_of(runs: list[Result]) -> Result:
    """One result for ``runs`` of one scenario: the median of ``seconds`` and of each
    figure over the runs that have figures, with every run's value in ``<figure>_runs``
    (``per_second_runs`` for the throughput) and the other runs' errors in ``failed_runs``."""
    good = [r for r in runs if not _failed(r)]
    failed = [_failed(r) for r in runs if _failed(r)]
    if not good:
        return Result(runs[0].scenario, runs[0].n, None, {**runs[-1].extra, "runs": len(runs)})
    extra = {**good[0].extra, "runs": len(runs)}
    if failed:
        extra["failed_runs"] = failed
    seconds = None
    if all(r.seconds for r in good):
        seconds = statistics.median(r.seconds or 0.0 for r in good)
        extra["per_second_runs"] = [round(r.per_second or 0.0, 1) for r in good]
    for name in FIGURES:
        values = [v for r in good if isinstance(v := r.extra.get(name), int | float)]
        if len(values) == len(good):
            extra[name] = round(statistics.median(values), 2)
            extra[f"{name}_runs"] = values
    return Result(good[0].scenario, good[0].n, seconds, extra)


def _failed(result: Result) -> Any:
    """Why ``result`` has no figures (its error or skip reason), else None."""
    return result.extra.get("error") or result.extra.get("skipped")


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """Yields a one-element list that holds the elapsed seconds after the block."""
    elapsed = [0.0]
    started = time.perf_counter()
    try:
        yield elapsed
    finally:
        elapsed[0] = time.perf_counter() - started


Loop = Callable[[int], Awaitable[None]]
"""An enqueue loop, opened and warm: ``await run(k)`` inserts ``k`` more jobs."""


async def interleaved(loops: Sequence[Loop], n: int, slice_size: int) -> list[tuple[float, float]]:
    """The seconds each loop took to insert ``n`` jobs, and the seconds of this process's
    CPU it used, the loops taking turns a slice of ``slice_size`` at a time (and the one
    that goes first alternating too).

    This machine's speed drifts by tens of percent within seconds: two runs timed
    one after the other compare the drift as much as the code. In turns, each
    loop sees the same drift, the same server state and tables of the same size.
    The client's CPU drifts far less than the wall clock, and shows what the
    client's code costs apart from the server's share.
    """
    spent = [0.0] * len(loops)
    cpu = [0.0] * len(loops)
    for turn, size in enumerate(chunks(n, slice_size)):
        shift = turn % len(loops)
        for i in [*range(shift, len(loops)), *range(shift)]:
            started, cpu_started = time.perf_counter(), time.process_time()
            await loops[i](size)
            spent[i] += time.perf_counter() - started
            cpu[i] += time.process_time() - cpu_started
    return list(zip(spent, cpu, strict=True))


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


async def checkpoint(dsn: str) -> None:
    """Write out every dirty page now (CHECKPOINT), so that what one scenario wrote
    is not flushed to disk while the next one is timed (the checkpointer spreads
    the writes of a drain's dirty buffers over minutes)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CHECKPOINT")
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
