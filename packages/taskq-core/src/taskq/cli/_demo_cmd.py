"""``taskq demo``: a worker processing a few hundred real jobs, then a summary.

The demo enqueues the mix from :func:`taskq.demo.plan` (quick jobs, retries,
permanent failures, snoozes, ``RetryAfter``, delayed and cancelled jobs, a
fan-out with sub-jobs, a job reporting progress), runs an in-process worker
until the demo queue is idle while a progress line counts finished jobs, and
prints how the jobs ended and how long they took.

Re-runs are repeatable: each run tags its jobs and reports on its own tag
only, and first cancels whatever an interrupted earlier run left waiting in
the demo queue (it would keep this run's worker from ever going idle). The
backend protocol has no way to delete jobs, so earlier runs' finished jobs
stay in the schema as history; the schema defaults to ``taskq_demo`` so they
never mix with an application's, and the demo touches no other schema.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Final, TextIO
from uuid import UUID, uuid4

from taskq.cli._exit_codes import EXIT_ERROR
from taskq.errors import ConfigurationError

if TYPE_CHECKING:
    from datetime import datetime

    from taskq.cli._commands import CommandRegistry
    from taskq.client import JobsClient
    from taskq.models import AttemptRow, JobFilter, JobRow, ScheduleRecord

DEFAULT_SCHEMA: Final = "taskq_demo"
DEFAULT_JOBS: Final = 300
MAX_JOBS: Final = 10_000
"""One page of ``list_jobs``: the demo reads its jobs back in a single call."""

# Short dispatch and maintenance intervals, so snoozed, retried and delayed
# jobs come due within the demo's seconds; the jobs are short, so heartbeats
# and leases keep their defaults. env={} below keeps the user's TASKQ_*
# variables from changing any of it.
_WORKER_SETTINGS: Final[dict[str, Any]] = {
    "concurrency": 16,
    "until_idle": True,
    "poll_interval": "200ms",
    "maintenance_interval": "100ms",
    "cron_interval": "200ms",  # its schedule's slots fire within the demo's seconds
    "termination_grace_period": "10s",
    # Fit within it (with the end's reserve), as the defaults (10 + 30 + 10 s) do not:
    # the demo's jobs are short, and a stop should not warn on every run.
    "drain_grace_period": "4s",
    "cancellation_grace_period": "2s",
    "cleanup_grace_period": "1s",
}


def _job_count(text: str) -> int:
    from taskq.demo import MIN_JOBS

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not MIN_JOBS <= value <= MAX_JOBS:
        raise argparse.ArgumentTypeError(f"must be between {MIN_JOBS} and {MAX_JOBS}, got {value}")
    return value


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        help="backend URL (default: $TASKQ_DSN, else the embedded PostgreSQL under ./.taskq/ "
        "when taskq-postgres[embedded] is installed); memory:// runs it all in this process",
    )
    parser.add_argument(
        "--schema",
        default=DEFAULT_SCHEMA,
        help=f"schema for the demo's jobs, migrated if needed (default: {DEFAULT_SCHEMA}; "
        f"TASKQ_SCHEMA is ignored so the demo never lands in an application's schema)",
    )
    parser.add_argument(
        "--jobs",
        type=_job_count,
        default=DEFAULT_JOBS,
        help=f"how many jobs, sub-jobs included (default: {DEFAULT_JOBS})",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


class _ProgressLine:
    """``done/total`` on stderr: redrawn in place on a terminal, else a plain line
    every few seconds (CI logs and pipes get no carriage returns)."""

    _WIDTH: Final = 30
    _PLAIN_EVERY_SECONDS: Final = 2.0

    def __init__(self, stream: TextIO, total: int) -> None:
        self._stream = stream
        self._total = total
        self._tty = stream.isatty()
        self._last_plain: float | None = None
        self._last_plain_done: int | None = None

    @property
    def interval(self) -> float:
        """How often to look at the jobs again."""
        return 0.1 if self._tty else 0.5

    def _text(self, done: int) -> str:
        filled = self._WIDTH * min(done, self._total) // self._total
        bar = "#" * filled + "." * (self._WIDTH - filled)
        return f"taskq demo: [{bar}] {done}/{self._total} jobs done"

    def show(self, done: int) -> None:
        """Report ``done`` finished jobs."""
        if self._tty:
            self._stream.write("\r" + self._text(done))
        else:
            now = time.monotonic()
            if self._last_plain is not None and now - self._last_plain < self._PLAIN_EVERY_SECONDS:
                return
            self._last_plain = now
            self._last_plain_done = done
            self._stream.write(self._text(done) + "\n")
        self._stream.flush()

    def finish(self, done: int) -> None:
        """The final count, ending the line; a plain line already showing it is not
        written again (a log would read the last count twice)."""
        if not self._tty and done == self._last_plain_done:
            return
        self._stream.write(("\r" if self._tty else "") + self._text(done) + "\n")
        self._stream.flush()


@dataclass(frozen=True)
class Summary:
    """How a demo run went: its jobs' final statuses and its timings (seconds)."""

    schema: str
    jobs: int
    statuses: dict[str, int]
    unfinished: int
    """Jobs not in a terminal status: the run was interrupted (Ctrl-C, SIGTERM)."""
    wall_seconds: float
    jobs_per_second: float
    """Finished jobs per second of wall time."""
    attempts: int
    run_seconds_median: float | None
    run_seconds_p95: float | None
    enqueue_to_start_seconds_median: float | None
    cron_fired: int = 0
    """Jobs the demo's every-second cron schedule fired and the worker ran (not counted
    in ``jobs``)."""

    def as_table(self) -> str:
        """The summary as aligned text for people."""
        lines = [f"taskq demo: {self.jobs} jobs in schema {self.schema}", "", "  status      jobs"]
        lines += [f"  {status:<10} {count:>5}" for status, count in self.statuses.items()]
        lines += [f"  {'total':<10} {self.jobs:>5}", ""]
        if self.unfinished:
            left = f"{self.unfinished} jobs left unfinished (the next run cancels them)"
            lines += [f"  interrupted: {left}", ""]
        lines.append(f"  {'wall time':<17} {_duration(self.wall_seconds)}")
        lines.append(f"  {'throughput':<17} {self.jobs_per_second:.1f} jobs/s")
        lines.append(
            f"  {'run time':<17} median {_duration(self.run_seconds_median)}, "
            f"p95 {_duration(self.run_seconds_p95)} (over {self.attempts} attempts)"
        )
        lines.append(
            f"  {'enqueue -> start':<17} median {_duration(self.enqueue_to_start_seconds_median)}"
        )
        lines.append(f"  {'cron schedule':<17} fired {self.cron_fired} (one job a second)")
        return "\n".join(lines)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _p95(values: list[float]) -> float | None:
    # Nearest rank: an observed value, never an interpolation between two.
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)]


