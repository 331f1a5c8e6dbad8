"""Enqueue -> start latency on an idle worker (NOTIFY-driven dispatch).

Starts a real `taskq-worker` process on a throwaway database of the local
server (127.0.0.1 only), then enqueues jobs one at a time at a steady rate
while the worker is otherwise idle. Latency per job is the server clock's
``started_at - created_at`` (dispatch time minus insert time, one clock, no
skew). The worker polls only every 30 s, so the figure is NOTIFY's.
Prints one JSON line; bounded by --jobs and --rate.

    python -m bench.latency [--jobs 200] [--rate 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from taskq import TaskQ
from taskq_testing.postgres import migrated_schema, throwaway_database
from tests.apps import basic

REPO = Path(__file__).resolve().parents[1]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_figures(latencies: list[float]) -> dict[str, float]:
    """p50/p95/p99/max of ``latencies`` (ms), rounded for a JSON line."""
    return {
        "p50_ms": round(statistics.median(latencies), 2),
        "p95_ms": round(_percentile(latencies, 0.95), 2),
        "p99_ms": round(_percentile(latencies, 0.99), 2),
        "max_ms": round(max(latencies), 2),
    }


def _start_worker(dsn: str, schema: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env.update(
        TASKQ_DSN=dsn, TASKQ_SCHEMA=schema, TASKQ_POLL_INTERVAL="30s", TASKQ_QUEUES="default"
    )
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "taskq-worker"), "tests.apps.basic:tq"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _measure(dsn: str, schema: str, jobs: int, rate: float) -> dict[str, object]:
    app = TaskQ(dsn, schema=schema, actors=basic.tq.actors.values())
    async with app:
        await asyncio.sleep(1.5)  # let the worker start and LISTEN
        ids = []
        for _ in range(jobs):
            ids.append((await app.client.enqueue(basic.nap, {"seconds": 0})).id)
            await asyncio.sleep(1 / rate)
        for job_id in ids:
            await app.client.wait_for_result(job_id, timeout=30)
        latencies = []
        for job_id in ids:
            row = await app.client.get(job_id)
            assert row is not None and row.started_at is not None
            latencies.append((row.started_at - row.created_at).total_seconds() * 1000)
    return {
        "scenario": "enqueue_to_start_latency_idle_worker",
        "jobs": jobs,
        "rate_per_s": rate,
        **latency_figures(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0, help="jobs enqueued per second")
    args = parser.parse_args()
    started = time.monotonic()
    with throwaway_database() as dsn, migrated_schema(dsn) as schema:
        worker = _start_worker(dsn, schema.name)
        try:
            result = asyncio.run(_measure(dsn, schema.name, args.jobs, args.rate))
        finally:
            worker.terminate()
            worker.wait(timeout=30)
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
