"""The sync actors' thread pool: a call in each idle thread at stop."""

from __future__ import annotations

import asyncio
import threading
import time

from taskq.worker._sync_pool import SyncActorPool


class _SlowRelease(threading.Semaphore):
    """An idle semaphore whose release comes late, as on a loaded machine: a thread
    has returned from its call (its future done) but not yet told the pool it is idle."""

    def release(self, n: int = 1) -> None:
        time.sleep(0.05)
        super().release(n)


async def test_each_idle_thread_gets_the_call_though_a_fresh_thread_starts_meanwhile() -> None:
    # A submit that finds no idle thread registered starts a new one, which took one
    # of the calls: a thread that had made values was left out, and its values were
    # closed on the loop's thread (refused there by sqlite), after a 5 s wait.
    pool = SyncActorPool()
    pool._idle_semaphore = _SlowRelease(0)  # the race made reproducible
    together = threading.Barrier(3)  # three calls at once: three threads

    def actor_call() -> int:
        together.wait(5)
        return threading.get_ident()

    loop = asyncio.get_running_loop()
    try:
        actors = set(await asyncio.gather(*(loop.run_in_executor(pool, actor_call) for _ in "abc")))
        closed_in: list[int] = []
        started = time.monotonic()
        await pool.in_each_idle_thread(lambda: closed_in.append(threading.get_ident()))
        assert sorted(closed_in) == sorted(actors)
        assert time.monotonic() - started < 2
        # Asked again at once, each round found the idle threads not yet counted and
        # started a thread per call: some 300 here, over a thousand when a release
        # took 0.2 s, and 16 s of thread starts on a loaded machine.
        assert len(pool._threads) < 60
    finally:
        pool.shutdown(wait=True)
