"""The provider registry: what can be injected, and the plan cache.

Providers declare their own dependencies through their signature (the type
hints of ``__init__`` for a class, the parameters of a factory), so
registering is one call per type::

    registry = ProviderRegistry()
    registry.register_value(Settings, settings)                  # PROCESS by default
    registry.register(Pool, open_pool, scope=Scope.LOOP)         # async generator: yield, teardown
    registry.register(Repository, Repository, scope=Scope.TRANSIENT)
    registry.register_context(Connection, pool.acquire, scope=Scope.TRANSIENT)

A resolution plan (parameter name → provider entry → effective scope) is
computed once per callable and cached; any registration clears the cache.
"""

from __future__ import annotations

from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
)
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, TypeAlias, TypeVar, cast

from taskq._di import _validate
from taskq._di.lifecycle import Lifecycle, detect_lifecycle
from taskq._di.solver import read_dependencies, type_name
from taskq._scope import Scope
from taskq.errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Collection

    from taskq._di._validate import ActorSpec, NameRegistry

__all__ = ["PlanStep", "Provider", "ProviderEntry", "ProviderRegistry"]

_T = TypeVar("_T")

#: Anything :meth:`ProviderRegistry.register` accepts for a type ``T``: a class,
#: a sync or async factory, a (async) generator function yielding once, or a
#: ``@contextmanager`` / ``@asynccontextmanager`` function.
Provider: TypeAlias = Callable[
    ...,
    _T
    | Awaitable[_T]
    | Iterator[_T]
    | AsyncIterator[_T]
    | AbstractContextManager[_T]
    | AbstractAsyncContextManager[_T],
]


@dataclass(frozen=True, eq=False, slots=True)
class ProviderEntry:
    """One registration: which type, provided by what, for how long.

    Entries compare by identity, so a replaced registration never shares
    cached values with the one it replaced.
    """

    key: object
    provider: object
    scope: Scope
    lifecycle: Lifecycle

    @property
    def name(self) -> str:
        """The provided type's name, for messages and logs."""
        return type_name(self.key)

    @property
    def factory(self) -> Callable[..., object]:
        """The provider as a callable; every lifecycle but ``VALUE`` has one."""
        return cast("Callable[..., object]", self.provider)


class PlanStep(NamedTuple):
    """How to fill one parameter: from *entry*, cached in *scope*'s container.

    *entry* is ``None`` when nothing provides *key*; that is an error unless
    the caller passes the parameter through.
    """

    name: str
    key: object
    entry: ProviderEntry | None
    scope: Scope


Plan: TypeAlias = tuple[PlanStep, ...]


