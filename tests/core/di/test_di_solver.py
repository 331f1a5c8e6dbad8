"""solve_dependencies: kwargs from the plan, through the containers only."""

from __future__ import annotations

import asyncio
import functools
from typing import Annotated, Optional

import pytest

from taskq._di import ProviderRegistry, ScopeContainer, solve_dependencies
from taskq._di.registry import ProviderEntry
from taskq._di.solver import MISSING, Container, Containers
from taskq._scope import Scope
from taskq.errors import MissingProvider


class Config:
    pass


class Conn:
    def __init__(self, config: Config) -> None:
        self.config = config


class Payload:
    pass


class Client:
    def __init__(self, conn: Conn, label: str) -> None:
        self.conn = conn
        self.label = label


FreshConfig = Annotated[Config, Scope.TRANSIENT]


class RecordingContainer:
    """A container that hands out markers and records what it was asked for."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.asked: list[str] = []

    def peek(self, entry: ProviderEntry) -> object:
        return MISSING

    async def get_or_create(
        self, entry: ProviderEntry, registry: ProviderRegistry, containers: Containers
    ) -> object:
        self.asked.append(entry.name)
        return f"{self.name}:{entry.name}"

    def get_or_create_sync(
        self,
        entry: ProviderEntry,
        registry: ProviderRegistry,
        containers: Containers,
        loop: asyncio.AbstractEventLoop,
    ) -> object:
        raise AssertionError("the async solver never uses the sync path")


def _explode(config: Config) -> Conn:
    raise AssertionError("the solver must not call providers itself")


async def test_the_solver_asks_the_container_of_each_effective_scope(
    registry: ProviderRegistry,
) -> None:
    registry.register(Config, Config, scope=Scope.PROCESS)
    registry.register(Conn, _explode, scope=Scope.LOOP)
    fakes = {scope: RecordingContainer(scope.name) for scope in Scope}
    containers: dict[Scope, Container] = dict(fakes)

    async def job(
        payload: Payload,
        ctx: object,
        config: Config,
        conn: Conn,
        fresh: Annotated[Conn, Scope.TRANSIENT],
    ) -> None:
        pass

    payload = Payload()
    kwargs = await solve_dependencies(job, registry, containers, {"payload": payload, "ctx": 7})
    assert kwargs == {
        "payload": payload,
        "ctx": 7,
        "config": "PROCESS:Config",
        "conn": "LOOP:Conn",
        "fresh": "TRANSIENT:Conn",
    }
    assert {scope.name: fake.asked for scope, fake in fakes.items()} == {
        "PROCESS": ["Config"],
        "THREAD": [],
        "LOOP": ["Conn"],
        "TRANSIENT": ["Conn"],
    }


async def test_passthrough_names_are_never_looked_up(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    registry.register_value(Payload, Payload())

    async def job(payload: Payload) -> None:
        pass

    mine = Payload()
    kwargs = await solve_dependencies(job, registry, containers, {"payload": mine})
    assert kwargs == {"payload": mine}


async def test_cached_values_skip_creation(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    calls: list[int] = []

    def make_config() -> Config:
        calls.append(1)
        return Config()

    registry.register(Config, make_config, scope=Scope.LOOP)
    registry.register(Conn, Conn, scope=Scope.LOOP)

    async def job(payload: int, conn: Conn, config: Config) -> None:
        pass

    first = await solve_dependencies(job, registry, containers, {"payload": 1})
    second = await solve_dependencies(job, registry, containers, {"payload": 2})
    assert first["conn"] is second["conn"]
    assert first["config"] is second["config"] is first["conn"].config  # type: ignore[attr-defined]
    assert calls == [1]


async def test_a_parameter_nobody_provides_raises_missing_provider(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    async def job(payload: int, conn: Conn) -> None:
        pass

    with pytest.raises(MissingProvider, match=r"job needs conn: Conn"):
        await solve_dependencies(job, registry, containers, {"payload": 1})


async def test_defaults_fill_parameters_nobody_provides(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    async def job(payload: int, retries: int = 3) -> None:
        pass

    assert await solve_dependencies(job, registry, containers, {"payload": 1}) == {"payload": 1}


async def test_an_optional_parameter_gets_its_types_provider_else_its_default(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # The union itself was looked up: never registered, so a registered Config was left
    # unused (None given), and without a default "no provider" was said for it.
    async def job(
        needed: Config | None,
        maybe: Optional[Config] = None,  # noqa: UP045 - the spelling under test
        also: Config | None = None,
        scoped: Annotated[Config | None, Scope.TRANSIENT] = None,
        absent: Conn | None = None,
    ) -> None:
        pass

    registry.register(Config, Config, scope=Scope.PROCESS)
    transient = {**containers, Scope.TRANSIENT: ScopeContainer(Scope.TRANSIENT)}
    values = await solve_dependencies(job, registry, transient, {})
    assert set(values) == {"needed", "maybe", "also", "scoped"}  # absent: its default
    assert isinstance(values["needed"], Config)
    assert values["needed"] is values["maybe"] is values["also"]
    assert isinstance(values["scoped"], Config) and values["scoped"] is not values["needed"]


async def test_an_optional_annotated_alias_gets_its_types_provider_in_its_scope(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # ``Annotated[T, Scope.X] | None`` (an alias made optional) looked the Annotated
    # form up: never registered, so a registered T was left unused and None given.
    async def job(
        maybe: FreshConfig | None = None,
        also: Optional[Annotated[Config, Scope.TRANSIENT]] = None,  # noqa: UP045 - under test
    ) -> None:
        pass

    registry.register(Config, Config, scope=Scope.PROCESS)
    registry.validate()
    transient = {**containers, Scope.TRANSIENT: ScopeContainer(Scope.TRANSIENT)}
    values = await solve_dependencies(job, registry, transient, {})
    assert isinstance(values.get("maybe"), Config)
    assert values["also"] is values["maybe"]  # one TRANSIENT value
    entry = registry.get(Config)
    assert entry is not None
    assert containers[Scope.PROCESS].peek(entry) is MISSING  # not PROCESS


async def test_a_partials_bound_keywords_are_not_injected(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # The registered Config replaced the one bound into the partial (a keyword bound
    # by partial reads as a parameter with a default, so it was injected over it).
    mine = Config()

    def connect(config: Config) -> Conn:
        return Conn(config)

    registry.register(Config, Config, scope=Scope.PROCESS)
    registry.register(Conn, functools.partial(connect, config=mine), scope=Scope.PROCESS)
    # A partial of a class: its __init__'s hints (the class's own were read: none).
    registry.register(Client, functools.partial(Client, label="bound"), scope=Scope.PROCESS)

    async def job(conn: Conn, client: Client) -> None:
        pass

    registry.validate()
    values = await solve_dependencies(job, registry, containers, {})
    assert isinstance(values["conn"], Conn) and isinstance(values["client"], Client)
    assert values["conn"].config is mine
    assert values["client"].label == "bound" and values["client"].conn is values["conn"]


async def test_an_optional_parameter_takes_the_unions_own_provider_first(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # A provider registered for the union itself (a feature that may be off) is kept;
    # and T's provider asking for a T | None to build on gets its default, not itself.
    def maybe_conn() -> Conn | None:
        return None

    def make_config(base: Config | None = None) -> Config:
        return Config() if base is None else base

    async def job(conn: Conn | None, config: Config) -> None:
        pass

    # register's key is typed type[T], which no union is; it takes one all the same.
    registry.register(Conn | None, maybe_conn, scope=Scope.PROCESS)  # type: ignore[arg-type]
    registry.register(Config, make_config, scope=Scope.PROCESS)
    registry.validate()
    values = await solve_dependencies(job, registry, containers, {})
    assert values["conn"] is None and isinstance(values["config"], Config)


async def test_a_scope_override_caches_the_value_in_that_scope(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    registry.register(Config, Config, scope=Scope.PROCESS)

    async def job(shared: Config, fresh: Annotated[Config, Scope.TRANSIENT], again: Config) -> None:
        pass

    first = ScopeContainer(Scope.TRANSIENT)
    second = ScopeContainer(Scope.TRANSIENT)
    one = await solve_dependencies(job, registry, {**containers, Scope.TRANSIENT: first}, {})
    two = await solve_dependencies(job, registry, {**containers, Scope.TRANSIENT: second}, {})
    assert one["shared"] is one["again"] is two["shared"]
    assert one["fresh"] is not one["shared"]
    assert one["fresh"] is not two["fresh"]


def test_a_builtin_provider_without_a_signature_gets_told_to_wrap_it() -> None:
    # The message asked to annotate the parameters of `dict`.
    from collections import OrderedDict

    from taskq._di.solver import read_dependencies
    from taskq.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"register a function that calls it .*lambda"):
        read_dependencies(OrderedDict)
