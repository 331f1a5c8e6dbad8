"""Cancellation, shutdown and the watchdogs, with real worker processes on Postgres."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from taskq import JobStatus, TaskQ, WorkerSettings
from taskq.settings import SettingsError
from taskq_testing.postgres import PgSchema
from tests.apps import basic, hung_teardown, slow_provider

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FAST = {
    "TASKQ_POLL_INTERVAL": "100ms",
    "TASKQ_HEARTBEAT_INTERVAL": "100ms",
    "TASKQ_LOCK_LEASE": "3s",
    "TASKQ_MAINTENANCE_INTERVAL": "100ms",
    "TASKQ_CANCELLATION_GRACE_PERIOD": "500ms",
    "TASKQ_CLEANUP_GRACE_PERIOD": "500ms",
    "TASKQ_DRAIN_GRACE_PERIOD": "300ms",
    "TASKQ_TERMINATION_GRACE_PERIOD": "15s",
}


@contextmanager
def worker(
    pg: PgSchema,
    *args: str,
    app: str = "tests.apps.basic:tq",
    log: Path | None = None,
    stdout_closed: bool = False,
    **env: str,
) -> Iterator[subprocess.Popen[str]]:
    """The worker process; its log (JSON lines, on stderr) goes to ``log`` when given,
    else to ``proc.stderr``. ``stdout_closed``: started with no stdout at all (``>&-``)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    closing = ["sh", "-c", 'exec "$0" "$@" >&-'] if stdout_closed else []
    with open(log or os.devnull, "w") as out:
        proc = subprocess.Popen(
            [*closing, str(BIN / "taskq-worker"), app, *args],
            cwd=REPO,
            env={**base, **FAST, "TASKQ_DSN": pg.dsn, "TASKQ_SCHEMA": pg.name, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE if log is None else out,
            text=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


@pytest.fixture
async def tq(pg_schema: PgSchema) -> AsyncIterator[TaskQ]:
    app = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=basic.tq.actors.values())
    async with app:
        yield app


async def _until_status(tq: TaskQ, job_id: Any, *statuses: JobStatus, seconds: float = 20) -> Any:
    async with asyncio.timeout(seconds):
        while True:
            row = await tq.client.get(job_id)
            if row is not None and row.status in statuses:
                return row
            await asyncio.sleep(0.05)


async def _until_started(*signals: Path, seconds: float = 20) -> None:
    """Until each actor has created its ``started`` file (its body runs): a job's row
    says running from its dispatch, before the worker has even read the reply."""
    async with asyncio.timeout(seconds):
        while not all(path.exists() for path in signals):  # noqa: ASYNC110 - the actors' files
            await asyncio.sleep(0.02)


async def _events(tq: TaskQ, job_id: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(e.kind, e.detail) for e in await tq.client.get_events(job_id)]


async def test_cooperative_forced_and_abandoned_cancellation(
    tq: TaskQ, pg_schema: PgSchema, tmp_path: Path
) -> None:
    signals = [tmp_path / f"{name}.started" for name in ("polite", "stubborn", "swallower")]
    polite = await tq.client.enqueue(basic.cooperative, {"seconds": 30, "started": str(signals[0])})
    stubborn = await tq.client.enqueue(basic.stubborn, {"seconds": 30, "started": str(signals[1])})
    swallower = await tq.client.enqueue(
        basic.swallower, {"seconds": 30, "started": str(signals[2])}
    )
    with worker(pg_schema, "--concurrency", "4") as proc:
        # The actors are inside their bodies (a cancel seen before its actor started
        # ends the job cancelled unstarted: no escalation, nothing abandoned).
        await _until_started(*signals)
        for job in (polite, stubborn, swallower):
            assert await tq.client.cancel(job.id, reason="test")

        done = await _until_status(tq, polite.id, JobStatus.CANCELLED)
        assert done.cancel_phase == 1  # honoured cooperatively: never forced
        kinds = [k for k, _ in await _events(tq, polite.id)]
        assert "cancel_requested" in kinds and "cancel_escalated" not in kinds

        forced = await _until_status(tq, stubborn.id, JobStatus.CANCELLED)
        assert forced.cancel_phase == 2
        events = await tq.client.get_events(stubborn.id)
        escalated = next(e for e in events if e.kind == "cancel_escalated")
        ended = next(e for e in events if e.detail.get("to_state") == "cancelled")
        assert escalated.event_id < ended.event_id  # phase 2 stored before the task stopped

        abandoned = await _until_status(tq, swallower.id, JobStatus.ABANDONED)
        assert abandoned.cancel_phase == 2
        assert [a.outcome for a in await tq.client.get_attempts(swallower.id)] == ["abandoned"]
        assert proc.poll() is None  # the worker itself carries on
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0  # the abandoned task cannot hold the exit


async def test_sigterm_hands_running_and_unstarted_jobs_back(
    tq: TaskQ, pg_schema: PgSchema, tmp_path: Path
) -> None:
    signals = [tmp_path / f"{i}.started" for i in range(25)]
    jobs = [
        await tq.client.enqueue(basic.cooperative, {"seconds": 60, "started": str(path)})
        for path in signals
    ]
    with worker(pg_schema, "--concurrency", "20", TASKQ_PREFETCH="5") as proc:
        async with asyncio.timeout(20):
            while len(await tq.client.list_jobs(status="running")) < 25:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            # Twenty in their bodies (a fixed 0.5 s could leave some still to start:
            # handed back unstarted too), five prefetched behind them.
            while sum(path.exists() for path in signals) < 20:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - started < 15  # within termination_grace_period
    rows = [await tq.client.get(j.id) for j in jobs]
    assert Counter(r.status for r in rows if r) == {JobStatus.PENDING: 25}
    ended = Counter[object]()
    outcomes = Counter[str]()
    for row in rows:
        assert row is not None and row.max_attempts == 3 + 1  # the retry budget is untouched
        [attempt] = await tq.client.get_attempts(row.id)
        outcomes[attempt.outcome] += 1
        if attempt.outcome == "unstarted":
            assert attempt.duration is None  # held, never run
            ended[attempt.finished_at] += 1
    # The 5 prefetched jobs went back in one statement (one clock reading), as never
    # started; the 20 running ones stopped, one by one.
    assert outcomes == {"interrupted": 20, "unstarted": 5}
    assert list(ended.values()) == [5]


async def test_a_shutdown_forces_a_users_cancel_as_the_protocol_does(
    tq: TaskQ, pg_schema: PgSchema, tmp_path: Path
) -> None:
    # The cancels are seen (phase 1) but their grace is long: the shutdown, hurried by a
    # second signal, is what forces them. Phase 2 is stored before each task is
    # cancelled, and a task that ignores it is marked abandoned, not left running.
    signals = [tmp_path / "stubborn.started", tmp_path / "swallower.started"]
    stubborn = await tq.client.enqueue(basic.stubborn, {"seconds": 60, "started": str(signals[0])})
    swallower = await tq.client.enqueue(
        basic.swallower, {"seconds": 60, "started": str(signals[1])}
    )
    log = tmp_path / "worker.log"
    with worker(
        pg_schema,
        "--concurrency",
        "2",
        log=log,
        TASKQ_CANCELLATION_GRACE_PERIOD="60s",
        TASKQ_TERMINATION_GRACE_PERIOD="30s",
    ) as proc:
        await _until_started(*signals)
        for job in (stubborn, swallower):
            assert await tq.client.cancel(job.id, reason="test")
        async with asyncio.timeout(20):  # a heartbeat or a cancel wake: both observed
            while log.read_text().count('"taskq.cancel-observed"') < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    forced = await tq.client.get(stubborn.id)
    assert forced is not None and forced.status is JobStatus.CANCELLED
    assert forced.cancel_phase == 2
    abandoned = await tq.client.get(swallower.id)
    assert abandoned is not None and abandoned.status is JobStatus.ABANDONED
    for job in (stubborn, swallower):
        kinds = [k for k, _ in await _events(tq, job.id)]
        assert "cancel_escalated" in kinds, kinds


async def test_a_third_sigint_exits_at_once(tq: TaskQ, pg_schema: PgSchema) -> None:
    # Ctrl-C three times: a stop stuck in a teardown is not waited for (its watchdog
    # would take the whole termination grace, a minute here).
    producer = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=hung_teardown.tq.actors.values())
    async with producer:
        job = await producer.client.enqueue(hung_teardown.uses_client, {})
    with worker(
        pg_schema, app="tests.apps.hung_teardown:tq", TASKQ_TERMINATION_GRACE_PERIOD="60s"
    ) as proc:
        await _until_status(tq, job.id, JobStatus.SUCCEEDED)  # the provider is open
        for _ in range(2):
            proc.send_signal(signal.SIGINT)
            await asyncio.sleep(0.5)
        assert proc.poll() is None  # stopping, held by the teardown
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert "taskq-worker: third signal, exiting at once" in stderr


