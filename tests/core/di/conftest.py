"""Fixtures for the DI engine tests: a fresh registry and the long-lived scopes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from taskq._di import LoopScope, ProcessScope, ProviderRegistry, ThreadScope
from taskq._di.solver import Container
from taskq._scope import Scope


@pytest.fixture
def registry() -> ProviderRegistry:
    return ProviderRegistry()


@pytest.fixture
async def process_scope() -> AsyncIterator[ProcessScope]:
    scope = ProcessScope()
    yield scope
    await scope.aclose()


@pytest.fixture
async def thread_scope() -> AsyncIterator[ThreadScope]:
    scope = ThreadScope()
    yield scope
    await scope.aclose()


@pytest.fixture
async def loop_scope() -> AsyncIterator[LoopScope]:
    scope = LoopScope()
    yield scope
    await scope.aclose()


@pytest.fixture
async def containers(
    process_scope: ProcessScope, thread_scope: ThreadScope, loop_scope: LoopScope
) -> dict[Scope, Container]:
    """PROCESS, THREAD and LOOP containers as a worker loop would pass them."""
    return {
        Scope.PROCESS: process_scope,
        Scope.THREAD: thread_scope,
        Scope.LOOP: loop_scope.current(),
    }
