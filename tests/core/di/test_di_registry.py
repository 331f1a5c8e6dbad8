"""ProviderRegistry: registration rules and the plan cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import pytest
from pydantic import BaseModel, ConfigDict

from taskq._di import ActorSpec, Lifecycle, ProviderRegistry
from taskq._di.registry import PlanStep
from taskq._scope import Scope
from taskq.errors import ConfigurationError

if TYPE_CHECKING:
    from decimal import Decimal


class Config:
    pass


class Conn:
    def __init__(self, config: Config) -> None:
        self.config = config


class OtherConn(Conn):
    pass


class Repo:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn


class CycleA:
    def __init__(self, b: CycleB) -> None:
        self.b = b


class CycleB:
    def __init__(self, a: CycleA) -> None:
        self.a = a


def actor(payload: int, ctx: object, repo: Repo, conn: Annotated[Conn, Scope.TRANSIENT]) -> None:
    pass


def test_registration_records_key_scope_and_lifecycle(registry: ProviderRegistry) -> None:
    config = Config()
    value_entry = registry.register_value(Config, config)
    conn_entry = registry.register(Conn, Conn, scope=Scope.THREAD)
    assert registry.get(Config) is value_entry
    assert (value_entry.provider, value_entry.scope, value_entry.lifecycle) == (
        config,
        Scope.PROCESS,
        Lifecycle.VALUE,
    )
    assert (conn_entry.scope, conn_entry.lifecycle, conn_entry.name) == (
        Scope.THREAD,
        Lifecycle.FACTORY,
        "Conn",
    )
    assert registry.register(Repo, Repo).scope is Scope.LOOP  # the default
    assert Conn in registry
    assert float not in registry
    assert registry.get(float) is None
    assert registry.entries() == [value_entry, conn_entry, registry.get(Repo)]


def test_registering_a_type_twice_is_refused_unless_replacing(registry: ProviderRegistry) -> None:
    registry.register(Conn, Conn)
    with pytest.raises(ConfigurationError, match="Conn already has a provider"):
        registry.register(Conn, OtherConn)
    replacement = registry.register(Conn, OtherConn, replace=True)
    assert registry.get(Conn) is replacement


def test_a_non_callable_provider_points_to_register_value(registry: ProviderRegistry) -> None:
    with pytest.raises(TypeError, match="register_value"):
        registry.register(Config, Config())  # type: ignore[arg-type]


def test_the_plan_maps_parameters_to_entries_and_effective_scopes(
    registry: ProviderRegistry,
) -> None:
    registry.register(Repo, Repo, scope=Scope.LOOP)
    conn = registry.register(Conn, Conn, scope=Scope.LOOP)
    plan = registry.plan(actor)
    assert plan == (
        PlanStep("payload", int, None, Scope.TRANSIENT),
        PlanStep("ctx", object, None, Scope.TRANSIENT),
        PlanStep("repo", Repo, registry.get(Repo), Scope.LOOP),
        # Annotated[Conn, Scope.TRANSIENT] overrides the registered LOOP scope.
        PlanStep("conn", Conn, conn, Scope.TRANSIENT),
    )


def test_plans_are_cached_until_the_next_registration(registry: ProviderRegistry) -> None:
    first = registry.register(Conn, Conn)
    plan = registry.plan(Repo)
    assert registry.plan(Repo) is plan
    assert plan[0].entry is first

    second = registry.register(Conn, OtherConn, replace=True)
    replanned = registry.plan(Repo)
    assert replanned is not plan
    assert replanned[0].entry is second

    registry.register(Config, Config)
    assert registry.plan(Repo) is not replanned


def test_parameters_with_defaults_and_no_provider_keep_their_default(
    registry: ProviderRegistry,
) -> None:
    def factory(config: Config, retries: int = 3, *args: object, **kwargs: object) -> Conn:
        return Conn(config)

    assert [step.name for step in registry.plan(factory)] == ["config"]
    registry.register_value(int, 5)
    assert [step.name for step in registry.plan(factory)] == ["config", "retries"]


def test_unannotated_parameters_have_no_key(registry: ProviderRegistry) -> None:
    def factory(config):  # type: ignore[no-untyped-def]
        return config

    assert registry.plan(factory) == (PlanStep("config", None, None, Scope.TRANSIENT),)


class Settings(BaseModel):
    """A class whose signature is its own (``__signature__``), not its ``__init__``'s."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    config: Config
    retries: int = 3


def test_a_class_with_a_signature_of_its_own_has_its_annotations_read(
    registry: ProviderRegistry,
) -> None:
    # Only __init__'s hints were read (a pydantic model's: **data), so every annotated
    # field was said to have no type hint.
    registry.register(Config, Config, scope=Scope.PROCESS)
    registry.register(Settings, Settings, scope=Scope.PROCESS)
    registry.validate()
    [step] = registry.plan(Settings)
    assert (step.name, step.key) == ("config", Config)


def test_positional_only_parameters_cannot_be_injected(registry: ProviderRegistry) -> None:
    def factory(config: Config, /) -> Conn:
        return Conn(config)

    def with_default(config: Config | None = None, /) -> Conn:
        assert config is not None
        return Conn(config)

    with pytest.raises(ConfigurationError, match="'config' of .*factory is positional-only"):
        registry.plan(factory)
    assert registry.plan(with_default) == ()


def test_unresolvable_type_hints_name_the_callable(registry: ProviderRegistry) -> None:
    def factory(amount: Decimal) -> None:
        pass

    with pytest.raises(ConfigurationError, match=r"signature of .*factory: name 'Decimal'"):
        registry.plan(factory)


@pytest.mark.parametrize("annotation", ["pytest.Nope", "list[int"])
def test_any_unevaluable_type_hint_names_the_callable(
    registry: ProviderRegistry, annotation: str
) -> None:
    # An attribute missing from a module, or a hint that is no expression, escaped as a
    # bare AttributeError / SyntaxError from the worker's start, naming no actor.
    def factory(amount: int) -> None:
        pass

    factory.__annotations__["amount"] = annotation
    with pytest.raises(ConfigurationError, match=r"signature of .*factory: "):
        registry.plan(factory)
    with pytest.raises(ConfigurationError, match=r"actor 'job': cannot read .*factory"):
        registry.validate({"job": ActorSpec(factory, {"amount"})})


def test_a_plan_reaching_a_cycle_fails_instead_of_deadlocking(registry: ProviderRegistry) -> None:
    registry.register(CycleA, CycleA)
    registry.register(CycleB, CycleB)

    def job(payload: int, a: CycleA) -> None:
        pass

    with pytest.raises(ConfigurationError, match=r"cycle: .*job -> CycleA \(LOOP\) -> CycleB"):
        registry.plan(job)
