"""The conformance suite fails backends that break the contract, and passes one that keeps it.

Each broken backend is the in-memory backend with one rule removed. The suite
runs against it in a separate pytest session (strict asyncio mode, warnings
as errors, as a third party would run it) and must report failures.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

_BACKENDS = '''
"""The in-memory backend, and copies of it that each break one rule of the contract."""
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, ClassVar

import pytest
import pytest_asyncio

from taskq.backend import FakeClock
from taskq.backend.memory import InMemoryBackend
from taskq.models import ActorConfig, EnqueueArgs, JobFilter, JobRow
from taskq_testing.conformance import AdvanceTime, BackendConformance


class IgnoresMaxConcurrent(InMemoryBackend):
    async def register_actors(self, configs: list[ActorConfig]) -> None:
        await super().register_actors([c.model_copy(update={"max_concurrent": None}) for c in configs])


class LetsAnyWorkerComplete(InMemoryBackend):
    async def mark_succeeded(
        self, job_id: Any, worker_id: Any, result: Any, *args: Any, attempt: Any = None, **kwargs: Any
    ) -> bool:
        row = await self.get(job_id)
        if row is not None and row.locked_by_worker is not None:
            worker_id, attempt = row.locked_by_worker, None
        return await super().mark_succeeded(job_id, worker_id, result, *args, attempt=attempt, **kwargs)


class DispatchesFinishedJobs(InMemoryBackend):
    async def dispatch_batch(self, worker_id: Any, queues: list[str], limit: int, lock_lease: timedelta) -> list[JobRow]:
        rows = await super().dispatch_batch(worker_id, queues, limit, lock_lease)
        for queue in queues:
            rows += await self.list_jobs(JobFilter(queue=queue, active=False))
        return rows[: max(limit, 0)]


class ForgetsIdempotencyKeys(InMemoryBackend):
    async def enqueue(self, args: EnqueueArgs) -> JobRow:
        return await super().enqueue(args.model_copy(update={"idempotency_key": None}))


class OnFakeClock:
    backend_type: ClassVar[type[InMemoryBackend]] = InMemoryBackend
    max_advance: ClassVar[timedelta] = timedelta(hours=1)

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest_asyncio.fixture
    async def backend(self, clock: FakeClock) -> AsyncIterator[InMemoryBackend]:
        backend = self.backend_type(clock=clock)
        await backend.open()
        yield backend
        await backend.close()

    @pytest.fixture
    def advance_time(self, clock: FakeClock) -> AdvanceTime:
        async def advance(delta: timedelta) -> None:
            clock.advance(delta)

        return advance

'''

_INI = """
[pytest]
asyncio_mode = strict
asyncio_default_fixture_loop_scope = function
filterwarnings = error
addopts = --strict-markers
"""


@pytest.fixture
def run_suite(pytester: pytest.Pytester) -> Callable[..., dict[str, int]]:
    """Run the conformance tests (those matching ``-k selection``, if given) against one
    backend class; the outcome counts."""
    pytester.makeini(_INI)
    pytester.makepyfile(backends=_BACKENDS)
    pytester.syspathinsert()

    def run(backend_type: str, selection: str | None = None) -> dict[str, int]:
        pytester.makepyfile(
            test_backend=f"""
            from backends import {backend_type}, OnFakeClock
            from taskq_testing.conformance import BackendConformance


            class TestBackend(OnFakeClock, BackendConformance):
                backend_type = {backend_type}
            """
        )
        selected = () if selection is None else ("-k", selection)
        result = pytester.runpytest("-p", "no:cacheprovider", *selected)
        return result.parseoutcomes()

    return run


@pytest.mark.parametrize(
    ("broken", "selection"),
    [
        ("IgnoresMaxConcurrent", "max_concurrent"),
        ("LetsAnyWorkerComplete", "another_worker_cannot_write"),
        ("DispatchesFinishedJobs", "dispatch_takes_only_pending_jobs"),
        ("ForgetsIdempotencyKeys", "idempotency_key_returns_the_existing_job"),
    ],
)
def test_the_suite_fails_a_broken_backend(
    run_suite: Callable[..., dict[str, int]], broken: str, selection: str
) -> None:
    outcomes = run_suite(broken, selection)
    assert outcomes.get("failed", 0) >= 1, outcomes


def test_the_suite_passes_a_correct_backend(
    run_suite: Callable[..., dict[str, int]],
) -> None:
    outcomes = run_suite("InMemoryBackend")
    assert set(outcomes) == {"passed"}, outcomes
    assert outcomes["passed"] >= 150


def test_a_backend_fixture_outside_the_class_is_said_to_be_shadowed(
    pytester: pytest.Pytester,
) -> None:
    # The natural place for it, a conftest.py, loses to the suite's own: the author
    # read "must override the `backend` fixture" about the fixture they had written.
    pytester.makeini(_INI)
    pytester.makeconftest(
        """
        import pytest_asyncio

        from taskq.backend.memory import InMemoryBackend


        @pytest_asyncio.fixture
        async def backend():
            backend = InMemoryBackend()
            await backend.open()
            yield backend
            await backend.close()
        """
    )
    pytester.makepyfile(
        """
        from taskq_testing.conformance import BackendConformance


        class TestBackend(BackendConformance):
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "protocol_version")
    result.assert_outcomes(errors=1)  # the fixture's failure, at setup
    result.stdout.fnmatch_lines(["*defined in the class itself*shadowed*"])
