"""Start-up validation of the dependency graph.

``ProviderRegistry.validate()`` runs five phases, each reporting every
problem it finds in one error (cycles stop at the first), with the full
dependency path from the actor or provider where the walk started:

1. actor signatures — the payload comes first and is passed through, the
   type hints resolve, nothing positional-only needs injecting
   (:class:`ConfigurationError`);
2. cycles — nothing depends on itself (:class:`ConfigurationError`);
3. the scope rule — nothing depends on a narrower scope, and nothing async
   is THREAD-scoped (:class:`ScopeViolation`);
4. missing providers (:class:`MissingProvider`);
5. the static rate-limit and reservation names each actor declares exist
   in the rate-limit registry, when one is given (:class:`MissingProvider`).

Every registered provider is checked, not only those actors reach: a
broken provider fails at start-up rather than on the first job using it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from taskq._di.lifecycle import Lifecycle
from taskq._di.solver import type_name
from taskq._scope import Scope
from taskq.context import Context
from taskq.errors import ConfigurationError, MissingProvider, ScopeViolation

if TYPE_CHECKING:
    from taskq._di.registry import ProviderEntry, ProviderRegistry

__all__ = [
    "ActorSpec",
    "NameRegistry",
    "Root",
    "check_cycles",
    "provider_label",
    "root_for",
    "run_validation",
]


class NameRegistry(Protocol):
    """The part of the rate-limit registry that validation reads."""

    def has_rate_limit(self, name: str) -> bool:
        """Whether a rate limit is statically registered under *name*."""
        ...

    def has_reservation(self, name: str) -> bool:
        """Whether a concurrency reservation is statically registered under *name*."""
        ...


class ActorSpec(NamedTuple):
    """An actor as validation sees it."""

    func: Callable[..., object]
    #: Parameters the caller passes by name: the payload's, and ``"ctx"``.
    passthrough: Collection[str]


@dataclass(frozen=True, slots=True)
class Root:
    """Where a walk of the dependency graph starts."""

    label: str
    func: Callable[..., object]
    scope: Scope
    passthrough: Collection[str] = ()
    entry: ProviderEntry | None = None


def root_for(func: Callable[..., object]) -> Root:
    """A root for any callable, resolved per invocation."""
    return Root(getattr(func, "__qualname__", repr(func)), func, Scope.TRANSIENT)


def provider_label(entry: ProviderEntry, scope: Scope) -> str:
    """How an error names a provider: its name and scope."""
    return f"{entry.name} ({scope.name})"


def run_validation(
    registry: ProviderRegistry,
    *,
    actors: Mapping[str, ActorSpec],
    rate_limit_registry: NameRegistry | None,
    actor_rate_limits: Mapping[str, tuple[Collection[str], Collection[str]]],
) -> None:
    """Run the five phases in order; raise on the first phase that finds problems."""
    _check_actor_signatures(registry, actors)
    roots = [
        Root(f"actor {name!r}", spec.func, Scope.TRANSIENT, spec.passthrough)
        for name, spec in actors.items()
    ]
    roots += [
        Root(provider_label(entry, entry.scope), entry.factory, entry.scope, entry=entry)
        for entry in registry.entries()
        if entry.lifecycle is not Lifecycle.VALUE
    ]
    check_cycles(registry, roots)
    violations, missing = _walk(registry, roots)
    if violations:
        raise ScopeViolation(
            "scope rule broken (a provider may depend only on its own scope or a wider one; "
            "PROCESS is widest, then THREAD, LOOP, TRANSIENT):\n  "
            + "\n  ".join(violations)
            + "\nWiden the dependency's scope, narrow the dependent's, or override one "
            "parameter with Annotated[T, Scope.X]."
        )
    if missing:
        raise MissingProvider(
            "no provider is registered for:\n  "
            + "\n  ".join(missing)
            + "\nRegister each type with ProviderRegistry.register() or register_value(), "
            "or remove the parameter."
        )
    if rate_limit_registry is not None:
        _check_names(rate_limit_registry, actor_rate_limits)


def _check_actor_signatures(registry: ProviderRegistry, actors: Mapping[str, ActorSpec]) -> None:
    problems = []
    for name, spec in actors.items():
        problem = _signature_problem(registry, spec)
        if problem is not None:
            problems.append(f"actor {name!r}: {problem}")
    if problems:
        raise ConfigurationError("invalid actor signatures:\n  " + "\n  ".join(problems))


def _signature_problem(registry: ProviderRegistry, spec: ActorSpec) -> str | None:
    func = spec.func
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        return "is a generator function; an actor returns its result, it does not yield"
    try:
        # Reading the plan resolves the hints and rejects positional-only parameters.
        registry.raw_plan(func)
        parameters = list(inspect.signature(func).parameters.values())
    except ConfigurationError as exc:
        return str(exc)
    if not parameters or parameters[0].name not in spec.passthrough:
        return (
            "its first parameter must be the payload, passed through by name "
            f"(passthrough: {sorted(spec.passthrough)})"
        )
    return None


def check_cycles(registry: ProviderRegistry, roots: Iterable[Root]) -> None:
    """Raise :class:`ConfigurationError` naming the first dependency cycle found."""
    finished: set[ProviderEntry] = set()
    for root in roots:
        on_path = [] if root.entry is None else [root.entry]
        _visit_for_cycles(registry, root.func, root.passthrough, [root.label], on_path, finished)
        if root.entry is not None:
            finished.add(root.entry)


def _visit_for_cycles(
    registry: ProviderRegistry,
    func: Callable[..., object],
    passthrough: Collection[str],
    labels: list[str],
    on_path: list[ProviderEntry],
    finished: set[ProviderEntry],
) -> None:
    for step in registry.raw_plan(func):
        entry = step.entry
        if (
            entry is None
            or step.name in passthrough
            or entry.lifecycle is Lifecycle.VALUE
            or entry in finished
        ):
            continue
        label = provider_label(entry, step.scope)
        if entry in on_path:
            raise ConfigurationError(
                f"dependency cycle: {' -> '.join([*labels, label])}. "
                "A provider cannot depend on itself, directly or indirectly; "
                "break the cycle by removing one of these parameters."
            )
        labels.append(label)
        on_path.append(entry)
        _visit_for_cycles(registry, entry.factory, (), labels, on_path, finished)
        labels.pop()
        on_path.pop()
        finished.add(entry)


def _fix(key: object, *, in_provider: bool) -> str:
    """What to do about a missing provider of ``key`` when it is not to register one."""
    if key is None:
        return " (no type hint: annotate the parameter with the type to inject)"
    if key is Context and in_provider:
        return (
            " (a provider cannot be given the job context: it is the actor's alone; have "
            "the actor pass what the provider needs from it)"
        )
    if key is Context:
        return " (the job context is passed by name: call the parameter ctx)"
    return ""


def _walk(registry: ProviderRegistry, roots: Iterable[Root]) -> tuple[list[str], list[str]]:
    """Collect scope violations and missing providers, each with its path."""
    violations: list[str] = []
    missing: list[str] = []
    seen: set[tuple[ProviderEntry, Scope]] = set()

    def visit(func: Callable[..., object], scope: Scope, skip: Collection[str], path: str) -> None:
        in_provider = func is not root_func
        for step in registry.raw_plan(func):
            entry = step.entry
            if step.name in skip:
                continue
            if entry is None:
                fix = _fix(step.key, in_provider=in_provider)
                missing.append(f"{path} -> {step.name}: {type_name(step.key)}{fix}")
                continue
            child = f"{path} -> {provider_label(entry, step.scope)}"
            if step.scope > scope:
                violations.append(
                    f"{child}: a {scope.name}-scoped value would outlive the "
                    f"{step.scope.name}-scoped {entry.name} it holds"
                )
            _check_thread_async(entry, step.scope, child, violations)
            if entry.lifecycle is not Lifecycle.VALUE and (entry, step.scope) not in seen:
                seen.add((entry, step.scope))
                visit(entry.factory, step.scope, (), child)

    root_func: Callable[..., object] | None = None
    for root in roots:
        root_func = root.func if root.entry is None else None
        if root.entry is not None:
            if (root.entry, root.scope) in seen:
                continue
            seen.add((root.entry, root.scope))
            _check_thread_async(root.entry, root.scope, root.label, violations)
        visit(root.func, root.scope, root.passthrough, root.label)
    return violations, missing


def _check_thread_async(
    entry: ProviderEntry, scope: Scope, path: str, violations: list[str]
) -> None:
    if scope is Scope.THREAD and entry.lifecycle.is_async:
        violations.append(
            f"{path}: {entry.name} is asynchronous, so it cannot be THREAD-scoped "
            "(a sync actor's thread has no event loop to create it on); "
            "use Scope.LOOP or a synchronous provider"
        )


def _check_names(
    rate_limit_registry: NameRegistry,
    actor_rate_limits: Mapping[str, tuple[Collection[str], Collection[str]]],
) -> None:
    unknown = []
    for actor, (rate_limits, reservations) in actor_rate_limits.items():
        unknown += [
            f"actor {actor!r}: rate limit {name!r}"
            for name in rate_limits
            if not rate_limit_registry.has_rate_limit(name)
        ]
        unknown += [
            f"actor {actor!r}: reservation {name!r}"
            for name in reservations
            if not rate_limit_registry.has_reservation(name)
        ]
    if unknown:
        raise MissingProvider(
            "unknown rate-limit or reservation names:\n  "
            + "\n  ".join(unknown)
            + "\nRegister these primitives with the RateLimitRegistry before validation, "
            "or fix the names in @actor(rate_limits=..., reservations=...)."
        )
