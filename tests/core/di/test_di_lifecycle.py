"""Each provider shape gets the lifecycle it implies, and is created and torn down by it."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from contextlib import asynccontextmanager, contextmanager
from types import TracebackType
from typing import Self

import pytest
import structlog

from taskq._di import Lifecycle, ProviderRegistry, ScopeContainer
from taskq._di.lifecycle import detect_lifecycle
from taskq._di.solver import Container
from taskq._scope import Scope


class Config:
    pass


class Service:
    def __init__(self, config: Config) -> None:
        self.config = config


class Client:
    """An async context manager class: entered only through register_context."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.entered = False

    async def __aenter__(self) -> Self:
        self.entered = True
        self.events.append("enter")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.events.append("exit")


def make_service(config: Config) -> Service:
    return Service(config)


async def make_service_async(config: Config) -> Service:
    await asyncio.sleep(0)
    return Service(config)


def service_generator(config: Config) -> Iterator[Service]:
    yield Service(config)


async def service_async_generator(config: Config) -> AsyncIterator[Service]:
    yield Service(config)


@contextmanager
def service_context(config: Config) -> Iterator[Service]:
    yield Service(config)


@asynccontextmanager
async def service_async_context(config: Config) -> AsyncIterator[Service]:
    yield Service(config)


class AsyncCallable:
    async def __call__(self, config: Config) -> Service:
        return Service(config)


@pytest.mark.parametrize(
    ("provider", "expected"),
    [
        (Service, Lifecycle.FACTORY),
        (make_service, Lifecycle.FACTORY),
        (functools.partial(make_service), Lifecycle.FACTORY),
        (make_service_async, Lifecycle.ASYNC_FACTORY),
        (functools.partial(make_service_async), Lifecycle.ASYNC_FACTORY),
        (AsyncCallable(), Lifecycle.ASYNC_FACTORY),
        (service_generator, Lifecycle.GENERATOR),
        (service_async_generator, Lifecycle.ASYNC_GENERATOR),
        (service_context, Lifecycle.CONTEXT_MANAGER),
        (service_async_context, Lifecycle.ASYNC_CONTEXT_MANAGER),
        # A partial binding options of one was a plain factory: never entered.
        (functools.partial(service_context), Lifecycle.CONTEXT_MANAGER),
        (
            functools.partial(functools.partial(service_async_context)),
            Lifecycle.ASYNC_CONTEXT_MANAGER,
        ),
        # A class is constructed, never entered, even if it is a context manager.
        (Client, Lifecycle.FACTORY),
        (asyncio.Lock, Lifecycle.FACTORY),
    ],
)
def test_lifecycle_follows_the_providers_shape(
    provider: Callable[..., object], expected: Lifecycle
) -> None:
    assert detect_lifecycle(provider) is expected


def test_only_async_lifecycles_need_a_loop() -> None:
    assert {lc for lc in Lifecycle if lc.is_async} == {
        Lifecycle.ASYNC_FACTORY,
        Lifecycle.ASYNC_GENERATOR,
        Lifecycle.ASYNC_CONTEXT_MANAGER,
    }


async def _resolve(
    registry: ProviderRegistry, key: type[object], containers: dict[Scope, Container]
) -> tuple[object, ScopeContainer]:
    container = ScopeContainer(Scope.LOOP)
    scoped: dict[Scope, Container] = {**containers, Scope.LOOP: container}
    entry = registry.get(key)
    assert entry is not None
    return await container.get_or_create(entry, registry, scoped), container


