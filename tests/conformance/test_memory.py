"""The conformance suite on the in-memory backend, with a fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import ClassVar

import pytest
import pytest_asyncio

from taskq.backend import FakeClock
from taskq.backend.memory import InMemoryBackend
from taskq_testing.conformance import AdvanceTime, BackendConformance


class TestInMemoryBackend(BackendConformance):
    # The fake clock jumps, so the real 60 s cancel headroom costs nothing.
    max_advance: ClassVar[timedelta] = timedelta(hours=1)

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest_asyncio.fixture
    async def backend(self, clock: FakeClock) -> AsyncIterator[InMemoryBackend]:
        backend = InMemoryBackend(clock=clock, cancel_reclaim_headroom=timedelta(seconds=60))
        await backend.open()
        yield backend
        await backend.close()

    @pytest.fixture
    def advance_time(self, clock: FakeClock) -> AdvanceTime:
        async def advance(delta: timedelta) -> None:
            clock.advance(delta)

        return advance
