"""Scope containers: where provided values are created, cached and torn down.

One :class:`ProcessScope` per worker process, one container per OS thread
(:class:`ThreadScope`), one per running event loop (:class:`LoopScope`) and
one per actor invocation (:func:`build_actor_scope`). A container creates a
value the first time it is asked for it, remembers its teardown, and on
close runs the teardowns in reverse order of creation: every one exactly
once, logging a failure and carrying on with the rest.

Concurrent first requests for the same value (two actor invocations on one
loop, or two threads) share one creation: the first caller creates it,
the others wait for it. A worker asks for its actors' shared values as it
starts (:func:`taskq._di.bootstrap.bootstrap`), so its jobs find them made.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import Executor, Future
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import structlog

from taskq._di.lifecycle import Lifecycle, Teardown, enter, enter_sync
from taskq._di.solver import (
    MISSING,
    Container,
    Containers,
    solve_dependencies,
    solve_dependencies_sync,
)
from taskq._scope import Scope
from taskq.errors import ConfigurationError

if TYPE_CHECKING:
    from taskq._di.registry import ProviderEntry, ProviderRegistry

__all__ = [
    "LoopScope",
    "ProcessScope",
    "ResolvedActorScope",
    "ScopeContainer",
    "ThreadScope",
    "build_actor_scope",
    "own_context",
]

_log = structlog.get_logger("taskq.di")


class _Abandoned(Exception):
    """The creator of a value was cancelled; a waiter should create it itself."""


class _Wait(NamedTuple):
    """Another caller is creating the value: wait on *future*."""

    future: Future[object]


class ScopeContainer:
    """The values of one scope instance, with their teardowns.

    Use it directly for a scope you manage yourself; :class:`ProcessScope`,
    :class:`ThreadScope`, :class:`LoopScope` and :func:`build_actor_scope`
    make the right ones for each scope.
    """

    def __init__(self, scope: Scope, *, context: contextvars.Context | None = None) -> None:
        self.scope = scope
        # Where a shared value is created (a copy of it): the context the scope was
        # opened in, not the one of the invocation that first asks for the value.
        if context is None and scope is not Scope.TRANSIENT:
            context = contextvars.copy_context()
        self._context = context
        self._values: dict[ProviderEntry, object] = {}
        # Values being created; the future exists only once someone waits for one.
        self._creating: dict[ProviderEntry, Future[object] | None] = {}
        self._teardowns: list[tuple[ProviderEntry, Teardown]] = []
        self._async_teardowns = 0
        # Guards _values/_creating together; never held across an await.
        self._lock = threading.Lock()
        self._closed = False
        self.teardown_failure: Exception | None = None
        """The first teardown that raised (logged, the others run on): for a TRANSIENT
        scope, what became of work its provider finishes on exit (a commit)."""

    def peek(self, entry: ProviderEntry) -> object:
        """Return the cached value for *entry*, or ``MISSING``."""
        return self._values.get(entry, MISSING)

    def _claim(self, entry: ProviderEntry) -> object:
        """Return the cached value, a :class:`_Wait`, or ``MISSING``: create it yourself."""
        with self._lock:
            value = self._values.get(entry, MISSING)
            if value is not MISSING:
                return value
            if self._closed:
                raise RuntimeError(
                    f"the {self.scope.name} scope is closed; cannot create {entry.name}"
                )
            if entry not in self._creating:
                self._creating[entry] = None
                return MISSING
            future = self._creating[entry]
            if future is None:
                future = self._creating[entry] = Future()
            return _Wait(future)

    def _publish(self, entry: ProviderEntry, value: object, teardown: Teardown | None) -> None:
        if teardown is not None:
            self._teardowns.append((entry, teardown))
            self._async_teardowns += entry.lifecycle.is_async
        with self._lock:
            self._values[entry] = value
            future = self._creating.pop(entry)
        if future is not None:
            future.set_result(value)

    def _fail(self, entry: ProviderEntry, exc: BaseException) -> None:
        with self._lock:
            future = self._creating.pop(entry)
        if future is not None:
            # Waiters must not inherit the creator's cancellation: they retry instead.
            future.set_exception(_Abandoned() if isinstance(exc, asyncio.CancelledError) else exc)

    async def get_or_create(
        self, entry: ProviderEntry, registry: ProviderRegistry, containers: Containers
    ) -> object:
        """Return the value for *entry*, creating it (and its dependencies) on first use."""
        while (claim := self._claim(entry)) is not MISSING:
            if not isinstance(claim, _Wait):
                return claim
            waiting = asyncio.wrap_future(claim.future)
            waiting.add_done_callback(_retrieved)  # read even if this waiter is gone
            try:
                # Shielded: a cancelled waiter must not cancel the shared creation.
                return await asyncio.shield(waiting)
            except _Abandoned:
                continue
        if self.scope is Scope.TRANSIENT:
            return await self._create(entry, registry, containers)
        # A shared value outlives the invocation that first asks for it: created on its
        # own, so that job's timeout or cancel does not cancel it for every other job
        # (a model taking longer to load than one job's timeout was never loaded), and
        # outside that job's context, so that a task it starts (a pool's health check)
        # does not log as that job (its id, actor, attempt) for the worker's life.
        context = None if self._context is None else self._context.copy()
        creation = asyncio.get_running_loop().create_task(
            self._create(entry, registry, containers), context=context
        )
        creation.add_done_callback(_retrieved)
        return await asyncio.shield(creation)

    async def _create(
        self, entry: ProviderEntry, registry: ProviderRegistry, containers: Containers
    ) -> object:
        try:
            kwargs = (
                {}
                if entry.lifecycle is Lifecycle.VALUE
                else await solve_dependencies(entry.factory, registry, containers, {})
            )
            value, teardown = await _enter_held(entry, kwargs, self.scope)
            if self._closed:
                # The scope closed while this was created (its creation outlives the job
                # that asked): no close would ever come for it, so it is closed now.
                if teardown is not None:
                    result = teardown(None)
                    if inspect.isawaitable(result):
                        await result
                raise RuntimeError(
                    f"the {self.scope.name} scope closed while {entry.name} was created"
                )
        except BaseException as exc:
            self._fail(entry, exc)
            raise
        self._publish(entry, value, teardown)
        return value

    def get_or_create_sync(
        self,
        entry: ProviderEntry,
        registry: ProviderRegistry,
        containers: Containers,
        loop: asyncio.AbstractEventLoop,
    ) -> object:
        """:meth:`get_or_create` from a worker thread that is not running *loop*.

        Synchronous providers of the PROCESS, THREAD and TRANSIENT scopes are
        created in the calling thread, so they see its THREAD-scoped values.
        LOOP-scoped values and async providers are created on *loop*, with
        their dependencies resolved there (the loop thread's THREAD values).
        """
        if self.scope is Scope.LOOP or entry.lifecycle.is_async:
            if self.scope is Scope.THREAD:
                raise ConfigurationError(
                    f"{entry.name} is THREAD-scoped but asynchronous; a sync actor's thread "
                    "has no event loop to create it on. Use Scope.LOOP or a sync provider."
                )
            return _run_on_loop(self.get_or_create(entry, registry, containers), loop)
        while (claim := self._claim(entry)) is not MISSING:
            if not isinstance(claim, _Wait):
                return claim
            try:
                return claim.future.result()
            except _Abandoned:
                continue
        try:
            kwargs = (
                {}
                if entry.lifecycle is Lifecycle.VALUE
                else solve_dependencies_sync(entry.factory, registry, containers, {}, loop)
            )
            value, teardown = enter_sync(entry.lifecycle, entry.provider, kwargs)
            if self._closed:  # closed while this was created: no close would come for it
                if teardown is not None:
                    teardown(None)
                raise RuntimeError(
                    f"the {self.scope.name} scope closed while {entry.name} was created"
                )
        except BaseException as exc:
            self._fail(entry, exc)
            raise
        self._publish(entry, value, teardown)
        return value

    @property
    def closes_synchronously(self) -> bool:
        """Whether every pending teardown is synchronous, so closing never awaits."""
        return not self._async_teardowns

    def _teardown_failed(self, entry: ProviderEntry, exc: BaseException) -> BaseException | None:
        """Log a teardown's failure. A ``BaseException`` (a ``CancelledError``) comes
        back, for the caller to re-raise once every other teardown has run."""
        if isinstance(exc, Exception):
            _log.error(
                "taskq.di-teardown-failed", scope=self.scope.name, provider=entry.name, exc_info=exc
            )
            if self.teardown_failure is None:
                self.teardown_failure = exc
            return None
        _log.warning(
            "taskq.di-teardown-interrupted",
            scope=self.scope.name,
            provider=entry.name,
            error=type(exc).__name__,
        )
        return exc

    def close_sync_suffix(self, error: BaseException | None = None) -> None:
        """Tear down, in the calling thread, the values created last whose teardowns are
        synchronous (every one, unless an async provider's came in between): the rest
        are :meth:`aclose`'s. Run from a sync actor's thread, so that what its providers
        made there is closed there (a thread-bound connection), not on the event loop
        (which a blocking teardown stalled). Failures are logged as in :meth:`aclose`."""
        deferred: BaseException | None = None
        while self._teardowns and not self._teardowns[-1][0].lifecycle.is_async:
            entry, teardown = self._teardowns.pop()
            try:
                teardown(error)
            except BaseException as exc:  # noqa: BLE001 - logged; carry on with the others
                interrupted = self._teardown_failed(entry, exc)  # every failure logged
                deferred = deferred or interrupted
        if deferred is not None:
            raise deferred

    def close_sync(self) -> None:
        """:meth:`aclose` in the calling thread, for a container whose teardowns are all
        synchronous (a THREAD one's: its providers cannot be async)."""
        if not self.closes_synchronously:
            raise RuntimeError(f"the {self.scope.name} scope has async teardowns: aclose it")
        self._closed = True
        try:
            self.close_sync_suffix()
        finally:
            with self._lock:
                self._values.clear()

    async def aclose(self, error: BaseException | None = None) -> None:
        """Tear down every value in reverse order of creation, then forget them.

        ``error`` is what ended the scope (an actor's exception), passed to each
        context manager provider's exit (generator providers resume as always). A
        teardown that raises something else is logged (``taskq.di-teardown-failed``)
        and the rest still run. A ``CancelledError`` (or other ``BaseException``) met
        on the way is re-raised once every teardown has run. Closing twice is
        harmless; a closed container refuses to create values.
        """
        self._closed = True
        deferred: BaseException | None = None
        while self._teardowns:
            # Popping before running makes each teardown run exactly once.
            entry, teardown = self._teardowns.pop()
            try:
                result = teardown(error)
                if inspect.isawaitable(result):
                    await result
            except BaseException as exc:  # noqa: BLE001 - logged; carry on with the others
                interrupted = self._teardown_failed(entry, exc)  # every failure logged
                deferred = deferred or interrupted
        self._async_teardowns = 0
        with self._lock:
            self._values.clear()
        if deferred is not None:
            raise deferred


async def _enter_held(
    entry: ProviderEntry, kwargs: Mapping[str, object], scope: Scope
) -> tuple[object, Teardown | None]:
    """:func:`enter`, an async context manager or generator in a task of its own that
    stays until the teardown, which it runs: one entered in a job's task and exited in
    another (the teardown's, the stop's) broke whatever checks the task it was entered
    in (an anyio task group or cancel scope: "exit cancel scope in a different task"),
    and a context variable it set could not be reset: a TRANSIENT one failed its job,
    a shared one's cleanup never ran."""
    lifecycle, provider = entry.lifecycle, entry.provider
    if (
        lifecycle is not Lifecycle.ASYNC_CONTEXT_MANAGER
        and lifecycle is not Lifecycle.ASYNC_GENERATOR
    ):
        return await enter(lifecycle, provider, kwargs)
    loop = asyncio.get_running_loop()
    entered: asyncio.Future[object] = loop.create_future()
    entered.add_done_callback(_retrieved)  # read even if its waiter was cancelled
    release: asyncio.Future[BaseException | None] = loop.create_future()
    # A TRANSIENT value's task runs in its invocation's own context, so that what the
    # provider sets there (a context variable) is what the actor sees.
    context = _current_context() if scope is Scope.TRANSIENT else None
    holder = loop.create_task(
        _hold(lifecycle, provider, kwargs, entered, release),
        name=f"taskq-provider-{entry.name}",  # what a stop held up by its exit names
        context=context,
    )
    try:
        value = await asyncio.shield(entered)
    except asyncio.CancelledError as exc:
        # Cut while it entered (a job's limit or cancel): it is cut too, or undone if it
        # had just entered, before the cancellation goes on: nothing is left open. The
        # release comes either way: a provider that enters all the same (its cut was
        # swallowed, as asyncio.wait_for may before Python 3.12) is exited at once, not
        # held open by a task waiting for a release that never came.
        release.set_result(exc)
        if not entered.done():
            holder.cancel()
        await asyncio.wait({holder})
        raise
    return value, functools.partial(_release, release, holder)


async def _hold(
    lifecycle: Lifecycle,
    provider: object,
    kwargs: Mapping[str, object],
    entered: asyncio.Future[object],
    release: asyncio.Future[BaseException | None],
) -> None:
    try:
        value, teardown = await enter(lifecycle, provider, kwargs)
    except asyncio.CancelledError:
        entered.cancel()
        return
    except BaseException as exc:  # noqa: BLE001 - the waiter's to raise
        entered.set_exception(exc)
        return
    assert teardown is not None, "async context managers and generators have a teardown"
    entered.set_result(value)
    try:
        error = await release
    except asyncio.CancelledError as exc:
        # The loop is ending with the value still open: it is closed all the same.
        await cast("Awaitable[None]", teardown(exc))
        raise
    await cast("Awaitable[None]", teardown(error))


async def _release(
    release: asyncio.Future[BaseException | None],
    holder: asyncio.Task[None],
    error: BaseException | None,
) -> None:
    """A held value's teardown: its task exits it; shielded, a cancelled closer does not
    cut the provider's cleanup."""
    if not release.done():
        release.set_result(error)
    await asyncio.shield(holder)


def _retrieved(future: asyncio.Future[object]) -> None:
    """Mark an outcome read: one nobody awaits any more (its waiter or creator was
    cancelled) is not reported as "never retrieved"."""
    if not future.cancelled():
        future.exception()


def _run_on_loop(coro: Coroutine[Any, Any, object], loop: asyncio.AbstractEventLoop) -> object:
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        # Blocking on the loop from its own thread would deadlock.
        raise RuntimeError("sync resolution ran on the event loop's thread; run it in a worker")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    invocation = _RESOLVING.get()
    if invocation is not None and not invocation.awaits(future):
        future.cancel()
    return future.result()


_RESOLVING: contextvars.ContextVar[ResolvedActorScope | None] = contextvars.ContextVar(
    "taskq_resolving", default=None
)
"""The sync actor invocation whose dependencies the calling thread resolves."""


class ProcessScope(ScopeContainer):
    """The PROCESS-scoped values: one container for the whole worker process."""

    def __init__(self) -> None:
        super().__init__(Scope.PROCESS)


class ThreadScope:
    """The THREAD-scoped values: one container per OS thread.

    It stands in for a container (pass it as ``containers[Scope.THREAD]``)
    and forwards each call to the calling thread's container, so a sync
    actor running in a worker thread gets that thread's values.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._containers: list[ScopeContainer] = []
        self._lock = threading.Lock()
        self._context = contextvars.copy_context()  # the containers' (ScopeContainer)

    def current(self) -> ScopeContainer:
        """The calling thread's container, created on first use."""
        container: ScopeContainer | None = getattr(self._local, "container", None)
        if container is None:
            container = ScopeContainer(Scope.THREAD, context=self._context)
            self._local.container = container
            with self._lock:
                self._containers.append(container)
        return container

    def peek(self, entry: ProviderEntry) -> object:
        """Return the calling thread's cached value for *entry*, or ``MISSING``."""
        return self.current().peek(entry)

    async def get_or_create(
        self, entry: ProviderEntry, registry: ProviderRegistry, containers: Containers
    ) -> object:
        """Return the calling thread's value for *entry*, creating it on first use."""
        return await self.current().get_or_create(entry, registry, containers)

    def get_or_create_sync(
        self,
        entry: ProviderEntry,
        registry: ProviderRegistry,
        containers: Containers,
        loop: asyncio.AbstractEventLoop,
    ) -> object:
        """:meth:`get_or_create` from a worker thread."""
        return self.current().get_or_create_sync(entry, registry, containers, loop)

    def close_current(self) -> None:
        """Close the calling thread's container, in this thread: what a THREAD provider
        made is often bound to its thread (sqlite refuses a close from another one).
        :meth:`aclose` closes the containers left."""
        container: ScopeContainer | None = getattr(self._local, "container", None)
        if container is None or not container.closes_synchronously:
            return  # an async teardown (none is allowed here) is aclose's
        with self._lock:
            if container not in self._containers:
                return  # aclose took it
            self._containers.remove(container)
        container.close_sync()

    async def aclose(self) -> None:
        """Close every thread's container, newest first, from the calling thread.

        THREAD-scoped providers are synchronous, so their teardowns run
        inline here; a ``BaseException`` from one container is re-raised
        after all were closed.
        """
        with self._lock:
            containers, self._containers = self._containers, []
        deferred: BaseException | None = None
        for container in reversed(containers):
            try:
                await container.aclose()
            except BaseException as exc:  # noqa: BLE001 - re-raised once all containers closed
                deferred = deferred or exc
        if deferred is not None:
            raise deferred


class LoopScope:
    """The LOOP-scoped values: one container per running event loop.

    Pass ``loops.current()`` as ``containers[Scope.LOOP]`` from the loop
    that runs the actors, and ``await loops.aclose()`` on that loop when it
    stops.
    """

    def __init__(self) -> None:
        self._containers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ScopeContainer]
        self._containers = weakref.WeakKeyDictionary()
        self._context = contextvars.copy_context()  # the containers' (ScopeContainer)
        # The last answer: a worker asks once per job, always from the same loop, and
        # a WeakKeyDictionary lookup makes a new weak reference every time.
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], ScopeContainer] | None = None

    def current(self) -> ScopeContainer:
        """The running loop's container, created on first use."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            return last[1]
        container = self._containers.get(loop)
        if container is None:
            container = ScopeContainer(Scope.LOOP, context=self._context)
            self._containers[loop] = container
        self._last = (weakref.ref(loop), container)
        return container

    async def aclose(self) -> None:
        """Close the running loop's container (its async teardowns need this loop)."""
        loop = asyncio.get_running_loop()
        if self._last is not None and self._last[0]() is loop:
            self._last = None
        container = self._containers.pop(loop, None)
        if container is not None:
            await container.aclose()


