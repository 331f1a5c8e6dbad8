"""InMemoryBackend behaviour that is specific to the in-memory backend.

The contract itself is checked by ``taskq_testing.conformance``; this file
covers construction, the injected clock, the import-time protocol check and
the decisions the contract leaves to each backend.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import ClassVar
from uuid import uuid4

import pytest
import pytest_asyncio

import taskq.backend._protocol as protocol
from taskq.backend import Backend, FakeClock, SystemClock, check_protocol_version
from taskq.backend import memory as memory_module
from taskq.backend.memory import InMemoryBackend
from taskq.errors import ConfigurationError, ProtocolVersionMismatch, SingletonCollisionError
from taskq.models import (
    ActorConfig,
    EnqueueArgs,
    JobStatus,
    QueueConfig,
    ScheduleCreateArgs,
    ScheduleUpdateArgs,
)

START = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest_asyncio.fixture
async def backend(clock: FakeClock) -> AsyncIterator[InMemoryBackend]:
    backend = InMemoryBackend(clock=clock)
    await backend.open()
    yield backend
    await backend.close()


# -- construction ----------------------------------------------------------------


def test_satisfies_the_backend_protocol_structurally() -> None:
    assert isinstance(InMemoryBackend(), Backend)
    assert Backend not in InMemoryBackend.__mro__
    assert InMemoryBackend.supports_transactional_simulation is True


async def test_an_unopened_backend_refuses_calls_as_postgres_does() -> None:
    # It answered before open(), where a Postgres backend raises: a program that forgot
    # open() passed its tests on memory:// and failed in production.
    backend = InMemoryBackend()
    message = r"^InMemoryBackend is not open: await backend\.open\(\) first \(TaskQ opens"
    with pytest.raises(ConfigurationError, match=message):
        await backend.enqueue(EnqueueArgs(actor="a"))
    with pytest.raises(ConfigurationError, match=message):
        await backend.dispatch_batch(uuid4(), ["default"], 1, timedelta(seconds=30))
    await backend.open()
    await backend.open()  # idempotent
    job = await backend.enqueue(EnqueueArgs(actor="a"))
    assert await backend.get(job.id) == job


def test_defaults() -> None:
    backend = InMemoryBackend()
    assert isinstance(backend.clock, SystemClock)
    assert backend.reclaim_event_visibility_delay == timedelta(seconds=2)
    assert backend.cancel_reclaim_headroom == timedelta(seconds=60)


@pytest.mark.parametrize("url", ["memory://", "memory://anything", "memory://test/db?x=1"])
def test_from_url_accepts_memory_urls(url: str, clock: FakeClock) -> None:
    backend = InMemoryBackend.from_url(url, clock=clock, cancel_reclaim_headroom=timedelta(0))
    assert isinstance(backend, InMemoryBackend)
    assert backend.clock is clock
    assert backend.cancel_reclaim_headroom == timedelta(0)


@pytest.mark.parametrize("url", ["postgresql://localhost/app", "memor://", "localhost", ""])
def test_from_url_refuses_other_schemes(url: str) -> None:
    with pytest.raises(ValueError, match="memory://"):
        InMemoryBackend.from_url(url)


def test_from_url_ignores_schema_and_refuses_unknown_options() -> None:
    # One application definition passes a schema to whatever backend it opens.
    assert isinstance(InMemoryBackend.from_url("memory://", schema="app"), InMemoryBackend)
    with pytest.raises(TypeError):
        InMemoryBackend.from_url("memory://", pool_size=3)


def test_from_url_takes_every_worker_backend_setting() -> None:
    # A fleet's TASKQ_* backend settings reach every application built from a URL: one
    # meant for Postgres must not break an application on memory://.
    from taskq.settings import BACKEND_TUNABLES, WorkerSettings

    env = {
        "TASKQ_DISPATCHER_COMMAND_TIMEOUT": "3s",
        "TASKQ_DISPATCH_OVERSAMPLE": "3",
        "TASKQ_RECLAIM_EVENT_VISIBILITY_DELAY": "1s",
        "TASKQ_CANCEL_RECLAIM_HEADROOM": "5s",
        "TASKQ_WAKE_COALESCE_WINDOW": "1ms",
        "TASKQ_POLL_ONLY": "true",
        "TASKQ_DIRECT_DSN": "postgresql://db/app",
        "TASKQ_STALE_BATCH_GRACE": "2s",
        "TASKQ_MIN_POOL_SIZE": "2",
        "TASKQ_MAX_POOL_SIZE": "4",
    }
    options = WorkerSettings.backend_options_from_env(env)
    assert sorted(options) == sorted(BACKEND_TUNABLES.values())  # every one, set
    backend = InMemoryBackend.from_url("memory://", **options)
    assert backend.reclaim_event_visibility_delay == timedelta(seconds=1)
    assert backend.stale_batch_grace == timedelta(seconds=2)


# -- the protocol version, checked at import ---------------------------------------


def test_declares_the_core_protocol_version() -> None:
    assert InMemoryBackend.BACKEND_PROTOCOL_VERSION == protocol.BACKEND_PROTOCOL_VERSION == 3


def test_check_protocol_version_refuses_an_older_backend() -> None:
    class OldBackend:
        BACKEND_PROTOCOL_VERSION: ClassVar[int] = 2

    with pytest.raises(ProtocolVersionMismatch, match="implements backend protocol 2"):
        check_protocol_version(OldBackend)


def test_importing_memory_against_another_core_protocol_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Run memory.py's source again as a fresh module while core claims another
    # protocol version: the module-level check must refuse to import.
    monkeypatch.setattr(protocol, "BACKEND_PROTOCOL_VERSION", protocol.BACKEND_PROTOCOL_VERSION + 1)
    spec = importlib.util.spec_from_file_location(
        "taskq.backend._memory_reimported", memory_module.__file__
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with pytest.raises(ProtocolVersionMismatch, match="protocol 3.*speaks protocol 4"):
        spec.loader.exec_module(module)


def test_importing_memory_against_the_same_core_protocol_succeeds() -> None:
    spec = importlib.util.spec_from_file_location(
        "taskq.backend._memory_reimported", memory_module.__file__
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.InMemoryBackend.BACKEND_PROTOCOL_VERSION == 3


# -- the injected clock --------------------------------------------------------------


async def test_times_come_from_the_injected_clock(
    backend: InMemoryBackend, clock: FakeClock
) -> None:
    clock.advance(timedelta(minutes=5))
    job = await backend.enqueue(
        EnqueueArgs(actor="a", delay=timedelta(seconds=30), schedule_to_close=timedelta(hours=1))
    )
    assert job.created_at == START + timedelta(minutes=5)
    assert job.scheduled_at == START + timedelta(minutes=5, seconds=30)
    assert job.deadline_at == START + timedelta(hours=1, minutes=5)


async def test_advancing_the_fake_clock_makes_scheduled_jobs_due(
    backend: InMemoryBackend, clock: FakeClock
) -> None:
    job = await backend.enqueue(EnqueueArgs(actor="a", delay=timedelta(seconds=10)))
    assert job.status is JobStatus.SCHEDULED
    assert await backend.scheduled_to_pending() == 0
    assert await backend.dispatch_batch(uuid4(), ["default"], 10, timedelta(seconds=30)) == []

    clock.advance(9.999)
    assert await backend.scheduled_to_pending() == 0
    clock.advance(0.001)
    assert await backend.scheduled_to_pending() == 1

    promoted = await backend.get(job.id)
    assert promoted is not None
    assert promoted.status is JobStatus.PENDING
    dispatched = await backend.dispatch_batch(uuid4(), ["default"], 10, timedelta(seconds=30))
    assert [row.id for row in dispatched] == [job.id]
    assert dispatched[0].started_at == clock.now()


async def test_a_lease_expires_only_by_the_injected_clock(
    backend: InMemoryBackend, clock: FakeClock
) -> None:
    await backend.enqueue(EnqueueArgs(actor="a"))
    assert await backend.dispatch_batch(uuid4(), ["default"], 1, timedelta(seconds=30))
    clock.advance(30)
    assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 0  # not yet "<"
    clock.advance(0.001)
    assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 1


async def test_schedule_next_fire_uses_the_clock_and_timezone(
    backend: InMemoryBackend, clock: FakeClock
) -> None:
    schedule = await backend.create_schedule(
        ScheduleCreateArgs(name="nine", actor="a", cron="0 9 * * *", timezone="America/New_York")
    )
    # 09:00 in New York on 2030-01-01 is 14:00 UTC (EST, UTC-5).
    assert schedule.next_fire_at == datetime(2030, 1, 1, 14, tzinfo=UTC)
    assert schedule.created_at == schedule.updated_at == START

    clock.advance(timedelta(hours=1))
    seconds = await backend.update_schedule(schedule.id, ScheduleUpdateArgs(cron="* * * * * */15"))
    # The sixth field is seconds: the first quarter-minute strictly after now.
    assert seconds.next_fire_at == START + timedelta(hours=1, seconds=15)
    assert seconds.updated_at == START + timedelta(hours=1)


# -- options of this backend ------------------------------------------------------------


async def test_visibility_delay_and_headroom_are_constructor_options(clock: FakeClock) -> None:
    backend = InMemoryBackend(
        clock=clock,
        reclaim_event_visibility_delay=timedelta(seconds=10),
        cancel_reclaim_headroom=timedelta(seconds=5),
    )
    await backend.open()
    await backend.enqueue(EnqueueArgs(actor="a"))
    (job,) = await backend.dispatch_batch(uuid4(), ["default"], 1, timedelta(seconds=1))
    await backend.write_cancel_request(job.id, "stop")

    clock.advance(timedelta(seconds=1, milliseconds=1))  # lease expired, cancel in progress
    assert await backend.reclaim_expired_locks(timedelta(seconds=1), timedelta(seconds=1)) == 0
    clock.advance(timedelta(seconds=7))  # expiry + 1 s + 1 s + 5 s headroom has passed
    assert await backend.reclaim_expired_locks(timedelta(seconds=1), timedelta(seconds=1)) == 1

    assert await backend.poll_reclaim_events(0) == []
    clock.advance(timedelta(seconds=10))
    (event,) = await backend.poll_reclaim_events(0)
    assert event.detail["to_state"] == "cancelled"
    assert await backend.poll_reclaim_events(0, visibility_delay=timedelta(hours=1)) == []


async def test_singleton_collision_carries_retry_after_from_the_clock(
    backend: InMemoryBackend, clock: FakeClock
) -> None:
    await backend.enqueue(
        EnqueueArgs(
            actor="a", identity_key="k", singleton=True, schedule_to_close=timedelta(seconds=90)
        )
    )
    clock.advance(30)
    with pytest.raises(SingletonCollisionError) as info:
        await backend.enqueue(EnqueueArgs(actor="a", identity_key="k", singleton=True))
    assert getattr(info.value, "retry_after", None) == pytest.approx(60.0)

    await backend.enqueue(EnqueueArgs(actor="b", identity_key="k", singleton=True))
    with pytest.raises(SingletonCollisionError) as info:
        await backend.enqueue(EnqueueArgs(actor="b", identity_key="k", singleton=True))
    assert getattr(info.value, "retry_after", "unset") is None


async def test_stored_rows_do_not_share_the_callers_dicts(backend: InMemoryBackend) -> None:
    payload = {"nested": {"n": 1}}
    job = await backend.enqueue(EnqueueArgs(actor="a", payload=payload))
    payload["nested"]["n"] = 2
    stored = await backend.get(job.id)
    assert stored is not None
    assert stored.payload == {"nested": {"n": 1}}


async def test_a_queue_max_concurrent_caps_dispatch(backend: InMemoryBackend) -> None:
    # The contract names the queue cap (configure_queue) without saying how it
    # bounds dispatch; here it caps the queue's running jobs like an actor cap.
    await backend.configure_queue(QueueConfig(queue="q", max_concurrent=2))
    for _ in range(4):
        await backend.enqueue(EnqueueArgs(actor="a", queue="q"))
    worker = uuid4()
    assert len(await backend.dispatch_batch(worker, ["q"], 10, timedelta(seconds=30))) == 2
    assert await backend.dispatch_batch(worker, ["q"], 10, timedelta(seconds=30)) == []


async def test_round_robin_and_strict_queues_in_one_dispatch(
    backend: InMemoryBackend, clock: FakeClock
) -> None:
    # One dispatch over a round-robin queue and a strict one: the strict queue's
    # jobs form a single cohort that takes its turn beside each fairness key.
    await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
    await backend.register_actors([ActorConfig(actor="a")])
    names: dict[object, str] = {}
    for name, queue, key in [
        ("t1-1", "rr", "t1"),
        ("t1-2", "rr", "t1"),
        ("fifo-1", "fifo", None),
        ("fifo-2", "fifo", None),
        ("t2-1", "rr", "t2"),
    ]:
        job = await backend.enqueue(EnqueueArgs(actor="a", queue=queue, fairness_key=key))
        names[job.id] = name
        clock.advance(1)
    batch = await backend.dispatch_batch(uuid4(), ["rr", "fifo"], 10, timedelta(seconds=30))
    assert [names[row.id] for row in batch] == ["t1-1", "fifo-1", "t2-1", "t1-2", "fifo-2"]


async def test_reservation_leases_are_always_zero(backend: InMemoryBackend) -> None:
    assert await backend.extend_reservation_leases(uuid4(), timedelta(seconds=30)) == 0


async def test_wake_subscription_is_registered_only_inside(backend: InMemoryBackend) -> None:
    async with backend.subscribe_wake() as wake, backend.subscribe_cancel_wake() as cancel:
        await backend.enqueue(EnqueueArgs(actor="a"))
        assert wake.is_set()
        assert not cancel.is_set()
        (job,) = await backend.dispatch_batch(uuid4(), ["default"], 1, timedelta(seconds=30))
        await backend.write_cancel_request(job.id, None)
        assert cancel.is_set()
    wake.clear()
    await backend.enqueue(EnqueueArgs(actor="a"))
    assert not wake.is_set()
