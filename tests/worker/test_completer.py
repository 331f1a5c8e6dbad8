"""The completer: concurrent successes share one ``mark_succeeded_many`` write."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from uuid import UUID, uuid4

import pytest

from taskq.backend import JobStatus
from taskq.backend.memory import InMemoryBackend
from taskq.models import JobRow, SuccessWrite
from taskq.worker.completer import Completer
from taskq_testing.conformance._support import fetch, running_job


class _Recording(InMemoryBackend):
    """Records each batch; can hold a write open, fail the next one, fail every write
    while ``away``, or time out every write that carries a ``slow`` job."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[UUID]] = []
        self.hold: asyncio.Event | None = None
        self.fail_next: Exception | None = None
        self.away = False
        self.slow: set[UUID] = set()
        self.entered = asyncio.Event()

    async def mark_succeeded_many(
        self,
        worker_id: UUID,
        items: Sequence[SuccessWrite],
        fallback_result_ttl: timedelta | None = None,
    ) -> list[bool]:
        self.batches.append([item.job_id for item in items])
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        if self.away:
            raise ConnectionRefusedError("database away")
        if self.slow.intersection(item.job_id for item in items):
            raise TimeoutError("statement timeout")
        return await super().mark_succeeded_many(worker_id, items, fallback_result_ttl)


async def _jobs(backend: InMemoryBackend, worker: UUID, n: int) -> list[JobRow]:
    return [await running_job(backend, worker_id=worker) for _ in range(n)]


def _completer(backend: InMemoryBackend, worker: UUID, window: float = 0) -> Completer:
    return Completer(backend, worker, fallback_result_ttl=None, window=timedelta(seconds=window))


async def test_successes_finishing_together_are_one_write() -> None:
    backend, worker = _Recording(), uuid4()
    await backend.open()
    jobs = await _jobs(backend, worker, 8)
    completer = _completer(backend, worker)
    flags = await asyncio.gather(
        *(
            completer.succeed(SuccessWrite(job_id=j.id, attempt=1, result=i))
            for i, j in enumerate(jobs)
        )
    )
    assert flags == [True] * 8
    assert backend.batches == [[j.id for j in jobs]]
    for i, job in enumerate(jobs):
        done = await fetch(backend, job.id)
        assert (done.status, done.result) == (JobStatus.SUCCEEDED, i)


async def test_successes_arriving_during_a_write_share_the_next_one() -> None:
    backend, worker = _Recording(), uuid4()
    await backend.open()
    first, *later = await _jobs(backend, worker, 4)
    completer = _completer(backend, worker)
    backend.hold = asyncio.Event()
    leading = asyncio.create_task(completer.succeed(SuccessWrite(job_id=first.id)))
    await backend.entered.wait()
    trailing = [asyncio.create_task(completer.succeed(SuccessWrite(job_id=j.id))) for j in later]
    await asyncio.sleep(0.01)
    assert backend.batches == [[first.id]]  # the others wait for the write in flight
    backend.hold.set()
    assert await leading
    assert await asyncio.gather(*trailing) == [True] * 3
    assert backend.batches == [[first.id], [j.id for j in later]]
    assert completer.flushes == 2


async def test_each_job_learns_its_own_outcome() -> None:
    backend, worker = _Recording(), uuid4()
    await backend.open()
    mine = await running_job(backend, worker_id=worker)
    theirs = await running_job(backend, worker_id=uuid4())
    completer = _completer(backend, worker)
    flags = await asyncio.gather(
        completer.succeed(SuccessWrite(job_id=mine.id)),
        completer.succeed(SuccessWrite(job_id=theirs.id)),
    )
    assert list(flags) == [True, False]  # typed a tuple, a list at run time
    assert (await fetch(backend, theirs.id)).status is JobStatus.RUNNING
    assert len(backend.batches) == 1


async def test_a_failed_write_reaches_every_job_it_carried_and_a_retry_succeeds() -> None:
    backend, worker = _Recording(), uuid4()
    await backend.open()
    jobs = await _jobs(backend, worker, 3)
    completer = _completer(backend, worker)
    backend.away = True
    outcomes = await asyncio.gather(
        *(completer.succeed(SuccessWrite(job_id=j.id)) for j in jobs), return_exceptions=True
    )
    assert all(isinstance(o, ConnectionRefusedError) for o in outcomes)
    assert [(await fetch(backend, j.id)).status for j in jobs] == [JobStatus.RUNNING] * 3
    # The consumer's transient-error loop submits again; the completer is usable.
    backend.away = False
    assert (
        await asyncio.gather(*(completer.succeed(SuccessWrite(job_id=j.id)) for j in jobs))
        == [True] * 3
    )


async def test_a_row_that_times_out_its_batch_fails_only_its_own_job() -> None:
    # A row slow to write (locked elsewhere, a huge result) timed the whole statement
    # out, and the jobs' retries gathered into the same batch again: none landed.
    backend, worker = _Recording(), uuid4()
    await backend.open()
    slow, *others = await _jobs(backend, worker, 3)
    backend.slow.add(slow.id)
    completer = _completer(backend, worker)
    outcomes = await asyncio.gather(
        *(completer.succeed(SuccessWrite(job_id=j.id)) for j in [slow, *others]),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], TimeoutError) and outcomes[1:] == [True, True]
    assert backend.batches[0] == [j.id for j in [slow, *others]]
    assert sorted(map(len, backend.batches[1:])) == [1, 1, 1]  # then one by one
    statuses = [(await fetch(backend, j.id)).status for j in [slow, *others]]
    assert statuses == [JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.SUCCEEDED]


async def test_a_window_gathers_successes_that_finish_apart() -> None:
    backend, worker = _Recording(), uuid4()
    await backend.open()
    jobs = await _jobs(backend, worker, 3)
    completer = _completer(backend, worker, window=0.05)

    async def finish_after(job: JobRow, delay: float) -> bool:
        await asyncio.sleep(delay)
        return await completer.succeed(SuccessWrite(job_id=job.id))

    flags = await asyncio.gather(*(finish_after(j, i * 0.005) for i, j in enumerate(jobs)))
    assert flags == [True] * 3
    assert backend.batches == [[j.id for j in jobs]]


async def test_a_cancelled_waiter_does_not_break_the_flush() -> None:
    backend, worker = _Recording(), uuid4()
    await backend.open()
    lost, kept = await _jobs(backend, worker, 2)
    completer = _completer(backend, worker)
    backend.hold = asyncio.Event()
    gone = asyncio.create_task(completer.succeed(SuccessWrite(job_id=lost.id)))
    stays = asyncio.create_task(completer.succeed(SuccessWrite(job_id=kept.id)))
    await backend.entered.wait()
    gone.cancel()
    backend.hold.set()
    assert await stays
    with pytest.raises(asyncio.CancelledError):
        await gone
    await completer.aclose()
    # The write was already in flight: the row moved even though nobody waited for it.
    assert (await fetch(backend, lost.id)).status is JobStatus.SUCCEEDED
