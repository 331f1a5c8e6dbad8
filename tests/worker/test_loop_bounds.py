"""How long a worker loop's iteration may take with the database slow or away: callers
queued behind a leader confirmation share the next one's answer instead of each asking
in turn, and an iteration of the producer, the heartbeat or a frequent leader loop ends
within the command timeout however many statements it makes."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import uuid4

from taskq import TaskQ, WorkerSettings
from taskq.backend.memory import InMemoryBackend
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


class _SlowSweeps(InMemoryBackend):
    """A slow but healthy database: each sweep statement takes 0.6 s."""

    async def scheduled_to_pending(self) -> int:
        await asyncio.sleep(0.6)
        return await super().scheduled_to_pending()

    async def deadline_sweep(self, **kwargs: Any) -> int:
        await asyncio.sleep(0.6)
        return await super().deadline_sweep(**kwargs)

    async def reclaim_expired_locks(self, *args: Any, **kwargs: Any) -> int:
        await asyncio.sleep(0.6)
        return await super().reclaim_expired_locks(*args, **kwargs)


async def _oldest_ticks(backend: InMemoryBackend, **settings: str) -> dict[str, float]:
    """Run a worker for 3 s over ``backend``; the longest each loop went without a tick."""
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    tq = TaskQ("memory://", backend=backend)
    oldest: dict[str, float] = {}
    async with tq:
        flags = {**TEST_SETTINGS, "queues": ["default"], **settings}
        worker = Worker(tq, WorkerSettings.load(flags, env={}))
        running = asyncio.create_task(worker.run())
        for _ in range(60):
            await asyncio.sleep(0.05)
            if worker._state is not None:
                for name, age in worker._state.liveness.ages().items():
                    oldest[name] = max(age, oldest.get(name, 0.0))
        worker.stop()
        await asyncio.wait_for(running, 10)
    return oldest


async def test_a_leader_loop_iteration_is_bounded_as_a_whole() -> None:
    # Each statement well inside the timeout, three of them were not: the sweep's
    # iterations outlasted its stale-tick budget and the watchdog took the worker down.
    oldest = await _oldest_ticks(
        _SlowSweeps(), dispatcher_command_timeout="500ms", maintenance_interval="100ms"
    )
    # 0.5 s bound + the period; unbounded: 1.8 s+
    assert oldest["leader-sweep"] < 1.2, oldest["leader-sweep"]


class _SlowPrune(InMemoryBackend):
    """A prune with a backlog: it takes 2 s."""

    async def prune_terminal_jobs(self, *args: Any, **kwargs: Any) -> int:
        await asyncio.sleep(2)
        return await super().prune_terminal_jobs(*args, **kwargs)


async def test_a_long_prune_is_not_a_stalled_loop() -> None:
    # Unbounded on purpose, it was tracked against five intervals: a prune every
    # 100 ms taking 2 s went 2 s without a tick, and the watchdog ended the leader.
    oldest = await _oldest_ticks(_SlowPrune(), prune_interval="100ms")
    assert oldest.get("leader-prune", 0.0) < 0.5, oldest


class _SlowWorkerCalls(InMemoryBackend):
    """A slow but healthy database under a worker's own loops: a dispatch and a
    heartbeat's statements take 0.6 s each."""

    async def dispatch_actors_batch(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(1.2)  # a dispatch of two statements
        return await super().dispatch_actors_batch(*args, **kwargs)

    async def heartbeat_jobs(self, *args: Any, **kwargs: Any) -> int:
        await asyncio.sleep(0.6)
        return await super().heartbeat_jobs(*args, **kwargs)

    async def poll_cancel_flags(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.6)
        return await super().poll_cancel_flags(*args, **kwargs)


async def test_the_producers_and_heartbeats_iterations_are_bounded_as_a_whole() -> None:
    oldest = await _oldest_ticks(
        _SlowWorkerCalls(),
        dispatcher_command_timeout="500ms",
        poll_interval="100ms",
        heartbeat_interval="100ms",
    )
    # 0.5 s bound + the period; unbounded, 1.2 s and more.
    assert oldest["producer"] < 1.0, oldest["producer"]
    assert oldest["heartbeat"] < 1.0, oldest["heartbeat"]