async def test_a_value_is_provided_as_is(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    config = Config()
    registry.register_value(Config, config)
    value, container = await _resolve(registry, Config, containers)
    assert value is config
    await container.aclose()


@pytest.mark.parametrize(
    "provider",
    [
        Service,
        make_service,
        make_service_async,
        AsyncCallable(),
        service_generator,
        service_async_generator,
        service_context,
        service_async_context,
    ],
)
async def test_every_factory_shape_gets_its_dependencies_injected(
    registry: ProviderRegistry,
    containers: dict[Scope, Container],
    provider: Callable[..., Service],
) -> None:
    config = Config()
    registry.register_value(Config, config)
    registry.register(Service, provider)
    value, container = await _resolve(registry, Service, containers)
    assert isinstance(value, Service)
    assert value.config is config
    await container.aclose()


async def test_a_plain_function_returning_an_awaitable_is_a_clear_error(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # A lambda around an async function: the actor was handed the coroutine itself.
    registry.register_value(Config, Config())

    def wrapper(config: Config) -> Awaitable[Service]:
        return make_service_async(config)

    registry.register(Service, wrapper)
    with pytest.raises(TypeError, match="returned an awaitable, not a value"):
        await _resolve(registry, Service, containers)


class _PoolToOpen:
    """What asyncpg.create_pool returns: awaitable, and unusable until awaited."""

    def __await__(self) -> Generator[None, None, _PoolToOpen]:
        yield
        return self


async def test_an_awaitable_still_to_open_from_a_plain_provider_is_refused(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    registry.register(_PoolToOpen, lambda: _PoolToOpen())
    with pytest.raises(TypeError, match="returned an awaitable, not a value"):
        await _resolve(registry, _PoolToOpen, containers)


async def test_a_future_made_by_a_plain_provider_is_the_value(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # A signal shared by jobs: awaitable, yet the value itself.
    made: list[asyncio.Future[None]] = []

    def ready() -> asyncio.Future[None]:
        made.append(asyncio.get_running_loop().create_future())
        return made[-1]

    registry.register(asyncio.Future, ready)
    value, container = await _resolve(registry, asyncio.Future, containers)
    assert value is made[0]
    await container.aclose()


async def test_generator_code_after_yield_is_the_teardown(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    events: list[str] = []

    def sync_gen() -> Iterator[Config]:
        events.append("sync up")
        yield Config()
        events.append("sync down")

    async def async_gen(config: Config) -> AsyncIterator[Service]:
        events.append("async up")
        yield Service(config)
        await asyncio.sleep(0)
        events.append("async down")

    registry.register(Config, sync_gen)
    registry.register(Service, async_gen)
    container = ScopeContainer(Scope.LOOP)
    scoped: dict[Scope, Container] = {**containers, Scope.LOOP: container}
    entry = registry.get(Service)
    assert entry is not None
    await container.get_or_create(entry, registry, scoped)
    assert events == ["sync up", "async up"]
    await container.aclose()
    assert events == ["sync up", "async up", "async down", "sync down"]


async def test_context_manager_functions_are_entered_and_exited(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    events: list[str] = []

    @contextmanager
    def config_context() -> Iterator[Config]:
        events.append("enter config")
        yield Config()
        events.append("exit config")

    @asynccontextmanager
    async def service_context(config: Config) -> AsyncIterator[Service]:
        events.append("enter service")
        yield Service(config)
        events.append("exit service")

    registry.register(Config, config_context)
    registry.register(Service, service_context)
    value, container = await _resolve(registry, Service, containers)
    assert isinstance(value, Service)
    await container.aclose()
    assert events == ["enter config", "enter service", "exit service", "exit config"]


async def test_register_context_enters_what_the_factory_returns(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    events: list[str] = []

    class Pool:
        def acquire(self) -> Client:
            return Client(events)

    registry.register_value(list[str], events)
    registry.register_context(Client, Client)
    value, container = await _resolve(registry, Client, containers)
    assert isinstance(value, Client)
    assert value.entered
    await container.aclose()
    assert events == ["enter", "exit"]

    # A bound method returning a context manager (think ``pool.acquire``).
    registry.register_context(Client, Pool().acquire, replace=True)
    value, container = await _resolve(registry, Client, containers)
    assert isinstance(value, Client)
    await container.aclose()
    assert events == ["enter", "exit", "enter", "exit"]


async def test_a_context_manager_class_registered_plainly_is_not_entered(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    registry.register(asyncio.Lock, asyncio.Lock)
    lock, container = await _resolve(registry, asyncio.Lock, containers)
    assert isinstance(lock, asyncio.Lock)
    assert not lock.locked()
    await container.aclose()


async def test_a_generator_that_does_not_yield_fails_creation(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    def no_yield() -> Iterator[Config]:
        yield from ()

    async def no_yield_async() -> AsyncIterator[Service]:
        if False:
            yield Service(Config())

    registry.register(Config, no_yield)
    registry.register(Service, no_yield_async)
    with pytest.raises(RuntimeError, match="did not yield"):
        await _resolve(registry, Config, containers)
    with pytest.raises(RuntimeError, match="did not yield"):
        await _resolve(registry, Service, containers)


async def test_a_generator_that_yields_twice_is_reported_at_teardown(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    closed: list[str] = []

    def twice() -> Iterator[Config]:
        try:
            yield Config()
            yield Config()
        finally:
            closed.append("sync")

    async def twice_async() -> AsyncIterator[Service]:
        try:
            yield Service(Config())
            yield Service(Config())
        finally:
            closed.append("async")

    registry.register(Config, twice)
    registry.register(Service, twice_async)
    container = ScopeContainer(Scope.LOOP)
    scoped: dict[Scope, Container] = {**containers, Scope.LOOP: container}
    for key in (Config, Service):
        entry = registry.get(key)
        assert entry is not None
        await container.get_or_create(entry, registry, scoped)
    with structlog.testing.capture_logs() as logs:
        await container.aclose()
    failures = [log for log in logs if log["event"] == "taskq.di-teardown-failed"]
    assert {log["provider"] for log in failures} == {"Config", "Service"}
    assert all("more than once" in str(log["exc_info"]) for log in failures)
    # The generators were closed all the same.
    assert sorted(closed) == ["async", "sync"]