class ProviderRegistry:
    """Registered providers, keyed by the type they provide.

    Registering a type twice raises :class:`ConfigurationError` unless
    ``replace=True`` (for tests that swap an implementation).
    """

    def __init__(self) -> None:
        self._entries: dict[object, ProviderEntry] = {}
        self._plans: dict[Callable[..., object], Plan] = {}
        self._raw_plans: dict[Callable[..., object], Plan] = {}

    def register(
        self,
        key: type[_T],
        provider: Provider[_T],
        *,
        scope: Scope = Scope.LOOP,
        replace: bool = False,
    ) -> ProviderEntry:
        """Provide *key* by calling *provider*; its lifecycle follows from its shape.

        - a class or sync function: its return value;
        - an ``async def`` function: its awaited result;
        - a generator / async generator function: the value it yields once;
          the code after ``yield`` is the teardown, run whatever happened (as a
          pytest fixture's);
        - a ``@contextmanager`` / ``@asynccontextmanager`` function: entered,
          and exited as the teardown, told the error that ended the scope (the
          actor's, for a TRANSIENT value) as ``with`` tells it: provide a
          transaction this way to have a failed job's work rolled back.

        *provider*'s own parameters are injected by type too. A worker creates
        the shared values (PROCESS, LOOP, THREAD for its event loop's thread) its
        actors need as it starts, before its first job: a slow provider delays the
        start, not a job, and one that raises stops the start. Teardown runs
        when *scope* ends, in reverse order of creation. A TRANSIENT value's
        teardown that raises after its actor returned (a commit that failed) fails
        the attempt, which is retried as any failure is, once the others have run;
        an actor's cancel, stop or time limit never interrupts that teardown.
        """
        if not callable(provider):
            raise TypeError(
                f"provider for {type_name(key)} is not callable; use register_value() for values"
            )
        return self._add(ProviderEntry(key, provider, scope, detect_lifecycle(provider)), replace)

    def register_value(
        self,
        key: type[_T],
        value: _T,
        *,
        scope: Scope = Scope.PROCESS,
        replace: bool = False,
    ) -> ProviderEntry:
        """Provide *key* as *value* itself, never called nor torn down."""
        return self._add(ProviderEntry(key, value, scope, Lifecycle.VALUE), replace)

    def register_context(
        self,
        key: type[_T],
        factory: Callable[..., AbstractAsyncContextManager[_T]],
        *,
        scope: Scope = Scope.LOOP,
        replace: bool = False,
    ) -> ProviderEntry:
        """Provide *key* as what entering ``factory(...)`` yields; exit is the teardown.

        For callables returning an async context manager that
        :meth:`register` would take as plain factories (a class implementing
        ``__aenter__``, a method like ``pool.acquire``).
        """
        entry = ProviderEntry(key, factory, scope, Lifecycle.ASYNC_CONTEXT_MANAGER)
        return self._add(entry, replace)

    def _add(self, entry: ProviderEntry, replace: bool) -> ProviderEntry:
        if not replace and entry.key in self._entries:
            raise ConfigurationError(
                f"{entry.name} already has a provider; pass replace=True to swap it"
            )
        self._entries[entry.key] = entry
        self._plans.clear()
        self._raw_plans.clear()
        return entry

    def get(self, key: object) -> ProviderEntry | None:
        """The entry providing *key*, if any."""
        return self._entries.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def entries(self) -> list[ProviderEntry]:
        """Every registered entry, in registration order."""
        return list(self._entries.values())

    def plan(self, func: Callable[..., object]) -> Plan:
        """The cached resolution plan for *func*'s parameters.

        The first plan built for a callable also checks that nothing it
        reaches depends on itself, so a cycle fails loudly instead of
        deadlocking on its own half-created value.
        """
        plan = self._plans.get(func)
        if plan is None:
            plan = self.raw_plan(func)
            _validate.check_cycles(self, [_validate.root_for(func)])
            self._plans[func] = plan
        return plan

    def raw_plan(self, func: Callable[..., object]) -> Plan:
        """:meth:`plan` without the cycle check (validation walks cycles itself).

        Parameters that nothing provides but that have a default are left to
        their default. A ``T | None`` parameter gets the union's provider, else
        ``T``'s.
        """
        plan = self._raw_plans.get(func)
        if plan is None:
            steps = []
            for dep in read_dependencies(func):
                key, entry = dep.key, self._entries.get(dep.key)
                if entry is None and dep.optional_of is not None:
                    # ``T | None``: the union's own provider first, else T's (a registered
                    # T went unused, None given), but not T's own provider asking for a
                    # T to build on (a cycle).
                    inner = self._entries.get(dep.optional_of)
                    if inner is not None and inner.provider is not func:
                        key, entry = dep.optional_of, inner
                if entry is None and dep.has_default:
                    continue
                scope = dep.scope
                if scope is None:
                    scope = entry.scope if entry is not None else Scope.TRANSIENT
                steps.append(PlanStep(dep.name, key, entry, scope))
            plan = self._raw_plans[func] = tuple(steps)
        return plan

    def validate(
        self,
        actors: Mapping[str, ActorSpec] | None = None,
        *,
        rate_limit_registry: NameRegistry | None = None,
        actor_rate_limits: Mapping[str, tuple[Collection[str], Collection[str]]] | None = None,
    ) -> None:
        """Check the whole dependency graph before any job runs.

        *actors* maps actor names to their function and passthrough names;
        *actor_rate_limits* maps actor names to the static names of their
        ``(rate_limits, reservations)``, checked when a *rate_limit_registry*
        is given. See :func:`taskq._di._validate.run_validation` for the phases.
        """
        _validate.run_validation(
            self,
            actors=actors or {},
            rate_limit_registry=rate_limit_registry,
            actor_rate_limits=actor_rate_limits or {},
        )
