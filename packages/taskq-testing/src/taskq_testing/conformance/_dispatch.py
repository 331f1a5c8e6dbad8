"""Dispatch: what gets locked, in which order, under which caps; heartbeats."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final
from uuid import UUID, uuid4

import pytest

from taskq.backend import (
    Backend,
    JobStatus,
    SupportsActorDispatch,
    SupportsHeldJobs,
    SupportsLeaseRenewal,
)
from taskq.models import ActorConfig, JobFilter, JobRow, QueueConfig, QueueMode
from taskq_testing.conformance._support import (
    ACTOR,
    ERROR,
    LONG_LEASE,
    SHORT_LEASE,
    TICK,
    AdvanceTime,
    assert_close,
    assert_utc,
    covers,
    enqueue_and_dispatch,
    fetch,
    make_args,
    reach,
)


def _fifo_key(row: JobRow) -> tuple[int, object, UUID]:
    return (-row.priority, row.scheduled_at, row.id)


def _round_robin_order(rows: list[JobRow]) -> list[UUID]:
    """The contract's round-robin order: rank within the fairness cohort first."""
    rank: dict[UUID, int] = {}
    cohorts: dict[str | None, list[JobRow]] = {}
    for row in rows:
        cohorts.setdefault(row.fairness_key, []).append(row)
    for members in cohorts.values():
        for position, row in enumerate(sorted(members, key=_fifo_key)):
            rank[row.id] = position
    return [row.id for row in sorted(rows, key=lambda r: (rank[r.id], *_fifo_key(r)))]


_FREE_ACTOR: Final = "conformance.free"


async def _round_robin_with_a_capped_actor(backend: Backend) -> str:
    """Queue ``rr`` made round-robin, ACTOR capped at one running job, and another actor
    free of caps: its name."""
    await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
    await backend.register_actors(
        [ActorConfig(actor=ACTOR, max_concurrent=1), ActorConfig(actor=_FREE_ACTOR)]
    )
    return _FREE_ACTOR


async def _enqueue_spread(
    backend: Backend, advance_time: AdvanceTime, *specs: dict[str, Any]
) -> list[JobRow]:
    """Enqueue one job per spec, letting time pass between them so ``scheduled_at`` differs."""
    rows = []
    for spec in specs:
        rows.append(await backend.enqueue(make_args(**spec)))
        await advance_time(TICK)
    return rows


OTHER = "conformance.other"
"""An actor the dispatching worker does not know."""


def _actor_dispatcher(backend: Backend) -> SupportsActorDispatch:
    if not isinstance(backend, SupportsActorDispatch):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsActorDispatch")
    return backend


async def _leases_to_renew(backend: Backend) -> tuple[UUID, list[JobRow], JobRow, JobRow]:
    """A worker holding two jobs on a short lease, a job it finished, and another
    worker's job: the worker, its held jobs, the finished one and the other one."""
    mine, theirs = uuid4(), uuid4()
    held = [
        await enqueue_and_dispatch(backend, worker_id=mine, lease=SHORT_LEASE) for _ in range(2)
    ]
    finished = await enqueue_and_dispatch(backend, worker_id=mine, lease=SHORT_LEASE)
    assert await backend.mark_succeeded(finished.id, mine, None)
    other = await enqueue_and_dispatch(backend, worker_id=theirs, lease=SHORT_LEASE)
    return mine, held, finished, other


async def _assert_renewed(
    backend: Backend, worker: UUID, held: list[JobRow], other: JobRow
) -> None:
    """``held`` still ``worker``'s, on the long lease; ``other`` untouched."""
    for job in held:
        row = await fetch(backend, job.id)
        assert row.status is JobStatus.RUNNING and row.locked_by_worker == worker
        assert row.lock_expires_at is not None and job.lock_expires_at is not None
        assert row.lock_expires_at >= job.lock_expires_at + LONG_LEASE - SHORT_LEASE
    assert await backend.get(other.id) == other