async def test_a_second_sigterm_skips_the_drain_wait(
    tq: TaskQ, pg_schema: PgSchema, tmp_path: Path
) -> None:
    signal_file = tmp_path / "stubborn.started"
    job = await tq.client.enqueue(basic.stubborn, {"seconds": 60, "started": str(signal_file)})
    with worker(
        pg_schema,
        TASKQ_DRAIN_GRACE_PERIOD="30s",
        TASKQ_CANCELLATION_GRACE_PERIOD="30s",
        TASKQ_TERMINATION_GRACE_PERIOD="90s",
    ) as proc:
        await _until_started(signal_file)  # a drain to wait for
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert time.monotonic() - started < 5  # not the 30 s drain nor the 30 s cancel wait
    row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.PENDING


async def test_a_drain_longer_than_the_stale_tick_budget_ends_cleanly(
    tq: TaskQ, pg_schema: PgSchema
) -> None:
    # The producer stops at the signal; the drain then waits ~2.5 s for the job, past
    # the 1 s budget a loop may go without ticking. A stopped loop is not a stuck one.
    job = await tq.client.enqueue(basic.nap, {"seconds": 3})
    with worker(
        pg_schema,
        TASKQ_DRAIN_GRACE_PERIOD="10s",
        TASKQ_WATCHDOG_STALE_FLOOR="1s",
        TASKQ_WATCHDOG_CHECK_INTERVAL="100ms",
        TASKQ_DISPATCHER_COMMAND_TIMEOUT="500ms",
    ) as proc:
        await _until_status(tq, job.id, JobStatus.RUNNING)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr[-2000:]
    row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.SUCCEEDED


