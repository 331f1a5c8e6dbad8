"""Stateful property tests of InMemoryBackend.

Hypothesis drives random sequences of protocol calls — enqueues with random
options, dispatches by random workers, heartbeats, every terminal write by
the owner and by others (with and without the attempt fence), cancel
requests, retries, sweeps and clock advances — and after every step checks
the invariants that must hold whatever the sequence:

* every status change recorded in the event log is in ``VALID_TRANSITIONS``
  (or is ``retry_job``'s reset of a terminal job), and the log replays to the
  stored status;
* a terminal job never changes again, except through ``retry_job``;
* a running job is held by exactly one worker, and no ``(actor,
  identity_key)`` runs twice;
* with one dispatcher no actor or queue exceeds its ``max_concurrent``;
* ``count_active_jobs`` / ``count_pending_jobs`` agree with ``list_jobs``.

Each rule also checks its own call against a model of the expected outcome
(owner or not, fence right or wrong, attempts left or not).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from taskq.backend import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    VALID_TRANSITIONS,
    CancelPhase,
    FakeClock,
    JobStatus,
)
from taskq.backend.memory import InMemoryBackend
from taskq.errors import RetryRefusedError, SingletonCollisionError
from taskq.models import (
    ActorConfig,
    EnqueueArgs,
    ErrorInfo,
    EventRow,
    JobFilter,
    JobId,
    JobRow,
    QueueConfig,
)

T = TypeVar("T")

# A passing run takes seconds; shrinking a failure to its shortest example can
# take a minute or two, which should end in a report, not a timeout.
pytestmark = pytest.mark.timeout(300)

ACTORS = ("a", "b")
QUEUES = ("q1", "q2")
WORKERS = tuple(UUID(int=n) for n in range(1, 4))
RETRYABLE = frozenset(
    {JobStatus.FAILED, JobStatus.CRASHED, JobStatus.CANCELLED, JobStatus.ABANDONED}
)
WAITING = frozenset({JobStatus.PENDING, JobStatus.SCHEDULED})

seconds = st.integers(min_value=0, max_value=90).map(lambda n: timedelta(seconds=n))
optional_seconds = st.none() | seconds


@st.composite
def enqueue_args(draw: st.DrawFn) -> EnqueueArgs:
    identity_key = draw(st.none() | st.sampled_from(["k1", "k2"]))
    # singleton without an identity key is refused (ValueError): keep it rare.
    singleton = draw(st.booleans()) if identity_key else draw(st.integers(0, 9)) == 0
    return EnqueueArgs(
        # Drawn, not uuid4(): ids break dispatch ties, so they must replay identically.
        id=draw(st.uuids()),
        actor=draw(st.sampled_from(ACTORS)),
        queue=draw(st.sampled_from(QUEUES)),
        priority=draw(st.integers(0, 2)),
        delay=draw(st.sampled_from([None, None, None, timedelta(0), timedelta(seconds=20)])),
        max_attempts=draw(st.integers(1, 3)),
        idempotency_key=draw(st.none() | st.sampled_from(["i1", "i2", "i3"])),
        identity_key=identity_key,
        singleton=singleton,
        fairness_key=draw(st.none() | st.sampled_from(["t1", "t2"])),
        schedule_to_close=draw(st.none() | st.integers(5, 300).map(lambda n: timedelta(seconds=n))),
    )


# The attempt fence a terminal write passes: none, the job's own, or a stale one.
fences = st.sampled_from(["none", "right", "right", "wrong"])
# Writes go to a running job most of the time (index into the running jobs),
# else to any job of the bundle, so both the real writes and the no-ops happen.
running_pick = st.none() | st.integers(0, 5)
owners = st.sampled_from([True, True, True, False])


@dataclass
class Observation:
    """What the backend reports after a step."""

    rows: list[JobRow]
    events: dict[JobId, list[EventRow]]
    active: list[JobRow]
    active_count: int
    waiting_counts: dict[str, int]


class MemoryBackendMachine(RuleBasedStateMachine):
    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock(datetime(2030, 1, 1, tzinfo=UTC))
        self.backend = InMemoryBackend(clock=self.clock)
        self.run(self.backend.open())
        self.actor_caps: dict[str, int | None] = {}
        self.queue_caps: dict[str, int | None] = {}
        self.seen: dict[JobId, JobRow] = {}
        """Every job as the previous step left it."""
        self.replayed: dict[JobId, tuple[int, JobStatus | None]] = {}
        """Per job: how many status events were replayed, and the status they lead to."""
        self.retried: set[JobId] = set()
        """Jobs that retry_job reset in the current step."""
        self.singletons: set[JobId] = set()
        """Jobs inserted as singletons."""

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.loop.close()

    def current(self, job_id: JobId) -> JobRow:
        row = self.run(self.backend.get(job_id))
        assert row is not None
        return row

    def all_jobs(self) -> list[JobRow]:
        return self.run(self.backend.list_jobs(JobFilter(limit=10_000)))

    def any_in(self, *statuses: JobStatus) -> bool:
        """Whether some job is in one of ``statuses`` (rules that would only be
        no-ops otherwise wait for one, so the steps go to interesting states)."""
        return any(row.status in statuses for row in self.seen.values())

    def target(self, job_id: JobId, pick: int | None, phase: CancelPhase | None = None) -> JobRow:
        """The ``pick``-th running job (in cancel ``phase``, if given) when asked for
        and there is one, else ``job_id``."""
        running = sorted(
            (
                row
                for row in self.seen.values()
                if row.status is JobStatus.RUNNING and phase in (None, row.cancel_phase)
            ),
            key=lambda row: row.id,
        )
        if pick is not None and running:
            return running[pick % len(running)]
        return self.current(job_id)

    def writer(self, row: JobRow, owner: bool, other: UUID) -> UUID:
        """The job's owner when asked for and there is one, else ``other``."""
        if owner and row.locked_by_worker is not None:
            return row.locked_by_worker
        return other

    def fence(self, row: JobRow, fence: str) -> int | None:
        return {"none": None, "right": row.attempt, "wrong": row.attempt + 1}[fence]

    def may_write(self, row: JobRow, worker: UUID, attempt: int | None) -> bool:
        return (
            row.status is JobStatus.RUNNING
            and row.locked_by_worker == worker
            and (attempt is None or attempt == row.attempt)
        )

    # -- set-up -----------------------------------------------------------------
    @initialize(
        actor_caps=st.lists(st.none() | st.integers(1, 2), min_size=2, max_size=2),
        queue_caps=st.lists(st.none() | st.integers(1, 3), min_size=2, max_size=2),
        modes=st.lists(st.sampled_from(["strict_fifo", "round_robin"]), min_size=2, max_size=2),
    )
    def configure(
        self, actor_caps: list[int | None], queue_caps: list[int | None], modes: list[str]
    ) -> None:
        self.actor_caps = dict(zip(ACTORS, actor_caps, strict=True))
        self.queue_caps = dict(zip(QUEUES, queue_caps, strict=True))
        self.run(
            self.backend.register_actors(
                [ActorConfig(actor=a, max_concurrent=c) for a, c in self.actor_caps.items()]
            )
        )
        for (queue, cap), mode in zip(self.queue_caps.items(), modes, strict=True):
            config = QueueConfig.model_validate(
                {"queue": queue, "mode": mode, "max_concurrent": cap}
            )
            self.run(self.backend.configure_queue(config))

    @initialize(
        target=jobs,
        batch=st.lists(
            st.builds(
                EnqueueArgs,
                id=st.uuids(),
                actor=st.sampled_from(ACTORS),
                queue=st.sampled_from(QUEUES),
                max_attempts=st.integers(1, 3),
                # Mostly one shared key, so identity serialization is contended.
                identity_key=st.sampled_from(["k1", None, "k1", "k2"]),
            ),
            min_size=2,
            max_size=6,
            unique_by=lambda args: args.id,
        ),
    )
    def seed(self, batch: list[EnqueueArgs]) -> Any:
        """Start every run with a few plain jobs, so the steps soon reach running ones."""
        rows = self.run(self.backend.enqueue_batch(batch))
        return multiple(*(row.id for row in rows))

    # -- enqueue ------------------------------------------------------------------
    def expect(self, args: EnqueueArgs, staged: list[EnqueueArgs]) -> JobId | type | None:
        """What enqueueing ``args`` after the ``staged`` items of the same call should
        do: raise (an exception type), return an existing job (its id), or insert (None)."""
        if args.singleton and args.identity_key is None:
            return ValueError
        earlier: list[JobRow | EnqueueArgs] = [*self.seen.values(), *staged]
        if args.idempotency_key is not None:
            for other in earlier:
                if (other.actor, other.idempotency_key) == (args.actor, args.idempotency_key):
                    return other.id
        if any(other.id == args.id for other in earlier):
            return ValueError
        active = [row for row in earlier if not isinstance(row, JobRow) or not row.is_terminal]
        if args.singleton and any(
            (other.actor, other.identity_key) == (args.actor, args.identity_key) for other in active
        ):
            return SingletonCollisionError
        return None

    @rule(target=jobs, args=enqueue_args())
    def enqueue(self, args: EnqueueArgs) -> Any:
        expected = self.expect(args, [])
        try:
            row = self.run(self.backend.enqueue(args))
        except (ValueError, SingletonCollisionError) as exc:
            assert type(exc) is expected
            return multiple()
        assert not isinstance(expected, type), f"expected {expected.__name__}"
        if expected is not None:
            assert row == self.seen[expected], "an idempotent enqueue returns the existing row"
            return multiple()
        delayed = args.delay is not None and args.delay > timedelta(0)
        assert row.status is (JobStatus.SCHEDULED if delayed else JobStatus.PENDING)
        assert (row.id, row.attempt, row.created_at) == (args.id, 0, self.clock.now())
        if args.singleton:
            self.singletons.add(row.id)
        return row.id

    @rule(target=jobs, batch=st.lists(enqueue_args(), min_size=1, max_size=3))
    def enqueue_batch(self, batch: list[EnqueueArgs]) -> Any:
        staged: list[EnqueueArgs] = []
        expected: list[JobId | type | None] = []
        for args in batch:
            expected.append(self.expect(args, staged))
            if expected[-1] is None:
                staged.append(args)
        errors = [e for e in expected if isinstance(e, type)]
        try:
            rows = self.run(self.backend.enqueue_batch(batch))
        except (ValueError, SingletonCollisionError) as exc:
            event("enqueue_batch: refused")
            assert errors and type(exc) is errors[0]
            assert len(self.all_jobs()) == len(self.seen), "a refused batch inserts nothing"
            return multiple()
        assert not errors
        assert [row.id for row in rows] == [
            args.id if e is None else e for args, e in zip(batch, expected, strict=True)
        ]
        self.singletons |= {
            a.id for a, e in zip(batch, expected, strict=True) if e is None and a.singleton
        }
        return multiple(*{row.id for row in rows})

    # -- dispatch and leases ---------------------------------------------------------
    @precondition(lambda self: self.any_in(JobStatus.PENDING))
    @rule(
        worker=st.sampled_from(WORKERS),
        queues=st.sampled_from([["q1", "q2"], ["q1"], ["q2"], ["q2", "q1"]]),
        limit=st.integers(1, 4),
        lease=st.integers(1, 60).map(lambda n: timedelta(seconds=n)),
    )
    def dispatch(self, worker: UUID, queues: list[str], limit: int, lease: timedelta) -> None:
        rows = self.run(self.backend.dispatch_batch(worker, queues, limit, lease))
        event(f"dispatch: {'some' if rows else 'none'}")
        assert len(rows) <= limit
        assert len({row.id for row in rows}) == len(rows)
        for row in rows:
            before = self.seen[row.id]
            assert before.status is JobStatus.PENDING and before.queue in queues
            assert row.status is JobStatus.RUNNING
            assert row.locked_by_worker == worker
            assert row.attempt == before.attempt + 1
            assert row.lock_expires_at == self.clock.now() + lease

    @precondition(lambda self: self.any_in(JobStatus.RUNNING))
    @rule(
        worker=st.sampled_from(WORKERS),
        lease=st.integers(1, 60).map(lambda n: timedelta(seconds=n)),
    )
    def heartbeat(self, worker: UUID, lease: timedelta) -> None:
        held = [
            row
            for row in self.seen.values()
            if row.status is JobStatus.RUNNING and row.locked_by_worker == worker
        ]
        assert self.run(self.backend.heartbeat_jobs(worker, lease)) == len(held)

    @rule(delta=st.floats(0, 120))
    def advance_clock(self, delta: float) -> None:
        self.clock.advance(delta)

    # -- terminal writes -------------------------------------------------------------
    @rule(
        job_id=jobs, pick=running_pick, owner=owners, other=st.sampled_from(WORKERS), fence=fences
    )
    def mark_succeeded(
        self, job_id: JobId, pick: int | None, owner: bool, other: UUID, fence: str
    ) -> None:
        row = self.target(job_id, pick)
        job_id = row.id
        worker, attempt = self.writer(row, owner, other), self.fence(row, fence)
        done = self.run(self.backend.mark_succeeded(job_id, worker, {"ok": 1}, attempt=attempt))
        event(f"mark_succeeded: {done}")
        assert done == self.may_write(row, worker, attempt)
        if done:
            assert self.current(job_id).status is JobStatus.SUCCEEDED

    @rule(
        job_id=jobs,
        pick=running_pick,
        owner=owners,
        other=st.sampled_from(WORKERS),
        fence=fences,
        retry_delay=optional_seconds,
    )
    def mark_failed_or_retry(
        self,
        job_id: JobId,
        pick: int | None,
        owner: bool,
        other: UUID,
        fence: str,
        retry_delay: timedelta | None,
    ) -> None:
        row = self.target(job_id, pick)
        job_id = row.id
        worker, attempt = self.writer(row, owner, other), self.fence(row, fence)
        error = ErrorInfo(error_class="Boom", message="boom")
        after = self.run(
            self.backend.mark_failed_or_retry(job_id, worker, error, retry_delay, attempt=attempt)
        )
        event(f"mark_failed_or_retry: {after.status if after != row else 'noop'}")
        if not self.may_write(row, worker, attempt):
            assert after == row
            return
        now = self.clock.now()
        retries = (
            retry_delay is not None
            and row.attempt < row.max_attempts
            and (row.deadline_at is None or now + retry_delay <= row.deadline_at)
        )
        if not retries:
            assert after.status is JobStatus.FAILED
        elif row.cancel_requested_at is not None:  # never put back in the queue
            assert (after.status, after.finished_at) == (JobStatus.CANCELLED, now)
        elif retry_delay == timedelta(0):
            assert (after.status, after.scheduled_at) == (JobStatus.PENDING, now)
        else:
            assert after.status is JobStatus.SCHEDULED
        assert after.error == error

    @rule(
        job_id=jobs, pick=running_pick, owner=owners, other=st.sampled_from(WORKERS), fence=fences
    )
    def mark_cancelled(
        self, job_id: JobId, pick: int | None, owner: bool, other: UUID, fence: str
    ) -> None:
        row = self.target(job_id, pick)
        job_id = row.id
        worker, attempt = self.writer(row, owner, other), self.fence(row, fence)
        done = self.run(self.backend.mark_cancelled(job_id, worker, attempt=attempt))
        event(f"mark_cancelled: {done}")
        assert done == self.may_write(row, worker, attempt)

    @rule(
        job_id=jobs,
        pick=running_pick,
        owner=owners,
        other=st.sampled_from(WORKERS),
        fence=fences,
        delay=seconds,
    )
    def mark_snoozed(
        self,
        job_id: JobId,
        pick: int | None,
        owner: bool,
        other: UUID,
        fence: str,
        delay: timedelta,
    ) -> None:
        row = self.target(job_id, pick)
        job_id = row.id
        worker, attempt = self.writer(row, owner, other), self.fence(row, fence)
        outcome = self.run(self.backend.mark_snoozed(job_id, worker, delay, attempt=attempt))
        event(f"mark_snoozed: {outcome}")
        if not self.may_write(row, worker, attempt):
            assert outcome == "noop"
            return
        late = row.deadline_at is not None and self.clock.now() + delay > row.deadline_at
        if late:
            assert outcome == "failed"
        else:
            assert outcome == ("cancelled" if row.cancel_requested_at else "scheduled")
        # The attempt is given back only to a job that runs again.
        given_back = 1 if outcome == "scheduled" else 0
        assert self.current(job_id).max_attempts == row.max_attempts + given_back

    @rule(
        job_id=jobs,
        pick=running_pick,
        owner=owners,
        other=st.sampled_from(WORKERS),
        fence=fences,
        delay=seconds,
        consume_budget=st.booleans(),
    )
    def mark_retry_after(
        self,
        job_id: JobId,
        pick: int | None,
        owner: bool,
        other: UUID,
        fence: str,
        delay: timedelta,
        consume_budget: bool,
    ) -> None:
        row = self.target(job_id, pick)
        job_id = row.id
        worker, attempt = self.writer(row, owner, other), self.fence(row, fence)
        outcome = self.run(
            self.backend.mark_retry_after(
                job_id, worker, delay, consume_budget=consume_budget, attempt=attempt
            )
        )
        event(f"mark_retry_after: {outcome}")
        if not self.may_write(row, worker, attempt):
            assert outcome == "noop"
        elif row.deadline_at is not None and self.clock.now() + delay > row.deadline_at:
            assert outcome == "failed:DeadlineExceeded"
        elif consume_budget and row.attempt >= row.max_attempts:
            assert outcome == "failed:MaxAttemptsExceeded"
        else:
            assert outcome == ("cancelled" if row.cancel_requested_at else "scheduled")
        if self.may_write(row, worker, attempt):
            given_back = 1 if outcome == "scheduled" and not consume_budget else 0
            assert self.current(job_id).max_attempts == row.max_attempts + given_back

    # -- cancellation -------------------------------------------------------------------
    @rule(job_id=jobs, pick=running_pick, reason=st.none() | st.just("stop"))
    def write_cancel_request(self, job_id: JobId, pick: int | None, reason: str | None) -> None:
        row = self.target(job_id, pick)
        job_id = row.id
        requested = self.run(self.backend.write_cancel_request(job_id, reason))
        assert requested == (not row.is_terminal)
        after = self.current(job_id)
        if row.status in WAITING:
            assert after.status is JobStatus.CANCELLED
        elif row.status is JobStatus.RUNNING:
            assert after.cancel_phase >= CancelPhase.COOPERATIVE
            assert after.cancel_requested_at == (row.cancel_requested_at or self.clock.now())

    @precondition(lambda self: self.any_in(*ACTIVE_STATUSES))
    @rule(actor=st.sampled_from(ACTORS), identity_key=st.sampled_from(["k1", "k2"]))
    def cancel_where(self, actor: str, identity_key: str) -> None:
        selected = [
            row
            for row in self.seen.values()
            if (row.actor, row.identity_key) == (actor, identity_key)
        ]
        filters = JobFilter(actor=actor, identity_key=identity_key, limit=1)
        result = self.run(self.backend.cancel_where(filters, None))
        assert set(result.cancelled) == {row.id for row in selected if row.status in WAITING}
        assert set(result.requested) == {
            row.id for row in selected if row.status is JobStatus.RUNNING
        }

    @rule(
        job_id=jobs, pick=running_pick, owner=owners, other=st.sampled_from(WORKERS), fence=fences
    )
    def write_cancel_escalation(
        self, job_id: JobId, pick: int | None, owner: bool, other: UUID, fence: str
    ) -> None:
        row = self.target(job_id, pick, CancelPhase.COOPERATIVE)
        job_id = row.id
        worker, attempt = self.writer(row, owner, other), self.fence(row, fence)
        escalated = self.run(
            self.backend.write_cancel_escalation(job_id, worker, 2, attempt=attempt)
        )
        event(f"write_cancel_escalation: {escalated}")
        assert escalated == (
            self.may_write(row, worker, attempt) and row.cancel_phase == CancelPhase.COOPERATIVE
        )

    @rule(
        job_id=jobs, pick=running_pick, owner=owners, other=st.sampled_from(WORKERS), fence=fences
    )
    def mark_abandoned(
        self, job_id: JobId, pick: int | None, owner: bool, other: UUID, fence: str
    ) -> None:
        row = self.target(job_id, pick, CancelPhase.FORCED)
        job_id = row.id
        worker, attempt = self.writer(row, owner, other), self.fence(row, fence)
        abandoned = self.run(self.backend.mark_abandoned(job_id, worker, attempt=attempt))
        event(f"mark_abandoned: {abandoned}")
        assert abandoned == (
            self.may_write(row, worker, attempt) and row.cancel_phase == CancelPhase.FORCED
        )

    # -- admin and sweeps -------------------------------------------------------------
    @rule(job_id=jobs)
    def retry_job(self, job_id: JobId) -> None:
        row = self.current(job_id)
        held = job_id in self.singletons and any(
            other.id != job_id
            and not other.is_terminal
            and (other.actor, other.identity_key) == (row.actor, row.identity_key)
            for other in self.all_jobs()
        )
        if held and row.status in RETRYABLE:
            # A second active job of a singleton's identity: refused, nothing changed.
            with pytest.raises(SingletonCollisionError):
                self.run(self.backend.retry_job(job_id))
            event("retry_job: singleton held")
            assert self.current(job_id) == row
            return
        late = row.deadline_at is not None and row.deadline_at <= self.clock.now()
        if late and row.status in RETRYABLE:
            # Past its deadline it could only fail again at once: refused, nothing changed.
            with pytest.raises(RetryRefusedError):
                self.run(self.backend.retry_job(job_id))
            event("retry_job: past its deadline")
            assert self.current(job_id) == row
            return
        retried = self.run(self.backend.retry_job(job_id))
        event(f"retry_job: {retried}")
        assert retried == (row.status in RETRYABLE)
        if retried:
            self.retried.add(job_id)
            after = self.current(job_id)
            assert after.status is JobStatus.PENDING
            assert after.max_attempts > after.attempt

    @precondition(lambda self: self.any_in(JobStatus.SCHEDULED))
    @rule()
    def scheduled_to_pending(self) -> None:
        due = [
            row
            for row in self.seen.values()
            if row.status is JobStatus.SCHEDULED and row.scheduled_at <= self.clock.now()
        ]
        assert self.run(self.backend.scheduled_to_pending()) == len(due)

    @precondition(lambda self: self.any_in(*WAITING))
    @rule()
    def deadline_sweep(self) -> None:
        late = [
            row
            for row in self.seen.values()
            if row.status in WAITING
            and row.deadline_at is not None
            and row.deadline_at < self.clock.now()
        ]
        assert self.run(self.backend.deadline_sweep()) == len(late)

    @precondition(lambda self: self.any_in(JobStatus.RUNNING))
    @rule(cancel_grace=seconds, cleanup_grace=seconds)
    def reclaim_expired_locks(self, cancel_grace: timedelta, cleanup_grace: timedelta) -> None:
        reclaimed = self.run(self.backend.reclaim_expired_locks(cancel_grace, cleanup_grace))
        event(f"reclaim_expired_locks: {'some' if reclaimed else 'none'}")

    # -- invariants, after every step -------------------------------------------------------
    async def observe(self) -> Observation:
        rows = await self.backend.list_jobs(JobFilter(limit=10_000))
        return Observation(
            rows=rows,
            events={row.id: await self.backend.get_events(row.id) for row in rows},
            active=await self.backend.list_jobs(JobFilter(active=True, limit=10_000)),
            active_count=await self.backend.count_active_jobs(list(QUEUES)),
            waiting_counts=await self.backend.count_pending_jobs(list(ACTORS)),
        )

    @invariant()
    def after_every_step(self) -> None:
        # One observation per step, in one trip through the event loop, keeps the
        # steps (and shrinking a failure) fast.
        observed = self.run(self.observe())
        self.check_history_replays_to_valid_transitions(observed)
        self.check_one_holder_per_running_job_and_identity(observed.rows)
        self.check_caps_are_never_exceeded(observed.rows)
        self.check_waiting_jobs_have_an_attempt_left(observed.rows)
        self.check_counts_agree_with_list_jobs(observed)
        self.check_terminal_jobs_never_change(observed.rows)  # last: it records the rows

    def check_history_replays_to_valid_transitions(self, observed: Observation) -> None:
        for row in observed.rows:
            events = [
                event
                for event in observed.events[row.id]
                if event.kind in ("state_change", "reclaimed")
            ]
            count, status = self.replayed.get(row.id, (0, None))
            if status is None:  # first sight: a job is created pending or scheduled
                status = JobStatus(events[0].detail["from_state"]) if events else row.status
                assert status in WAITING
            for record in events[count:]:
                source = JobStatus(record.detail["from_state"])
                target = JobStatus(record.detail["to_state"])
                assert source is status, f"{record} does not continue from {status}"
                retried = record.detail.get("reason") == "retried"
                assert target in VALID_TRANSITIONS[source] or (
                    retried and source in TERMINAL_STATUSES and target is JobStatus.PENDING
                ), f"invalid transition {source} -> {target}"
                status = target
            assert status is row.status
            self.replayed[row.id] = (len(events), status)

    def check_one_holder_per_running_job_and_identity(self, rows: list[JobRow]) -> None:
        for row in rows:
            held = row.locked_by_worker is not None and row.lock_expires_at is not None
            assert held == (row.status is JobStatus.RUNNING)
        identities = [
            (row.actor, row.identity_key)
            for row in rows
            if row.status is JobStatus.RUNNING and row.identity_key is not None
        ]
        assert len(identities) == len(set(identities)), "an identity runs twice"

    def check_caps_are_never_exceeded(self, rows: list[JobRow]) -> None:
        running = [row for row in rows if row.status is JobStatus.RUNNING]
        per_actor = Counter(row.actor for row in running)
        per_queue = Counter(row.queue for row in running)
        for actor, cap in self.actor_caps.items():
            assert cap is None or per_actor[actor] <= cap, f"actor {actor} over its cap"
        for queue, cap in self.queue_caps.items():
            assert cap is None or per_queue[queue] <= cap, f"queue {queue} over its cap"

    def check_waiting_jobs_have_an_attempt_left(self, rows: list[JobRow]) -> None:
        for row in rows:
            if row.status in WAITING:
                assert row.attempt < row.max_attempts

    def check_counts_agree_with_list_jobs(self, observed: Observation) -> None:
        active_ids = {row.id for row in observed.rows if not row.is_terminal}
        assert {row.id for row in observed.active} == active_ids
        assert observed.active_count == len(active_ids)
        waiting = Counter(row.actor for row in observed.rows if row.status in WAITING)
        assert observed.waiting_counts == {actor: waiting[actor] for actor in ACTORS}

    def check_terminal_jobs_never_change(self, rows: list[JobRow]) -> None:
        for row in rows:
            before = self.seen.get(row.id)
            if before is not None and before.is_terminal and row.id not in self.retried:
                assert row == before, f"terminal job {row.id} changed"
            self.seen[row.id] = row
        self.retried.clear()


MemoryBackendMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    # Shrink only the first failure found, so a failing run reports well within
    # the pytest timeout instead of shrinking several bugs one after another.
    report_multiple_bugs=False,
)
TestMemoryBackendProperties = MemoryBackendMachine.TestCase
