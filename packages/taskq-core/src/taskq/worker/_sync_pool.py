"""The threads sync actors run in, counting the calls they are still running."""

from __future__ import annotations

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

    @property
    def running(self) -> int:
        """Calls a thread is executing right now."""
        with self._lock:
            return self._running

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        def counted() -> _T:
            with self._lock:
                self._running += 1
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self._running -= 1

        return super().submit(counted)
