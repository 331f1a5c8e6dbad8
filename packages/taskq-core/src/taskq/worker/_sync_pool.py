"""The threads sync actors run in, counting the calls they are still running."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["SyncActorPool"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class SyncActorPool(ThreadPoolExecutor):
    """A thread pool that knows how many calls its threads are in.

    A stop can cancel a sync actor's task but not its thread: the call goes on,
    though its job was handed back or abandoned. The process must not outlive such
    a call (another worker may be running the job again), and it would: the
    interpreter waits for the pool's threads at exit.
    """

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix="taskq-sync-actor")
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
