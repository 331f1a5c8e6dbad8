"""``BackendConformance``: the mixins assembled, the fixtures a backend author overrides."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import taskq.backend
from taskq.backend import Backend, Connection
from taskq.errors import ConfigurationError
from taskq.models import JobFilter
from taskq_testing.conformance._batches import BatchTests
from taskq_testing.conformance._cancel import CancelTests
from taskq_testing.conformance._dispatch import DispatchTests
from taskq_testing.conformance._enqueue import EnqueueTests
from taskq_testing.conformance._filters import FilterTests
from taskq_testing.conformance._history import HistoryTests
from taskq_testing.conformance._leadership import LeadershipTests
from taskq_testing.conformance._maintenance import MaintenanceTests
from taskq_testing.conformance._reclaim_events import ReclaimEventTests
from taskq_testing.conformance._schedules import ScheduleTests
from taskq_testing.conformance._support import AdvanceTime, covers, make_args
from taskq_testing.conformance._sweeps import SweepTests
from taskq_testing.conformance._terminal import TerminalWriteTests
from taskq_testing.conformance._transitions import TransitionTests


async def _sleep(delta: timedelta) -> None:
    await asyncio.sleep(delta.total_seconds())


def _backend_not_overridden(self: object) -> Backend:
    """An opened backend with no data, fresh for each test. Override this fixture."""
    pytest.fail(
        f"{type(self).__name__} must override the `backend` fixture: an async fixture "
        f"yielding an opened, empty backend (fresh per test) and closing it afterwards, "
        f"defined in the class itself (a `backend` fixture of a conftest.py or of the "
        f"module is shadowed by BackendConformance's own)",
        pytrace=False,
    )


class ProtocolTests:
    """The protocol version and the lifecycle: checked before anything else."""

    @covers("open", "close")
    async def test_backend_speaks_this_protocol_version(self, backend: Backend) -> None:
        assert type(backend).BACKEND_PROTOCOL_VERSION == taskq.backend.BACKEND_PROTOCOL_VERSION
        assert isinstance(backend, Backend)
        # The keywords this version gained before its release (batch_ends), which a
        # backend written against a draft of it lacks.
        taskq.backend.check_protocol_keywords(backend)

    @covers("open", "close")
    async def test_open_and_close_are_idempotent(self, backend: Backend) -> None:
        await backend.open()
        job = await backend.enqueue(make_args())
        assert await backend.list_jobs(JobFilter()) == [job]
        await backend.close()
        await backend.close()

    @covers("open", "close", "enqueue", "get", "list_jobs")
    async def test_a_closed_backend_refuses_calls_until_it_is_opened_again(
        self, backend: Backend
    ) -> None:
        # One backend worked unopened (or closed) where another raised: a program that
        # forgot open() ran on the first and failed on the second.
        job = await backend.enqueue(make_args())
        await backend.close()
        with pytest.raises(ConfigurationError, match=r"is not open: await backend\.open\(\)"):
            await backend.get(job.id)
        with pytest.raises(ConfigurationError, match=r"is not open"):
            await backend.enqueue(make_args())
        await backend.open()
        assert await backend.list_jobs(JobFilter()) == [job]  # the data outlives a close


# pytest runs inherited tests in reverse MRO order, so the bases are listed last
# area first: the protocol pin runs first, then enqueue, dispatch, and so on.
class BackendConformance(
    LeadershipTests,
    MaintenanceTests,
    HistoryTests,
    ScheduleTests,
    BatchTests,
    FilterTests,
    CancelTests,
    ReclaimEventTests,
    SweepTests,
    TransitionTests,
    TerminalWriteTests,
    DispatchTests,
    EnqueueTests,
    ProtocolTests,
):
    """The executable ``Backend`` contract (``docs/backend-contract.md``).

    Subclass it in a test module and override the ``backend`` fixture in the
    subclass (one in a conftest.py or the module is shadowed by this class's own)::

        class TestMyBackend(BackendConformance):
            @pytest_asyncio.fixture
            async def backend(self) -> AsyncIterator[MyBackend]:
                backend = MyBackend(cancel_reclaim_headroom=timedelta(seconds=1))
                await backend.open()
                yield backend
                await backend.close()

    Override ``advance_time`` too when the backend runs on a fake clock, and
    ``transaction_conn`` when its ``*_with_conn`` methods need a driver
    connection. The class name does not start with ``Test``, so pytest runs
    only subclasses. Every test reaches its states through the protocol and
    takes time from the backend, so the same tests run unchanged on every
    backend; tests a backend cannot run (a setting too long to wait for, a
    missing connection) are skipped with the reason.

    ``max_advance`` (class attribute, 2 s) is the longest single wait a test may
    ask of ``advance_time``: keep the backend's ``cancel_reclaim_headroom`` and
    ``reclaim_event_visibility_delay`` under it on a real clock, or raise it
    when ``advance_time`` moves a fake clock.
    """

    pytestmark = pytest.mark.asyncio

    # Typed Any so that overriding it with a fixture of any signature (an async
    # generator taking other fixtures) type-checks in the backend author's module.
    backend: Any = pytest.fixture(_backend_not_overridden, name="backend")

    @pytest.fixture
    def advance_time(self) -> AdvanceTime:
        """``await advance_time(delta)`` lets the backend's clock move on by at least ``delta``.

        The default really sleeps, which suits a backend on a real clock (a
        database). Override it to advance a fake clock (``FakeClock.advance``).
        """
        return _sleep

    @pytest.fixture
    def transaction_conn(self) -> Connection:
        """A driver connection the backend's ``*_with_conn`` methods accept (outside any
        transaction, so what they write commits), or None (the default).

        Backends with ``supports_transactional_simulation`` ignore the connection;
        for the others the tests that need one are skipped while this is None.
        """
        return None
