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