async def test_a_blocked_event_loop_trips_the_loop_lag_watchdog(
    tq: TaskQ, pg_schema: PgSchema
) -> None:
    await tq.client.enqueue(basic.blocker, {"seconds": 60})
    with worker(
        pg_schema,
        TASKQ_WATCHDOG_LOOP_LAG_BUDGET="1s",
        TASKQ_WATCHDOG_LOOP_LAG_STARTUP_GRACE="0.2s",
        TASKQ_WATCHDOG_CHECK_INTERVAL="200ms",
    ) as proc:
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert '"detector": "loop-lag"' in stderr
    assert "in blocker" in stderr  # the faulthandler dump names the actor


async def test_a_provider_slower_than_the_loop_lag_budget_is_created_before_it_arms(
    pg_schema: PgSchema,
) -> None:
    # Created by the job that first needed it, the sync provider blocked the loop past
    # the budget with the watchdog armed: exit 2 at each start, a crash loop.
    producer = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=slow_provider.tq.actors.values())
    async with producer:
        job = await producer.client.enqueue(slow_provider.infer, {})
        with worker(
            pg_schema,
            "--until-idle",
            app="tests.apps.slow_provider:tq",
            SLOW_PROVIDER_SECONDS="2.5",
            TASKQ_WATCHDOG_LOOP_LAG_BUDGET="1s",
            TASKQ_WATCHDOG_LOOP_LAG_STARTUP_GRACE="0.2s",
            TASKQ_WATCHDOG_CHECK_INTERVAL="100ms",
        ) as proc:
            _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr[-2000:]
        assert await producer.client.wait_for_result(job.id, timeout=0) == {"load": 1, "loads": 1}
    assert "taskq.di-bootstrapped" in stderr


