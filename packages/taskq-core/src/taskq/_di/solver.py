"""Turn a callable's signature into keyword arguments.

The solver reads what a callable needs (its parameters' types, with
``Annotated[T, Scope.X]`` overriding the scope) and asks the container of
each dependency's scope for the value. It never calls a provider itself:
creating, caching and tearing down values is the containers' job
(architecture, Decision 6), so the solver's hot path is a loop of dict
lookups over a cached plan.
"""

from __future__ import annotations

import functools
import inspect
from asyncio import AbstractEventLoop
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import UnionType
from typing import (
    TYPE_CHECKING,
    Annotated,
    Protocol,
    TypeAlias,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from taskq._scope import Scope
from taskq.errors import ConfigurationError, MissingProvider

if TYPE_CHECKING:
    from taskq._di.registry import ProviderEntry, ProviderRegistry

__all__ = [
    "MISSING",
    "Container",
    "Containers",
    "Dependency",
    "read_dependencies",
    "solve_dependencies",
    "solve_dependencies_sync",
    "type_name",
]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: What :meth:`Container.peek` returns when no value is cached.
MISSING: object = _Missing()


class Container(Protocol):
    """Where the values of one scope live.

    :class:`~taskq._di.scopes.ScopeContainer` holds them;
    :class:`~taskq._di.scopes.ThreadScope` forwards to the calling thread's
    container.
    """

    def peek(self, entry: ProviderEntry) -> object:
        """Return the cached value for *entry*, or :data:`MISSING`."""
        ...

    async def get_or_create(
        self, entry: ProviderEntry, registry: ProviderRegistry, containers: Containers
    ) -> object:
        """Return the cached value for *entry*, creating it on first use."""
        ...

    def get_or_create_sync(
        self,
        entry: ProviderEntry,
        registry: ProviderRegistry,
        containers: Containers,
        loop: AbstractEventLoop,
    ) -> object:
        """Like :meth:`get_or_create`, from a thread that is not running *loop*."""
        ...


#: One container per scope, as the solver receives them.
Containers: TypeAlias = Mapping[Scope, Container]


@dataclass(frozen=True, slots=True)
class Dependency:
    """One parameter of a callable, as injection sees it."""

    name: str
    #: The parameter's type with ``Annotated`` stripped; ``None`` if unannotated.
    key: object
    #: The scope named in ``Annotated[T, Scope.X]``, if any.
    scope: Scope | None
    has_default: bool
    #: ``T`` when ``key`` is ``T | None``: looked up when ``key`` itself is not provided.
    optional_of: object | None = None


def type_name(key: object) -> str:
    """A short, readable name for a dependency key, for messages."""
    if isinstance(key, type):
        return key.__qualname__
    return "<unannotated>" if key is None else repr(key)


def _hint_source(func: Callable[..., object]) -> object:
    # get_type_hints needs the function that carries the annotations.
    if inspect.isclass(func):
        return func.__init__
    if isinstance(func, functools.partial):
        return _hint_source(func.func)  # a partial of a class: its __init__'s
    if inspect.isroutine(func):
        return func
    return type(func).__call__


def read_dependencies(func: Callable[..., object]) -> tuple[Dependency, ...]:
    """Read the injectable parameters of *func* (``__init__`` for a class).

    ``*args`` and ``**kwargs`` are skipped, and so are positional-only
    parameters that have a default. Raises :class:`ConfigurationError` when
    the signature or type hints cannot be read, or a positional-only
    parameter has no default (values are injected by keyword).
    """
    label = getattr(func, "__qualname__", repr(func))
    try:
        parameters = inspect.signature(func).parameters.values()
    except ValueError as exc:  # a builtin without one (dict, threading.Lock)
        raise ConfigurationError(
            f"cannot read the signature of {label} ({exc}); register a function that "
            f"calls it instead, e.g. `lambda: {label}()`"
        ) from exc
    try:
        hints = get_type_hints(_hint_source(func), include_extras=True)
    except Exception as exc:
        # Evaluating a hint may raise anything: a NameError, an attribute missing from
        # a module, a string that is no expression (SyntaxError).
        raise ConfigurationError(
            f"cannot read the signature of {label}: {exc}. Annotate its parameters with types "
            "importable at run time (not only under `if TYPE_CHECKING`)."
        ) from exc
    # A keyword a partial binds reads as a parameter with a default: it is the
    # partial's to give, never injected over.
    bound = func.keywords if isinstance(func, functools.partial) else {}
    dependencies = []
    for param in parameters:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name in bound:
            continue
        has_default = param.default is not param.empty
        if param.kind is param.POSITIONAL_ONLY:
            if has_default:
                continue
            raise ConfigurationError(
                f"parameter {param.name!r} of {label} is positional-only, so it cannot be "
                "injected by keyword; make it a regular parameter"
            )
        annotation = hints.get(param.name)
        if annotation is None and not isinstance(param.annotation, str):
            # A signature of its own (``__signature__``: a pydantic model's fields), whose
            # annotations the hints of ``__init__`` (``**data``) do not have.
            annotation = None if param.annotation is param.empty else param.annotation
        scope = None
        if get_origin(annotation) is Annotated:
            annotation, *metadata = get_args(annotation)
            scope = _scope_in(metadata)
        optional_of = _optional_of(annotation)
        if get_origin(optional_of) is Annotated:
            # ``Annotated[T, Scope.X] | None`` (an alias made optional): T, in that scope.
            optional_of, *metadata = get_args(optional_of)
            scope = scope if scope is not None else _scope_in(metadata)
        dependencies.append(Dependency(param.name, annotation, scope, has_default, optional_of))
    return tuple(dependencies)


def _scope_in(metadata: list[object]) -> Scope | None:
    return next((item for item in metadata if isinstance(item, Scope)), None)


def _optional_of(annotation: object) -> object | None:
    """``T`` for ``T | None`` (``Optional[T]``), else None."""
    if get_origin(annotation) in (Union, UnionType):
        members: list[object] = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(members) == 1 and len(get_args(annotation)) == 2:
            return members[0]
    return None


def _missing(func: Callable[..., object], name: str, key: object) -> MissingProvider:
    label = getattr(func, "__qualname__", repr(func))
    return MissingProvider(
        f"{label} needs {name}: {type_name(key)}, but no provider is registered for it. "
        f"Register one with ProviderRegistry.register(), or pass {name!r} through; "
        "ProviderRegistry.validate() reports this at start-up."
    )


async def solve_dependencies(
    func: Callable[..., object],
    registry: ProviderRegistry,
    scope_containers: Containers,
    passthrough_kwargs: Mapping[str, object],
) -> dict[str, object]:
    """Return the keyword arguments to call *func* with.

    Names in *passthrough_kwargs* (an actor's payload and ``ctx``) are taken
    from it and never looked up; every other parameter is resolved through
    the container of its effective scope. Raises :class:`MissingProvider`
    for a parameter nobody provides.
    """
    kwargs = dict(passthrough_kwargs)
    for name, key, entry, scope in registry.plan(func):
        if name in kwargs:
            continue
        if entry is None:
            raise _missing(func, name, key)
        container = scope_containers[scope]
        value = container.peek(entry)
        if value is MISSING:
            value = await container.get_or_create(entry, registry, scope_containers)
        kwargs[name] = value
    return kwargs


def solve_dependencies_sync(
    func: Callable[..., object],
    registry: ProviderRegistry,
    scope_containers: Containers,
    passthrough_kwargs: Mapping[str, object],
    loop: AbstractEventLoop,
) -> dict[str, object]:
    """:func:`solve_dependencies` for a worker thread (a sync actor's).

    Values are created in the calling thread where they can be; values that
    need *loop* (async providers, LOOP scope) are created on it.
    """
    kwargs = dict(passthrough_kwargs)
    for name, key, entry, scope in registry.plan(func):
        if name in kwargs:
            continue
        if entry is None:
            raise _missing(func, name, key)
        container = scope_containers[scope]
        value = container.peek(entry)
        if value is MISSING:
            value = container.get_or_create_sync(entry, registry, scope_containers, loop)
        kwargs[name] = value
    return kwargs
