"""End to end on Postgres: real `taskq-worker` processes started by the test."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from taskq import JobFilter, JobStatus, MaxPendingExceededError, TaskQ
from taskq.models import EnqueueArgs
from taskq_testing.postgres import PgSchema
from tests.apps import basic

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FAST_ENV = {
    "TASKQ_POLL_INTERVAL": "100ms",
    "TASKQ_HEARTBEAT_INTERVAL": "100ms",
    "TASKQ_LOCK_LEASE": "2s",
    "TASKQ_MAINTENANCE_INTERVAL": "50ms",
    "TASKQ_TERMINATION_GRACE_PERIOD": "10s",
}


def _env(pg: PgSchema, extra: dict[str, str] | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    return {**base, **FAST_ENV, "TASKQ_DSN": pg.dsn, "TASKQ_SCHEMA": pg.name, **(extra or {})}


@contextmanager
def worker_process(
    pg: PgSchema, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """A `taskq-worker tests.apps.basic:tq` process, killed if the test leaves it running."""
    proc = subprocess.Popen(
        [str(BIN / "taskq-worker"), "tests.apps.basic:tq", *args],
        cwd=REPO,
        env=_env(pg, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def run_until_idle(pg: PgSchema, *args: str, env: dict[str, str] | None = None) -> str:
    with worker_process(pg, "--until-idle", *args, env=env) as proc:
        _, stderr = proc.communicate(timeout=90)
        assert proc.returncode == 0, stderr
        return stderr


@pytest.fixture
async def tq(pg_schema: PgSchema) -> AsyncIterator[TaskQ]:
    app = TaskQ(
        pg_schema.dsn,
        schema=pg_schema.name,
        actors=basic.tq.actors.values(),
        queues=basic.tq.queues,
    )
    async with app:
        # what a worker does at start-up, so enqueue-side limits are known
        from taskq.models import ActorConfig

        await app.backend.register_actors(
            [
                ActorConfig(
                    actor=a.name,
                    max_concurrent=a.options.max_concurrent,
                    max_pending=a.options.max_pending,
                )
                for a in app.actors.values()
            ]
        )
        for queue in app.queues:
            await app.backend.configure_queue(queue)
        yield app


async def _all_jobs(tq: TaskQ) -> list[Any]:
    rows: list[Any] = []
    page = JobFilter(limit=1000)
    while batch := await tq.client.list_jobs(page):
        rows += batch
        page = page.after(batch[-1])
    return rows


def _until_a_failed_start_attempt(port: int, proc: subprocess.Popen[str]) -> None:
    """Until the worker's /readyz says it waits for its backend after a failed try."""
    import json
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        except urllib.error.HTTPError as answer:  # 503 while it starts
            if json.loads(answer.read()).get("attempt", 0) >= 1:
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.05)
    raise AssertionError("the worker never reported a failed attempt to reach its database")


async def test_a_worker_connects_with_a_dsn_whose_password_it_never_shows(
    tq: TaskQ, pg_schema: PgSchema
) -> None:
    # The trust-auth test server ignores the password: the worker still reaches it
    # with the DSN as given, while its settings show the password masked.
    from urllib.parse import urlsplit, urlunsplit

    from taskq import WorkerSettings

    parts = urlsplit(pg_schema.dsn)
    netloc = f"{parts.username or 'postgres'}:pw-s3cret-9@{parts.hostname}:{parts.port or 5432}"
    dsn = urlunsplit(parts._replace(netloc=netloc))
    settings = WorkerSettings.load({"dsn": dsn}, env={})
    assert "pw-s3cret-9" not in repr(settings) + settings.model_dump_json()
    job = await tq.client.enqueue(basic.nap, {"seconds": 0, "tag": "secret"})
    stderr = await asyncio.to_thread(run_until_idle, pg_schema, env={"TASKQ_DSN": dsn})
    assert "pw-s3cret-9" not in stderr
    row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.SUCCEEDED