def summarize(
    schema: str, rows: list[JobRow], attempts: list[AttemptRow], wall_seconds: float
) -> Summary:
    """Count ``rows`` by status (every terminal status listed, zero or not) and
    time the ``attempts``; queueing time runs from a job's creation to its first start."""
    from taskq.backend.statemachine import TERMINAL_STATUSES, JobStatus

    counts = {s.value: 0 for s in JobStatus if s in TERMINAL_STATUSES}
    for row in rows:
        counts[row.status.value] = counts.get(row.status.value, 0) + 1
    unfinished = sum(1 for row in rows if row.status not in TERMINAL_STATUSES)
    finished = len(rows) - unfinished
    run_times = [d.total_seconds() for a in attempts if (d := a.duration) is not None]
    first_start: dict[UUID, datetime] = {}
    for a in attempts:
        if a.started_at is not None:
            first_start[a.job_id] = min(a.started_at, first_start.get(a.job_id, a.started_at))
    waits = [
        (first_start[r.id] - r.created_at).total_seconds() for r in rows if r.id in first_start
    ]
    return Summary(
        schema=schema,
        jobs=len(rows),
        statuses=counts,
        unfinished=unfinished,
        wall_seconds=wall_seconds,
        jobs_per_second=finished / wall_seconds if wall_seconds > 0 else 0.0,
        attempts=len(attempts),
        run_seconds_median=statistics.median(run_times) if run_times else None,
        run_seconds_p95=_p95(run_times),
        enqueue_to_start_seconds_median=statistics.median(waits) if waits else None,
    )


