"""Start-up validation: every phase, with the full dependency path in each message."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Annotated

import pytest

from taskq._di import ActorSpec, ProviderRegistry
from taskq._scope import Scope
from taskq.context import Context
from taskq.errors import ConfigurationError, MissingProvider, ScopeViolation

if TYPE_CHECKING:
    from decimal import Decimal


class Payload:
    pass


class Settings:
    pass


class Conn:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings


class Service:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn


class Facade:
    def __init__(self, service: Service) -> None:
        self.service = service


class Clock:
    pass


class SelfLoop:
    def __init__(self, again: SelfLoop) -> None:
        self.again = again


class Alpha:
    def __init__(self, beta: Beta) -> None:
        self.beta = beta


class Beta:
    def __init__(self, gamma: Gamma) -> None:
        self.gamma = gamma


class Gamma:
    def __init__(self, alpha: Alpha) -> None:
        self.alpha = alpha


async def send(payload: Payload, ctx: object, facade: Facade) -> None:
    pass


def _spec(func: object, *passthrough: str) -> ActorSpec:
    assert callable(func)
    return ActorSpec(func, frozenset(passthrough or ("payload", "ctx")))


def _healthy(registry: ProviderRegistry) -> None:
    registry.register_value(Settings, Settings())
    registry.register(Conn, Conn, scope=Scope.LOOP)
    registry.register(Service, Service, scope=Scope.LOOP)
    registry.register(Facade, Facade, scope=Scope.TRANSIENT)


def test_a_sound_graph_passes(registry: ProviderRegistry) -> None:
    _healthy(registry)

    def sync_send(payload: Payload, service: Service, extra: int = 0) -> None:
        pass

    registry.validate({"send": _spec(send), "sync_send": _spec(sync_send, "payload")})


def test_a_cycle_is_reported_with_its_full_path(registry: ProviderRegistry) -> None:
    registry.register(Alpha, Alpha)
    registry.register(Beta, Beta)
    registry.register(Gamma, Gamma, scope=Scope.TRANSIENT)

    async def job(payload: Payload, alpha: Alpha) -> None:
        pass

    with pytest.raises(ConfigurationError) as caught:
        registry.validate({"job": _spec(job, "payload")})
    assert str(caught.value).startswith(
        "dependency cycle: actor 'job' -> Alpha (LOOP) -> Beta (LOOP) -> Gamma (TRANSIENT) "
        "-> Alpha (LOOP). "
    )


def test_a_provider_depending_on_itself_is_a_cycle(registry: ProviderRegistry) -> None:
    registry.register(SelfLoop, SelfLoop)
    with pytest.raises(ConfigurationError, match=r"cycle: SelfLoop \(LOOP\) -> SelfLoop \(LOOP\)"):
        registry.validate()


def test_a_wider_scope_depending_on_a_narrower_one_is_a_scope_violation(
    registry: ProviderRegistry,
) -> None:
    _healthy(registry)
    registry.register(Service, Service, scope=Scope.PROCESS, replace=True)
    with pytest.raises(ScopeViolation) as caught:
        registry.validate({"send": _spec(send)})
    message = str(caught.value)
    assert (
        "actor 'send' -> Facade (TRANSIENT) -> Service (PROCESS) -> Conn (LOOP): "
        "a PROCESS-scoped value would outlive the LOOP-scoped Conn it holds"
    ) in message
    # Reported once, from the first path that reaches it.
    assert message.count("-> Conn (LOOP)") == 1


def test_providers_no_actor_uses_are_checked_too(registry: ProviderRegistry) -> None:
    _healthy(registry)
    registry.register(Service, Service, scope=Scope.PROCESS, replace=True)
    with pytest.raises(
        ScopeViolation, match=r"\n  Service \(PROCESS\) -> Conn \(LOOP\): a PROCESS"
    ):
        registry.validate()


@pytest.mark.parametrize(
    ("outer", "inner"),
    [
        (Scope.PROCESS, Scope.THREAD),
        (Scope.PROCESS, Scope.TRANSIENT),
        (Scope.THREAD, Scope.LOOP),
        (Scope.LOOP, Scope.TRANSIENT),
    ],
)
def test_every_narrowing_edge_is_refused(
    registry: ProviderRegistry, outer: Scope, inner: Scope
) -> None:
    registry.register_value(Settings, Settings())
    registry.register(Conn, Conn, scope=inner)
    registry.register(Service, Service, scope=outer)
    with pytest.raises(ScopeViolation, match=rf"Service \({outer.name}\) -> Conn \({inner.name}\)"):
        registry.validate()


def test_depending_on_the_same_or_a_wider_scope_is_fine(registry: ProviderRegistry) -> None:
    registry.register(Settings, Settings, scope=Scope.PROCESS)
    registry.register(Conn, Conn, scope=Scope.THREAD)
    registry.register(Service, Service, scope=Scope.LOOP)
    registry.register(Facade, Facade, scope=Scope.TRANSIENT)
    registry.validate({"send": _spec(send)})


def test_scope_overrides_are_validated_on_the_edge_they_annotate(
    registry: ProviderRegistry,
) -> None:
    registry.register_value(Settings, Settings())
    registry.register(Conn, Conn, scope=Scope.LOOP)

    def narrowing(conn: Annotated[Conn, Scope.TRANSIENT]) -> Service:
        return Service(conn)

    registry.register(Service, narrowing, scope=Scope.LOOP)
    with pytest.raises(ScopeViolation, match=r"Service \(LOOP\) -> Conn \(TRANSIENT\)"):
        registry.validate()

    # Widening the dependency through an override satisfies the rule.
    def widening(conn: Annotated[Conn, Scope.PROCESS]) -> Service:
        return Service(conn)

    registry.register(Service, widening, scope=Scope.PROCESS, replace=True)
    registry.validate()


def test_an_async_provider_cannot_be_thread_scoped(registry: ProviderRegistry) -> None:
    async def clock() -> AsyncIterator[Clock]:
        yield Clock()

    registry.register(Clock, clock, scope=Scope.THREAD)
    with pytest.raises(ScopeViolation, match=r"Clock \(THREAD\): Clock is asynchronous"):
        registry.validate()

    def sync_clock() -> Iterator[Clock]:
        yield Clock()

    registry.register(Clock, sync_clock, scope=Scope.THREAD, replace=True)

    async def job(payload: Payload, clock: Annotated[Clock, Scope.THREAD]) -> None:
        pass

    registry.validate({"job": _spec(job, "payload")})


def test_missing_providers_are_all_listed_with_their_paths(registry: ProviderRegistry) -> None:
    registry.register(Service, Service, scope=Scope.LOOP)
    registry.register(Facade, Facade, scope=Scope.TRANSIENT)

    async def job(payload: Payload, ctx: object, facade: Facade, clock: Clock) -> None:
        pass

    with pytest.raises(MissingProvider) as caught:
        registry.validate({"job": _spec(job)})
    message = str(caught.value)
    assert "actor 'job' -> Facade (TRANSIENT) -> Service (LOOP) -> conn: Conn" in message
    assert "actor 'job' -> clock: Clock" in message
    # Passthrough parameters are not providers' business.
    assert "payload" not in message
    assert "ctx" not in message


def test_an_unannotated_parameter_is_a_missing_provider(registry: ProviderRegistry) -> None:
    def factory(settings):  # type: ignore[no-untyped-def]
        return Conn(settings)

    registry.register(Conn, factory)
    with pytest.raises(
        MissingProvider,
        match=r"Conn \(LOOP\) -> settings: <unannotated> \(no type hint: annotate the parameter",
    ):
        registry.validate()


def test_a_context_under_another_name_is_told_to_be_called_ctx(
    registry: ProviderRegistry,
) -> None:
    async def job(payload: Payload, context: Context) -> None:
        pass

    with pytest.raises(MissingProvider, match=r"context: Context \(.*call the parameter ctx\)"):
        registry.validate({"job": _spec(job)})


class JobLog:
    """A provided value whose provider asks for the job context."""


def test_a_provider_asking_for_the_context_is_told_it_cannot_have_it(
    registry: ProviderRegistry,
) -> None:
    # It was told to "call the parameter ctx", which it already did.
    def job_log(ctx: Context) -> JobLog:
        return JobLog()

    async def job(payload: Payload, log: JobLog) -> None:
        pass

    registry.register(JobLog, job_log)
    with pytest.raises(MissingProvider, match=r"ctx: Context \(a provider cannot be given the job"):
        registry.validate({"job": _spec(job)})


def test_bad_actor_signatures_are_all_reported(registry: ProviderRegistry) -> None:
    def no_parameters() -> None:
        pass

    def payload_not_first(service: Service, payload: Payload) -> None:
        pass

    def positional_only(payload: Payload, /) -> None:
        pass

    async def generator(payload: Payload) -> AsyncIterator[int]:
        yield 1

    def unresolvable(payload: Payload, amount: Decimal) -> None:
        pass

    actors = {
        "no_parameters": _spec(no_parameters, "payload"),
        "payload_not_first": _spec(payload_not_first),
        "positional_only": _spec(positional_only, "payload"),
        "generator": _spec(generator, "payload"),
        "unresolvable": _spec(unresolvable, "payload"),
        "fine": _spec(send),
    }
    _healthy(registry)
    with pytest.raises(ConfigurationError) as caught:
        registry.validate(actors)
    assert not isinstance(caught.value, (MissingProvider, ScopeViolation))
    lines = str(caught.value).splitlines()
    assert lines[0] == "invalid actor signatures:"
    problems = dict(line.strip().split(": ", 1) for line in lines[1:])
    assert set(problems) == {
        "actor 'no_parameters'",
        "actor 'payload_not_first'",
        "actor 'positional_only'",
        "actor 'generator'",
        "actor 'unresolvable'",
    }
    assert problems["actor 'no_parameters'"].startswith("its first parameter must be the payload")
    assert problems["actor 'payload_not_first'"].startswith("its first parameter must be")
    assert "positional-only" in problems["actor 'positional_only'"]
    assert "generator function" in problems["actor 'generator'"]
    assert "name 'Decimal' is not defined" in problems["actor 'unresolvable'"]


class TinyRateLimits:
    """Stands in for the RateLimitRegistry: only the names matter here."""

    def __init__(self, rate_limits: set[str], reservations: set[str]) -> None:
        self.rate_limits = rate_limits
        self.reservations = reservations

    def has_rate_limit(self, name: str) -> bool:
        return name in self.rate_limits

    def has_reservation(self, name: str) -> bool:
        return name in self.reservations


def test_rate_limit_and_reservation_names_must_be_registered(registry: ProviderRegistry) -> None:
    _healthy(registry)
    limits = TinyRateLimits({"smtp", "api"}, {"gpu"})
    actors = {"send": _spec(send)}
    registry.validate(
        actors,
        rate_limit_registry=limits,
        actor_rate_limits={"send": (["smtp", "api"], ["gpu"])},
    )
    with pytest.raises(MissingProvider) as caught:
        registry.validate(
            actors,
            rate_limit_registry=limits,
            actor_rate_limits={"send": (["smtp", "ftp"], ["gpu", "tpu"]), "other": ((), ["gpu"])},
        )
    lines = str(caught.value).splitlines()
    assert lines[:3] == [
        "unknown rate-limit or reservation names:",
        "  actor 'send': rate limit 'ftp'",
        "  actor 'send': reservation 'tpu'",
    ]
    assert "RateLimitRegistry" in lines[3]


def test_names_are_not_checked_without_a_rate_limit_registry(registry: ProviderRegistry) -> None:
    _healthy(registry)
    registry.validate({"send": _spec(send)}, actor_rate_limits={"send": (["nowhere"], ["none"])})