async def test_a_worker_started_before_its_database_accepts_connections_waits_for_it(
    tq: TaskQ, pg_schema: PgSchema
) -> None:
    from urllib.parse import urlsplit

    from taskq_testing.faults import TcpProxy

    job = await tq.client.enqueue(basic.nap, {"seconds": 0, "tag": "late"})
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with TcpProxy(urlsplit(pg_schema.dsn).port or 5432) as proxy:
        proxy.cut()  # what a server not started yet looks like: connections refused
        env = {
            "TASKQ_DSN": proxy.through(pg_schema.dsn),
            "TASKQ_STARTUP_WAIT": "60s",
            "TASKQ_HEALTH_PORT": str(port),
        }
        with worker_process(pg_schema, "--until-idle", env=env) as proc:
            # Restored once a try failed (a fixed sleep lost the race on a loaded machine:
            # the first try came after the restore).
            await asyncio.to_thread(_until_a_failed_start_attempt, port, proc)
            proxy.restore()
            _, stderr = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, stderr
    assert "taskq.backend-unreachable-at-start" in stderr
    row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.SUCCEEDED


async def test_a_thousand_jobs_across_actors_and_queues(tq: TaskQ, pg_schema: PgSchema) -> None:
    items: list[Any] = []
    for i in range(1000):
        actor = (basic.nap, basic.nap_sync, basic.capped)[i % 3]
        items.append((actor, {"seconds": 0, "tag": str(i)}))
    await tq.client.enqueue_batch(items)
    await asyncio.to_thread(
        run_until_idle, pg_schema, "--queues", "default,other", "--concurrency", "16"
    )
    rows = await _all_jobs(tq)
    assert len(rows) == 1000
    assert Counter(r.status for r in rows) == {JobStatus.SUCCEEDED: 1000}
    assert {r.attempt for r in rows} == {1}
    sync_row = next(r for r in rows if r.actor == "nap_sync")
    assert sync_row.result["thread"].startswith("taskq-sync-actor")
    assert await tq.client.wait_for_result(rows[0].id, timeout=1) is not None


async def test_priority_and_round_robin_order_show_in_start_order(
    tq: TaskQ, pg_schema: PgSchema
) -> None:
    low = [await tq.client.enqueue(basic.ordered, {"tag": f"low{i}"}, priority=0) for i in range(3)]
    high = [
        await tq.client.enqueue(basic.ordered, {"tag": f"high{i}"}, priority=5) for i in range(3)
    ]
    a = [await tq.client.enqueue(basic.fair, {"tag": "a"}, fairness_key="a") for _ in range(4)]
    b = [await tq.client.enqueue(basic.fair, {"tag": "b"}, fairness_key="b") for _ in range(4)]
    await asyncio.to_thread(
        run_until_idle,
        pg_schema,
        "--queues",
        "default,fair",
        "--concurrency",
        "1",
        # one dispatch locks everything, in the order it will run: fairness and
        # priority are decided per dispatch batch (architecture: Dispatch CTE)
        env={"TASKQ_PREFETCH": "20", "TASKQ_DISPATCH_BATCH_SIZE": "20"},
    )

    async def start_order(jobs: list[Any]) -> list[str]:
        results = [(await tq.client.get(job.id)) for job in jobs]
        ordered = sorted((r.result["started"], r.result["tag"]) for r in results if r is not None)
        return [tag for _, tag in ordered]

    assert await start_order(low + high) == ["high0", "high1", "high2", "low0", "low1", "low2"]
    assert await start_order(a + b) == ["a", "b"] * 4


