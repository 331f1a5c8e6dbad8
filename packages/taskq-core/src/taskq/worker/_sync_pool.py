"""The threads sync actors run in, counting the calls they are still running."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final, ParamSpec, TypeVar

__all__ = ["SyncActorPool"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

_UNCAPPED: Final = sys.maxsize
"""ThreadPoolExecutor starts a thread for a call only when none is idle."""

_GATHER_WITHIN: Final = 5.0
"""Seconds :meth:`SyncActorPool.in_each_idle_thread` waits for every idle thread to take
a call before running them as they came."""


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

        A barrier spreads the calls: each thread that takes one waits for the others to
        take theirs, so no thread takes two. If one never comes (a thread was not idle
        after all), the barrier gives up and the calls run anyway.
        """
        with self._lock:
            idle = len(self._seen - self._in_call)
        if not idle:
            return
        barrier = threading.Barrier(idle)

        def once() -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=_GATHER_WITHIN)
            fn()

        # Not counted: no actor's call.
        calls = [asyncio.wrap_future(ThreadPoolExecutor.submit(self, once)) for _ in range(idle)]
        # Each failure was logged where it happened (a teardown's): none stops the others.
        await asyncio.gather(*calls, return_exceptions=True)
