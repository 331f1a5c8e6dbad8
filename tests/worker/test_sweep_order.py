"""The leader's sweep iteration: crash recovery first."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from taskq import WorkerSettings
from taskq.backend.memory import InMemoryBackend
from taskq.worker.maintenance import sweep_once
from taskq_testing import TEST_SETTINGS


class _LongPromotion(InMemoryBackend):
    """A promotion backlog that outlasts the iteration's bound."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def scheduled_to_pending(self) -> int:
        self.calls.append("scheduled_to_pending")
        await asyncio.sleep(3600)
        return 0

    async def reclaim_expired_locks(
        self, cancel_grace: timedelta, cleanup_grace: timedelta, **kwargs: Any
    ) -> int:
        self.calls.append("reclaim_expired_locks")
        return await super().reclaim_expired_locks(cancel_grace, cleanup_grace, **kwargs)


async def test_the_reclaim_runs_before_a_promotion_backlog_can_use_up_the_bound() -> None:
    # The iteration is bounded as a whole: promotion first, a backlog of due jobs
    # held every crashed worker's jobs running until it was gone.
    backend = _LongPromotion()
    state: Any = SimpleNamespace(
        backend=backend, settings=WorkerSettings.load(dict(TEST_SETTINGS), env={})
    )
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(sweep_once(state, reclaim=True), 0.2)
    assert backend.calls == ["reclaim_expired_locks", "scheduled_to_pending"]


class _PromotionAlwaysTimesOut(InMemoryBackend):
    """A promotion that fails (transiently) at every turn, after the reclaim ran."""

    def __init__(self) -> None:
        super().__init__()
        self.reclaims = 0

    async def scheduled_to_pending(self) -> int:
        raise TimeoutError("the promotion backlog outlasted the bound")

    async def reclaim_expired_locks(
        self, cancel_grace: timedelta, cleanup_grace: timedelta, **kwargs: Any
    ) -> int:
        self.reclaims += 1
        return await super().reclaim_expired_locks(cancel_grace, cleanup_grace, **kwargs)


async def test_a_sweep_failing_after_its_reclaim_still_reclaims() -> None:
    # The grace a leader gives the workers after its sweep could not reach the database
    # is not for a database that answers: a later step failing at every turn must not
    # hold the reclaim before it back.
    from taskq import TaskQ
    from taskq.worker import Worker

    backend = _PromotionAlwaysTimesOut()
    tq = TaskQ("memory://", backend=backend)
    async with tq:
        worker = Worker(tq, WorkerSettings.load(dict(TEST_SETTINGS), env={}))
        running = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(2)  # 100 turns of 20 ms; the grace is 100 ms
        finally:
            worker.stop()
            await asyncio.wait_for(running, 10)
    # About one a turn (91 of 100 here); holding the grace again after each failed turn
    # left one in seven (15).
    assert backend.reclaims >= 40