async def test_a_provider_that_fails_at_start_stops_the_worker_with_one_line(
    pg_schema: PgSchema,
) -> None:
    producer = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=slow_provider.tq.actors.values())
    async with producer:
        job = await producer.client.enqueue(slow_provider.infer, {})
        with worker(
            pg_schema, "--until-idle", app="tests.apps.slow_provider:tq", SLOW_PROVIDER_FAILS="1"
        ) as proc:
            _, stderr = proc.communicate(timeout=60)
        row = await producer.client.get(job.id)
    assert proc.returncode == 1, stderr[-2000:]
    errors = [line for line in stderr.splitlines() if line.startswith("taskq-worker: error:")]
    assert errors == [
        (
            "taskq-worker: error: the worker cannot start: the LOOP-scoped provider of Model "
            "(load_model), needed by actor 'infer', raised PermissionError: the model store "
            "refused the credentials. Fix the provider or its configuration; no job was taken."
        )
    ]
    assert "Traceback" not in stderr
    assert row is not None and row.status is JobStatus.PENDING and row.attempt == 0


async def test_a_teardown_that_hangs_trips_the_shutdown_watchdog(
    tq: TaskQ, pg_schema: PgSchema
) -> None:
    producer = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=hung_teardown.tq.actors.values())
    async with producer:
        job = await producer.client.enqueue(hung_teardown.uses_client, {})
    with worker(
        pg_schema, app="tests.apps.hung_teardown:tq", TASKQ_TERMINATION_GRACE_PERIOD="2s"
    ) as proc:
        await _until_status(tq, job.id, JobStatus.SUCCEEDED)  # the provider is open
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert '"detector": "shutdown-deadline"' in stderr
    assert time.monotonic() - started < 10
    # the back half of the budget logged what the shutdown was waiting for: the
    # provider's own task, which exits it
    stragglers = [ln for ln in stderr.splitlines() if "task-stack [shutdown-straggler]" in ln]
    assert any("taskq-provider-Client _hold at" in ln and "lifecycle.py" in ln for ln in stragglers)


async def test_an_until_idle_worker_whose_teardown_hangs_trips_the_shutdown_watchdog(
    tq: TaskQ, pg_schema: PgSchema
) -> None:
    # Only a signal armed the watchdog: idle, the worker hung in its teardown for ever.
    producer = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=hung_teardown.tq.actors.values())
    async with producer:
        await producer.client.enqueue(hung_teardown.uses_client, {})
    started = time.monotonic()
    with worker(
        pg_schema,
        "--until-idle",
        app="tests.apps.hung_teardown:tq",
        TASKQ_TERMINATION_GRACE_PERIOD="2s",
    ) as proc:
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert '"detector": "shutdown-deadline"' in stderr
    assert time.monotonic() - started < 20


async def test_graces_longer_than_the_termination_grace_are_cut_to_hand_the_job_back(
    tq: TaskQ, pg_schema: PgSchema, tmp_path: Path
) -> None:
    # 2 + 5 + 2 s of graces in a 3 s wall: the watchdog ended the stop (exit 2) with the
    # job still locked, and the reclaim then spent one of its attempts (crashed).
    signal_file = tmp_path / "stubborn.started"
    job = await tq.client.enqueue(basic.stubborn, {"seconds": 60, "started": str(signal_file)})
    graces: dict[str, Any] = {
        "TASKQ_DRAIN_GRACE_PERIOD": "2s",
        "TASKQ_CANCELLATION_GRACE_PERIOD": "5s",
        "TASKQ_CLEANUP_GRACE_PERIOD": "2s",
        "TASKQ_TERMINATION_GRACE_PERIOD": "3s",
    }
    with worker(pg_schema, **graces) as proc:
        # Started, so interrupted (signalled at its dispatch, it was handed back unstarted)
        await _until_started(signal_file)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr[-2000:]
    assert "taskq.stop-graces-shortened" in stderr
    row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.PENDING
    assert [a.outcome for a in await tq.client.get_attempts(job.id)] == ["interrupted"]