async def test_signals_retries_timeouts_and_deadlines(tq: TaskQ, pg_schema: PgSchema) -> None:
    c = tq.client
    snoozed = await c.enqueue(basic.snooze_twice, {})
    failing = await c.enqueue(basic.always_fails, {})
    after = await c.enqueue(basic.retry_after, {})
    slow = await c.enqueue(basic.too_slow, {})
    # Its deadline passes while it waits (the client refuses such options up front;
    # a backend stores what it is given).
    late = await tq.backend.enqueue(
        EnqueueArgs(
            actor=basic.nap.name,
            delay=timedelta(seconds=5),
            schedule_to_close=timedelta(seconds=0.3),
        )
    )
    await asyncio.to_thread(run_until_idle, pg_schema, "--queues", "default")

    assert await c.wait_for_result(snoozed.id, timeout=1) == 3
    snoozed_attempts = await c.get_attempts(snoozed.id)
    assert [a.outcome for a in snoozed_attempts] == ["snoozed", "snoozed", "succeeded"]

    failed = await c.get(failing.id)
    assert failed is not None and failed.status is JobStatus.FAILED
    tries = await c.get_attempts(failing.id)
    assert [a.outcome for a in tries] == ["failed"] * 3
    gaps = [b.started_at - a.finished_at for a, b in itertools.pairwise(tries)]  # type: ignore[operator]
    assert all(g >= timedelta(seconds=0.18) for g in gaps), gaps  # the 0.2 s backoff

    after_row = await c.get(after.id)
    assert after_row is not None and after_row.status is JobStatus.FAILED
    assert [a.outcome for a in await c.get_attempts(after.id)] == ["retry_after"] * 2

    slow_row = await c.get(slow.id)
    assert slow_row is not None and slow_row.status is JobStatus.FAILED
    assert slow_row.error is not None and "timeout" in slow_row.error.message

    late_row = await c.get(late.id)
    assert late_row is not None and late_row.status is JobStatus.FAILED
    assert late_row.error is not None and late_row.error.error_class.endswith("DeadlineExceeded")
    assert await c.get_attempts(late.id) == []


async def test_idempotency_and_max_pending(tq: TaskQ, pg_schema: PgSchema) -> None:
    c = tq.client
    first = await c.enqueue(basic.nap, {"tag": "x"}, idempotency_key="k1")
    again = await c.enqueue(basic.nap, {"tag": "y"}, idempotency_key="k1")
    assert again.id == first.id and again.payload == {"seconds": 0.0, "tag": "x"}
    for _ in range(3):
        await c.enqueue(basic.bounded, {})
    with pytest.raises(MaxPendingExceededError, match="max_pending=3"):
        await c.enqueue(basic.bounded, {})
    await asyncio.to_thread(run_until_idle, pg_schema)
    assert len(await c.get_attempts(first.id)) == 1
    await c.enqueue(basic.bounded, {})  # room again once the backlog ran


async def test_max_concurrent_and_identity_serialization(tq: TaskQ, pg_schema: PgSchema) -> None:
    c = tq.client
    capped = [await c.enqueue(basic.capped, {"seconds": 0.15}) for _ in range(6)]
    same = [await c.enqueue(basic.serialized, {"seconds": 0.1, "tag": "t"}) for _ in range(4)]
    await asyncio.to_thread(run_until_idle, pg_schema, "--concurrency", "8")

    def max_overlap(spans: list[tuple[Any, Any]]) -> int:
        edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
        running = peak = 0
        for _, step in edges:
            running += step
            peak = max(peak, running)
        return peak

    async def spans(jobs: list[Any]) -> list[tuple[Any, Any]]:
        out = []
        for job in jobs:
            [attempt] = await c.get_attempts(job.id)
            out.append((attempt.started_at, attempt.finished_at))
        return out

    assert max_overlap(await spans(capped)) <= 2
    assert max_overlap(await spans(same)) == 1


