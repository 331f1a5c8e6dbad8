"""``taskq demo`` against a server and schema given on the command line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from uuid import UUID

import pytest

from taskq.models import JobStatus
from taskq_testing.postgres import PgSchema
from tests.demo._support import expected_statuses, taskq

JOBS = 40


@pytest.mark.postgres
def test_demo_runs_on_the_given_schema_and_reruns_alike(
    pg_schema: PgSchema, tmp_path: Path
) -> None:
    args = ("demo", "--dsn", pg_schema.dsn, "--schema", pg_schema.name, "--jobs", str(JOBS))
    # The second run finds the first one's jobs in the schema and reports its own only.
    fired = 0
    for _ in range(2):
        result = taskq(*args, "--json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "embedded" not in result.stderr
        summary = json.loads(result.stdout)
        assert summary["schema"] == pg_schema.name
        assert summary["jobs"] == JOBS
        assert summary["statuses"] == expected_statuses(JOBS)
        assert summary["unfinished"] == 0
        fired += summary["cron_fired"]
        # Its cron schedule is gone with it, and every job it fired ran (or, fired as the
        # worker went idle, was cancelled): none is left waiting.
        schedules, ticks = asyncio.run(_cron_left(pg_schema))
        assert schedules == [] and JobStatus.PENDING not in ticks
        assert ticks.count(JobStatus.SUCCEEDED) == fired
    assert not (tmp_path / ".taskq").exists()
    # Each run's tracked batch completed, and its finalizer ran after that.
    assert asyncio.run(_batches(pg_schema)) == [("complete", JobStatus.SUCCEEDED, True)] * 2
    # The table ends saying where the jobs are: not in `taskq jobs list`'s default schema.
    result = taskq(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.strip() == f"the jobs stay: taskq jobs list --schema {pg_schema.name} --dsn ..."


async def _cron_left(pg_schema: PgSchema) -> tuple[list[str], list[JobStatus]]:
    from taskq import TaskQ

    async with TaskQ(pg_schema.dsn, schema=pg_schema.name) as tq:
        schedules = [s.name for s in await tq.client.list_schedules()]
        ticks = [row.status for row in await tq.client.list_jobs(actor="demo.tick")]
    return schedules, ticks


async def _batches(pg_schema: PgSchema) -> list[tuple[str, JobStatus, bool]]:
    from taskq import TaskQ

    async with TaskQ(pg_schema.dsn, schema=pg_schema.name) as tq:
        found: list[tuple[str, JobStatus, bool]] = []
        for final in await tq.client.list_jobs(actor="demo.batch_done"):
            batch = await tq.backend.get_batch(UUID(final.metadata["batch_finalizer_for"]))
            assert batch is not None and batch.completed_at is not None
            after = final.started_at is not None and final.started_at >= batch.completed_at
            found.append((batch.status, final.status, after))
    return found


@pytest.mark.postgres
def test_ctrl_c_stops_the_demo_gracefully_and_leaves_no_job_locked(
    pg_schema: PgSchema, tmp_path: Path
) -> None:
    import asyncio
    import signal
    import subprocess
    import time

    from taskq.models import JobFilter, JobRow, JobStatus
    from tests.demo._support import TASKQ, user_env

    args = ["demo", "--dsn", pg_schema.dsn, "--schema", pg_schema.name, "--jobs", "5000"]
    proc = subprocess.Popen(
        [TASKQ, *args],
        cwd=tmp_path,
        env=user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    async def succeeded() -> int:
        from taskq import TaskQ

        async with TaskQ(pg_schema.dsn, schema=pg_schema.name) as app:
            return len(await app.client.list_jobs(JobFilter(status=[JobStatus.SUCCEEDED])))

    # Enqueued, and the worker busy: a fixed sleep came before the worker on a loaded
    # machine.
    deadline = time.monotonic() + 60
    while asyncio.run(succeeded()) == 0:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    # Said, and not a success: the summary counted pending jobs as throughput, exit 0.
    assert proc.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "jobs left unfinished" in stdout

    async def running() -> list[JobRow]:
        from taskq import TaskQ

        async with TaskQ(pg_schema.dsn, schema=pg_schema.name) as app:
            return await app.client.list_jobs(JobFilter(status=[JobStatus.RUNNING]))

    assert asyncio.run(running()) == []  # handed back, not left for a lease to expire


@pytest.mark.postgres
def test_ctrl_c_before_the_worker_starts_says_where_the_jobs_wait(
    pg_schema: PgSchema, tmp_path: Path
) -> None:
    from tests.demo._support import taskq_interrupted_while_enqueueing

    result = taskq_interrupted_while_enqueueing(
        "demo", "--dsn", pg_schema.dsn, "--schema", pg_schema.name, cwd=tmp_path
    )

    assert result.returncode == 1
    # The demo's own line: the generic one pointed at `taskq jobs list`, which looks in
    # the default schema, not the demo's.
    assert result.stderr.splitlines() == [
        (
            "taskq demo: interrupted before its worker started; the jobs it enqueued wait "
            f"until the next run cancels them (taskq jobs list --schema {pg_schema.name} "
            "--dsn ... shows them)"
        )
    ]
    assert result.stdout == ""
