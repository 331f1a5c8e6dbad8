"""Create a worker's shared values before its first job.

Left to the first job that needs it, a shared value (PROCESS, LOOP, or THREAD for
the event loop's thread) is created during that job: a slow synchronous provider
(a model loading for 40 s) then blocks the event loop while the loop-lag watchdog
is armed and other jobs' leases need their heartbeats, and a provider that cannot
work (bad credentials) fails every job instead of the start. :func:`bootstrap`
creates them at start-up instead, in the worker's own scope containers (the very
values its jobs get, torn down when the worker stops), dependencies first.

What stays at first use: TRANSIENT values (one per invocation, walked through for
the shared values they need), and the THREAD values of a sync actor's pool threads
(one per thread, made in the thread that runs the actor).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, NamedTuple

import structlog

from taskq._di._validate import provider_label
from taskq._di.lifecycle import Lifecycle
from taskq._di.solver import Containers
from taskq._scope import Scope
from taskq.errors import ConfigurationError

if TYPE_CHECKING:
    from taskq._di._validate import ActorSpec
    from taskq._di.registry import ProviderEntry, ProviderRegistry

__all__ = ["SharedNeed", "bootstrap", "shared_needs"]

_log = structlog.get_logger("taskq.di")


class SharedNeed(NamedTuple):
    """A shared value to create at start-up, and who first needs it (for messages)."""

    entry: ProviderEntry
    scope: Scope
    actor: str
    path: tuple[str, ...]
    """From the actor to this value: ``("actor 'predict'", "Model (LOOP)")``."""


def shared_needs(registry: ProviderRegistry, actors: Mapping[str, ActorSpec]) -> list[SharedNeed]:
    """The shared values *actors* need, transitively, each once, dependencies first.

    A value is looked for where a job would create it: an async actor resolves
    on the event loop's thread, a sync actor in a pool thread, whose THREAD values
    (and those of the sync providers made there) are that thread's own and are
    skipped; whatever is created on the loop (a LOOP value, an async provider) has
    its dependencies resolved on the loop's thread again. Values registered as such
    (``register_value``) are left out: there is nothing to create.
    """
    needs: list[SharedNeed] = []
    planned: set[tuple[ProviderEntry, Scope]] = set()
    walked: set[tuple[ProviderEntry, Scope, bool]] = set()

    def visit(
        func: Callable[..., object],
        passthrough: Collection[str],
        on_loop: bool,
        actor: str,
        path: tuple[str, ...],
    ) -> None:
        for step in registry.raw_plan(func):
            entry = step.entry
            if entry is None or step.name in passthrough:
                continue  # passed through, or left to its default (validation checked)
            scope = step.scope
            created_on_loop = on_loop or scope is Scope.LOOP or entry.lifecycle.is_async
            child = (*path, provider_label(entry, scope))
            if (entry, scope, created_on_loop) not in walked:
                walked.add((entry, scope, created_on_loop))
                if entry.lifecycle is not Lifecycle.VALUE:
                    visit(entry.factory, (), created_on_loop, actor, child)
            shared = scope is not Scope.TRANSIENT and (scope is not Scope.THREAD or on_loop)
            # A registered value needs no creating, and cannot fail.
            if shared and entry.lifecycle is not Lifecycle.VALUE and (entry, scope) not in planned:
                planned.add((entry, scope))
                needs.append(SharedNeed(entry, scope, actor, child))

    for name, spec in actors.items():
        # An async actor's dependencies are resolved on the loop, a sync one's in its thread.
        on_loop = inspect.iscoroutinefunction(spec.func)
        visit(spec.func, spec.passthrough, on_loop, name, (f"actor {name!r}",))
    return needs


async def bootstrap(
    registry: ProviderRegistry,
    actors: Mapping[str, ActorSpec],
    containers: Containers,
    *,
    stopping: asyncio.Event | None = None,
) -> int:
    """Create the shared values *actors* need in *containers*; return how many.

    Run it on the event loop that will run the actors, before the first job and
    before anything watches that loop's lag: a synchronous provider blocks it
    for as long as it takes. A provider that raises stops the bootstrap with a
    one-line :class:`ConfigurationError` naming the provider, its scope and the
    actor that needs it (the provider's error chained); the values created so far
    stay in *containers*, for the caller to close. Once *stopping* is set (a stop
    during a long start) it returns, creating no more: at once from the wait for an
    async provider (one that hangs must not hold the stop; its creation goes on, and
    the closed scope tears down what it makes), after a sync one (it holds the loop).
    """
    if not registry.entries():
        return 0  # nothing is provided: nothing to walk
    needs = shared_needs(registry, actors)
    if not needs:
        return 0
    started = time.monotonic()
    _log.info("taskq.di-bootstrap-started", values=len(needs))
    created = 0
    for need in needs:
        entry, scope = need.entry, need.scope
        try:
            made = await _unless_stopped(
                containers[scope].get_or_create(entry, registry, containers), stopping
            )
        except Exception as exc:
            error = " ".join(str(exc).split()) or "(no message)"
            provider = getattr(entry.provider, "__qualname__", None) or repr(entry.provider)
            via = f" (through {' -> '.join(need.path[1:-1])})" if len(need.path) > 2 else ""
            raise ConfigurationError(
                f"the worker cannot start: the {scope.name}-scoped provider of {entry.name} "
                f"({provider}), needed by actor {need.actor!r}{via}, raised "
                f"{type(exc).__name__}: {error}. Fix the provider or its configuration; "
                "no job was taken."
            ) from exc
        if not made:
            # `values`, as the finished start says it; `created` is a LogRecord attribute.
            _log.info("taskq.di-bootstrap-stopped", values=created, left=len(needs) - created)
            return created
        created += 1
    _log.info("taskq.di-bootstrapped", values=created, seconds=round(time.monotonic() - started, 3))
    return created


async def _unless_stopped(creation: Awaitable[object], stopping: asyncio.Event | None) -> bool:
    """Await *creation*; False, leaving it, when *stopping* is (or gets) set first."""
    if stopping is None:
        await creation
        return True
    if stopping.is_set():
        if inspect.iscoroutine(creation):
            creation.close()
        return False
    created = asyncio.ensure_future(creation)
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({created, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not created.done():
            # The wait only: a shared value's creation is shielded from its waiters.
            created.cancel()
    if not created.done() or created.cancelled():
        return False
    created.result()  # raises the provider's error
    return True
