"""TaskQ's scenarios: enqueue (one at a time, batch, COPY), drain, and enqueue->start latency."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from bench._common import NAP_PAYLOAD, Loop, Result, chunks, drain_span, stopwatch
from bench.latency import REPO, _start_worker, latency_figures

from taskq import TaskQ
from taskq.identifiers import check_identifier
from tests.apps import basic


def _app(dsn: str, schema: str) -> TaskQ:
    return TaskQ(dsn, schema=schema, actors=basic.tq.actors.values())


@asynccontextmanager
async def enqueue_one(dsn: str, schema: str) -> AsyncIterator[Loop]:
    """A loop of ``k`` calls of ``client.enqueue`` per call, one after the other."""
    async with _app(dsn, schema) as app:

        async def run(k: int) -> None:
            for _ in range(k):
                await app.client.enqueue(basic.nap, NAP_PAYLOAD)

        yield run


async def enqueue_batch(dsn: str, schema: str, n: int, chunk: int) -> Result:
    """``n`` jobs through ``client.enqueue_batch``, ``chunk`` per call."""
    async with _app(dsn, schema) as app:
        with stopwatch() as elapsed:
            for size in chunks(n, chunk):
                await app.client.enqueue_batch([(basic.nap, NAP_PAYLOAD)] * size)
    return Result("taskq_enqueue_batch", n, elapsed[0], {"chunk": chunk})


@asynccontextmanager
async def enqueue_copy(dsn: str, schema: str) -> AsyncIterator[Loop]:
    """A loop of one ``client.enqueue_batch_fast`` (COPY) of ``k`` jobs per call."""
    async with _app(dsn, schema) as app:

        async def run(k: int) -> None:
            await app.client.enqueue_batch_fast([(basic.nap, NAP_PAYLOAD)] * k)

        yield run


async def preload(dsn: str, schema: str, n: int, chunk: int) -> None:
    """Enqueue ``n`` no-op jobs by COPY, untimed (the drains' backlog)."""
    async with enqueue_copy(dsn, schema) as run:
        for size in chunks(n, chunk):
            await run(size)


def _worker_env(
    dsn: str, schema: str, concurrency: int, prefetch: int | None = None
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env.update(
        TASKQ_DSN=dsn,
        TASKQ_SCHEMA=schema,
        TASKQ_CONCURRENCY=str(concurrency),
        TASKQ_QUEUES="default",
        TASKQ_UNTIL_IDLE="true",
    )
    if prefetch is not None:
        env["TASKQ_PREFETCH"] = str(prefetch)
    return env


def drain_name(workers: int, concurrency: int, prefetch: int | None) -> str:
    """The scenario name of a TaskQ drain (``_prefetchP`` for a fixed ``TASKQ_PREFETCH``;
    None: the default, ``auto``)."""
    fixed = "" if prefetch is None else f"_prefetch{prefetch}"
    return f"taskq_drain_w{workers}_c{concurrency}{fixed}"


async def drain(
    dsn: str,
    schema: str,
    n: int,
    workers: int,
    concurrency: int,
    time_limit: float,
    prefetch: int | None = None,
) -> Result:
    """Run ``workers`` ``taskq-worker --until-idle`` processes over ``n`` pending jobs,
    each locking up to ``prefetch`` jobs ahead of its ``concurrency`` (None: as many as
    ``auto``, the default, decides)."""
    command = [os.path.join(os.path.dirname(sys.executable), "taskq-worker"), "tests.apps.basic:tq"]
    env = _worker_env(dsn, schema, concurrency, prefetch)
    processes = [
        await asyncio.create_subprocess_exec(
            *command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        for _ in range(workers)
    ]
    extra: dict[str, Any] = {"workers": workers, "concurrency": concurrency}
    deadline = time.monotonic() + time_limit
    for process in processes:
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                _, stderr = await process.communicate()
        except TimeoutError:
            process.kill()
            _, stderr = await process.communicate()
            extra["error"] = f"timed out after {time_limit:.0f} s"
        if process.returncode != 0 and "error" not in extra:
            tail = " ".join(stderr.decode(errors="replace").strip().splitlines()[-1:])
            extra["error"] = f"worker exited with {process.returncode}: {tail}"
    done, span = await drain_span(dsn, schema)
    if done != n and "error" not in extra:
        extra["error"] = f"only {done} of {n} jobs succeeded"
    return Result(drain_name(workers, concurrency, prefetch), n, span, extra)


async def latency(dsn: str, schema: str, rate: float, seconds: float) -> Result:
    """Enqueue at a steady ``rate`` for ``seconds`` to an idle worker (NOTIFY-driven, as
    bench/latency.py); latency is the server clock's ``started_at - created_at``."""
    n = int(rate * seconds)
    worker = _start_worker(dsn, schema)
    try:
        async with _app(dsn, schema) as app:
            await _warm_up(app, rate)
            loop = asyncio.get_running_loop()
            start = loop.time()
            with stopwatch() as elapsed:
                for i in range(n):
                    await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
                    await app.client.enqueue(basic.nap, NAP_PAYLOAD)
            latencies = await _wait_latencies(dsn, schema, n, time_limit=30)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    extra: dict[str, Any] = {"target_rate_per_s": rate}
    if len(latencies) < n:
        extra["error"] = f"only {len(latencies)} of {n} jobs started within 30 s"
    if latencies:
        extra.update(latency_figures(latencies))
    return Result("taskq_latency", n, elapsed[0], extra)


WARM_UP_JOBS = 50
"""Jobs run, untimed, before the timed ones, so the worker is up and idle when they start."""


async def _warm_up(app: TaskQ, rate: float) -> None:
    """Run ``WARM_UP_JOBS`` (tagged ``warm-up``) through the worker at ``rate`` and wait
    for all of them: the first dispatches of a fresh worker (statements prepared,
    caches filled) and jobs enqueued before it listens would otherwise count."""
    ids = []
    for _ in range(WARM_UP_JOBS):
        ids.append((await app.client.enqueue(basic.nap, {**NAP_PAYLOAD, "tag": "warm-up"})).id)
        await asyncio.sleep(1 / rate)
    for job_id in ids:
        await app.client.wait_for_result(job_id, timeout=60)
    await asyncio.sleep(0.5)  # idle again


async def _wait_latencies(dsn: str, schema: str, n: int, time_limit: float) -> list[float]:
    conn = await asyncpg.connect(dsn)
    try:
        query = f"""
            SELECT extract(epoch FROM started_at - created_at)::float8 * 1000 AS ms
            FROM {check_identifier(schema)}.jobs
            WHERE started_at IS NOT NULL AND payload->>'tag' <> 'warm-up'
        """
        deadline = time.monotonic() + time_limit
        while True:
            rows = await conn.fetch(query)
            if len(rows) >= n or time.monotonic() > deadline:
                return [float(r["ms"]) for r in rows]
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


def _rss_kb(pid: int) -> int | None:
    """The process's resident set in kB (``VmRSS``), or None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return None  # a zombie keeps its status file but no VmRSS line


def memory_name(concurrency: int) -> str:
    """The memory scenario's name."""
    return f"taskq_memory_c{concurrency}"


async def memory(dsn: str, schema: str, n: int, concurrency: int, time_limit: float) -> Result:
    """One ``taskq-worker --until-idle`` at ``concurrency`` over ``n`` pending jobs, its RSS
    read about every second next to the number of jobs done so far."""
    command = [os.path.join(os.path.dirname(sys.executable), "taskq-worker"), "tests.apps.basic:tq"]
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=REPO,
        env=_worker_env(dsn, schema, concurrency),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    stderr = asyncio.create_task(process.stderr.read())  # drained, so the pipe never fills
    extra: dict[str, Any] = {"concurrency": concurrency}
    samples: list[tuple[int, int]] = []  # (jobs succeeded, RSS kB)
    conn = await asyncpg.connect(dsn)
    deadline = time.monotonic() + time_limit
    try:
        done_sql = (
            f"SELECT count(*) FROM {check_identifier(schema)}.jobs WHERE status = 'succeeded'"
        )
        while process.returncode is None:
            rss = _rss_kb(process.pid)
            done = int(await conn.fetchval(done_sql))
            if rss is not None:
                samples.append((done, rss))
            if time.monotonic() > deadline:
                process.kill()
                extra["error"] = f"timed out after {time_limit:.0f} s"
            try:
                async with asyncio.timeout(1.0):
                    await process.wait()
            except TimeoutError:
                pass
    finally:
        await conn.close()
        if process.returncode is None:
            process.kill()
        await process.wait()
    log = await stderr
    if process.returncode != 0 and "error" not in extra:
        tail = " ".join(log.decode(errors="replace").strip().splitlines()[-1:])
        extra["error"] = f"worker exited with {process.returncode}: {tail}"
    warm = next((rss for done, rss in samples if done >= n // 10), None)
    if warm is not None:
        end = samples[-1][1]
        extra.update(
            rss_warm_mb=round(warm / 1024, 1),
            rss_end_mb=round(end / 1024, 1),
            rss_peak_mb=round(max(rss for _, rss in samples) / 1024, 1),
            rss_growth_pct=round((end - warm) / warm * 100, 1),
            rss_samples=len(samples),
        )
    elif "error" not in extra:
        extra["error"] = f"no RSS sample after {n // 10} jobs"
    done, span = await drain_span(dsn, schema)
    if done != n and "error" not in extra:
        extra["error"] = f"only {done} of {n} jobs succeeded"
    return Result(memory_name(concurrency), n, span, extra)
