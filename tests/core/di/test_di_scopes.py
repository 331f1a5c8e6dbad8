"""Scope containers: caching per scope, LIFO teardown, shared creation."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import structlog

from taskq._di import LoopScope, ProcessScope, ProviderRegistry, ScopeContainer, ThreadScope
from taskq._di.registry import ProviderEntry
from taskq._di.solver import Container
from taskq._scope import Scope


class First:
    pass


class Second:
    def __init__(self, first: First) -> None:
        self.first = first


class Third:
    pass


def _entry(registry: ProviderRegistry, key: type[object]) -> ProviderEntry:
    entry = registry.get(key)
    assert entry is not None
    return entry


async def test_teardown_runs_in_reverse_order_of_creation(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    events: list[str] = []

    def first() -> Iterator[First]:
        events.append("open first")
        yield First()
        events.append("close first")

    async def second(first: First) -> AsyncIterator[Second]:
        events.append("open second")
        yield Second(first)
        events.append("close second")

    def third() -> Iterator[Third]:
        events.append("open third")
        yield Third()
        events.append("close third")

    registry.register(First, first)
    registry.register(Second, second)
    registry.register(Third, third)
    container = ScopeContainer(Scope.LOOP)
    scoped: dict[Scope, Container] = {**containers, Scope.LOOP: container}
    await container.get_or_create(_entry(registry, Second), registry, scoped)
    await container.get_or_create(_entry(registry, Third), registry, scoped)
    await container.aclose()
    assert events == [
        "open first",
        "open second",
        "open third",
        "close third",
        "close second",
        "close first",
    ]


async def test_a_failing_teardown_is_logged_and_the_others_still_run_once(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    closed: list[str] = []

    def first() -> Iterator[First]:
        yield First()
        closed.append("first")

    async def second(first: First) -> AsyncIterator[Second]:
        yield Second(first)
        raise OSError("disk gone")

    def third() -> Iterator[Third]:
        yield Third()
        closed.append("third")

    registry.register(First, first)
    registry.register(Second, second)
    registry.register(Third, third)
    container = ScopeContainer(Scope.LOOP)
    scoped: dict[Scope, Container] = {**containers, Scope.LOOP: container}
    for key in (Second, Third):
        await container.get_or_create(_entry(registry, key), registry, scoped)
    with structlog.testing.capture_logs() as logs:
        await container.aclose()
        await container.aclose()
    assert closed == ["third", "first"]
    assert [(log["event"], log["provider"], log["scope"]) for log in logs] == [
        ("taskq.di-teardown-failed", "Second", "LOOP")
    ]
    assert isinstance(logs[0]["exc_info"], OSError)


async def test_a_closed_container_refuses_new_values(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    registry.register(First, First)
    container = ScopeContainer(Scope.LOOP)
    scoped: dict[Scope, Container] = {**containers, Scope.LOOP: container}
    await container.aclose()
    with pytest.raises(RuntimeError, match="LOOP scope is closed; cannot create First"):
        await container.get_or_create(_entry(registry, First), registry, scoped)


async def test_process_values_are_shared_across_loops_and_threads(
    registry: ProviderRegistry,
) -> None:
    registry.register(First, First, scope=Scope.PROCESS)
    process, threads = ProcessScope(), ThreadScope()
    entry = _entry(registry, First)

    async def resolve() -> object:
        scoped: dict[Scope, Container] = {
            Scope.PROCESS: process,
            Scope.THREAD: threads,
            Scope.LOOP: LoopScope().current(),
        }
        return await process.get_or_create(entry, registry, scoped)

    here = await resolve()
    elsewhere = await asyncio.to_thread(asyncio.run, resolve())
    assert here is elsewhere
    await process.aclose()


async def test_loop_values_are_per_event_loop(registry: ProviderRegistry) -> None:
    registry.register(First, First, scope=Scope.LOOP)
    loops = LoopScope()
    entry = _entry(registry, First)
    scoped: dict[Scope, Container] = {Scope.LOOP: loops.current()}

    async def resolve_on_this_loop() -> object:
        container = loops.current()
        value = await container.get_or_create(entry, registry, {Scope.LOOP: container})
        await loops.aclose()
        return value

    here = await loops.current().get_or_create(entry, registry, scoped)
    assert await loops.current().get_or_create(entry, registry, scoped) is here
    assert loops.current() is scoped[Scope.LOOP]
    other_loop_value = await asyncio.to_thread(asyncio.run, resolve_on_this_loop())
    assert other_loop_value is not here
    await loops.aclose()
    # Closing forgot this loop's container: the next one starts empty.
    assert loops.current() is not scoped[Scope.LOOP]
    await loops.aclose()


async def test_thread_values_are_per_thread_and_torn_down_on_close(
    registry: ProviderRegistry,
) -> None:
    events: list[str] = []

    def first() -> Iterator[First]:
        events.append(f"open {threading.current_thread().name}")
        yield First()
        events.append("close")

    registry.register(First, first, scope=Scope.THREAD)
    threads = ThreadScope()
    entry = _entry(registry, First)
    loop = asyncio.get_running_loop()
    scoped: dict[Scope, Container] = {Scope.THREAD: threads}

    def in_thread() -> tuple[object, object]:
        one = threads.get_or_create_sync(entry, registry, scoped, loop)
        return one, threads.get_or_create_sync(entry, registry, scoped, loop)

    here = await threads.get_or_create(entry, registry, scoped)
    assert threads.peek(entry) is here
    with ThreadPoolExecutor(1, thread_name_prefix="worker") as pool:
        one, two = await loop.run_in_executor(pool, in_thread)
    assert one is two
    assert one is not here
    await threads.aclose()
    assert events[:2] == ["open MainThread", "open worker_0"]
    assert events[2:] == ["close", "close"]


async def test_concurrent_first_requests_share_one_creation(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    calls: list[int] = []
    release = asyncio.Event()

    async def slow() -> First:
        calls.append(1)
        await release.wait()
        return First()

    registry.register(First, slow, scope=Scope.LOOP)
    container = containers[Scope.LOOP]
    entry = _entry(registry, First)
    tasks = [
        asyncio.create_task(container.get_or_create(entry, registry, containers)) for _ in range(5)
    ]
    await asyncio.sleep(0)
    release.set()
    values = await asyncio.gather(*tasks)
    assert calls == [1]
    assert all(value is values[0] for value in values)


async def test_threads_share_one_creation_of_a_process_value(
    registry: ProviderRegistry,
) -> None:
    calls: list[int] = []
    started = threading.Event()
    release = threading.Event()

    def slow() -> First:
        calls.append(1)
        started.set()
        release.wait(5)
        return First()

    registry.register(First, slow, scope=Scope.PROCESS)
    process = ProcessScope()
    entry = _entry(registry, First)
    loop = asyncio.get_running_loop()
    scoped: dict[Scope, Container] = {Scope.PROCESS: process}

    def resolve() -> object:
        return process.get_or_create_sync(entry, registry, scoped, loop)

    with ThreadPoolExecutor(4) as pool:
        creator = loop.run_in_executor(pool, resolve)
        await asyncio.to_thread(started.wait, 5)
        waiters = [loop.run_in_executor(pool, resolve) for _ in range(3)]
        # An async caller on the loop waits for the same creation too.
        on_loop = asyncio.create_task(process.get_or_create(entry, registry, scoped))
        await asyncio.sleep(0.05)
        release.set()
        values = await asyncio.gather(creator, *waiters, on_loop)
    assert calls == [1]
    assert all(value is values[0] for value in values)
    await process.aclose()


async def test_a_failed_creation_reaches_every_waiter_and_is_not_cached(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    attempts: list[int] = []
    release = asyncio.Event()

    async def flaky() -> First:
        attempts.append(1)
        await release.wait()
        if len(attempts) == 1:
            raise ConnectionError("database down")
        return First()

    registry.register(First, flaky, scope=Scope.LOOP)
    container = containers[Scope.LOOP]
    entry = _entry(registry, First)
    tasks = [
        asyncio.create_task(container.get_or_create(entry, registry, containers)) for _ in range(3)
    ]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(result, ConnectionError) for result in results)
    assert isinstance(await container.get_or_create(entry, registry, containers), First)
    assert len(attempts) == 2


async def test_a_cancelled_creator_does_not_cancel_the_shared_creation(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # The first job to ask cancelled it (its timeout, shorter than the creation): the
    # waiters started it again, and were cancelled in turn; a model slower to load
    # than one job's timeout was never loaded.
    attempts: list[int] = []
    release = asyncio.Event()

    async def slow() -> First:
        attempts.append(1)
        await release.wait()
        return First()

    registry.register(First, slow, scope=Scope.LOOP)
    container = containers[Scope.LOOP]
    entry = _entry(registry, First)
    creator = asyncio.create_task(container.get_or_create(entry, registry, containers))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(container.get_or_create(entry, registry, containers))
    await asyncio.sleep(0)
    creator.cancel()
    await asyncio.sleep(0)
    release.set()
    value = await waiter
    assert isinstance(value, First)
    assert creator.cancelled()
    assert len(attempts) == 1
    assert await container.get_or_create(entry, registry, containers) is value


async def test_a_cancelled_waiter_does_not_disturb_the_shared_creation(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    release = asyncio.Event()

    async def slow() -> First:
        await release.wait()
        return First()

    registry.register(First, slow, scope=Scope.LOOP)
    container = containers[Scope.LOOP]
    entry = _entry(registry, First)
    creator = asyncio.create_task(container.get_or_create(entry, registry, containers))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(container.get_or_create(entry, registry, containers))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.sleep(0)
    release.set()
    value = await creator
    assert waiter.cancelled()
    assert container.peek(entry) is value


async def test_a_shared_value_created_after_its_scope_closed_is_closed_at_once(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # Its creation outlives the job that asked (cancelled); the worker then stopped and
    # closed the scope: the value landed in a closed container, never to be closed.
    events: list[str] = []
    release = asyncio.Event()

    async def slow() -> AsyncIterator[First]:
        await release.wait()
        events.append("open")
        yield First()
        events.append("close")

    registry.register(First, slow, scope=Scope.LOOP)
    container = containers[Scope.LOOP]
    assert isinstance(container, ScopeContainer)  # the loop's own, which it closes below
    entry = _entry(registry, First)
    job = asyncio.create_task(container.get_or_create(entry, registry, containers))
    await asyncio.sleep(0)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    await container.aclose()
    release.set()
    async with asyncio.timeout(5):
        while events != ["open", "close"]:  # noqa: ASYNC110 - the creation's own task
            await asyncio.sleep(0.01)