async def _count_finished(client: JobsClient, run: JobFilter) -> int:
    return len(await client.list_jobs(run.model_copy(update={"active": False})))


async def _watch(client: JobsClient, run: JobFilter, progress: _ProgressLine) -> None:
    from taskq.worker._transient import transient_cause

    while True:
        try:
            done = await _count_finished(client, run)
        except Exception as exc:
            # A blip the worker rides out: it ended the whole demo (the progress line's
            # task failed its TaskGroup). The count is shown at the next look. Not a
            # transient type's error that a plugin calls the calling code's fault (a
            # statement on a busy connection): a bug, hidden at every look.
            if transient_cause(exc) is None:
                raise
        else:
            progress.show(done)
        await asyncio.sleep(progress.interval)


async def run_demo(dsn: str, schema: str, jobs: int, progress_stream: TextIO) -> Summary:
    """Enqueue the demo's ``jobs`` jobs in ``schema`` on ``dsn``, work them off, summarize."""
    from taskq.backend import JobStatus, SupportsMigrate
    from taskq.demo import BATCH_CHILDREN, DEMO_QUEUE, EVERY_SECOND, batch_plan, build_app, plan
    from taskq.demo import tick as tick_actor
    from taskq.models import BatchRow, JobFilter, ScheduleCreateArgs
    from taskq.settings import WorkerSettings
    from taskq.worker import Worker
    from taskq.worker.signal_handlers import install_signal_handlers

    app = build_app(dsn, schema=schema)
    if isinstance(app.backend, SupportsMigrate):
        await app.backend.migrate()
    settings = WorkerSettings.load({**_WORKER_SETTINGS, "queues": [DEMO_QUEUE]}, env={})
    tag = f"taskq-demo-run:{uuid4().hex[:12]}"
    run = JobFilter(tags=(tag,), limit=MAX_JOBS)
    async with app:
        client = app.client
        await client.cancel_where(
            JobFilter(queue=DEMO_QUEUE, active=True), reason="left over by an interrupted demo"
        )
        for stale in await client.list_schedules(actor=tick_actor.name):
            await client.delete_schedule(stale.id)  # an earlier run's, left by a crash
        rng = random.Random()
        items, to_cancel = plan(jobs, rng, tags=[tag])
        enqueued = await client.enqueue_batch(items)
        # A tracked batch: its finalizer waits until its children have all finished (or
        # two have failed in a row), and runs then.
        children, finalizer = batch_plan(app, rng, tags=[tag])
        batch_id = uuid4()
        await app.backend.enqueue_batch_atomic(
            children,
            batch_id=batch_id,
            queue=DEMO_QUEUE,
            batch_row=BatchRow(
                id=batch_id, queue=DEMO_QUEUE, expected_size=BATCH_CHILDREN, failure_threshold=2
            ),
            finalizer_args=finalizer,
        )
        for index in to_cancel:
            await client.cancel(enqueued[index].id, reason="cancelled by the demo while pending")

        # A cron schedule firing every second while the demo runs (the worker's leader
        # fires it); its jobs are tagged apart, as they are not part of the mix.
        fired = JobFilter(tags=(f"{tag}:cron",), limit=MAX_JOBS)
        schedule: ScheduleRecord | None = None
        try:
            schedule = await client.create_schedule(
                ScheduleCreateArgs(
                    name=f"taskq-demo-tick-{tag.rsplit(':', 1)[-1]}",
                    actor=tick_actor.name,
                    cron=EVERY_SECOND,
                    queue=DEMO_QUEUE,
                    options={"tags": list(fired.tags)},
                )
            )
            progress = _ProgressLine(progress_stream, jobs)
            worker = Worker(app, settings)
            # Ctrl-C stops the demo as it stops taskq-worker: jobs handed back, not left
            # locked for the next run to wait out.
            install_signal_handlers(worker, "taskq demo")
            started = time.monotonic()
            async with asyncio.TaskGroup() as group:
                watcher = group.create_task(_watch(client, run, progress))
                await worker.run()
                watcher.cancel()
        finally:
            if schedule is not None:
                await _delete_schedule(client, schedule)
        wall_seconds = time.monotonic() - started
        progress.finish(await _count_finished(client, run))
        # A slot that fired as the worker went idle waits for no one: cancelled.
        await client.cancel_where(JobFilter(tags=fired.tags, active=True), reason="demo over")

        rows = await client.list_jobs(run)
        attempts = [a for row in rows for a in await client.get_attempts(row.id)]
        ticks = await client.list_jobs(fired)
    summary = summarize(schema, rows, attempts, wall_seconds)
    cron_fired = sum(row.status is JobStatus.SUCCEEDED for row in ticks)
    return replace(summary, cron_fired=cron_fired)