class ResolvedActorScope:
    """One actor invocation, its arguments resolved; yielded by :func:`build_actor_scope`.

    For an async actor :attr:`kwargs` holds every argument. A sync actor's
    dependencies are resolved in the thread that runs it, by
    :meth:`call_sync`, so that it gets that thread's THREAD-scoped values;
    until then its :attr:`kwargs` holds only the passthrough arguments.
    """

    __slots__ = (
        "_abort",
        "_awaiting",
        "_containers",
        "_in_thread",
        "_loop",
        "_registry",
        "_thread_lock",
        "_when_thread_ends",
        "closed_clean",
        "func",
        "is_async",
        "kwargs",
    )

    def __init__(
        self,
        func: Callable[..., object],
        kwargs: dict[str, object],
        *,
        is_async: bool,
        registry: ProviderRegistry,
        containers: Containers,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.func = func
        self.kwargs = kwargs
        self.is_async = is_async
        self._registry = registry
        self._containers = containers
        self._loop = loop
        self._in_thread = False
        self._when_thread_ends: Callable[[], object] | None = None
        self._thread_lock = None if is_async else threading.Lock()
        self._abort: BaseException | None = None
        # What its thread last waited for on the loop (an async dependency being made).
        self._awaiting: Future[object] | None = None
        self.closed_clean = False
        """A sync actor's: its thread returned and closed its values told of no error
        (a transaction committed), the invocation's outcome since."""

    async def invoke(self, executor: Executor | None = None) -> object:
        """Call the actor: awaited if async, else in *executor* (default: the loop's).

        Cancelling a sync actor stops the wait, not its thread: the thread runs
        on, closes its synchronous TRANSIENT values as it ends, and
        :func:`build_actor_scope` the others once it has (:meth:`defer_while_in_thread`).
        """
        if self.is_async:
            return await cast("Awaitable[object]", self.func(**self.kwargs))
        return await self.start_in_thread(executor)

    def start_in_thread(self, executor: Executor | None = None) -> asyncio.Future[object]:
        """Start a sync actor in *executor* (default: the loop's); the future of its result.

        A plain future, not a task: what the thread raises is the future's to give
        to whoever awaits it, ``SystemExit`` included (a task re-raises that out of
        the event loop, ending the worker).
        """
        context = contextvars.copy_context()
        return self._loop.run_in_executor(executor, context.run, self.call_sync)

    def call_sync(self) -> object:
        """Resolve a sync actor's dependencies in the calling thread, then call it.

        Run it in the thread that should own the actor's THREAD-scoped values,
        never on the event loop's thread.
        """
        lock = self._thread_lock
        assert lock is not None, "call_sync is for sync actors"
        with lock:
            self._in_thread = True
        error: BaseException | None = None
        try:
            resolving = _RESOLVING.set(self)  # what abort_thread cuts on the loop
            try:
                kwargs = solve_dependencies_sync(
                    self.func, self._registry, self._containers, self.kwargs, self._loop
                )
            finally:
                _RESOLVING.reset(resolving)
            with lock:
                error = self._abort
            if error is not None:
                # Its wait ended (its limit, a cancel, a stop) before the body started:
                # started now, it did its work for an outcome already decided (a stop's
                # job, handed back, ran twice). Its values are closed told of that.
                return None
            return self.func(**kwargs)
        except BaseException as exc:
            error = exc
            raise
        finally:
            try:
                transient = self._containers.get(Scope.TRANSIENT)
                if isinstance(transient, ScopeContainer):
                    with lock:  # told of the abort, or the clean close is the outcome
                        if error is None:
                            error = self._abort
                        self.closed_clean = error is None
                    transient.close_sync_suffix(error)
                    if error is None and transient.teardown_failure is not None:
                        # The actor returned, but its work did not finish (a commit
                        # failed): the attempt fails on it, so the job is retried.
                        raise transient.teardown_failure
            finally:
                with lock:
                    self._in_thread = False
                    then = self._when_thread_ends
                if then is not None:
                    try:
                        self._loop.call_soon_threadsafe(then)
                    except RuntimeError:  # the loop is closed: the process is ending
                        _log.warning("taskq.di-transient-scope-left-open", actor=self.func.__name__)

    def abort_thread(self, error: BaseException) -> bool:
        """A sync actor's wait ended (past its limit, cancelled) while its thread may run
        on: its values are to be closed told of ``error`` (a transaction rolls back).
        False when the thread had already closed them clean: it finished in time."""
        if self._thread_lock is None:
            return True
        with self._thread_lock:
            if self.closed_clean:
                return False
            self._abort = error
            awaiting = self._awaiting
        if awaiting is not None:
            # Its thread waits for a dependency made on the loop (a connection from a
            # pool with none free): cut as an async actor's would be, where the limit
            # left the thread, and the job, waiting for as long as that took.
            awaiting.cancel()
        return True

    def awaits(self, future: Future[object]) -> bool:
        """Note that the thread waits for *future* on the loop, to be cancelled with
        :meth:`abort_thread`; False when the wait has already ended: do not wait."""
        assert self._thread_lock is not None, "a sync actor's thread waits"
        with self._thread_lock:
            if self._abort is not None:
                return False
            self._awaiting = future
            return True

    def defer_while_in_thread(self, then: Callable[[], object]) -> bool:
        """If a sync actor's thread still runs (its wait was cancelled: a timeout, a
        forced cancel), have ``then`` called on the loop once it ends, and return True;
        else False. A thread that starts later finds the scope closed and creates
        nothing."""
        if self._thread_lock is None:
            return False
        with self._thread_lock:
            if not self._in_thread:
                return False
            self._when_thread_ends = then
            return True


def passthrough_scope(
    func: Callable[..., object],
    registry: ProviderRegistry,
    containers: Containers,
    passthrough_kwargs: Mapping[str, object],
) -> ResolvedActorScope | None:
    """The invocation of *func* when every parameter it needs is passed through, else None.

    Then there is nothing to resolve and no TRANSIENT value to tear down, so the
    invocation needs no scope around it (for a no-op actor, ~2.5 µs against ~7 µs
    through :func:`build_actor_scope`'s context manager and TRANSIENT container).
    """
    if any(step.name not in passthrough_kwargs for step in registry.plan(func)):
        return None
    return ResolvedActorScope(
        func,
        dict(passthrough_kwargs),
        is_async=inspect.iscoroutinefunction(func),
        registry=registry,
        containers=containers,
        loop=asyncio.get_running_loop(),
    )


@asynccontextmanager
async def build_actor_scope(
    func: Callable[..., object],
    registry: ProviderRegistry,
    containers: Containers,
    passthrough_kwargs: Mapping[str, object],
) -> AsyncIterator[ResolvedActorScope]:
    """Open a TRANSIENT scope for one invocation of *func* and resolve its arguments.

    *containers* maps PROCESS, THREAD and LOOP to their containers
    (``process``, ``threads``, ``loops.current()``); the TRANSIENT one is
    created here. On exit the TRANSIENT values are torn down in reverse
    order, shielded from cancellation: a ``CancelledError`` (from the body
    or during teardown) is re-raised only after every teardown ran. When the body
    ended without error, the first teardown that raised (a provider's commit) is
    raised once every teardown ran: the invocation did not finish its work. A sync
    actor's thread closes its synchronous values itself as it ends
    (:meth:`ScopeContainer.close_sync_suffix`), told of its error or of the
    limit or cancel that ended its wait (:meth:`ResolvedActorScope.abort_thread`).
    """
    transient = ScopeContainer(Scope.TRANSIENT)
    scoped: dict[Scope, Container] = {**containers, Scope.TRANSIENT: transient}
    is_async = inspect.iscoroutinefunction(func)
    resolved: ResolvedActorScope | None = None
    error: BaseException | None = None
    try:
        if is_async:
            kwargs = await solve_dependencies(func, registry, scoped, passthrough_kwargs)
        else:
            kwargs = dict(passthrough_kwargs)
        resolved = ResolvedActorScope(
            func,
            kwargs,
            is_async=is_async,
            registry=registry,
            containers=scoped,
            loop=asyncio.get_running_loop(),
        )
        yield resolved
    except BaseException as exc:
        error = exc  # the providers' teardown is told (a transaction rolls back)
        raise
    finally:
        # A sync actor whose thread runs on still uses (or is creating) its values:
        # closing now would pull them from under it, or miss what it creates next.
        if resolved is None or not resolved.defer_while_in_thread(
            lambda: _close_later(transient, error)
        ):
            await _aclose_shielded(transient, error)
            if error is None and transient.teardown_failure is not None:
                # The actor returned, but its work did not finish (a commit failed):
                # the invocation fails on it, so the job is retried, not succeeded.
                raise transient.teardown_failure


_CLOSING_LATER: set[asyncio.Task[None]] = set()
"""TRANSIENT scopes closing after their actor's thread ended (held until done)."""


def _close_later(container: ScopeContainer, error: BaseException | None) -> None:
    task = asyncio.get_running_loop().create_task(container.aclose(error))
    _CLOSING_LATER.add(task)
    task.add_done_callback(_CLOSING_LATER.discard)


_OWN_CONTEXT: contextvars.ContextVar[contextvars.Context | None] = contextvars.ContextVar(
    "taskq_own_context", default=None
)
_PROBE: contextvars.ContextVar[object] = contextvars.ContextVar("taskq_context_probe")


def own_context() -> contextvars.Context:
    """A copy of the current context, for ``create_task(..., context=own_context())``.

    A task started in it has its TRANSIENT teardowns run in its very context, not a
    copy (Python 3.11 cannot name a task's context otherwise): a provider that set a
    context variable on entry (``token = var.set(...)``) can reset it on exit.
    """
    context = contextvars.copy_context()
    context.run(_OWN_CONTEXT.set, context)
    return context


def _current_context() -> contextvars.Context | None:
    """The calling task's context object itself, when it can be named; else None."""
    task = asyncio.current_task()
    get_context = getattr(task, "get_context", None)  # Python 3.12+
    if get_context is not None:
        return cast("contextvars.Context", get_context())
    own = _OWN_CONTEXT.get()
    if own is None:
        return None
    # A task started from an own_context() task inherits a copy that names the parent's:
    # only a value set here and seen there proves it is this one.
    probe = object()
    token = _PROBE.set(probe)
    try:
        return own if own.get(_PROBE) is probe else None
    finally:
        _PROBE.reset(token)


async def _aclose_shielded(container: ScopeContainer, error: BaseException | None) -> None:
    if container.closes_synchronously:
        # Nothing in it awaits, so no cancellation can land: skip the task and shield.
        await container.aclose(error)
        return
    # In a task of its own, which the caller's cancellation cannot cut, but in the
    # caller's context (not a copy): a context variable a provider set as it entered
    # is reset as it exits ("token created in a different Context" failed every job).
    closing = asyncio.get_running_loop().create_task(
        container.aclose(error), context=_current_context()
    )
    cancelled: asyncio.CancelledError | None = None
    while not closing.done():
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError as exc:
            # Keep waiting: the teardowns must all run before cancellation goes on.
            cancelled = exc
    if cancelled is not None:
        raise cancelled
    closing.result()
