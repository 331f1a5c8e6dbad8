"""A third party's backend written against a draft of protocol 3, whose methods lack
the keyword-only ``batch_ends`` that version gained before its release: refused when a
worker starts, not met as a TypeError when it stops or when its leader sweeps."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import pytest

from taskq import JobStatus, TaskQ, WorkerSettings, actor
from taskq.backend import check_protocol_keywords
from taskq.backend.memory import InMemoryBackend
from taskq.errors import IncompatiblePluginError, ProtocolKeywordMissing
from taskq.worker import Worker
from taskq_testing import TEST_SETTINGS


class _DraftBackend(InMemoryBackend):
    """Its hand-back and deadline sweep predate ``batch_ends`` (it declares version 3)."""

    async def hand_back_unstarted(  # type: ignore[override]
        self, worker_id: UUID, jobs: Sequence[tuple[UUID, int | None]]
    ) -> int:
        return await super().hand_back_unstarted(worker_id, jobs)

    async def deadline_sweep(self) -> int:  # type: ignore[override]
        return await super().deadline_sweep()


class _Wrapper:
    """A third party's wrapper that passes every call's keywords through."""

    def __init__(self, inner: InMemoryBackend) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def hand_back_unstarted(self, *args: Any, **kwargs: Any) -> int:
        return await self._inner.hand_back_unstarted(*args, **kwargs)


@actor(name="nap")
async def nap(payload: dict[str, Any]) -> None:
    return None


async def test_a_worker_refuses_a_backend_without_batch_ends_at_its_start() -> None:
    # Without the check the worker ran; at its stop the hand-back of its prefetched jobs
    # raised TypeError, and they stayed locked until their leases ran out.
    # Not a Backend on purpose (its keywords are missing): the worker's check is under test.
    tq = TaskQ("memory://", actors=[nap], backend=_DraftBackend())  # type: ignore[arg-type]
    async with tq:
        job = await tq.client.enqueue(nap, {})
        worker = Worker(tq, WorkerSettings.load({**TEST_SETTINGS, "until_idle": True}, env={}))
        with pytest.raises(ProtocolKeywordMissing) as refused:
            await asyncio.wait_for(worker.run(), 10)
        row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.PENDING  # nothing was dispatched
    message = str(refused.value)
    assert "declares backend protocol 3 but lacks its keyword-only " in message
    assert "deadline_sweep(*, batch_ends), hand_back_unstarted(*, batch_ends)" in message
    assert "upgrade the backend" in message
    assert isinstance(refused.value, IncompatiblePluginError)


def test_the_bundled_backends_and_a_keyword_passing_wrapper_take_every_keyword() -> None:
    from taskq_postgres import PostgresBackend

    for backend in (
        InMemoryBackend(),
        _Wrapper(InMemoryBackend()),
        PostgresBackend.from_url("postgresql://localhost/app"),
    ):
        check_protocol_keywords(backend)  # raises nothing


class _PreUpToBackend(InMemoryBackend):
    """Its backlog count predates ``up_to`` (the keyword the client passes past a
    ``max_pending``), its registry ``actors``; everything else is current."""

    async def count_pending_jobs(self, actors: list[str]) -> dict[str, int]:  # type: ignore[override]
        return await super().count_pending_jobs(actors)

    async def register_worker(self, *args: Any) -> None:  # type: ignore[override]
        await super().register_worker(*args)


def test_every_keyword_only_parameter_of_the_protocol_is_checked_not_only_batch_ends() -> None:
    # A draft lacking up_to passed the check and then failed every enqueue of an actor
    # with max_pending with a TypeError.
    with pytest.raises(ProtocolKeywordMissing) as refused:
        check_protocol_keywords(_PreUpToBackend())
    assert "count_pending_jobs(*, up_to), register_worker(*, actors)" in str(refused.value)