@pytest.mark.parametrize(
    ("actor", "queues"),
    [(basic.nap_sync, "other"), (basic.nap_to_thread, "default")],
    ids=["sync-actor", "async-actor-to-thread"],
)
async def test_a_call_still_in_its_thread_does_not_hold_the_exit(
    tq: TaskQ, pg_schema: PgSchema, actor: Any, queues: str, tmp_path: Path
) -> None:
    # Nothing can cancel a thread: the job is handed back (or abandoned) at the stop,
    # and a process lingering until the call returns could run it alongside its next
    # run. A sync actor's thread, or the loop's default executor an async actor's
    # asyncio.to_thread runs in (its exit waited 43 s past a 6 s wall).
    signal_file = tmp_path / "in-its-thread.started"
    await tq.client.enqueue(actor, {"seconds": 30, "started": str(signal_file)})
    with worker(pg_schema, "--queues", queues) as proc:
        await _until_started(signal_file)  # in its thread
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=40)
    assert proc.returncode == 0, stderr[-3000:]
    assert time.monotonic() - started < 10
    assert "1 sync actor or thread call(s) still running" in stderr


async def test_a_call_still_in_its_thread_does_not_hold_the_exit_with_stderr_gone(
    tq: TaskQ, pg_schema: PgSchema, tmp_path: Path
) -> None:
    # With stderr gone (a log shipper's pipe closed), the line saying what was left
    # running raised BrokenPipeError before os._exit: the exit waited for the thread.
    signal_file = tmp_path / "in-its-thread.started"
    await tq.client.enqueue(basic.nap_sync, {"seconds": 30, "started": str(signal_file)})
    with worker(pg_schema, "--queues", "other") as proc:
        await _until_started(signal_file)  # in its thread
        assert proc.stderr is not None
        proc.stderr.close()
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 40)
    assert proc.returncode == 0
    assert time.monotonic() - started < 10


async def test_a_call_still_in_its_thread_does_not_hold_the_exit_with_stdout_closed(
    tq: TaskQ, pg_schema: PgSchema, tmp_path: Path
) -> None:
    # Started with stdout closed (`>&-`: Python's sys.stdout is None), the flush before
    # os._exit raised AttributeError: the exit waited for the thread, then failed.
    signal_file = tmp_path / "in-its-thread.started"
    await tq.client.enqueue(basic.nap_sync, {"seconds": 30, "started": str(signal_file)})
    with worker(pg_schema, "--queues", "other", stdout_closed=True) as proc:
        await _until_started(signal_file)  # in its thread
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=40)
    # It ended when the thread did, with the AttributeError's traceback: exit 1.
    assert proc.returncode == 0, stderr[-3000:]
    assert "1 sync actor or thread call(s) still running" in stderr


async def test_sigusr2_dumps_task_stacks_and_the_worker_keeps_running(
    tq: TaskQ, pg_schema: PgSchema
) -> None:
    with worker(pg_schema) as proc:
        first = await tq.client.enqueue(basic.nap, {})
        await tq.client.wait_for_result(first.id, timeout=20)
        proc.send_signal(signal.SIGUSR2)
        second = await tq.client.enqueue(basic.nap, {})
        assert await tq.client.wait_for_result(second.id, timeout=20) is not None
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    dumps = [line for line in stderr.splitlines() if line.startswith("taskq task-stack [sigusr2]")]
    assert any("taskq-producer" in line for line in dumps)
    assert any("taskq-heartbeat" in line for line in dumps)


def test_a_loop_lag_budget_at_or_above_the_lease_is_refused() -> None:
    with pytest.raises(SettingsError, match="watchdog_loop_lag_budget"):
        WorkerSettings.load({"lock_lease": "30s", "watchdog_loop_lag_budget": "30s"}, env={})
    settings = WorkerSettings.load({"lock_lease": "30s", "watchdog_loop_lag_budget": "29s"}, env={})
    assert settings.loop_lag_budget.total_seconds() == 29
    relaxed = WorkerSettings.load({"lock_lease": "8s", "heartbeat_interval": "2s"}, env={})
    assert relaxed.loop_lag_budget.total_seconds() == 4


