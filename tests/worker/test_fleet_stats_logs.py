"""The leader's fleet-stats records stay bounded however many queues there are: the
busiest 50 named, the rest counted (one entry per queue made 6 MB records at 20,000)."""

from __future__ import annotations

import structlog.testing

from taskq.backend.memory import InMemoryBackend
from taskq.models import EnqueueArgs
from taskq.worker.maintenance import queue_depth_once, stranded_jobs_once


async def _backend() -> InMemoryBackend:
    backend = InMemoryBackend()
    await backend.open()
    # 120 queues of one job each, and one busy queue of 5; actors nobody runs (stranded).
    for n in range(120):
        await backend.enqueue(EnqueueArgs(actor=f"gone_{n}", queue=f"q{n:03d}"))
    for _ in range(5):
        await backend.enqueue(EnqueueArgs(actor="busy", queue="busiest"))
    return backend


async def test_queue_depth_names_the_50_busiest_queues_and_counts_the_rest() -> None:
    backend = await _backend()
    with structlog.testing.capture_logs() as logs:
        await queue_depth_once(backend)
    [record] = logs
    assert len(record["queues"]) == 50 and record["queues_not_shown"] == 71
    assert record["queues"]["busiest"]["pending"] == 5
    assert list(record["queues"])[:3] == ["busiest", "q000", "q001"]


async def test_stranded_jobs_name_the_50_actors_with_most_and_count_them_all() -> None:
    backend = await _backend()
    with structlog.testing.capture_logs() as logs:
        await stranded_jobs_once(backend)
    [record] = logs
    assert len(record["actors"]) == 50 and record["actors_not_shown"] == 71
    assert record["actors"]["busy"] == {"busiest": 5}
    assert record["jobs"] == 125 and len(record["queues"]) == 50


async def test_an_actors_stranded_queues_are_named_busiest_first() -> None:
    backend = InMemoryBackend()
    await backend.open()
    for n in range(60):
        await backend.enqueue(EnqueueArgs(actor="gone", queue=f"q{n:02d}"))
    for _ in range(3):
        await backend.enqueue(EnqueueArgs(actor="gone", queue="z-busy"))
    with structlog.testing.capture_logs() as logs:
        await stranded_jobs_once(backend)
    [record] = logs
    assert len(record["actors"]["gone"]) == 50 and record["actors"]["gone"]["z-busy"] == 3
