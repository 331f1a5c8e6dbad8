"""The in-memory tables and the few primitives that write them.

:class:`JobStore` plays the part of the Postgres schema: the ``jobs`` table
(frozen :class:`~taskq.models.JobRow` values, replaced on every change),
``job_attempts`` keyed by ``(job_id, attempt)``, ``job_events`` with one
global increasing id, and the idempotency index; :meth:`JobStore.delete` is
the cascade that removes a job with all of them. Every status change goes
through :meth:`JobStore.move` (checked against the state machine, event row
written) and every finished attempt through :meth:`JobStore.end_attempt`,
so the "every transition leaves history" rule has one home.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from taskq.backend.statemachine import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    JobStatus,
    assert_valid_transition,
)
from taskq.backend.storable import clean_text, dump_json, stored_json
from taskq.errors import SingletonCollisionError
from taskq.models import (
    AttemptOutcome,
    AttemptRow,
    BatchChildEnd,
    EnqueueArgs,
    ErrorInfo,
    EventKind,
    EventRow,
    JobId,
    JobRow,
)

__all__ = [
    "InsertPlan",
    "JobStore",
    "WorkerRecord",
    "due_after",
    "new_job",
    "report_batch_end",
    "wake",
]

_ZERO = timedelta(0)


def new_job(args: EnqueueArgs, now: datetime) -> JobRow:
    """The row ``enqueue`` inserts for ``args``, its values as stored (``stored_json``:
    copies the caller's later mutations cannot reach)."""
    status, scheduled_at = due_after(now, args.delay or _ZERO)
    return JobRow(
        id=args.id,
        actor=args.actor,
        queue=args.queue,
        status=status,
        payload=stored_json(args.payload),
        priority=args.priority,
        attempt=0,
        max_attempts=args.max_attempts,
        created_at=now,
        scheduled_at=scheduled_at,
        idempotency_key=args.idempotency_key,
        identity_key=args.identity_key,
        fairness_key=args.fairness_key,
        deadline_at=now + args.schedule_to_close if args.schedule_to_close is not None else None,
        timeout=args.timeout,
        result_ttl=args.result_ttl,
        metadata=stored_json(args.metadata),
        tags=[clean_text(tag) for tag in args.tags],
        trace_id=args.trace_id,
        span_id=args.span_id,
    )


def due_after(now: datetime, delay: timedelta) -> tuple[JobStatus, datetime]:
    """Status and ``scheduled_at`` of a job that should run ``delay`` from now:
    ``pending`` at once for no delay, else ``scheduled``."""
    if delay <= _ZERO:
        return JobStatus.PENDING, now
    return JobStatus.SCHEDULED, now + delay


@dataclass(frozen=True)
class WorkerRecord:
    """One row of the in-memory ``workers`` table (the worker registry)."""

    id: UUID
    hostname: str
    pid: int
    queues: list[str]
    actors: frozenset[str] | None
    """The actors the worker runs; None when it did not say (it runs any on its
    ``queues``, as far as the stranded-jobs detector knows)."""
    started_at: datetime
    last_seen_at: datetime


@dataclass
class InsertPlan:
    """An enqueue after validation, before anything is stored."""

    rows: list[JobRow] = field(default_factory=list)
    """One row per input item: the new row, or the existing idempotent match."""
    new: dict[JobId, JobRow] = field(default_factory=dict)
    """The rows to insert, by id."""
    singletons: set[JobId] = field(default_factory=set)
    """Those of them enqueued as singletons."""


class JobStore:
    """Jobs, attempts, events and the wake-up subscribers of one in-memory backend."""

    def __init__(self) -> None:
        self.jobs: dict[JobId, JobRow] = {}
        self.attempts: dict[JobId, dict[int, AttemptRow]] = {}
        self.events: dict[JobId, list[EventRow]] = {}
        self.reclaim_events: list[EventRow] = []
        """The ``reclaimed`` events, in id order: the outbox ``poll_reclaim_events`` reads."""
        self.wake_subscribers: set[asyncio.Event] = set()
        self.cancel_wake_subscribers: set[asyncio.Event] = set()
        self.worker_cancel_wake_subscribers: defaultdict[UUID, set[asyncio.Event]] = defaultdict(
            set
        )
        """By worker: woken only by cancel requests for that worker's jobs."""
        self._idempotency: dict[tuple[str, str], JobId] = {}
        self.singletons: set[JobId] = set()
        """The jobs enqueued as singletons (Postgres: the ``singleton`` column)."""
        self._event_ids = itertools.count(1)

    # -- inserting -------------------------------------------------------------
    def plan_inserts(
        self,
        args_list: Sequence[EnqueueArgs],
        now: datetime,
        *,
        idempotent: bool,
        finishing: JobId | None = None,
    ) -> InsertPlan:
        """Validate every item against the store and the items before it.

        Raises before anything is stored, so a failing batch inserts nothing.
        With ``idempotent`` an item whose ``(actor, idempotency_key)`` exists
        yields the existing row; without it, that is an error. ``finishing`` is a job
        taken as ended already (it holds no singleton's identity).
        """
        plan = InsertPlan()
        staged_keys: dict[tuple[str, str], JobRow] = {}
        for args in args_list:
            if args.singleton and args.identity_key is None:
                raise ValueError(
                    f"singleton=True needs an identity_key (actor {args.actor!r}): "
                    f"a singleton is unique per (actor, identity_key)"
                )
            if args.idempotency_key is not None:
                key = (args.actor, args.idempotency_key)
                existing = staged_keys.get(key) or self.by_idempotency_key(key)
                if existing is not None:
                    if not idempotent:
                        raise ValueError(
                            f"idempotency key {args.idempotency_key!r} of actor {args.actor!r} "
                            f"is already used; enqueue_batch_fast does not deduplicate, "
                            f"use enqueue_batch"
                        )
                    # Refused though nothing of it is stored, as Postgres refuses it
                    # when it serializes the rows it sends.
                    dump_json(args.payload)
                    dump_json(args.metadata)
                    plan.rows.append(existing)
                    continue
            if args.id in self.jobs or args.id in plan.new:
                raise ValueError(f"a job with id {args.id} already exists")
            if args.singleton:
                self._check_singleton(args, now, plan.new.values(), finishing)
                plan.singletons.add(args.id)
            row = new_job(args, now)
            plan.rows.append(row)
            plan.new[row.id] = row
            if args.idempotency_key is not None:
                staged_keys[(args.actor, args.idempotency_key)] = row
        return plan

    def insert(self, plan: InsertPlan) -> None:
        """Store the new rows of ``plan``; one wake-up for all of them."""
        for row in plan.new.values():
            self.jobs[row.id] = row
            if row.idempotency_key is not None:
                self._idempotency[(row.actor, row.idempotency_key)] = row.id
        self.singletons |= plan.singletons
        if plan.new:
            wake(self.wake_subscribers)

    def by_idempotency_key(self, key: tuple[str, str]) -> JobRow | None:
        """The stored job of ``(actor, idempotency_key)``, or None."""
        job_id = self._idempotency.get(key)
        return self.jobs[job_id] if job_id is not None else None

    def singleton_holder(self, row: JobRow) -> JobRow | None:
        """Another active job holding the identity of ``row``, a singleton (else None)."""
        if row.id not in self.singletons:
            return None
        return next(
            (
                other
                for other in self.jobs.values()
                if other.id != row.id
                and other.status in ACTIVE_STATUSES
                and other.actor == row.actor
                and other.identity_key == row.identity_key
            ),
            None,
        )

    def _check_singleton(
        self,
        args: EnqueueArgs,
        now: datetime,
        staged: Iterable[JobRow],
        finishing: JobId | None = None,
    ) -> None:
        for row in staged:
            if row.actor == args.actor and row.identity_key == args.identity_key:
                raise SingletonCollisionError.in_one_call(args.actor, args.identity_key)
        for row in self.jobs.values():
            if (
                row.id != finishing
                and row.status in ACTIVE_STATUSES
                and row.actor == args.actor
                and row.identity_key == args.identity_key
            ):
                # An advisory hint for the caller (architecture: Clock Domains).
                retry_after = (
                    max((row.deadline_at - now).total_seconds(), 0.0)
                    if row.deadline_at is not None
                    else None
                )
                raise SingletonCollisionError(
                    f"actor {args.actor!r} already has an active job ({row.id}) with "
                    f"identity_key {args.identity_key!r}; retry once it finishes",
                    retry_after=retry_after,
                )

    # -- writing -------------------------------------------------------------------
    def event(self, job_id: JobId, kind: EventKind, detail: dict[str, Any], now: datetime) -> None:
        """Append one event row with the next global id."""
        event = EventRow(
            event_id=next(self._event_ids), job_id=job_id, occurred_at=now, kind=kind, detail=detail
        )
        self.events.setdefault(job_id, []).append(event)
        if kind == "reclaimed":
            self.reclaim_events.append(event)

    def update(self, row: JobRow, **changes: Any) -> JobRow:
        """Change fields other than the status (lease, cancel flags)."""
        updated = row.model_copy(update=changes)
        self.jobs[row.id] = updated
        return updated

    def write_status(
        self,
        row: JobRow,
        to: JobStatus,
        now: datetime,
        *,
        kind: EventKind = "state_change",
        detail: dict[str, Any] | None = None,
        **changes: Any,
    ) -> JobRow:
        """Store ``row`` in status ``to`` with ``changes``, plus its event row
        (``from_state``, ``to_state`` and ``detail``). A job entering ``pending``
        wakes the workers. Unchecked: only an operator reset calls this directly."""
        updated = self.update(row, status=to, **changes)
        base = {"from_state": row.status.value, "to_state": to.value}
        self.event(row.id, kind, {**base, **(detail or {})}, now)
        if to is JobStatus.PENDING:
            wake(self.wake_subscribers)
        return updated

    def move(
        self,
        row: JobRow,
        to: JobStatus,
        now: datetime,
        *,
        kind: EventKind = "state_change",
        detail: dict[str, Any] | None = None,
        **changes: Any,
    ) -> JobRow:
        """A state-machine transition: checked against ``VALID_TRANSITIONS``, then written."""
        assert_valid_transition(row.status, to, row.id)
        return self.write_status(row, to, now, kind=kind, detail=detail, **changes)

    def delete(self, job_ids: Collection[JobId]) -> dict[JobId, list[AttemptRow]]:
        """Delete jobs with their events (the reclaim outbox's too) and their idempotency
        keys, as the Postgres cascade does; returns each job's attempts, by attempt
        number, which leave the store with it."""
        attempts: dict[JobId, list[AttemptRow]] = {}
        for job_id in job_ids:
            row = self.jobs.pop(job_id)
            self.singletons.discard(job_id)
            key = (row.actor, row.idempotency_key) if row.idempotency_key is not None else None
            if key is not None and self._idempotency.get(key) == job_id:
                del self._idempotency[key]
            self.events.pop(job_id, None)
            by_number = self.attempts.pop(job_id, {})
            attempts[job_id] = [by_number[n] for n in sorted(by_number)]
        if attempts:
            self.reclaim_events[:] = [e for e in self.reclaim_events if e.job_id not in attempts]
        return attempts

    def owned(self, job_id: JobId, worker_id: UUID, attempt: int | None) -> JobRow | None:
        """The job if ``worker_id`` may finish it: running, locked by that worker and,
        when ``attempt`` is given, still on that attempt (the fence against a paused
        worker whose job was reclaimed and dispatched again)."""
        row = self.jobs.get(job_id)
        if (
            row is None
            or row.status is not JobStatus.RUNNING
            or row.locked_by_worker != worker_id
            or (attempt is not None and row.attempt != attempt)
        ):
            return None
        return row

    def end_attempt(
        self,
        row: JobRow,
        to: JobStatus,
        now: datetime,
        *,
        worker_id: UUID | None,
        outcome: AttemptOutcome,
        attempt_error: ErrorInfo | None = None,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        kind: EventKind = "state_change",
        detail: dict[str, Any] | None = None,
        **changes: Any,
    ) -> JobRow:
        """Close the running attempt of ``row``: move it to ``to``, release the lock,
        keep newer progress, and write the attempt row and the event row."""
        if to in TERMINAL_STATUSES:
            changes["finished_at"] = now
        if progress_seq > row.progress_seq:
            changes["progress_seq"] = progress_seq
            changes["progress_state"] = stored_json(progress_state)
        updated = self.move(
            row,
            to,
            now,
            kind=kind,
            detail=detail,
            locked_by_worker=None,
            lock_expires_at=None,
            **changes,
        )
        self.attempts.setdefault(row.id, {})[row.attempt] = AttemptRow(
            job_id=row.id,
            attempt=row.attempt,
            worker_id=worker_id,
            started_at=row.started_at,
            finished_at=now,
            outcome=outcome,
            error=attempt_error,
        )
        return updated


def wake(subscribers: set[asyncio.Event]) -> None:
    """Set every subscribed event (each consumer clears its own)."""
    for event in subscribers:
        event.set()


def report_batch_end(
    batch_ends: list[BatchChildEnd] | None, row: JobRow, status: JobStatus
) -> None:
    """Append the end (``status``) of ``row``, a job a cancel or a sweep ended, to
    ``batch_ends`` when the caller asked and the job carries a ``metadata.batch_id``."""
    tag = row.metadata.get("batch_id")
    if batch_ends is not None and tag is not None:
        batch_ends.append(BatchChildEnd(str(tag), status))