async def test_two_workers_split_the_work_and_run_nothing_twice(
    tq: TaskQ, pg_schema: PgSchema
) -> None:
    # 300 x 20 ms at concurrency 4 keep one worker busy 1.5 s, and the work is enqueued
    # only once both workers are up, so both get jobs (enqueued before, the first worker
    # could run them all while the second was still starting on a loaded machine). A job
    # scheduled an hour out keeps the idle workers from ending meanwhile (until-idle
    # counts it).
    hold = await tq.client.enqueue(basic.nap, {}, delay=timedelta(hours=1))
    with (
        worker_process(pg_schema, "--until-idle", "--concurrency", "4") as w1,
        worker_process(pg_schema, "--until-idle", "--concurrency", "4") as w2,
    ):

        async def both_up() -> bool:
            async with tq.backend.connection() as conn:  # type: ignore[attr-defined]
                count = await conn.fetchval(f"SELECT count(*) FROM {tq.schema}.workers")
            assert w1.poll() is None and w2.poll() is None
            return bool(count == 2)

        deadline = time.monotonic() + 60
        while not await both_up():
            assert time.monotonic() < deadline, "the workers did not both start"
            await asyncio.sleep(0.05)
        await tq.client.enqueue_batch([(basic.nap, {"seconds": 0.02}) for _ in range(300)])
        assert await tq.client.cancel(hold.id)  # the work keeps them until it is done
        for proc in (w1, w2):
            _, err = await asyncio.to_thread(proc.communicate, timeout=90)
            assert proc.returncode == 0, err
    rows = [r for r in await _all_jobs(tq) if r.id != hold.id]
    assert Counter(r.status for r in rows) == {JobStatus.SUCCEEDED: 300}
    workers: set[Any] = set()
    for row in rows:
        attempts = await tq.client.get_attempts(row.id)
        assert len(attempts) == 1
        workers.add(attempts[0].worker_id)
    assert len(workers) == 2


async def test_sub_jobs_exist_only_if_their_parent_succeeds(tq: TaskQ, pg_schema: PgSchema) -> None:
    ok = await tq.client.enqueue(basic.spawner, {"children": 3})
    failed = await tq.client.enqueue(basic.spawner, {"children": 2, "fail": True}, max_attempts=1)
    await asyncio.to_thread(run_until_idle, pg_schema)
    assert await tq.client.wait_for_result(ok.id, timeout=1) == 3
    failed_row = await tq.client.get(failed.id)
    assert failed_row is not None and failed_row.status is JobStatus.FAILED
    children = await tq.client.list_jobs(actor="nap")
    assert sorted(r.payload["tag"] for r in children) == ["child0", "child1", "child2"]
    assert {r.status for r in children} == {JobStatus.SUCCEEDED}


async def test_an_actor_uses_its_applications_client(tq: TaskQ, pg_schema: PgSchema) -> None:
    # taskq-worker ran a copy of the application, built anew with its settings: the one
    # the actors' module names was never opened, and each of its calls failed.
    job = await tq.client.enqueue(basic.follows_up, {"tag": "followed"})
    await asyncio.to_thread(run_until_idle, pg_schema)
    followed = await tq.client.wait_for_result(job.id, timeout=1)
    row = await tq.client.get(followed)
    assert row is not None and row.status is JobStatus.SUCCEEDED
    assert row.payload["tag"] == "followed"


async def test_progress_is_persisted_while_the_job_runs(tq: TaskQ, pg_schema: PgSchema) -> None:
    job = await tq.client.enqueue(basic.reporter, {"seconds": 1.5})
    with worker_process(pg_schema, "--until-idle") as proc:
        # Polled until the first step shows or the job moves on without showing it: a
        # count of 100 polls (5 s) ran out on a loaded machine before the worker had
        # even started. Once running, the first step stays visible for 1.5 s.
        seen = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            row = await tq.client.get(job.id)
            assert row is not None
            if row.status is JobStatus.RUNNING and row.progress_seq == 1:
                seen = row.progress_state
                break
            if row.status not in (JobStatus.PENDING, JobStatus.RUNNING) or row.progress_seq > 1:
                break  # past the first step without the test seeing it persisted
            await asyncio.sleep(0.05)
        assert row is not None  # as checked in the loop
        assert seen == {"step": 1}, (row.status, row.progress_seq)
        _, err = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, err
    done = await tq.client.get(job.id)
    assert done is not None and (done.progress_seq, done.progress_state) == (2, {"step": 2})
