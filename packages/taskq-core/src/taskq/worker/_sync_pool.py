"""The threads sync actors run in, counting the calls they are still running."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final, ParamSpec, TypeVar

__all__ = ["SyncActorPool"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

_UNCAPPED: Final = sys.maxsize
"""ThreadPoolExecutor starts a thread for a call only when none is idle."""

_GATHER_WITHIN: Final = 5.0
"""Seconds :meth:`SyncActorPool.in_each_idle_thread` goes on asking each idle thread to
take a call."""

_SETTLE_FIRST: Final = 0.01
_SETTLE_MOST: Final = 0.2
"""Seconds :meth:`SyncActorPool.in_each_idle_thread` waits after a round that visited no
thread, doubling from the first to the most, before asking again."""


class SyncActorPool(ThreadPoolExecutor):
    """A thread pool that knows how many calls its threads are in, with a thread for
    every call it is given.

    A cancel or a stop can end a sync actor's job but not its thread: the call goes
    on, though its job was abandoned or handed back, and its slot is free again. A
    pool of ``concurrency`` threads would then queue the next sync job behind it,
    ``running`` and leased but not started, for as long as that call runs (for ever,
    for a loop that never returns). So the pool is not capped at the slots: the
    worker's slots bound the calls of live jobs, and a thread is added only while an
    abandoned call holds one (an idle thread is reused first).

    The process must not outlive an abandoned call (another worker may be running
    the job again), and it would: the interpreter waits for the pool's threads at exit.
    """

    def __init__(self) -> None:
        super().__init__(max_workers=_UNCAPPED, thread_name_prefix="taskq-sync-actor")
        self._lock = threading.Lock()
        self._running = 0
        # Thread idents: every thread the pool started ran a call (one starts only for
        # a call), and none ends before shutdown.
        self._seen: set[int] = set()
        self._in_call: set[int] = set()

    @property
    def running(self) -> int:
        """Calls a thread is executing right now."""
        with self._lock:
            return self._running

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        def counted() -> _T:
            thread = threading.get_ident()
            with self._lock:
                self._running += 1
                self._seen.add(thread)
                self._in_call.add(thread)
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self._running -= 1
                    self._in_call.discard(thread)

        return super().submit(counted)

    async def in_each_idle_thread(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` once in each thread not in a call now (a sync actor's thread-bound
        values closed there, at stop), concurrently; exceptions are ``fn``'s to log.

        The pool cannot aim a call at a thread, so calls go out in rounds, one for
        each thread to visit and each other thread seen idle. Each call is held until
        every call of its round is taken, so no thread takes two; one taken by
        another thread (a fresh one the pool started because an idle thread had not
        yet said so) runs nothing, and the next round asks again, counting it (after a
        pause, growing, when a round visited none). Threads still not visited after a
        few seconds are left to the caller.
        """
        with self._lock:
            targets = self._seen - self._in_call
        visited: set[int] = set()
        holders: set[int] = set()
        deadline = time.monotonic() + _GATHER_WITHIN
        settle = _SETTLE_FIRST
        while (missing := targets - visited) and time.monotonic() < deadline:
            calls = len(missing) + len(holders - missing)
            await self._round(fn, calls, targets, visited, holders, deadline)
            if targets - visited == missing:
                # Fresh threads took every call: the idle ones had not yet told the pool
                # so (the thread that finished a call does, after its result is out).
                # Asked again at once, the pool would start as many threads again,
                # doubling each round; a moment lets the idle ones say so.
                await asyncio.sleep(min(settle, max(0.0, deadline - time.monotonic())))
                settle = min(settle * 2, _SETTLE_MOST)

    async def _round(
        self,
        fn: Callable[[], object],
        calls: int,
        targets: set[int],
        visited: set[int],
        holders: set[int],
        deadline: float,
    ) -> None:
        lock = threading.Lock()
        taken = 0
        all_taken = threading.Event()

        def once() -> None:
            nonlocal taken
            with lock:
                taken += 1
                if taken == calls:
                    all_taken.set()
            all_taken.wait(timeout=max(0.0, deadline - time.monotonic()))
            thread = threading.get_ident()
            with lock:
                holders.add(thread)
                if thread not in targets or thread in visited:
                    return
                visited.add(thread)
            fn()

        # Not counted: no actor's call.
        futures = [asyncio.wrap_future(ThreadPoolExecutor.submit(self, once)) for _ in range(calls)]
        # Each failure was logged where it happened (a teardown's): none stops the others.
        await asyncio.gather(*futures, return_exceptions=True)