async def _delete_schedule(client: JobsClient, schedule: ScheduleRecord) -> None:
    """The run's schedule gone; one left (the database away) is said, not raised over
    the error that ended the run, and the next run deletes it."""
    try:
        await client.delete_schedule(schedule.id)
    except Exception as exc:  # noqa: BLE001 - cleanup: the run's own outcome comes first
        print(
            f"taskq demo: could not delete its schedule {schedule.name!r} ({exc!r}); the next "
            f"run deletes it, or: taskq schedules delete {schedule.id}",
            file=sys.stderr,
        )


def _quiet_logs() -> None:
    # The worker logs every failed attempt at INFO; the demo fails dozens on
    # purpose, and those lines would bury the progress line and the summary.
    # Warnings and errors still show.
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def _run(args: argparse.Namespace) -> int:
    from taskq._dsn import resolve_dsn
    from taskq.identifiers import validate_schema_name

    try:
        schema = validate_schema_name(args.schema)
    except ValueError as exc:
        raise ConfigurationError(f"--schema: {exc}") from None
    try:
        dsn = resolve_dsn(args.dsn)
    except KeyboardInterrupt:
        # The embedded server starting (the plugin's default DSN): no job enqueued yet.
        print("taskq demo: interrupted before its worker started", file=sys.stderr)
        return EXIT_ERROR
    except ConfigurationError as exc:
        # The demo alone needs no server: say so where it is the quickest way on.
        raise ConfigurationError(
            f"{exc}; or --dsn memory:// to run the demo in this process"
        ) from None
    _quiet_logs()
    # Not in the commands' default schema: `taskq jobs list` alone finds none.
    listed = f"taskq jobs list --schema {schema}" + (" --dsn ..." if args.dsn else "")
    try:
        summary = asyncio.run(run_demo(dsn, schema, args.jobs, sys.stderr))
    except KeyboardInterrupt:
        # Ctrl-C before the worker's own handlers: said for the demo, not as the
        # generic `taskq jobs list` hint (the demo's schema is not the default one).
        left = (
            ""
            if dsn.startswith("memory:")
            else f"; the jobs it enqueued wait until the next run cancels them ({listed} shows them)"
        )
        print(f"taskq demo: interrupted before its worker started{left}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(asdict(summary), indent=2))
    else:
        print(summary.as_table())
        if not dsn.startswith("memory:"):
            print(f"\n  the jobs stay: {listed}")
    return EXIT_ERROR if summary.unfinished else 0


def register(cli: CommandRegistry) -> None:
    """Add ``taskq demo`` to the ``taskq`` command."""
    cli.add(
        "demo",
        help="run a worker on a few hundred demonstration jobs and summarize how they ended "
        "(embedded PostgreSQL when no DSN is given)",
        configure=_configure,
        run=_run,
    )
