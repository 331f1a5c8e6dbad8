"""The completer: successes that finish close together share one write.

A job's success is the most common write a worker makes, and on Postgres
one statement per job is what bounds a drain (River's completer batches the
same way). Jobs hand their success here and wait for it: the first one
starts a flush; every success that arrives while a flush is being written
joins the next one (group commit), so an idle worker writes at once and a
busy one writes one statement per round trip. ``completion_window`` adds an
optional wait before each flush to gather more.

Each job still learns its own outcome (the backend guards every row on its
own), and its slot stays held until its write is done, so the heartbeat keeps
the lease of a job whose success is still queued here.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from uuid import UUID

from taskq.backend import SupportsBatchedSuccess
from taskq.models import SuccessWrite

__all__ = ["Completer"]

_Waiting = tuple[SuccessWrite, "asyncio.Future[bool]"]


class Completer:
    """Coalesces concurrent ``mark_succeeded`` calls into ``mark_succeeded_many``."""

    def __init__(
        self,
        backend: SupportsBatchedSuccess,
        worker_id: UUID,
        *,
        fallback_result_ttl: timedelta | None,
        window: timedelta,
    ) -> None:
        self._backend = backend
        self._worker_id = worker_id
        self._ttl = fallback_result_ttl
        self._window = window.total_seconds()
        self._waiting: list[_Waiting] = []
        self._flusher: asyncio.Task[None] | None = None
        self.flushes = 0
        """Statements written so far (for tests and the benchmark)."""

    async def succeed(self, write: SuccessWrite) -> bool:
        """Record ``write``; True when it moved the job, False on a no-op.

        A flush of several jobs that failed is retried write by write, concurrently,
        so that only the job whose own write fails gets the error: a value the
        database refuses, or a transient error (each job's own retry, the consumer's
        transient-error loop, submits it again).
        """
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((write, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_all(), name="taskq-completer")
        return await future

    async def aclose(self) -> None:
        """Wait for the flush in progress, if any (worker shutdown)."""
        if self._flusher is not None:
            await asyncio.shield(self._flusher)

    async def _flush_all(self) -> None:
        try:
            while self._waiting:
                # Let the other jobs finishing in this loop turn join the flush.
                await asyncio.sleep(self._window)
                batch, self._waiting = self._waiting, []
                await self._flush(batch)
        finally:
            self._flusher = None

    async def _flush(self, batch: list[_Waiting]) -> None:
        self.flushes += 1
        try:
            flags = await self._backend.mark_succeeded_many(
                self._worker_id, [write for write, _ in batch], self._ttl
            )
        except Exception as exc:  # noqa: BLE001 - every waiter gets the error
            if len(batch) > 1:
                # One row must not fail the jobs sharing its statement: a value the
                # database refuses (one job's result), or a row slow to write (locked
                # elsewhere, a huge result) that times the statement out, again and
                # again as the jobs' retries gather into the same batch. Each is
                # written on its own, all at once: an outage costs one timeout.
                await asyncio.gather(*(self._flush([waiting]) for waiting in batch))
                return
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            # Cancelled (the loop is going away): nobody must wait forever.
            for _, future in batch:
                future.cancel()
            raise
        for (_, future), flag in zip(batch, flags, strict=True):
            # A job task cancelled meanwhile (lock lost) no longer waits for its flag.
            if not future.done():
                future.set_result(flag)
