"""``MaintenanceLeader.confirm``: callers that queued behind a confirmation share the
next one's answer instead of each asking in turn."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from uuid import uuid4

from taskq import TaskQ, WorkerSettings
from taskq.worker._state import WorkerState
from taskq.worker.leader import MaintenanceLeader


class _StalledElector:
    """Every confirmation hangs until the outage ends, then times out."""

    def __init__(self) -> None:
        self.calls = 0
        self.outage_over = asyncio.Event()

    async def try_acquire(self) -> bool:
        self.calls += 1
        await self.outage_over.wait()
        raise TimeoutError("no answer")

    async def release(self) -> None:
        return None


async def test_callers_queued_behind_a_confirmation_share_the_next_ones_answer() -> None:
    # In an outage every confirmation runs to its timeout: the leader loops asking one
    # after the other held the election loop behind all of them, past its stale-tick
    # budget. Those that queued behind the one in flight now take one fresh answer.
    app = TaskQ("memory://")
    with ThreadPoolExecutor(1) as executor:
        state = WorkerState(
            worker_id=uuid4(),
            settings=WorkerSettings.load({}, env={}),
            backend=app.backend,
            actors={},
            providers=app.providers,
            client=app.client,
            executor=executor,
        )
        leader = MaintenanceLeader(state)
        elector = _StalledElector()
        leader.elector = elector
        in_flight = asyncio.create_task(leader.confirm())
        await asyncio.sleep(0)
        queued = [asyncio.create_task(leader.confirm()) for _ in range(5)]
        await asyncio.sleep(0)
        elector.outage_over.set()
        answers = await asyncio.gather(in_flight, *queued, return_exceptions=True)
    # The one in flight, then one begun after the others asked, whose answer they take.
    assert elector.calls == 2
    assert [type(a) for a in answers[:2]] == [TimeoutError, TimeoutError]
    assert answers[2:] == [False] * 4
    assert not leader.is_leader.is_set()
