"""The leader's sweep iteration: crash recovery first."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import pytest

from taskq import WorkerSettings
from taskq.backend.memory import InMemoryBackend
from taskq.models import JobRow
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
    await backend.open()
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


class _Blackholed(InMemoryBackend):
    """Once ``cut``, the sweep and the leader's probe of the pool hang (a network black
    hole: no reset, every wait runs to its bound); the election does not (its own
    session, direct)."""

    def __init__(self) -> None:
        super().__init__()
        self.cut = False

    async def scheduled_to_pending(self) -> int:
        if self.cut:
            await asyncio.sleep(3600)
        return await super().scheduled_to_pending()

    async def get(self, job_id: UUID, **kwargs: Any) -> JobRow | None:
        if self.cut:
            await asyncio.sleep(3600)
        return await super().get(job_id, **kwargs)


@pytest.mark.parametrize("leader_lease", ["30s", "1s"], ids=["within-the-lease", "resigning"])
async def test_a_blackholed_sweep_keeps_within_its_stale_tick_budget(leader_lease: str) -> None:
    # A failed turn probes the pool (a plain read, bounded as the turn is) once the sweep
    # has been silent for reclaim_grace, or for a leader_lease before it resigns: the
    # turn and its probe together took two bounds, past the stale-tick budget the
    # settings size for one (here 0.6 s x 2 + 20 ms > 1 s; by default 5 s x 2 + 1 s >
    # 10 s), and the watchdog ended the leader a few seconds into a black hole. (With
    # 0.4 s and 0.6 s, one turn left 0.18 s for a loaded machine's loop lag.)
    from taskq import TaskQ
    from taskq.worker import Worker

    backend = _Blackholed()
    tq = TaskQ("memory://", backend=backend)
    settings = {
        **TEST_SETTINGS,
        "dispatcher_command_timeout": "600ms",
        "watchdog_stale_floor": "1s",
        "leader_lease": leader_lease,
        "cron_catch_up": "1m",
    }
    stale: list[dict[str, float]] = []
    async with tq:
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        running = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(0.3)
            backend.cut = True
            for _ in range(60):  # three seconds: several probes
                await asyncio.sleep(0.05)
                if found := worker._state.liveness.stale():  # type: ignore[union-attr]
                    stale.append(found)
        finally:
            worker.stop()
            await asyncio.wait_for(running, 10)
    assert not stale, stale
