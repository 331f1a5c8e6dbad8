"""Provider lifecycles, read from the provider's shape.

The registry never asks how a value should be created or torn down: the
shape of what was registered says it. A generator function yields its value
once and runs the code after ``yield`` as teardown; a ``@contextmanager`` or
``@asynccontextmanager`` function is entered and exited; anything else
callable is a factory whose result is the value.

Classes are always plain factories, even when they implement the context
manager protocol: ``asyncio.Lock`` is an async context manager, and entering
it on injection would be wrong. To have a context manager entered, register
it with :meth:`~taskq._di.registry.ProviderRegistry.register_context`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from enum import Enum
from typing import Any, cast

__all__ = ["Lifecycle", "Teardown", "detect_lifecycle", "enter", "enter_sync"]

#: Undoes one provided value, told the error that ended its scope (None: none did);
#: returns an awaitable when the teardown is async.
Teardown = Callable[[BaseException | None], object]


class Lifecycle(Enum):
    """How a provider creates its value and what tears it down."""

    #: A ready value, returned as is; nothing to tear down.
    VALUE = "value"
    #: A class or sync function; its return value is provided.
    FACTORY = "factory"
    #: An ``async def`` function; its awaited result is provided.
    ASYNC_FACTORY = "async-factory"
    #: A generator function: the value is what it yields, teardown resumes it.
    GENERATOR = "generator"
    #: An async generator function, likewise.
    ASYNC_GENERATOR = "async-generator"
    #: A callable returning a context manager (``@contextmanager``): entered, then exited.
    CONTEXT_MANAGER = "context-manager"
    #: A callable returning an async context manager: entered, then exited.
    ASYNC_CONTEXT_MANAGER = "async-context-manager"

    @property
    def is_async(self) -> bool:
        """Whether creating (or tearing down) the value needs an event loop."""
        # Identity tests: Enum.__hash__ is Python code, and this runs per creation.
        return (
            self is Lifecycle.ASYNC_FACTORY
            or self is Lifecycle.ASYNC_GENERATOR
            or self is Lifecycle.ASYNC_CONTEXT_MANAGER
        )


def detect_lifecycle(provider: Callable[..., object]) -> Lifecycle:
    """Return the lifecycle that *provider*'s shape implies (never ``VALUE``)."""
    if inspect.isclass(provider):
        return Lifecycle.FACTORY
    # A callable instance's shape is the shape of its __call__.
    shape = (
        provider
        if inspect.isroutine(provider) or isinstance(provider, functools.partial)
        else type(provider).__call__
    )
    if inspect.isasyncgenfunction(shape):
        return Lifecycle.ASYNC_GENERATOR
    if inspect.isgeneratorfunction(shape):
        return Lifecycle.GENERATOR
    if inspect.iscoroutinefunction(shape):
        return Lifecycle.ASYNC_FACTORY
    # @asynccontextmanager / @contextmanager keep the generator in __wrapped__ (of the
    # function a partial binds: unwrap does not look inside a partial).
    while isinstance(shape, functools.partial):
        shape = shape.func
    wrapped = inspect.unwrap(shape)
    if inspect.isasyncgenfunction(wrapped):
        return Lifecycle.ASYNC_CONTEXT_MANAGER
    if inspect.isgeneratorfunction(wrapped):
        return Lifecycle.CONTEXT_MANAGER
    return Lifecycle.FACTORY


def enter_sync(
    lifecycle: Lifecycle, provider: object, kwargs: Mapping[str, object]
) -> tuple[object, Teardown | None]:
    """Create a value with a synchronous lifecycle; return it and its teardown."""
    if lifecycle is Lifecycle.VALUE:
        return provider, None
    factory = cast("Callable[..., Any]", provider)
    if lifecycle is Lifecycle.FACTORY:
        value = factory(**kwargs)
        # A future (or task) may be the value itself: a signal jobs share. Any other
        # awaitable is a value still to come (a coroutine, asyncpg.create_pool's pool).
        if inspect.isawaitable(value) and not isinstance(value, asyncio.Future):
            if inspect.iscoroutine(value):
                value.close()  # never awaited: no "never awaited" warning either
            raise TypeError(
                f"provider {provider!r} returned an awaitable, not a value: a plain "
                f"function (a lambda) around an async one cannot be awaited here; register "
                f"the async function itself, or a functools.partial of it"
            )
        return value, None
    if lifecycle is Lifecycle.GENERATOR:
        generator: Generator[object] = factory(**kwargs)
        try:
            value = next(generator)
        except StopIteration:
            raise RuntimeError(f"generator provider {provider!r} did not yield") from None
        return value, functools.partial(_finish, generator, provider)
    if lifecycle is not Lifecycle.CONTEXT_MANAGER:
        raise RuntimeError(f"{lifecycle.value} provider {provider!r} needs an event loop")
    manager: AbstractContextManager[object] = factory(**kwargs)
    value = manager.__enter__()
    return value, functools.partial(_exit, manager)


async def enter(
    lifecycle: Lifecycle, provider: object, kwargs: Mapping[str, object]
) -> tuple[object, Teardown | None]:
    """Create a value with any lifecycle; return it and its teardown."""
    if not lifecycle.is_async:
        return enter_sync(lifecycle, provider, kwargs)
    factory = cast("Callable[..., Any]", provider)
    if lifecycle is Lifecycle.ASYNC_FACTORY:
        return await cast("Awaitable[object]", factory(**kwargs)), None
    if lifecycle is Lifecycle.ASYNC_GENERATOR:
        generator: AsyncGenerator[object] = factory(**kwargs)
        try:
            value = await anext(generator)
        except StopAsyncIteration:
            raise RuntimeError(f"generator provider {provider!r} did not yield") from None
        return value, functools.partial(_afinish, generator, provider)
    manager: AbstractAsyncContextManager[object] = factory(**kwargs)
    value = await manager.__aenter__()
    return value, functools.partial(_aexit, manager)


# A context manager's exit is told the error that ended the scope, as ``with`` tells
# it: an ``@asynccontextmanager`` provider wrapping a transaction rolls a failed job's
# work back instead of committing it. It cannot swallow the error for the actor, and
# raising it again is not a teardown failure. A generator provider is resumed as a
# pytest fixture is, whatever happened: the code after its ``yield`` always runs.


def _exit(manager: AbstractContextManager[object], error: BaseException | None) -> None:
    if error is None:
        manager.__exit__(None, None, None)
        return
    try:
        manager.__exit__(type(error), error, error.__traceback__)
    except BaseException as again:
        if again is not error:
            raise


async def _aexit(manager: AbstractAsyncContextManager[object], error: BaseException | None) -> None:
    if error is None:
        await manager.__aexit__(None, None, None)
        return
    try:
        await manager.__aexit__(type(error), error, error.__traceback__)
    except BaseException as again:
        if again is not error:
            raise


def _finish(generator: Generator[object], provider: object, error: BaseException | None) -> None:
    try:
        next(generator)
    except StopIteration:
        return
    generator.close()
    raise RuntimeError(f"generator provider {provider!r} yielded more than once")


async def _afinish(
    generator: AsyncGenerator[object], provider: object, error: BaseException | None
) -> None:
    try:
        await anext(generator)
    except StopAsyncIteration:
        return
    await generator.aclose()
    raise RuntimeError(f"generator provider {provider!r} yielded more than once")
