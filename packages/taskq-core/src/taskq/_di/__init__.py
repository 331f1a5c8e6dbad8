"""The dependency-injection engine: providers, scopes, resolution and validation.

Actors and providers declare what they need through type hints; the
:class:`ProviderRegistry` knows what provides each type and for how long
(:class:`Scope`), the scope containers create, cache and tear the values
down, :func:`bootstrap` creates a worker's shared values before its first job,
and :func:`build_actor_scope` resolves one actor invocation
(:func:`passthrough_scope` one that needs nothing resolved).
"""

from __future__ import annotations

from taskq._di._validate import ActorSpec as ActorSpec
from taskq._di._validate import NameRegistry as NameRegistry
from taskq._di.bootstrap import bootstrap as bootstrap
from taskq._di.lifecycle import Lifecycle as Lifecycle
from taskq._di.registry import Provider as Provider
from taskq._di.registry import ProviderEntry as ProviderEntry
from taskq._di.registry import ProviderRegistry as ProviderRegistry
from taskq._di.scopes import LoopScope as LoopScope
from taskq._di.scopes import ProcessScope as ProcessScope
from taskq._di.scopes import ResolvedActorScope as ResolvedActorScope
from taskq._di.scopes import ScopeContainer as ScopeContainer
from taskq._di.scopes import ThreadScope as ThreadScope
from taskq._di.scopes import build_actor_scope as build_actor_scope
from taskq._di.scopes import own_context as own_context
from taskq._di.scopes import passthrough_scope as passthrough_scope
from taskq._di.solver import Container as Container
from taskq._di.solver import Containers as Containers
from taskq._di.solver import solve_dependencies as solve_dependencies
from taskq._scope import Scope as Scope

__all__ = [
    "ActorSpec",
    "Container",
    "Containers",
    "Lifecycle",
    "LoopScope",
    "NameRegistry",
    "ProcessScope",
    "Provider",
    "ProviderEntry",
    "ProviderRegistry",
    "ResolvedActorScope",
    "Scope",
    "ScopeContainer",
    "ThreadScope",
    "bootstrap",
    "build_actor_scope",
    "own_context",
    "passthrough_scope",
    "solve_dependencies",
]
