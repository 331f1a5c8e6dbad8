"""Batches: the atomic enqueue, the failure counter, abort/complete and the batch reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID, uuid4

import pytest

from taskq.backend import (
    Backend,
    JobStatus,
    SupportsBatchChildCheck,
    SupportsBatchFailureCount,
    SupportsPrune,
)
from taskq.errors import RetryRefusedError
from taskq.models import (
    BatchChildEnd,
    BatchFilter,
    BatchRow,
    EnqueueArgs,
    ErrorInfo,
    JobFilter,
    JobRow,
)
from taskq_testing.conformance._support import (
    FAR,
    LONG_LEASE,
    SHORT_LEASE,
    TICK,
    AdvanceTime,
    assert_close,
    assert_history_consistent,
    assert_utc,
    covers,
    expire_short_leases,
    fetch,
    make_args,
)
from taskq_testing.conformance._terminal import handing_back

_QUEUE = "batch"
_ABORT_MESSAGE = "Batch aborted due to consecutive failures"


async def _tracked_batch(
    backend: Backend,
    *children: dict[str, Any],
    threshold: int | None = 2,
    **finalizer_options: Any,
) -> tuple[UUID, list[JobRow], EnqueueArgs]:
    """A batch with a row and a finalizer; its id, children and the finalizer's args."""
    batch_id = uuid4()
    finalizer = make_args(actor="conformance.finalizer", queue=_QUEUE, **finalizer_options)
    rows = await backend.enqueue_batch_atomic(
        [make_args(queue=_QUEUE, **spec) for spec in children],
        batch_id=batch_id,
        queue=_QUEUE,
        batch_row=BatchRow(
            id=batch_id, queue=_QUEUE, expected_size=len(children), failure_threshold=threshold
        ),
        finalizer_args=finalizer,
    )
    return batch_id, rows, finalizer


async def _succeed_one(backend: Backend) -> JobRow:
    """Dispatch the head of the batch queue and let it succeed."""
    worker = uuid4()
    [job] = await backend.dispatch_batch(worker, [_QUEUE], 1, LONG_LEASE)
    assert await backend.mark_succeeded(job.id, worker, None)
    return await fetch(backend, job.id)


async def _batch(backend: Backend, batch_id: UUID) -> BatchRow:
    row = await backend.get_batch(batch_id)
    assert row is not None, f"batch {batch_id} vanished"
    return row


async def _completed_now(backend: Backend, batch_id: UUID | None = None) -> datetime:
    """Create and complete a batch (``batch_id``, else a fresh one): its ``completed_at``,
    a prune cutoff the backend itself wrote, never the test's clock."""
    batch_id = batch_id or uuid4()
    await backend.create_batch(batch_id, "q", 0, None, None, None)
    await backend.complete_batch(batch_id)
    cutoff = (await _batch(backend, batch_id)).completed_at
    assert cutoff is not None
    return cutoff