async def test_a_stop_that_cannot_hand_jobs_back_exits_1_saying_so(
    tq: TaskQ, pg_schema: PgSchema
) -> None:
    # A SIGTERM with the database away: the hand-backs fail, the jobs stay locked for the
    # reclaim (an attempt each). The worker exited 0, as after a clean stop.
    from urllib.parse import urlsplit

    from taskq_testing.faults import TcpProxy

    jobs = [await tq.client.enqueue(basic.cooperative, {"seconds": 60}) for _ in range(3)]
    with TcpProxy(urlsplit(pg_schema.dsn).port or 5432) as proxy:
        dsn = proxy.through(pg_schema.dsn)
        with worker(
            pg_schema,
            "--concurrency",
            "4",
            TASKQ_DSN=dsn,
            TASKQ_DISPATCHER_COMMAND_TIMEOUT="500ms",
            TASKQ_TERMINATION_GRACE_PERIOD="6s",
        ) as proc:
            async with asyncio.timeout(20):
                while len(await tq.client.list_jobs(status="running")) < 3:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            proxy.cut()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 1
            stderr = proc.stderr.read() if proc.stderr else ""
    [summary] = [line for line in stderr.splitlines() if "stop-left-jobs-unconfirmed" in line]
    assert json.loads(summary)["jobs"] == 3, stderr
    # The loops that failed every 100 ms through the outage said so once each (a line
    # per try: dozens of each in these seconds, hundreds a minute in production).
    events = Counter(
        json.loads(line).get("event") for line in stderr.splitlines() if "{" in line[:1]
    )
    for loop in ("heartbeat", "leader-election", "worker-touch"):
        assert events[f"taskq.{loop}-transient-error"] <= 1, events
    for job in jobs:  # still locked: nothing was written
        row = await tq.client.get(job.id)
        assert row is not None and row.status is JobStatus.RUNNING


@pytest.mark.parametrize("first", ["stop", "controller"])
async def test_an_abandonment_landed_with_its_reply_lost_counts_for_its_batch_once(
    first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cancel controller's abandonment landed as the tick's bound cut it (its reply
    # lost), so it stayed queued. Whichever of the stop and the controller then found it
    # written (its own write refused, the attempt already "abandoned") applied the
    # batch hook as its own end, without marking the attempt ended: the other, refused
    # in turn, found it so too and applied it again (a batch's failure counted twice).
    from taskq.backend.memory import InMemoryBackend
    from taskq.worker import cancel, shutdown
    from tests.worker.controller_state import dispatched, forced_past_cleanup, worker_state

    hooks: list[str] = []

    async def hook(backend: Any, row: Any, outcome: str) -> None:
        hooks.append(outcome)

    monkeypatch.setattr(cancel, "apply_batch_terminal_outcome", hook)
    monkeypatch.setattr(shutdown, "apply_batch_terminal_outcome", hook)

    class ReplyLost(InMemoryBackend):
        calls = 0

        async def mark_abandoned(self, *args: Any, **kwargs: Any) -> bool:
            ReplyLost.calls += 1
            landed = await super().mark_abandoned(*args, **kwargs)
            if ReplyLost.calls == 1:
                await asyncio.sleep(3600)  # written; the tick's bound cuts the reply
            return landed

    backend = ReplyLost()
    await backend.open()
    worker, [job] = await dispatched(backend)
    active = await forced_past_cleanup(backend, worker, job)
    state = worker_state(backend, worker, active)
    controller = state.cancel
    try:
        await controller.run_tick([])  # past its cleanup grace: queued for abandonment
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await controller.run_post_tick()
        if first == "controller":
            await controller.run_post_tick()
            await controller.write_late_outcomes()
            await shutdown._mark_abandoned(state, active, True)
        else:
            await shutdown._mark_abandoned(state, active, True)
            await controller.run_post_tick()
            await controller.write_late_outcomes()
    finally:
        assert active.task is not None  # started by forced_past_cleanup
        active.task.cancel()
    assert hooks == ["abandoned"]