class DispatchTests:
    """``dispatch_batch``, queue modes, ``max_concurrent``, identity serialization, heartbeats."""

    @covers("dispatch_batch", "get")
    async def test_dispatch_locks_the_job_for_the_worker(self, backend: Backend) -> None:
        job = await backend.enqueue(make_args(max_attempts=4))
        worker = uuid4()
        [row] = await backend.dispatch_batch(worker, ["default"], 10, LONG_LEASE)
        assert row.id == job.id
        assert row.status is JobStatus.RUNNING
        assert row.attempt == 1
        assert row.max_attempts == 4
        assert row.locked_by_worker == worker
        assert row.execution_started_at is None
        assert_utc(row.started_at, row.lock_expires_at)
        assert row.started_at is not None and row.started_at >= job.created_at
        assert_close(row.lock_expires_at, row.started_at + LONG_LEASE)
        assert await backend.get(job.id) == row

    @covers(
        "enqueue",
        "dispatch_batch",
        "get",
        "list_jobs",
        "get_events",
        "mark_failed_or_retry",
    )
    async def test_a_returned_row_is_a_copy_of_what_is_stored(self, backend: Backend) -> None:
        # An actor that changed its dict payload in place changed the stored job on the
        # in-memory backend: each retry saw the changes of the attempts before it.
        payload = {"items": [1], "nested": {"k": "v"}}
        enqueued = await backend.enqueue(make_args(payload=payload, tags=["t"]))
        enqueued.payload["items"].append(2)
        worker = uuid4()
        [row] = await backend.dispatch_batch(worker, ["default"], 1, LONG_LEASE)
        row.payload["items"].append(3)
        row.payload["nested"]["k"] = "changed"
        row.tags.append("u")
        got = await fetch(backend, row.id)
        got.payload["items"].append(4)
        [listed] = await backend.list_jobs(JobFilter(actor=ACTOR))
        listed.metadata["x"] = 1
        stored = await fetch(backend, row.id)
        assert stored.payload == {"items": [1], "nested": {"k": "v"}}
        assert (stored.tags, stored.metadata) == (["t"], {})
        # History too: an edit of a returned event or row changes nothing stored.
        for event in await backend.get_events(row.id):
            event.detail["to_state"] = "edited"
        assert "edited" not in {e.detail.get("to_state") for e in await backend.get_events(row.id)}
        failed = await backend.mark_failed_or_retry(row.id, worker, ERROR, None)
        failed.payload["items"].append(5)
        assert (await fetch(backend, row.id)).payload["items"] == [1]

    @covers("dispatch_batch", "get_events")
    async def test_dispatch_records_a_state_change_event(self, backend: Backend) -> None:
        worker = uuid4()
        row = await enqueue_and_dispatch(backend, worker_id=worker)
        [event] = await backend.get_events(row.id)
        assert event.kind == "state_change"
        assert event.detail == {
            "from_state": "pending",
            "to_state": "running",
            "worker_id": str(worker),
        }
        assert_utc(event.occurred_at)
        assert_close(event.occurred_at, row.started_at)

    @pytest.mark.parametrize(
        "status",
        [
            JobStatus.SCHEDULED,
            JobStatus.RUNNING,
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
            JobStatus.ABANDONED,
        ],
    )
    @covers("dispatch_batch")
    async def test_dispatch_takes_only_pending_jobs(
        self, backend: Backend, status: JobStatus
    ) -> None:
        other = await reach(backend, status, queue="q")
        pending = await backend.enqueue(make_args(queue="q"))
        rows = await backend.dispatch_batch(uuid4(), ["q"], 10, LONG_LEASE)
        assert [row.id for row in rows] == [pending.id]
        assert await backend.get(other.id) == other

    @covers("dispatch_batch")
    async def test_dispatch_takes_only_the_given_queues(self, backend: Backend) -> None:
        a = await backend.enqueue(make_args(queue="a"))
        b = await backend.enqueue(make_args(queue="b"))
        c = await backend.enqueue(make_args(queue="c"))
        rows = await backend.dispatch_batch(uuid4(), ["a", "c"], 10, LONG_LEASE)
        assert {row.id for row in rows} == {a.id, c.id}
        assert (await fetch(backend, b.id)).status is JobStatus.PENDING

    @pytest.mark.parametrize(("limit", "queues"), [(0, ["default"]), (-1, ["default"]), (5, [])])
    @covers("dispatch_batch")
    async def test_dispatch_with_nothing_to_take_returns_nothing(
        self, backend: Backend, limit: int, queues: list[str]
    ) -> None:
        job = await backend.enqueue(make_args())
        assert await backend.dispatch_batch(uuid4(), queues, limit, LONG_LEASE) == []
        assert await backend.get(job.id) == job

    @covers("dispatch_batch")
    async def test_dispatch_takes_at_most_limit_jobs(self, backend: Backend) -> None:
        jobs = [await backend.enqueue(make_args()) for _ in range(5)]
        rows = await backend.dispatch_batch(uuid4(), ["default"], 2, LONG_LEASE)
        assert len(rows) == 2
        remaining = {job.id for job in jobs} - {row.id for row in rows}
        assert {(await fetch(backend, i)).status for i in remaining} == {JobStatus.PENDING}

    @covers("dispatch_batch")
    async def test_a_running_job_is_not_dispatched_again(self, backend: Backend) -> None:
        await enqueue_and_dispatch(backend, worker_id=uuid4(), queue="q")
        assert await backend.dispatch_batch(uuid4(), ["q"], 10, LONG_LEASE) == []

    @covers("dispatch_batch", "mark_failed_or_retry")
    async def test_each_dispatch_starts_a_new_attempt(self, backend: Backend) -> None:
        worker = uuid4()
        first = await enqueue_and_dispatch(backend, worker_id=worker, queue="q")
        retried = await backend.mark_failed_or_retry(
            first.id, worker, ERROR, timedelta(0), attempt=1
        )
        assert retried.status is JobStatus.PENDING
        [second] = await backend.dispatch_batch(worker, ["q"], 1, LONG_LEASE)
        assert (second.id, second.attempt) == (first.id, 2)

    # -- order ----------------------------------------------------------------------

    @covers("dispatch_batch")
    async def test_strict_fifo_orders_by_priority_then_time_then_id(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        spread = await _enqueue_spread(
            backend,
            advance_time,
            {"priority": 0},
            {"priority": 0},
            {"priority": 5},
            {"priority": -1},
        )
        # Jobs inserted in one call may share scheduled_at: then the id decides. Ids
        # are chosen descending so an insertion-order tie-break would be caught.
        ids = sorted((uuid4() for _ in range(3)), reverse=True)
        tied = await backend.enqueue_batch([make_args(id=i, priority=2) for i in ids])
        stored = [await fetch(backend, row.id) for row in [*spread, *tied]]
        rows = await backend.dispatch_batch(uuid4(), ["default"], 10, LONG_LEASE)
        assert [row.id for row in rows] == [row.id for row in sorted(stored, key=_fifo_key)]
        assert rows[0].id == spread[2].id

    @covers("dispatch_batch")
    async def test_limit_takes_the_head_of_the_order(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        low, _, high = await _enqueue_spread(
            backend, advance_time, {"priority": 1}, {"priority": 0}, {"priority": 9}
        )
        rows = await backend.dispatch_batch(uuid4(), ["default"], 2, LONG_LEASE)
        assert [row.id for row in rows] == [high.id, low.id]

    @covers("dispatch_batch", "configure_queue")
    async def test_round_robin_interleaves_fairness_cohorts(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
        specs: list[dict[str, Any]] = [
            {"fairness_key": "a"},
            {"fairness_key": "a"},
            {"fairness_key": "a", "priority": 3},
            {"fairness_key": "a"},
            {"fairness_key": "b"},
            {"fairness_key": "b"},
            {},
            {},
        ]
        rows = await _enqueue_spread(backend, advance_time, *({"queue": "rr", **s} for s in specs))
        dispatched = await backend.dispatch_batch(uuid4(), ["rr"], 10, LONG_LEASE)
        assert [row.id for row in dispatched] == _round_robin_order(rows)
        # The deep cohort does not starve the others: one of each comes first.
        assert {row.fairness_key for row in dispatched[:3]} == {"a", "b", None}

    @covers("dispatch_batch", "configure_queue")
    async def test_round_robin_limit_gives_every_cohort_a_turn(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
        rows = await _enqueue_spread(
            backend,
            advance_time,
            *({"queue": "rr", "fairness_key": "busy"} for _ in range(4)),
            {"queue": "rr", "fairness_key": "quiet"},
        )
        dispatched = await backend.dispatch_batch(uuid4(), ["rr"], 2, LONG_LEASE)
        assert [row.id for row in dispatched] == [rows[0].id, rows[4].id]

    @covers("dispatch_batch", "configure_queue", "register_actors")
    async def test_round_robin_ranks_only_the_jobs_of_actors_with_room(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
        await backend.register_actors([ActorConfig(actor=ACTOR, max_concurrent=1)])
        worker = uuid4()
        # Of a cohort of its own: running jobs count in their cohort's ranks.
        await _enqueue_spread(backend, advance_time, {"queue": "rr", "fairness_key": "t0"})
        assert len(await backend.dispatch_batch(worker, ["rr"], 1, LONG_LEASE)) == 1
        # ACTOR is at its cap: its waiting jobs must not push cohort t1's other job
        # behind cohort t2's in the ranking.
        *_, first_free, _ = await _enqueue_spread(
            backend,
            advance_time,
            *({"queue": "rr", "fairness_key": "t1"} for _ in range(3)),
            {"queue": "rr", "fairness_key": "t1", "actor": "conformance.free"},
            {"queue": "rr", "fairness_key": "t2", "actor": "conformance.free"},
        )
        [taken] = await backend.dispatch_batch(worker, ["rr"], 1, LONG_LEASE)
        assert taken.id == first_free.id

    @covers("dispatch_batch", "configure_queue", "register_actors")
    async def test_round_robin_ranks_a_job_among_its_whole_cohort_not_its_actors_jobs(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # A fairness cohort spans actors: the capped actor's jobs of cohorts t1 and t2
        # come second in them (the free actor's come first), its job of t3 is t3's
        # first. Its one place goes to that one; Postgres ranked each job among its
        # own actor's jobs of the cohort only and took t1's second job.
        free = await _round_robin_with_a_capped_actor(backend)
        free_t1, free_t2, _, _, first_of_t3 = await _enqueue_spread(
            backend,
            advance_time,
            {"queue": "rr", "fairness_key": "t1", "actor": free},
            {"queue": "rr", "fairness_key": "t2", "actor": free},
            *({"queue": "rr", "fairness_key": key} for key in ("t1", "t2", "t3")),
        )
        dispatched = await backend.dispatch_batch(uuid4(), ["rr"], 10, LONG_LEASE)
        assert [row.id for row in dispatched] == [free_t1.id, free_t2.id, first_of_t3.id]

    @covers("dispatch_batch", "configure_queue")
    async def test_round_robin_ranks_a_job_behind_a_capped_actors_whole_backlog_in_its_cohort(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # The capped actor's three jobs of cohort a all come before the free actor's one:
        # that one is a's fourth, behind the free actor's third of b.
        free = await _round_robin_with_a_capped_actor(backend)
        capped_a, _, _, free_b1, free_b2, _, free_b3 = await _enqueue_spread(
            backend,
            advance_time,
            *({"queue": "rr", "fairness_key": "a"} for _ in range(3)),
            *({"queue": "rr", "fairness_key": key, "actor": free} for key in ("b", "b", "a", "b")),
        )
        dispatched = await backend.dispatch_batch(uuid4(), ["rr"], 4, LONG_LEASE)
        assert [row.id for row in dispatched] == [capped_a.id, free_b1.id, free_b2.id, free_b3.id]

    @covers("dispatch_batch", "configure_queue", "register_actors")
    async def test_round_robin_ranks_a_strict_job_behind_a_capped_actors_strict_backlog(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # A strict queue asked for with a round-robin one is one cohort over its actors:
        # the capped actor's three jobs of it come before the free actor's one, which is
        # its fourth, behind the free actor's third of b. Postgres ranked it third, among
        # the capped actor's first two jobs only, and took it before that job of b.
        free = await _round_robin_with_a_capped_actor(backend)
        capped_first, _, _, free_b1, free_b2, _, free_b3 = await _enqueue_spread(
            backend,
            advance_time,
            *({"queue": "plain"} for _ in range(3)),
            {"queue": "rr", "fairness_key": "b", "actor": free},
            {"queue": "rr", "fairness_key": "b", "actor": free},
            {"queue": "plain", "actor": free},
            {"queue": "rr", "fairness_key": "b", "actor": free},
        )
        dispatched = await backend.dispatch_batch(uuid4(), ["plain", "rr"], 4, LONG_LEASE)
        assert [row.id for row in dispatched] == [
            capped_first.id,
            free_b1.id,
            free_b2.id,
            free_b3.id,
        ]

    @covers("dispatch_batch", "configure_queue")
    async def test_round_robin_puts_a_cohort_after_its_running_jobs(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # One slot at a time: a deep cohort of older jobs must not take every dispatch
        # while a shallow one waits behind its whole backlog.
        await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
        big = {"queue": "rr", "fairness_key": "big"}
        *_, small = await _enqueue_spread(
            backend, advance_time, big, big, big, {"queue": "rr", "fairness_key": "small"}
        )
        taken = [
            (await backend.dispatch_batch(uuid4(), ["rr"], 1, LONG_LEASE))[0] for _ in range(2)
        ]
        assert taken[0].fairness_key == "big"
        assert taken[1].id == small.id

    async def _one_slot_at_a_time(
        self, backend: Backend, advance_time: AdvanceTime, queues: list[str], n: int
    ) -> list[JobRow]:
        """``n`` one-job dispatches, each job done before the next (short jobs)."""
        worker, taken = uuid4(), []
        for _ in range(n):
            [job] = await backend.dispatch_batch(worker, queues, 1, LONG_LEASE)
            assert await backend.mark_succeeded(job.id, worker, None, attempt=job.attempt)
            taken.append(job)
            await advance_time(TICK)
        return taken

    @covers("dispatch_batch", "configure_queue", "mark_succeeded")
    async def test_round_robin_one_slot_at_a_time_serves_every_cohort_in_turn(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # With nothing running between dispatches, each went to the cohort of the
        # oldest jobs and the next: tenant "c" waited until "a" had drained.
        await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
        await _enqueue_spread(
            backend,
            advance_time,
            *({"queue": "rr", "fairness_key": "a"} for _ in range(4)),
            *({"queue": "rr", "fairness_key": key} for key in ("b", "b", None, None)),
        )
        taken = await self._one_slot_at_a_time(backend, advance_time, ["rr"], 8)
        assert [j.fairness_key for j in taken] == ["a", "b", None, "a", "b", None, "a", "a"]

    @covers("dispatch_batch", "configure_queue", "mark_succeeded")
    async def test_round_robin_takes_turns_with_the_strict_queues_of_the_call(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # A call for a strict and a round-robin queue: the strict queue's jobs are one
        # cohort, which takes its turn like the others (and starves none of them).
        await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
        await _enqueue_spread(
            backend,
            advance_time,
            *({"queue": "plain"} for _ in range(4)),
            *({"queue": "rr", "fairness_key": key} for key in ("a", "b", "a", "b")),
        )
        taken = await self._one_slot_at_a_time(backend, advance_time, ["plain", "rr"], 6)
        cohorts = [j.fairness_key if j.queue == "rr" else "plain" for j in taken]
        assert cohorts == ["plain", "a", "b", "plain", "a", "b"]

    @covers("dispatch_batch", "configure_queue", "mark_succeeded")
    async def test_round_robin_turns_are_per_fairness_key_across_queues(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # A key in two round-robin queues is one cohort, in its ranks and its turns.
        for queue in ("rr1", "rr2"):
            await backend.configure_queue(QueueConfig(queue=queue, mode="round_robin"))
        await _enqueue_spread(
            backend,
            advance_time,
            *({"queue": q, "fairness_key": "t"} for q in ("rr1", "rr2", "rr1", "rr2")),
            *({"queue": "rr1", "fairness_key": "u"} for _ in range(4)),
        )
        taken = await self._one_slot_at_a_time(backend, advance_time, ["rr1", "rr2"], 6)
        assert [j.fairness_key for j in taken] == ["t", "u", "t", "u", "t", "u"]

    @covers("dispatch_batch", "configure_queue")
    async def test_queues_are_strict_fifo_unless_configured(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        await backend.configure_queue(QueueConfig(queue="other", mode="round_robin"))
        # Queue "rr" is switched to round robin and back: the upsert keeps the last mode.
        await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
        await backend.configure_queue(
            QueueConfig(queue="rr", mode="strict_fifo", max_concurrent=50)
        )
        for queue in ("default", "rr"):
            rows = await _enqueue_spread(
                backend,
                advance_time,
                {"queue": queue, "fairness_key": "a"},
                {"queue": queue, "fairness_key": "a"},
                {"queue": queue, "fairness_key": "b"},
            )
            dispatched = await backend.dispatch_batch(uuid4(), [queue], 10, LONG_LEASE)
            assert [row.id for row in dispatched] == [row.id for row in rows], queue

    # -- caps -------------------------------------------------------------------------

    @pytest.mark.parametrize("cap", [1, 2, 3])
    @covers("dispatch_batch", "register_actors")
    async def test_max_concurrent_caps_an_actors_running_jobs(
        self, backend: Backend, cap: int
    ) -> None:
        await backend.register_actors([ActorConfig(actor=ACTOR, max_concurrent=cap)])
        for _ in range(cap + 3):
            await backend.enqueue(make_args())
        uncapped = [await backend.enqueue(make_args(actor="conformance.free")) for _ in range(4)]
        worker = uuid4()
        first = await backend.dispatch_batch(worker, ["default"], 20, LONG_LEASE)
        assert sum(row.actor == ACTOR for row in first) == cap
        assert {row.id for row in first if row.actor != ACTOR} == {row.id for row in uncapped}
        # A later round sees the running jobs and takes none until one finishes.
        assert await backend.dispatch_batch(worker, ["default"], 20, LONG_LEASE) == []
        done = next(row for row in first if row.actor == ACTOR)
        assert await backend.mark_succeeded(done.id, worker, None)
        refill = await backend.dispatch_batch(worker, ["default"], 20, LONG_LEASE)
        assert [row.actor for row in refill] == [ACTOR]

    @pytest.mark.parametrize("mode", ["strict_fifo", "round_robin"])
    @covers("dispatch_batch", "configure_queue")
    async def test_a_full_capped_queue_does_not_hold_back_the_others(
        self, backend: Backend, mode: QueueMode
    ) -> None:
        await backend.configure_queue(QueueConfig(queue="capped", mode=mode, max_concurrent=2))
        # The capped queue's waiting jobs come first in the order (priority).
        for _ in range(5):
            await backend.enqueue(make_args(queue="capped", priority=10))
        other = {(await backend.enqueue(make_args(queue="other"))).id for _ in range(3)}
        worker, queues = uuid4(), ["capped", "other"]
        assert len(await backend.dispatch_batch(worker, ["capped"], 5, LONG_LEASE)) == 2
        # "capped" is full: the places go to the other queue's jobs.
        second = await backend.dispatch_batch(worker, queues, 2, LONG_LEASE)
        third = await backend.dispatch_batch(worker, queues, 2, LONG_LEASE)
        assert (len(second), len(third)) == (2, 1)
        assert {row.id for row in [*second, *third]} == other

    @pytest.mark.parametrize("mode", ["strict_fifo", "round_robin"])
    @covers("dispatch_batch", "configure_queue")
    async def test_a_capped_queues_job_takes_no_identity_or_actor_place_past_its_cap(
        self, backend: Backend, mode: QueueMode
    ) -> None:
        # Postgres took the identity (and actor) places before the queue cap: a full
        # queue's job won its identity and then was dropped, and the other queue's job
        # of that identity waited for as long as the queue stayed full.
        await backend.configure_queue(QueueConfig(queue="capped", mode=mode, max_concurrent=1))
        worker, queues = uuid4(), ["capped", "other"]
        await backend.enqueue(make_args(queue="capped", priority=10))
        assert len(await backend.dispatch_batch(worker, ["capped"], 1, LONG_LEASE)) == 1
        await backend.enqueue(make_args(queue="capped", priority=10, identity_key="i1"))
        other = await backend.enqueue(make_args(queue="other", identity_key="i1"))
        for _ in range(2):  # not a one-tick shortfall: every dispatch
            rows = await backend.dispatch_batch(worker, queues, 5, LONG_LEASE)
            if rows:
                break
        assert [row.id for row in rows] == [other.id]

    @pytest.mark.parametrize("mode", ["strict_fifo", "round_robin"])
    @covers("dispatch_batch", "configure_queue")
    async def test_a_capped_queues_job_past_its_cap_leaves_its_actors_place(
        self, backend: Backend, mode: QueueMode
    ) -> None:
        await backend.configure_queue(QueueConfig(queue="capped", mode=mode, max_concurrent=1))
        await backend.register_actors([ActorConfig(actor=ACTOR, max_concurrent=2)])
        capped = {(await backend.enqueue(make_args(queue="capped", priority=10))).id for _ in "ab"}
        other = await backend.enqueue(make_args(queue="other"))
        rows = await backend.dispatch_batch(uuid4(), ["capped", "other"], 2, LONG_LEASE)
        taken = {row.id for row in rows}
        assert len(taken) == 2 and other.id in taken and len(taken & capped) == 1

    @pytest.mark.parametrize("mode", ["strict_fifo", "round_robin"])
    @covers("dispatch_batch", "configure_queue", "register_actors")
    async def test_a_job_refused_for_its_actors_cap_leaves_its_queues_place(
        self, backend: Backend, advance_time: AdvanceTime, mode: QueueMode
    ) -> None:
        # The capped queue has room for two: the capped actor's second job is refused
        # for the actor's cap, so the queue's second place is the next job's. Postgres
        # gave it to that refused job, and the next job waited a dispatch, run after a
        # later job of its actor.
        await backend.configure_queue(QueueConfig(queue="capped", mode=mode, max_concurrent=2))
        free = "conformance.free"
        await backend.register_actors(
            [ActorConfig(actor=ACTOR, max_concurrent=1), ActorConfig(actor=free)]
        )
        first, _, next_in_queue, other_queue = await _enqueue_spread(
            backend,
            advance_time,
            {"queue": "capped"},
            {"queue": "capped"},
            {"queue": "capped", "actor": free},
            {"queue": "other", "actor": free},
        )
        worker, queues = uuid4(), ["capped", "other"]
        rows = await backend.dispatch_batch(worker, queues, 10, LONG_LEASE)
        assert {row.id for row in rows} == {first.id, next_in_queue.id, other_queue.id}
        if mode == "strict_fifo":
            assert [row.id for row in rows] == [first.id, next_in_queue.id, other_queue.id]
        assert await backend.dispatch_batch(worker, queues, 10, LONG_LEASE) == []

    @pytest.mark.parametrize("mode", ["strict_fifo", "round_robin"])
    @covers("dispatch_batch", "configure_queue")
    async def test_a_job_refused_for_its_identity_leaves_its_queues_place(
        self, backend: Backend, advance_time: AdvanceTime, mode: QueueMode
    ) -> None:
        # Identity i1's job of the other queue comes first and takes the identity; the
        # capped queue's job of i1 is refused for it, so the queue's one place is the
        # next job's. Postgres gave the place to the refused job: the batch was short.
        await backend.configure_queue(QueueConfig(queue="capped", mode=mode, max_concurrent=1))
        worker, queues = uuid4(), ["capped", "other"]
        held, _, later, _ = await _enqueue_spread(
            backend,
            advance_time,
            {"queue": "other", "identity_key": "i1", "priority": 5},
            {"queue": "capped", "identity_key": "i1", "priority": 3},
            {"queue": "capped", "priority": 1},
            {"queue": "capped"},
        )
        rows = await backend.dispatch_batch(worker, queues, 10, LONG_LEASE)
        assert {row.id for row in rows} == {held.id, later.id}

    @covers("dispatch_batch", "register_actors")
    async def test_raising_max_concurrent_releases_more_jobs(self, backend: Backend) -> None:
        await backend.register_actors([ActorConfig(actor=ACTOR, max_concurrent=1)])
        for _ in range(4):
            await backend.enqueue(make_args())
        assert len(await backend.dispatch_batch(uuid4(), ["default"], 10, LONG_LEASE)) == 1
        await backend.register_actors([ActorConfig(actor=ACTOR, max_concurrent=3)])
        assert len(await backend.dispatch_batch(uuid4(), ["default"], 10, LONG_LEASE)) == 2

    @covers("dispatch_batch")
    async def test_one_batch_takes_one_job_per_identity(self, backend: Backend) -> None:
        same = [await backend.enqueue(make_args(identity_key="user-1")) for _ in range(3)]
        other = await backend.enqueue(make_args(identity_key="user-2"))
        plain = [await backend.enqueue(make_args()) for _ in range(2)]
        rows = await backend.dispatch_batch(uuid4(), ["default"], 10, LONG_LEASE)
        taken = {row.id for row in rows}
        assert len(taken & {job.id for job in same}) == 1
        assert {other.id, *(job.id for job in plain)} <= taken
        assert len(rows) == 4

    @covers("dispatch_batch", "mark_succeeded")
    async def test_an_identity_already_running_is_not_dispatched_again(
        self, backend: Backend
    ) -> None:
        worker = uuid4()
        running = await enqueue_and_dispatch(
            backend, worker_id=worker, queue="q1", identity_key="user-1"
        )
        # Same actor and identity in another queue: serialization is per (actor, identity).
        waiting = await backend.enqueue(make_args(queue="q2", identity_key="user-1"))
        other_actor = await backend.enqueue(
            make_args(actor="conformance.other", queue="q2", identity_key="user-1")
        )
        rows = await backend.dispatch_batch(worker, ["q1", "q2"], 10, LONG_LEASE)
        assert [row.id for row in rows] == [other_actor.id]
        assert await backend.mark_succeeded(running.id, worker, None)
        rows = await backend.dispatch_batch(worker, ["q2"], 10, LONG_LEASE)
        assert [row.id for row in rows] == [waiting.id]

    @covers("dispatch_batch", "configure_queue")
    @pytest.mark.parametrize("mode", ["strict_fifo", "round_robin"])
    async def test_jobs_waiting_on_a_running_identity_do_not_hide_the_jobs_behind_them(
        self, backend: Backend, mode: str
    ) -> None:
        await backend.configure_queue(QueueConfig(queue="q", mode=mode))
        worker = uuid4()
        await enqueue_and_dispatch(backend, worker_id=worker, identity_key="user-1")
        # More of them than any sample of the head a small dispatch reads.
        for _ in range(12):
            await backend.enqueue(make_args(queue="q", identity_key="user-1"))
        other = await backend.enqueue(make_args(queue="q", identity_key="user-2"))
        plain = await backend.enqueue(make_args(queue="q"))
        first = await backend.dispatch_batch(worker, ["q"], 1, LONG_LEASE)
        second = await backend.dispatch_batch(worker, ["q"], 1, LONG_LEASE)
        assert {row.id for row in first + second} == {other.id, plain.id}

    @covers("dispatch_batch", "configure_queue")
    async def test_round_robin_ranks_a_cohort_past_its_jobs_waiting_on_a_running_identity(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
        worker = uuid4()
        await enqueue_and_dispatch(backend, worker_id=worker, identity_key="k1")
        # Cohort a's first job that can run is first in its ranks, level with b's first,
        # and older: it goes first.
        _, behind, _ = await _enqueue_spread(
            backend,
            advance_time,
            {"queue": "rr", "identity_key": "k1", "fairness_key": "a"},
            {"queue": "rr", "fairness_key": "a"},
            {"queue": "rr", "fairness_key": "b"},
        )
        rows = await backend.dispatch_batch(worker, ["rr"], 1, LONG_LEASE)
        assert [row.id for row in rows] == [behind.id]

    # -- heartbeats ---------------------------------------------------------------------

    @covers("heartbeat_jobs")
    async def test_heartbeat_extends_only_the_workers_running_jobs(self, backend: Backend) -> None:
        mine, held, finished, other = await _leases_to_renew(backend)
        assert await backend.heartbeat_jobs(mine, LONG_LEASE) == 2
        await _assert_renewed(backend, mine, held, other)
        assert (await fetch(backend, finished.id)).lock_expires_at is None

    @covers("renew_leases")
    async def test_renew_leases_renews_the_workers_running_jobs_and_names_them(
        self, backend: Backend
    ) -> None:
        if not isinstance(backend, SupportsLeaseRenewal):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsLeaseRenewal")
        mine, held, _, other = await _leases_to_renew(backend)
        assert sorted(await backend.renew_leases(mine, LONG_LEASE)) == sorted(j.id for j in held)
        await _assert_renewed(backend, mine, held, other)
        assert await backend.renew_leases(uuid4(), LONG_LEASE) == []

    @covers("heartbeat_jobs")
    async def test_heartbeat_of_a_worker_without_jobs_counts_zero(self, backend: Backend) -> None:
        await enqueue_and_dispatch(backend, worker_id=uuid4())
        assert await backend.heartbeat_jobs(uuid4(), LONG_LEASE) == 0

    # -- dispatch_actors_batch (SupportsActorDispatch) ----------------------------------

    @pytest.mark.parametrize("mode", ["strict_fifo", "round_robin"])
    @covers("dispatch_actors_batch", "dispatch_batch", "configure_queue", "get_events")
    async def test_actor_dispatch_takes_only_the_actors_asked_for(
        self, backend: Backend, advance_time: AdvanceTime, mode: QueueMode
    ) -> None:
        dispatcher = _actor_dispatcher(backend)
        await backend.configure_queue(QueueConfig(queue="q", mode=mode))
        # A newer release's actor, ahead in the order: an older worker leaves its jobs be.
        other = await _enqueue_spread(
            backend,
            advance_time,
            *({"queue": "q", "actor": OTHER, "priority": 5} for _ in range(3)),
        )
        mine = await _enqueue_spread(backend, advance_time, *({"queue": "q"} for _ in range(2)))
        worker = uuid4()
        taken = await dispatcher.dispatch_actors_batch(worker, ["q"], 10, LONG_LEASE, [ACTOR])
        assert [row.id for row in taken] == [row.id for row in mine]
        for row in other:
            assert await fetch(backend, row.id) == row  # untouched: no attempt, no lock
            assert await backend.get_events(row.id) == []  # an enqueue writes none
        assert await dispatcher.dispatch_actors_batch(worker, ["q"], 10, LONG_LEASE, []) == []
        # A worker that knows the actor takes them.
        rest = await dispatcher.dispatch_actors_batch(
            uuid4(), ["q"], 10, LONG_LEASE, [OTHER, "conformance.absent"]
        )
        assert {row.id for row in rest} == {row.id for row in other}

    @covers("dispatch_actors_batch")
    async def test_a_backlog_of_other_actors_ahead_does_not_hide_the_actors_asked_for(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # More jobs of another actor ahead than any head a dispatch of 2 reads.
        for _ in range(40):
            await backend.enqueue(make_args(actor=OTHER, priority=5))
        mine = await _enqueue_spread(backend, advance_time, {}, {}, {})
        taken = await _actor_dispatcher(backend).dispatch_actors_batch(
            uuid4(), ["default"], 2, LONG_LEASE, [ACTOR]
        )
        assert [row.id for row in taken] == [row.id for row in mine[:2]]

    @covers("dispatch_actors_batch", "configure_queue")
    async def test_round_robin_ranks_only_the_jobs_of_the_actors_asked_for(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
        # Another actor's older jobs of cohort t1 would rank this actor's t1 job fourth,
        # behind its t2 job; they are not this dispatch's, so both rank first.
        await _enqueue_spread(
            backend, advance_time, *({"queue": "rr", "actor": OTHER, "fairness_key": "t1"},) * 3
        )
        first, _ = await _enqueue_spread(
            backend,
            advance_time,
            {"queue": "rr", "fairness_key": "t1"},
            {"queue": "rr", "fairness_key": "t2"},
        )
        [taken] = await _actor_dispatcher(backend).dispatch_actors_batch(
            uuid4(), ["rr"], 1, LONG_LEASE, [ACTOR]
        )
        assert taken.id == first.id

    @pytest.mark.parametrize("mode", ["strict_fifo", "round_robin"])
    @covers("dispatch_actors_batch", "configure_queue", "mark_succeeded")
    async def test_other_actors_running_jobs_count_against_the_queue_cap(
        self, backend: Backend, mode: QueueMode
    ) -> None:
        dispatcher = _actor_dispatcher(backend)
        await backend.configure_queue(QueueConfig(queue="capped", mode=mode, max_concurrent=1))
        await backend.enqueue(make_args(queue="capped", actor=OTHER))
        theirs = uuid4()
        [running] = await dispatcher.dispatch_actors_batch(
            theirs, ["capped"], 1, LONG_LEASE, [OTHER]
        )
        mine = await backend.enqueue(make_args(queue="capped"))
        worker = uuid4()
        assert (
            await dispatcher.dispatch_actors_batch(worker, ["capped"], 1, LONG_LEASE, [ACTOR]) == []
        )
        assert await backend.mark_succeeded(running.id, theirs, None)
        [taken] = await dispatcher.dispatch_actors_batch(worker, ["capped"], 1, LONG_LEASE, [ACTOR])
        assert taken.id == mine.id

    # -- held_jobs (SupportsHeldJobs) ---------------------------------------------------

    @covers("held_jobs")
    async def test_held_jobs_are_the_workers_running_jobs_with_their_attempts(
        self, backend: Backend
    ) -> None:
        if not isinstance(backend, SupportsHeldJobs):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsHeldJobs")
        mine, theirs = uuid4(), uuid4()
        held = [await enqueue_and_dispatch(backend, worker_id=mine) for _ in range(2)]
        finished = await enqueue_and_dispatch(backend, worker_id=mine)
        assert await backend.mark_succeeded(finished.id, mine, None)
        await enqueue_and_dispatch(backend, worker_id=theirs)
        assert sorted(await backend.held_jobs(mine)) == sorted(
            (job.id, job.attempt) for job in held
        )
        assert await backend.held_jobs(uuid4()) == []

    @covers("extend_reservation_leases")
    async def test_no_reservations_no_extended_leases(self, backend: Backend) -> None:
        worker = uuid4()
        await enqueue_and_dispatch(backend, worker_id=worker)
        assert await backend.extend_reservation_leases(worker, LONG_LEASE) == 0