class BatchTests:
    """``enqueue_batch_atomic`` and the batch row methods."""

    @covers("create_batch", "get_batch")
    async def test_create_batch_inserts_an_active_row(self, backend: Backend) -> None:
        batch_id, finalizer_id = uuid4(), uuid4()
        await backend.create_batch(batch_id, "q", 3, 2, finalizer_id, "conformance.origin")
        row = await _batch(backend, batch_id)
        assert (row.id, row.queue, row.status) == (batch_id, "q", "active")
        assert (row.expected_size, row.consecutive_failures, row.failure_threshold) == (3, 0, 2)
        assert (row.finalizer_job_id, row.originating_actor) == (finalizer_id, "conformance.origin")
        assert_utc(row.created_at)
        assert row.completed_at is None

    @covers("create_batch")
    @pytest.mark.parametrize(("size", "threshold"), [(1, 0), (1, -3), (-5, None)])
    async def test_create_batch_refuses_counts_out_of_range(
        self, backend: Backend, size: int, threshold: int | None
    ) -> None:
        batch_id = uuid4()
        with pytest.raises(ValueError):  # the message is the backend's own
            await backend.create_batch(batch_id, "q", size, threshold, None, None)
        assert await backend.get_batch(batch_id) is None

    @covers("create_batch")
    @pytest.mark.parametrize(("queue", "actor"), [("q\x00", None), ("q", "a\x00b")])
    async def test_create_batch_refuses_a_name_with_a_nul(
        self, backend: Backend, queue: str, actor: str | None
    ) -> None:
        # As a job's queue and actor are: Postgres raised its driver's error, the in-memory
        # backend stored the batch.
        batch_id = uuid4()
        with pytest.raises(ValueError, match="NUL"):
            await backend.create_batch(batch_id, queue, 1, None, None, actor)
        assert await backend.get_batch(batch_id) is None

    @covers("get_batch")
    async def test_get_batch_of_an_unknown_batch_is_none(self, backend: Backend) -> None:
        await backend.create_batch(uuid4(), "q", 1, None, None, None)
        assert await backend.get_batch(uuid4()) is None

    # -- enqueue_batch_atomic ------------------------------------------------------------

    @covers("enqueue_batch_atomic", "get_batch", "scheduled_to_pending")
    async def test_enqueue_batch_atomic_tags_children_and_parks_the_finalizer(
        self, backend: Backend
    ) -> None:
        children: list[dict[str, Any]] = [{"metadata": {"k": "v"}}, {}, {"delay": FAR}]
        batch_id, rows, finalizer = await _tracked_batch(backend, *children)
        assert len(rows) == 3 and finalizer.id not in {row.id for row in rows}
        for row, spec in zip(rows, children, strict=True):
            assert row.metadata == {**spec.get("metadata", {}), "batch_id": str(batch_id)}
            assert row.batch_id == batch_id
            assert await backend.get(row.id) == row
        assert [row.status for row in rows] == [
            JobStatus.PENDING,
            JobStatus.PENDING,
            JobStatus.SCHEDULED,
        ]
        batch = await _batch(backend, batch_id)
        assert (batch.status, batch.finalizer_job_id, batch.expected_size) == (
            "active",
            finalizer.id,
            3,
        )
        parked = await fetch(backend, finalizer.id)
        assert (parked.status, parked.scheduled_at.year) == (JobStatus.SCHEDULED, 9999)
        assert parked.metadata["batch_finalizer_for"] == str(batch_id)
        # The finalizer waits for the batch, not for time.
        assert await backend.scheduled_to_pending() == 0
        dispatched = await backend.dispatch_batch(uuid4(), [_QUEUE], 10, LONG_LEASE)
        assert {row.id for row in dispatched} == {rows[0].id, rows[1].id}

    @covers("enqueue_batch_atomic", "get_batch")
    async def test_a_batch_row_is_stored_as_every_backend_stores_values(
        self, backend: Backend
    ) -> None:
        # The caller's row goes through the stored-value rules: its metadata is JSON
        # (tuples as lists, NULs replaced), its times come back in UTC (a naive one taken
        # as UTC), and metadata JSON cannot hold is refused with nothing written.
        batch_id = uuid4()
        created = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=5)))
        row = BatchRow(
            id=batch_id,
            queue=_QUEUE,
            expected_size=1,
            metadata={"pair": (1, 2), "text": "a\x00b"},
            created_at=created,
        )
        await backend.enqueue_batch_atomic(
            [make_args(queue=_QUEUE)],
            batch_id=batch_id,
            queue=_QUEUE,
            batch_row=row,
            finalizer_args=None,
        )
        stored = await _batch(backend, batch_id)
        assert stored.metadata == {"pair": [1, 2], "text": "a\ufffdb"}
        assert stored.created_at == created
        assert_utc(stored.created_at)
        naive_id = uuid4()
        await backend.enqueue_batch_atomic(
            [make_args(queue=_QUEUE)],
            batch_id=naive_id,
            queue=_QUEUE,
            batch_row=BatchRow(
                id=naive_id,
                queue=_QUEUE,
                expected_size=1,
                status="complete",
                created_at=datetime(2030, 1, 1, 12),
                completed_at=datetime(2030, 1, 1, 13),
            ),
            finalizer_args=None,
        )
        naive = await _batch(backend, naive_id)
        assert (naive.created_at, naive.completed_at) == (
            datetime(2030, 1, 1, 12, tzinfo=UTC),
            datetime(2030, 1, 1, 13, tzinfo=UTC),
        )
        assert_utc(naive.created_at, naive.completed_at)
        jobs = await backend.list_jobs(JobFilter())
        refused_id, child = uuid4(), make_args(queue=_QUEUE)
        with pytest.raises(ValueError, match="is not a JSON number"):
            await backend.enqueue_batch_atomic(
                [child],
                batch_id=refused_id,
                queue=_QUEUE,
                batch_row=BatchRow(
                    id=refused_id,
                    queue=_QUEUE,
                    expected_size=1,
                    metadata={"ratio": float("nan")},
                ),
                finalizer_args=None,
            )
        assert await backend.get_batch(refused_id) is None
        assert await backend.list_jobs(JobFilter()) == jobs

    @covers("enqueue_batch_atomic")
    async def test_enqueue_batch_atomic_without_row_or_finalizer_only_tags(
        self, backend: Backend
    ) -> None:
        batch_id = uuid4()
        items = [make_args(queue=_QUEUE) for _ in range(3)]
        rows = await backend.enqueue_batch_atomic(
            items, batch_id=batch_id, queue=_QUEUE, batch_row=None, finalizer_args=None
        )
        assert [row.id for row in rows] == [item.id for item in items]
        assert await backend.get_batch(batch_id) is None
        listed = await backend.list_jobs(JobFilter(batch_id=batch_id))
        assert {row.id for row in listed} == {item.id for item in items}

    @covers("enqueue_batch_atomic")
    async def test_enqueue_batch_atomic_spans_chunks(self, backend: Backend) -> None:
        batch_id = uuid4()
        items = (make_args(queue=_QUEUE, payload={"i": i}) for i in range(5))
        rows = await backend.enqueue_batch_atomic(
            items,
            batch_id=batch_id,
            queue=_QUEUE,
            batch_row=None,
            finalizer_args=None,
            chunk_size=2,
        )
        assert [row.payload["i"] for row in rows] == list(range(5))
        assert len(await backend.list_jobs(JobFilter(batch_id=batch_id))) == 5

    @covers("enqueue_batch_atomic")
    async def test_enqueue_batch_atomic_returns_existing_rows_for_known_keys(
        self, backend: Backend
    ) -> None:
        existing = await backend.enqueue(make_args(idempotency_key="dup"))
        fresh = make_args(queue=_QUEUE)
        rows = await backend.enqueue_batch_atomic(
            [fresh, make_args(idempotency_key="dup")],
            batch_id=uuid4(),
            queue=_QUEUE,
            batch_row=None,
            finalizer_args=None,
        )
        assert [row.id for row in rows] == [fresh.id, existing.id]
        assert rows[1] == existing
        assert len(await backend.list_jobs(JobFilter())) == 2

    @covers("enqueue_batch_atomic")
    async def test_a_tracked_batch_refuses_a_child_key_naming_a_stored_job(
        self, backend: Backend
    ) -> None:
        # The stored job is not the batch's: it was not counted, so the batch could
        # complete, and release its finalizer, before that job ran.
        existing = await backend.enqueue(make_args(idempotency_key="dup"))
        batch_id, fresh, finalizer = uuid4(), make_args(queue=_QUEUE), make_args(queue=_QUEUE)
        with pytest.raises(ValueError, match="not a child of batch"):
            await backend.enqueue_batch_atomic(
                [fresh, make_args(queue=_QUEUE, idempotency_key="dup")],
                batch_id=batch_id,
                queue=_QUEUE,
                batch_row=BatchRow(id=batch_id, queue=_QUEUE, expected_size=2),
                finalizer_args=finalizer,
            )
        assert await backend.list_jobs(JobFilter()) == [existing]
        assert await backend.get_batch(batch_id) is None

    @covers("enqueue_batch_atomic")
    async def test_children_of_a_tracked_batch_may_share_a_key(self, backend: Backend) -> None:
        batch_id = uuid4()
        first = make_args(queue=_QUEUE, idempotency_key="same")
        rows = await backend.enqueue_batch_atomic(
            [first, make_args(queue=_QUEUE, idempotency_key="same")],
            batch_id=batch_id,
            queue=_QUEUE,
            batch_row=BatchRow(id=batch_id, queue=_QUEUE, expected_size=2),
            finalizer_args=None,
        )
        assert [row.id for row in rows] == [first.id, first.id]
        assert await backend.count_batch_non_terminal(batch_id) == 1

    @covers("enqueue_batch_atomic", "complete_batch", "mark_failed_or_retry")
    @pytest.mark.parametrize(
        ("ended", "threshold", "batch_status"),
        [(JobStatus.SUCCEEDED, None, "complete"), (JobStatus.FAILED, 1, "aborted")],
    )
    async def test_a_tracked_batch_whose_children_have_all_ended_ends_at_once(
        self, backend: Backend, ended: JobStatus, threshold: int | None, batch_status: str
    ) -> None:
        # Its child's key names a job of this batch's (tagged before it had a row) that
        # has ended: no end of a child was left to complete the batch, which stayed
        # active, its finalizer parked. It ends as its last child's end would end it.
        batch_id = uuid4()
        await backend.enqueue_batch_atomic(
            [make_args(queue=_QUEUE, idempotency_key="ended")],
            batch_id=batch_id,
            queue=_QUEUE,
            batch_row=None,
            finalizer_args=None,
        )
        worker = uuid4()
        [child] = await backend.dispatch_batch(worker, [_QUEUE], 1, LONG_LEASE)
        if ended is JobStatus.SUCCEEDED:
            assert await backend.mark_succeeded(child.id, worker, None)
        else:
            error = ErrorInfo(error_class="RuntimeError", message="child failed")
            assert (
                await backend.mark_failed_or_retry(child.id, worker, error, None)
            ).status is JobStatus.FAILED
        finalizer = make_args(actor="conformance.finalizer", queue=_QUEUE)
        [row] = await backend.enqueue_batch_atomic(
            [make_args(queue=_QUEUE, idempotency_key="ended")],
            batch_id=batch_id,
            queue=_QUEUE,
            batch_row=BatchRow(
                id=batch_id, queue=_QUEUE, expected_size=1, failure_threshold=threshold
            ),
            finalizer_args=finalizer,
        )
        assert (row.id, row.status) == (child.id, ended)
        batch = await _batch(backend, batch_id)
        assert (batch.status, batch.finalizer_job_id) == (batch_status, finalizer.id)
        assert_utc(batch.completed_at)
        released = await fetch(backend, finalizer.id)
        assert released.status is JobStatus.PENDING
        await assert_history_consistent(backend, finalizer.id)

    @covers("enqueue_batch_atomic")
    @pytest.mark.parametrize("tracked", [True, False])
    async def test_a_retried_enqueue_batch_atomic_returns_what_the_first_call_made(
        self, backend: Backend, tracked: bool
    ) -> None:
        # The same call again (its reply was lost after the first one committed) raised
        # "already exists" (the batch row's, or a child's id) where the caller needs the
        # rows it would have had.
        batch_id = uuid4()
        items = [
            make_args(queue=_QUEUE, priority=1),  # the head of the queue
            make_args(queue=_QUEUE, idempotency_key="keyed"),
            make_args(queue=_QUEUE, delay=FAR, singleton=True, identity_key="one"),
        ]
        batch_row = (
            BatchRow(id=batch_id, queue=_QUEUE, expected_size=3, failure_threshold=2)
            if tracked
            else None
        )
        finalizer = make_args(actor="conformance.finalizer", queue=_QUEUE) if tracked else None

        async def call(children: list[EnqueueArgs]) -> list[JobRow]:
            return await backend.enqueue_batch_atomic(
                children,
                batch_id=batch_id,
                queue=_QUEUE,
                batch_row=batch_row,
                finalizer_args=finalizer,
            )

        first = await call(items)
        stored = await backend.list_jobs(JobFilter())
        batch = await backend.get_batch(batch_id)
        assert await call(items) == first
        # Its keyed child rebuilt (another id, the same key) is the same job too.
        rebuilt = [items[0], make_args(queue=_QUEUE, idempotency_key="keyed"), items[2]]
        assert await call(rebuilt) == first
        assert await backend.list_jobs(JobFilter()) == stored
        assert await backend.get_batch(batch_id) == batch
        if finalizer is not None:
            assert (await fetch(backend, finalizer.id)).status is JobStatus.SCHEDULED
        # Retried after a child ended, it returns the children as they are now.
        done = await _succeed_one(backend)
        again = await call(items)
        assert [row.id for row in again] == [row.id for row in first]
        assert again[0] == done

    @covers("enqueue_batch_atomic")
    async def test_another_call_with_a_batch_id_in_use_is_refused(self, backend: Backend) -> None:
        # Only the same call again is a retry: other children, or another policy, under
        # the id of a stored batch are a mistake, refused with nothing written.
        batch_id, first, finalizer = await _tracked_batch(backend, {}, threshold=2)
        stored = await backend.list_jobs(JobFilter())
        batch = await _batch(backend, batch_id)
        same = [make_args(id=first[0].id, queue=_QUEUE)]
        for items, threshold, final in [
            ([make_args(queue=_QUEUE)], 2, finalizer),  # another child
            ([*same, make_args(queue=_QUEUE)], 2, finalizer),  # one child more
            (same, 3, finalizer),  # another threshold
            (same, 2, make_args(queue=_QUEUE)),  # another finalizer
        ]:
            with pytest.raises(ValueError, match="already exists"):
                await backend.enqueue_batch_atomic(
                    items,
                    batch_id=batch_id,
                    queue=_QUEUE,
                    batch_row=BatchRow(
                        id=batch_id,
                        queue=_QUEUE,
                        expected_size=len(items),
                        failure_threshold=threshold,
                    ),
                    finalizer_args=final,
                )
        assert await backend.list_jobs(JobFilter()) == stored
        assert await _batch(backend, batch_id) == batch

    @covers("enqueue_batch_atomic")
    async def test_a_finalizer_takes_no_idempotency_key(self, backend: Backend) -> None:
        # A stored job of that key (due in an hour, say) was released and run in its
        # place when the batch completed; the batch's own finalizer never ran.
        stored = await backend.enqueue(make_args(idempotency_key="fin"))
        batch_id, child = uuid4(), make_args(queue=_QUEUE)
        with pytest.raises(ValueError, match="finalizer takes no idempotency_key"):
            await backend.enqueue_batch_atomic(
                [child],
                batch_id=batch_id,
                queue=_QUEUE,
                batch_row=BatchRow(id=batch_id, queue=_QUEUE, expected_size=1),
                finalizer_args=make_args(queue=_QUEUE, idempotency_key="fin"),
            )
        assert await backend.list_jobs(JobFilter()) == [stored]
        assert await backend.get_batch(batch_id) is None

    @covers("enqueue_batch_atomic")
    async def test_a_finalizer_needs_a_batch_row(self, backend: Backend) -> None:
        # Only the row's completion or abort releases a finalizer: without one it stayed
        # parked (scheduled until 9999) for ever, and a worker run until idle never was.
        batch_id, child = uuid4(), make_args(queue=_QUEUE)
        with pytest.raises(ValueError, match="finalizer needs a batch row"):
            await backend.enqueue_batch_atomic(
                [child],
                batch_id=batch_id,
                queue=_QUEUE,
                batch_row=None,
                finalizer_args=make_args(queue=_QUEUE),
            )
        assert await backend.list_jobs(JobFilter()) == []
        assert await backend.get_batch(batch_id) is None

    @covers("enqueue_batch_atomic")
    async def test_enqueue_batch_atomic_is_all_or_nothing(self, backend: Backend) -> None:
        existing = await backend.enqueue(make_args())
        batch_id, fresh, finalizer = uuid4(), make_args(queue=_QUEUE), make_args(queue=_QUEUE)
        # A second job cannot take an existing id, so the last child fails the call.
        with pytest.raises(Exception):  # noqa: B017 - the contract fixes failure, not the type
            await backend.enqueue_batch_atomic(
                [fresh, make_args(id=existing.id, queue=_QUEUE)],
                batch_id=batch_id,
                queue=_QUEUE,
                batch_row=BatchRow(id=batch_id, queue=_QUEUE, expected_size=2),
                finalizer_args=finalizer,
            )
        assert await backend.get(fresh.id) is None
        assert await backend.get(finalizer.id) is None
        assert await backend.get_batch(batch_id) is None
        assert await backend.list_jobs(JobFilter()) == [existing]

    # -- the failure counter -----------------------------------------------------------

    @covers("increment_batch_failures", "reset_batch_failures")
    async def test_the_failure_counter_counts_up_and_resets(self, backend: Backend) -> None:
        batch_id, _, _ = await _tracked_batch(backend, {}, {}, {}, threshold=3)
        await _succeed_one(backend)
        # Whether a child is left (two are), not how many.
        assert await backend.increment_batch_failures(batch_id) == (1, 3, 1)
        assert await backend.increment_batch_failures(batch_id) == (2, 3, 1)
        assert (await _batch(backend, batch_id)).consecutive_failures == 2
        assert await backend.reset_batch_failures(batch_id) == 1
        assert (await _batch(backend, batch_id)).consecutive_failures == 0
        assert await backend.increment_batch_failures(batch_id) == (1, 3, 1)

    @covers("reset_batch_failures", "complete_batch", "increment_batch_failures")
    async def test_a_success_leaves_a_streak_that_reached_its_threshold(
        self, backend: Backend
    ) -> None:
        # Two last children's hooks racing: one's failure reached the threshold and,
        # before its abort, the other's success reset the streak, saw no child left and
        # completed the batch (released its finalizer as if the policy held).
        batch_id, _, finalizer = await _tracked_batch(backend, {}, threshold=2)
        await backend.increment_batch_failures(batch_id)
        assert await backend.increment_batch_failures(batch_id) == (2, 2, 1)
        assert await backend.reset_batch_failures(batch_id) == 0
        await backend.complete_batch(batch_id)
        batch = await _batch(backend, batch_id)
        assert (batch.status, batch.consecutive_failures) == ("active", 2)
        assert (await fetch(backend, finalizer.id)).status is JobStatus.SCHEDULED
        await backend.abort_batch(batch_id)
        assert (await _batch(backend, batch_id)).status == "aborted"

    @covers("increment_batch_failures")
    async def test_a_batch_without_a_policy_reports_no_threshold(self, backend: Backend) -> None:
        batch_id, _, _ = await _tracked_batch(backend, {}, threshold=None)
        assert await backend.increment_batch_failures(batch_id) == (1, None, 1)
        await _succeed_one(backend)  # its one child ended: none is left
        assert await backend.increment_batch_failures(batch_id) == (2, None, 0)

    @covers("reset_batch_failures")
    async def test_resetting_an_unknown_batch_changes_nothing(self, backend: Backend) -> None:
        assert await backend.reset_batch_failures(uuid4()) == 0

    @covers("increment_batch_failures", "reset_batch_failures", "abort_batch", "complete_batch")
    async def test_a_finished_batchs_streak_is_over(self, backend: Backend) -> None:
        # A child still running when its batch ended: its failure counted again (and
        # aborted again), its success reset an aborted batch's streak.
        for end in (backend.abort_batch, backend.complete_batch):
            batch_id, _, _ = await _tracked_batch(backend, {}, threshold=3)
            assert await backend.increment_batch_failures(batch_id) == (1, 3, 1)
            await end(batch_id)
            with pytest.raises(KeyError):
                await backend.increment_batch_failures(batch_id)
            assert await backend.reset_batch_failures(batch_id) == 0
            assert (await _batch(backend, batch_id)).consecutive_failures == 1
        with pytest.raises(KeyError):
            await backend.increment_batch_failures(uuid4())

    @covers("add_batch_failures", "increment_batch_failures")
    async def test_failures_added_at_once_leave_what_as_many_increments_leave(
        self, backend: Backend
    ) -> None:
        # A sweep that ended many children of one batch counted them one round trip
        # each: the one call must leave the streak where those increments stop.
        if not isinstance(backend, SupportsBatchFailureCount):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsBatchFailureCount")
        cases = [
            # (threshold, failures before, added): the result of `added` increments
            (None, 0, 3),
            (5, 1, 2),  # short of the threshold
            (3, 1, 5),  # past it: they stop at the abort
            (2, 2, 3),  # already at it (the abort was lost): one more, as one call
        ]
        for threshold, before, added in cases:
            one_call, _, _ = await _tracked_batch(backend, {}, threshold=threshold)
            one_by_one, _, _ = await _tracked_batch(backend, {}, threshold=threshold)
            for batch_id in (one_call, one_by_one):
                for _ in range(before):
                    await backend.increment_batch_failures(batch_id)
            expected: tuple[int, int | None, int] = (before, threshold, 1)
            for _ in range(added):
                expected = await backend.increment_batch_failures(one_by_one)
                if threshold is not None and expected[0] >= threshold:
                    break
            assert await backend.add_batch_failures(one_call, added) == expected
            assert (await _batch(backend, one_call)).consecutive_failures == expected[0]

    @covers("add_batch_failures")
    async def test_adding_failures_to_a_finished_batch_or_none_is_refused(
        self, backend: Backend
    ) -> None:
        if not isinstance(backend, SupportsBatchFailureCount):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsBatchFailureCount")
        batch_id, _, _ = await _tracked_batch(backend, {}, threshold=None)
        with pytest.raises(ValueError, match="at least 1"):
            await backend.add_batch_failures(batch_id, 0)
        await _succeed_one(backend)
        assert await backend.add_batch_failures(batch_id, 2) == (2, None, 0)
        await backend.complete_batch(batch_id)
        with pytest.raises(KeyError):
            await backend.add_batch_failures(batch_id, 1)
        with pytest.raises(KeyError):
            await backend.add_batch_failures(uuid4(), 1)
        assert (await _batch(backend, batch_id)).consecutive_failures == 2

    @covers("complete_batch", "increment_batch_failures")
    async def test_a_batch_whose_streak_reached_its_threshold_is_not_completed(
        self, backend: Backend
    ) -> None:
        # Two children's hooks racing: the one that saw no child left (after its own
        # failure, the first) completes while the other's failure reaches the threshold.
        batch_id, _, finalizer = await _tracked_batch(backend, {}, threshold=2)
        await backend.increment_batch_failures(batch_id)
        await backend.increment_batch_failures(batch_id)
        await backend.complete_batch(batch_id)
        assert (await _batch(backend, batch_id)).status == "active"
        assert (await fetch(backend, finalizer.id)).status is JobStatus.SCHEDULED
        await backend.abort_batch(batch_id)
        assert (await _batch(backend, batch_id)).status == "aborted"

    @covers("complete_batch", "increment_batch_failures", "mark_failed_or_retry")
    async def test_a_batch_whose_last_children_all_failed_ends_aborted(
        self, backend: Backend
    ) -> None:
        # Its last two children failed at once on two workers: the first one's hook
        # counted its failure, found no child left and completed the batch; the other's
        # failure, which reached the threshold, then found the batch ended.
        batch_id, _, finalizer = await _tracked_batch(backend, {}, {}, threshold=2)
        error = ErrorInfo(error_class="RuntimeError", message="child failed")
        for _ in range(2):
            worker = uuid4()
            [child] = await backend.dispatch_batch(worker, [_QUEUE], 1, LONG_LEASE)
            ended = await backend.mark_failed_or_retry(child.id, worker, error, None)
            assert ended.status is JobStatus.FAILED
        assert await backend.increment_batch_failures(batch_id) == (1, 2, 0)
        await backend.complete_batch(batch_id)
        batch = await _batch(backend, batch_id)
        assert batch.status == "aborted"
        assert_utc(batch.completed_at)
        assert (await fetch(backend, finalizer.id)).status is JobStatus.PENDING
        with pytest.raises(KeyError):
            await backend.increment_batch_failures(batch_id)

    @covers("complete_batch", "mark_succeeded", "mark_failed_or_retry")
    async def test_a_success_after_the_failures_completes_the_batch(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # The failures before the last success are no streak at the batch's end.
        batch_id, _, _ = await _tracked_batch(backend, {}, {}, {}, threshold=2)
        error = ErrorInfo(error_class="RuntimeError", message="child failed")
        for _ in range(2):
            worker = uuid4()
            [child] = await backend.dispatch_batch(worker, [_QUEUE], 1, LONG_LEASE)
            await backend.mark_failed_or_retry(child.id, worker, error, None)
        await advance_time(TICK)
        await _succeed_one(backend)
        await backend.complete_batch(batch_id)
        assert (await _batch(backend, batch_id)).status == "complete"

    # -- abort and complete -----------------------------------------------------------------

    @covers("abort_batch", "get_batch")
    async def test_abort_batch_cancels_waiting_children_and_releases_the_finalizer(
        self, backend: Backend
    ) -> None:
        batch_id, children, finalizer = await _tracked_batch(
            backend, {"priority": 9}, {"priority": 5}, {}, {"delay": FAR}
        )
        done = await _succeed_one(backend)
        [running] = await backend.dispatch_batch(uuid4(), [_QUEUE], 1, LONG_LEASE)
        assert (done.id, running.id) == (children[0].id, children[1].id)
        assert await backend.abort_batch(batch_id) == 2
        for child in children[2:]:
            after = await fetch(backend, child.id)
            assert after.status is JobStatus.CANCELLED
            assert after.error is not None and after.error.message == _ABORT_MESSAGE
            await assert_history_consistent(backend, child.id)
        # Running and finished children are left alone.
        assert await backend.get(running.id) == running
        assert await backend.get(done.id) == done
        batch = await _batch(backend, batch_id)
        assert batch.status == "aborted"
        assert_utc(batch.completed_at)
        released = await fetch(backend, finalizer.id)
        assert released.status is JobStatus.PENDING
        assert_close(released.scheduled_at, batch.completed_at)
        dispatched = await backend.dispatch_batch(uuid4(), [_QUEUE], 10, LONG_LEASE)
        assert [row.id for row in dispatched] == [finalizer.id]

    @covers("retry_job", "abort_batch")
    async def test_a_child_of_an_aborted_batch_is_not_retried(self, backend: Backend) -> None:
        # Put back to pending, the stale-batch sweep cancelled it again ("Batch
        # aborted"), though retry_job had answered True. A child of a completed batch is
        # retried: nothing cancels it.
        batch_id, children, _ = await _tracked_batch(backend, {}, {})
        assert await backend.abort_batch(batch_id) == 2
        with pytest.raises(RetryRefusedError, match="aborted"):
            await backend.retry_job(children[0].id)
        after = await fetch(backend, children[0].id)
        assert after.status is JobStatus.CANCELLED
        await assert_history_consistent(backend, children[0].id)
        done_id, done_children, _ = await _tracked_batch(backend, {})
        await backend.write_cancel_request(done_children[0].id, "not needed")
        await backend.complete_batch(done_id)
        assert (await _batch(backend, done_id)).status == "complete"
        assert await backend.retry_job(done_children[0].id)

    @covers("complete_batch")
    async def test_complete_batch_completes_once_and_releases_the_finalizer(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        batch_id, _, finalizer = await _tracked_batch(backend, {})
        await _succeed_one(backend)
        await backend.complete_batch(batch_id)
        batch = await _batch(backend, batch_id)
        assert batch.status == "complete"
        assert_utc(batch.completed_at)
        released = await fetch(backend, finalizer.id)
        assert released.status is JobStatus.PENDING
        assert_close(released.scheduled_at, batch.completed_at)
        await advance_time(TICK)
        await backend.complete_batch(batch_id)
        assert await backend.get_batch(batch_id) == batch
        assert await backend.get(finalizer.id) == released

    @covers("complete_batch", "deadline_sweep")
    async def test_a_parked_finalizers_deadline_counts_from_its_release(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # The deadline sweep failed it while it waited for its batch: it never ran.
        batch_id, _, finalizer = await _tracked_batch(backend, {}, schedule_to_close=SHORT_LEASE)
        await expire_short_leases(advance_time)  # the batch outlasts the finalizer's budget
        assert await backend.deadline_sweep() == 0
        await _succeed_one(backend)
        await backend.complete_batch(batch_id)
        released = await fetch(backend, finalizer.id)
        assert released.status is JobStatus.PENDING and released.deadline_at is not None
        assert_close(released.deadline_at, released.scheduled_at + SHORT_LEASE)
        assert await backend.deadline_sweep() == 0
        await expire_short_leases(advance_time)
        assert await backend.deadline_sweep() == 1  # from its release, it does count

    @covers("complete_batch", "abort_batch")
    async def test_complete_batch_leaves_an_aborted_batch_aborted(self, backend: Backend) -> None:
        batch_id, _, _ = await _tracked_batch(backend, {})
        await backend.abort_batch(batch_id)
        aborted = await _batch(backend, batch_id)
        await backend.complete_batch(batch_id)
        assert await backend.get_batch(batch_id) == aborted

    # -- children ended outside the worker: reported in batch_ends -------------------------

    @covers("write_cancel_request", "cancel_where")
    async def test_a_cancel_reports_the_batch_children_it_ends(self, backend: Backend) -> None:
        # Not reported, a cancelled child never reached its batch: the batch waited for
        # the stale-batch sweep to complete it.
        batch_id, children, _ = await _tracked_batch(
            backend, {"priority": 9}, {}, {}, {"delay": FAR}
        )
        [running] = await backend.dispatch_batch(uuid4(), [_QUEUE], 1, LONG_LEASE)
        assert running.id == children[0].id
        ends: list[BatchChildEnd] = []
        assert await backend.write_cancel_request(running.id, None, batch_ends=ends)
        assert ends == []  # only flagged: its worker ends it
        assert await backend.write_cancel_request(children[1].id, None, batch_ends=ends)
        assert ends == [BatchChildEnd(str(batch_id), JobStatus.CANCELLED)]
        untagged = await backend.enqueue(make_args(queue=_QUEUE))
        ends.clear()
        selected = JobFilter(batch_id=batch_id)
        result = await backend.cancel_where(selected, "operator", batch_ends=ends)
        assert sorted(result.cancelled) == sorted(child.id for child in children[2:])
        assert result.requested == [running.id]
        assert ends == [BatchChildEnd(str(batch_id), JobStatus.CANCELLED)] * 2
        ends.clear()
        assert await backend.write_cancel_request(untagged.id, None, batch_ends=ends)
        assert ends == []  # no batch tag, nothing to report

    @covers("deadline_sweep")
    async def test_the_deadline_sweep_reports_the_batch_children_it_fails(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # Not reported, a child failed past its deadline never counted toward its batch's
        # failure threshold: a batch whose policy should have aborted it completed.
        batch_id, _, _ = await _tracked_batch(
            backend,
            {"schedule_to_close": SHORT_LEASE},
            {"schedule_to_close": SHORT_LEASE, "delay": FAR},
            {"schedule_to_close": FAR},
        )
        await backend.enqueue(make_args(schedule_to_close=SHORT_LEASE))
        await expire_short_leases(advance_time)
        ends: list[BatchChildEnd] = []
        assert await backend.deadline_sweep(batch_ends=ends) == 3
        assert ends == [BatchChildEnd(str(batch_id), JobStatus.FAILED)] * 2

    @covers("reclaim_expired_locks")
    async def test_the_reclaim_reports_the_batch_children_it_ends(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        batch_id, children, _ = await _tracked_batch(
            backend, {"priority": 9, "max_attempts": 1}, {"max_attempts": 3}
        )
        running = await backend.dispatch_batch(uuid4(), [_QUEUE], 2, SHORT_LEASE)
        assert [row.id for row in running] == [child.id for child in children]
        await expire_short_leases(advance_time)
        ends: list[BatchChildEnd] = []
        assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0), batch_ends=ends) == 2
        # The last attempt crashed; the other child is pending again, not ended.
        assert ends == [BatchChildEnd(str(batch_id), JobStatus.CRASHED)]
        assert (await fetch(backend, children[1].id)).status is JobStatus.PENDING

    @covers("hand_back_unstarted")
    async def test_the_unstarted_hand_back_reports_the_batch_children_it_ends(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # Not reported, a child the hand-back failed past its deadline never counted
        # toward its batch's failure threshold, and a last one it cancelled left its
        # batch active until the stale-batch sweep.
        many = handing_back(backend)
        batch_id, children, _ = await _tracked_batch(
            backend,
            {"priority": 9, "schedule_to_close": SHORT_LEASE},
            {"priority": 8},
            {"priority": 7},
        )
        untagged = await backend.enqueue(make_args(queue="untagged"))
        worker = uuid4()
        held = await backend.dispatch_batch(worker, [_QUEUE], 3, LONG_LEASE)
        assert [row.id for row in held] == [child.id for child in children]
        held += await backend.dispatch_batch(worker, ["untagged"], 1, LONG_LEASE)
        assert held[-1].id == untagged.id
        for job in (children[1], untagged):
            assert await backend.write_cancel_request(job.id, None)  # flagged: running
        await expire_short_leases(advance_time)  # the first child's deadline passes
        ends: list[BatchChildEnd] = []
        jobs = [(row.id, row.attempt) for row in held]
        assert await many.hand_back_unstarted(worker, jobs, batch_ends=ends) == 4
        tag = str(batch_id)
        assert sorted(ends) == [
            BatchChildEnd(tag, JobStatus.CANCELLED),
            BatchChildEnd(tag, JobStatus.FAILED),
        ]  # the third child is pending again, not ended; the untagged job not reported
        statuses = [(await fetch(backend, row.id)).status for row in held]
        assert statuses == [
            JobStatus.FAILED,
            JobStatus.CANCELLED,
            JobStatus.PENDING,
            JobStatus.CANCELLED,
        ]

    # -- reads ------------------------------------------------------------------------------

    @covers("count_batch_non_terminal")
    async def test_count_batch_non_terminal_excludes_finished_children_and_the_finalizer(
        self, backend: Backend
    ) -> None:
        batch_id, children, _ = await _tracked_batch(backend, {"priority": 1}, {}, {"delay": FAR})
        assert await backend.count_batch_non_terminal(batch_id) == 3
        await _succeed_one(backend)
        assert await backend.count_batch_non_terminal(batch_id) == 2
        assert await backend.write_cancel_request(children[2].id, None)
        assert await backend.count_batch_non_terminal(batch_id) == 1

    @covers("batch_has_active_children")
    async def test_batch_has_active_children_while_a_child_waits_or_runs(
        self, backend: Backend
    ) -> None:
        if not isinstance(backend, SupportsBatchChildCheck):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsBatchChildCheck")
        batch_id, children, _ = await _tracked_batch(backend, {"priority": 1}, {"delay": FAR})
        assert await backend.batch_has_active_children(batch_id) is True
        worker = uuid4()
        [running] = await backend.dispatch_batch(worker, [_QUEUE], 1, LONG_LEASE)
        assert running.id == children[0].id
        assert await backend.batch_has_active_children(batch_id) is True
        assert await backend.write_cancel_request(children[1].id, None)  # scheduled: cancelled
        assert await backend.batch_has_active_children(batch_id) is True  # one still runs
        assert await backend.mark_succeeded(running.id, worker, None)
        # Only the parked finalizer waits now: it is no child.
        assert await backend.batch_has_active_children(batch_id) is False
        assert await backend.batch_has_active_children(uuid4()) is False

    @covers("batch_has_active_children", "count_batch_non_terminal")
    async def test_batch_has_active_children_of_a_tags_only_batch(self, backend: Backend) -> None:
        # A batch of tags only (no batch row) has children as a tracked one does, and
        # count_batch_non_terminal counts them: Postgres answered False while they waited,
        # the in-memory backend True.
        if not isinstance(backend, SupportsBatchChildCheck):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsBatchChildCheck")
        batch_id = uuid4()
        [child] = await backend.enqueue_batch_atomic(
            [make_args(queue=_QUEUE)],
            batch_id=batch_id,
            queue=_QUEUE,
            batch_row=None,
            finalizer_args=None,
        )
        assert await backend.count_batch_non_terminal(batch_id) == 1
        assert await backend.batch_has_active_children(batch_id) is True
        assert (await _succeed_one(backend)).id == child.id
        assert await backend.count_batch_non_terminal(batch_id) == 0
        assert await backend.batch_has_active_children(batch_id) is False

    @covers("list_batches", "create_batch", "complete_batch")
    async def test_list_batches_filters_newest_first(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        ids = []
        for queue in ("q1", "q1", "q2"):
            ids.append(uuid4())
            await backend.create_batch(ids[-1], queue, 0, None, None, None)
            await advance_time(TICK)
        first, second, third = ids
        await backend.complete_batch(second)

        async def listed(**fields: Any) -> list[UUID]:
            return [row.id for row, _ in await backend.list_batches(BatchFilter(**fields))]

        assert await listed() == [third, second, first]
        assert await listed(queue="q1") == [second, first]
        assert await listed(active=True) == [third, first]
        assert await listed(active=False) == [second]
        assert await listed(batch_id=first) == [first]
        assert await listed(limit=1) == [third]

    @covers("list_batches")
    async def test_list_batches_counts_children_without_the_finalizer(
        self, backend: Backend
    ) -> None:
        batch_id, children, _ = await _tracked_batch(backend, {"priority": 1}, {}, {})
        await _succeed_one(backend)
        assert await backend.write_cancel_request(children[2].id, None)
        [(row, counts)] = await backend.list_batches(BatchFilter(batch_id=batch_id))
        assert row == await backend.get_batch(batch_id)
        assert counts.total == 3
        assert {status: n for status, n in counts.by_status.items() if n} == {
            JobStatus.SUCCEEDED: 1,
            JobStatus.PENDING: 1,
            JobStatus.CANCELLED: 1,
        }
        assert counts.non_terminal == 1

    @covers("prune_old_batches")
    async def test_prune_old_batches_deletes_only_old_finished_childless_batches(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        old, active = uuid4(), uuid4()
        await backend.create_batch(old, "q", 0, None, None, None)
        await backend.create_batch(active, "q", 0, None, None, None)
        with_children, _, _ = await _tracked_batch(backend, {})
        await backend.complete_batch(old)
        await backend.complete_batch(with_children)
        await advance_time(TICK)
        recent = uuid4()
        cutoff = await _completed_now(backend, recent)
        assert await backend.prune_old_batches(cutoff) == 1
        assert await backend.get_batch(old) is None
        for kept in (active, with_children, recent):
            assert await backend.get_batch(kept) is not None

    @covers("prune_old_batches", "enqueue_batch_atomic", "complete_batch")
    async def test_prune_old_batches_keeps_a_batch_while_its_finalizer_is_a_job(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # Pruned while its finalizer waited or ran, the finalizer ran against a batch
        # that no longer existed: like a child, it keeps its batch until it is pruned.
        batch_id, _, finalizer = await _tracked_batch(backend)
        await backend.complete_batch(batch_id)
        assert (await fetch(backend, finalizer.id)).status is JobStatus.PENDING
        await advance_time(TICK)
        cutoff = await _completed_now(backend)
        assert await backend.prune_old_batches(cutoff) == 0
        worker = uuid4()
        [running] = await backend.dispatch_batch(worker, [_QUEUE], 1, LONG_LEASE)
        assert running.id == finalizer.id
        assert await backend.prune_old_batches(cutoff) == 0
        assert await backend.mark_succeeded(finalizer.id, worker, None)
        assert await backend.prune_old_batches(cutoff) == 0
        assert (await _batch(backend, batch_id)).status == "complete"
        if isinstance(backend, SupportsPrune):
            await advance_time(TICK)
            retention = {"succeeded": timedelta(0)}
            assert await backend.prune_terminal_jobs(retention, archive_retention=FAR) == 1
            assert await backend.prune_old_batches(cutoff) == 1
            assert await backend.get_batch(batch_id) is None

    @covers("prune_old_batches")
    async def test_prune_old_batches_takes_a_naive_cutoff_as_utc(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # As asyncpg takes it: the in-memory backend compared it with its own aware
        # times, and raised TypeError.
        old, recent = uuid4(), uuid4()
        await backend.create_batch(old, "q", 0, None, None, None)
        await backend.complete_batch(old)
        await advance_time(TICK)
        cutoff = await _completed_now(backend, recent)
        assert await backend.prune_old_batches(cutoff.astimezone(UTC).replace(tzinfo=None)) == 1
        assert await backend.get_batch(old) is None
        assert await backend.get_batch(recent) is not None
