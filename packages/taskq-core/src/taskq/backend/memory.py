"""``InMemoryBackend``: the reference implementation of the Backend protocol.

Everything lives in Python dicts inside one process, so this backend is for
tests, examples and single-process experiments. It is also the executable
reading of ``docs/backend-contract.md``: every method does what that page
says in the simplest way that is still correct, and it is held to the same
``taskq_testing.conformance`` suite as Postgres.

How it maps to the Postgres backend:

* **Tables** live in :class:`~taskq.backend._memory_store.JobStore` (jobs,
  attempts, events), :class:`~taskq.backend._memory_archive.JobArchive`
  (the pruned jobs), :class:`~taskq.backend._memory_batches.BatchTable` and
  :class:`~taskq.backend._memory_schedules.ScheduleTable`. Rows are frozen
  pydantic models, replaced with ``model_copy`` on every change.
* **Atomicity.** No method awaits while it works, so on one event loop each
  call is one atomic step, like one SQL transaction. Multi-row inserts
  validate every item before storing any.
* **Time.** Every stored or compared time comes from the injected
  :class:`~taskq.backend.clock.Clock` (a ``FakeClock`` in tests).
* **Transitions** go through ``JobStore.move``, which checks them against
  :mod:`taskq.backend.statemachine` and writes the event row. The one
  exception is ``retry_job``: an operator reset of a terminal job, which has
  no transition to check.
* **Lifecycle.** As a Postgres backend's pool, its tables answer only between
  ``open()`` and ``close()``: every other coroutine method raises
  ``ConfigurationError`` outside (:func:`_open_only`), so a program that forgot
  ``open()`` fails the same on both. The data outlives a close, for a reopen.

Not thread-safe: use one instance from one event loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Literal, TypeVar
from urllib.parse import urlsplit
from uuid import UUID

from pydantic import BaseModel

from taskq.backend._memory_archive import JobArchive
from taskq.backend._memory_batches import BatchTable
from taskq.backend._memory_dispatch import RunningLoad, dispatch_order, take_jobs
from taskq.backend._memory_queries import select_jobs
from taskq.backend._memory_schedules import ScheduleTable
from taskq.backend._memory_store import (
    JobStore,
    WorkerRecord,
    due_after,
    report_batch_end,
    wake,
)
from taskq.backend._memory_sweeps import fail_past_deadline, promote_due, reclaim_expired
from taskq.backend._protocol import (
    Connection,
    ScheduleFire,
    check_failure_count,
    check_protocol_version,
    check_up_to,
)
from taskq.backend.clock import Clock, SystemClock
from taskq.backend.cron import cron_slots, one_per_singleton, skipped_slots, within_max_pending
from taskq.backend.fairness import CohortTurns, cohort_of
from taskq.backend.late_outcome import late_outcome_detail
from taskq.backend.statemachine import ACTIVE_STATUSES, CancelPhase, JobStatus
from taskq.backend.storable import check_delay, clean_text, dump_json, stored_error, stored_json
from taskq.errors import (
    ConfigurationError,
    RetryRefusedError,
    SingletonCollisionError,
    TaskQError,
)
from taskq.models import (
    DEADLINE_EXCEEDED,
    INT32_MAX,
    ActorConfig,
    AttemptOutcome,
    AttemptRow,
    BatchChildEnd,
    BatchCounts,
    BatchFilter,
    BatchRow,
    BulkCancelResult,
    CancelFlag,
    EnqueueArgs,
    ErrorInfo,
    EventRow,
    JobFilter,
    JobId,
    JobRow,
    QueueConfig,
    ScheduleCreateArgs,
    ScheduleRecord,
    ScheduleUpdateArgs,
    SuccessWrite,
    check_names,
    registered_over,
)

__all__ = ["InMemoryBackend"]

_S = JobStatus
_WAITING: frozenset[JobStatus] = frozenset({_S.PENDING, _S.SCHEDULED})
_RETRYABLE: frozenset[JobStatus] = frozenset({_S.FAILED, _S.CRASHED, _S.CANCELLED, _S.ABANDONED})


def _requeue(row: JobRow, now: datetime, delay: timedelta, changes: dict[str, Any]) -> JobStatus:
    """Where a job put back in the queue goes: ``scheduled`` or ``pending`` (its new
    time added to ``changes``), or ``cancelled`` when a cancel was requested, whoever
    missed the request: such a job is never run again."""
    if row.cancel_requested_at is not None:
        return _S.CANCELLED
    to, changes["scheduled_at"] = due_after(now, delay)
    return to


def _requeued_because(to: JobStatus, why: str) -> str:
    """The reason a state-change event out of ``running`` gives for a job put back in the
    queue (``why``: a retry, a snooze, a hand-back…), or ended by a cancel it missed."""
    return "cancel_requested" if to is _S.CANCELLED else why


def _refuse_unstorable(*values: Any) -> None:
    """Raise what storing each value would (``UnstorableValueError``), before anything
    else: a value is refused whether or not the write would store it (a no-op, progress
    that is not newer), as Postgres refuses it when it serializes the call's arguments."""
    for value in values:
        if value is not None:
            dump_json(value)


def _utc(value: datetime) -> datetime:
    """``value`` in UTC; a naive time taken as UTC, as asyncpg takes it."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _in_utc(value: datetime | None) -> datetime | None:
    """:func:`_utc` of a time that may be missing."""
    return None if value is None else _utc(value)


_Stored = TypeVar("_Stored", bound=BaseModel)


def _copy(stored: _Stored) -> _Stored:
    """A row (job, attempt, event, schedule, batch) to hand out: its containers
    (payload, result, tags, detail…) are not the stored ones, as a database's rows
    are not (an actor changing its payload in place changed the job, and each retry
    saw the attempts before it; a feed consumer's edit changed the stored event)."""
    return stored.model_copy(deep=True)


_Class = TypeVar("_Class", bound=type)


def _open_only(cls: _Class) -> _Class:
    """``cls`` with each public coroutine method but ``open`` and ``close`` refusing to
    run unless the instance is open, as a Postgres backend without its pool refuses:
    used unopened, the in-memory backend worked where Postgres raised."""

    def guarded(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(method)
        async def call(self: InMemoryBackend, *args: Any, **kwargs: Any) -> Any:
            if not self._open:
                raise ConfigurationError(
                    f"{type(self).__name__} is not open: await backend.open() first "
                    f"(TaskQ opens and closes its backend for you)"
                )
            return await method(self, *args, **kwargs)

        return call

    for name, member in list(vars(cls).items()):
        public = not name.startswith("_") and name not in {"open", "close"}
        if public and inspect.iscoroutinefunction(member):
            setattr(cls, name, guarded(member))
    return cls


@_open_only
class InMemoryBackend:
    """A complete Backend kept in process memory (URL ``memory://``).

    ``clock`` is the one source of time (default: the system clock; pass a
    :class:`~taskq.backend.clock.FakeClock` to move time in tests).
    ``reclaim_event_visibility_delay`` is the default trailing watermark of
    :meth:`poll_reclaim_events`; ``cancel_reclaim_headroom`` is the extra
    time a job with a cancel in progress gets before a crash reclaim.
    ``stale_batch_grace`` is how long :meth:`complete_stale_batches` leaves a batch
    alone after its last child ended (or its creation).
    """

    BACKEND_PROTOCOL_VERSION: ClassVar[int] = 3
    # Sub-jobs enqueued by a running job are buffered by the worker and flushed
    # on success: there is no real transaction to roll back here.
    supports_transactional_simulation: ClassVar[bool] = True

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        reclaim_event_visibility_delay: timedelta = timedelta(seconds=2),
        cancel_reclaim_headroom: timedelta = timedelta(seconds=60),
        stale_batch_grace: timedelta = timedelta(seconds=10),
    ) -> None:
        self._open = False
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.reclaim_event_visibility_delay = reclaim_event_visibility_delay
        self.cancel_reclaim_headroom = cancel_reclaim_headroom
        self.stale_batch_grace = stale_batch_grace
        self._store = JobStore()
        # Reads scan the jobs table directly; every write goes through the store.
        self._jobs = self._store.jobs
        self._actors: dict[str, ActorConfig] = {}
        self._queues: dict[str, QueueConfig] = {}
        self._turns = CohortTurns()
        """Round robin's turns (one process: every worker's dispatches share them)."""
        self._schedules = ScheduleTable(self.clock)
        self._batches = BatchTable(self._store, self.clock)
        self._archive = JobArchive(self._store, self.clock)
        self.leader: UUID | None = None
        """The worker leading maintenance on this backend, if any."""
        self._maintenance_runs: dict[str, datetime] = {}
        """The latest slot each slotted leader loop ran (``SupportsMaintenanceRuns``)."""
        self.workers: dict[UUID, WorkerRecord] = {}
        """The worker registry (``SupportsWorkerRegistry``), by worker id."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> InMemoryBackend:
        """Build from a ``memory://`` URL (anything after the scheme is ignored);
        ``options`` are the constructor's keyword arguments (``schema`` is accepted
        and ignored, so one application definition serves every backend)."""
        scheme = urlsplit(url).scheme
        if scheme != "memory":
            raise ValueError(
                f"InMemoryBackend serves memory:// URLs, not {url!r}; "
                f"use 'memory://' or the backend that serves {scheme or 'this'}://"
            )
        # A schema namespaces a database and dispatch samples a table; one
        # process's memory needs neither.
        options.pop("schema", None)
        options.pop("dispatch_oversample", None)  # nothing is sampled in memory
        options.pop("command_timeout", None)  # no statements, no server to stall
        options.pop("min_pool_size", None)  # no connections
        options.pop("max_pool_size", None)
        # Wakes are in-process events: no NOTIFY to coalesce or leave out.
        options.pop("wake_coalesce_window", None)
        options.pop("poll_only", None)
        options.pop("direct_dsn", None)  # no server, no pooler in front of one
        return cls(**options)

    # -- lifecycle -------------------------------------------------------------
    async def open(self) -> None:
        """Nothing to connect: the methods answer from now on. Idempotent."""
        self._open = True

    async def close(self) -> None:
        """Nothing to release; the methods refuse until the next ``open()``, and the
        data stays until the instance is dropped. Idempotent."""
        self._open = False

    # -- configuration -----------------------------------------------------------
    async def register_actors(self, configs: list[ActorConfig]) -> None:
        """Upsert each actor's ``max_concurrent`` / ``max_pending`` / ``queue`` /
        ``job_defaults`` (a queue or defaults not given keep the ones registered before,
        as an older worker's upsert does). Job defaults are stored as JSON values are,
        and one that JSON cannot hold refuses the call before anything is stored."""
        configs = [
            config
            if config.job_defaults is None
            else config.model_copy(update={"job_defaults": stored_json(config.job_defaults)})
            for config in configs
        ]
        for config in configs:
            self._actors[config.actor] = registered_over(config, self._actors.get(config.actor))

    async def configure_queue(self, config: QueueConfig) -> None:
        """Upsert a queue's mode and ``max_concurrent``."""
        self._queues[config.queue] = config

    # -- enqueue -------------------------------------------------------------------
    async def enqueue(self, args: EnqueueArgs) -> JobRow:
        """Insert one job (``pending``, or ``scheduled`` after a positive ``delay``)."""
        plan = self._store.plan_inserts([args], self.clock.now(), idempotent=True)
        self._store.insert(plan)
        return _copy(plan.rows[0])

    async def enqueue_batch(
        self, args_list: list[EnqueueArgs], *, connection: Connection = None
    ) -> list[JobRow]:
        """Insert all items or none; one row per item, in order. ``connection`` is ignored."""
        plan = self._store.plan_inserts(args_list, self.clock.now(), idempotent=True)
        self._store.insert(plan)
        return [_copy(row) for row in plan.rows]

    async def enqueue_batch_fast(
        self, args_list: Iterable[EnqueueArgs], *, connection: Connection = None
    ) -> int:
        """Insert all items or none; a used idempotency key fails the whole call."""
        plan = self._store.plan_inserts(list(args_list), self.clock.now(), idempotent=False)
        self._store.insert(plan)
        return len(plan.new)

    async def enqueue_with_conn(self, conn: Connection, args: EnqueueArgs) -> JobRow:
        """``enqueue``; there is no transaction to join, so ``conn`` is ignored."""
        return await self.enqueue(args)

    async def precheck_enqueue(
        self, args_list: list[EnqueueArgs], *, finishing: JobId | None = None
    ) -> None:
        """Raise what ``enqueue_batch(args_list)`` would raise once ``finishing`` (the
        parent) has ended; write nothing (``SupportsEnqueuePrecheck``)."""
        self._store.plan_inserts(args_list, self.clock.now(), idempotent=True, finishing=finishing)

    # -- dispatch and heartbeat ------------------------------------------------------
    async def dispatch_batch(
        self, worker_id: UUID, queues: list[str], limit: int, lock_lease: timedelta
    ) -> list[JobRow]:
        """Lock up to ``limit`` due pending jobs of ``queues`` for ``worker_id``."""
        return self._dispatch(worker_id, queues, limit, lock_lease, None)

    async def dispatch_actors_batch(
        self,
        worker_id: UUID,
        queues: list[str],
        limit: int,
        lock_lease: timedelta,
        actors: Sequence[str],
    ) -> list[JobRow]:
        """``dispatch_batch`` over the jobs of ``actors`` only (``SupportsActorDispatch``)."""
        return self._dispatch(worker_id, queues, limit, lock_lease, frozenset(actors))

    def _dispatch(
        self,
        worker_id: UUID,
        queues: list[str],
        limit: int,
        lock_lease: timedelta,
        actors: frozenset[str] | None,
    ) -> list[JobRow]:
        check_names(*queues, *(actors or ()))
        if limit <= 0 or not queues:
            return []
        now = self.clock.now()
        wanted = set(queues)
        due = [
            row
            for row in self._jobs.values()
            if row.status is _S.PENDING
            and row.queue in wanted
            and row.scheduled_at <= now
            and (actors is None or row.actor in actors)
        ]
        round_robin = {
            q for q in wanted if q in self._queues and self._queues[q].mode == "round_robin"
        }
        load = RunningLoad.of(self._jobs.values())
        actor_caps = {name: cfg.max_concurrent for name, cfg in self._actors.items()}
        # As the Postgres CTE samples only actors with room, past the jobs waiting on a
        # running identity: neither takes a place in the fairness ranks.
        ranked = dispatch_order(
            (
                row
                for row in due
                if not load.actor_full(row.actor, actor_caps) and not load.identity_running(row)
            ),
            round_robin,
            load,
            self._turns.turns(),
        )
        chosen = take_jobs(
            ranked,
            limit,
            load,
            actor_caps=actor_caps,
            queue_caps={name: cfg.max_concurrent for name, cfg in self._queues.items()},
        )
        if round_robin:
            self._turns.served(cohort_of(row, round_robin) for row in chosen)
        return [
            _copy(
                self._store.move(
                    row,
                    _S.RUNNING,
                    now,
                    detail={"worker_id": str(worker_id)},
                    attempt=row.attempt + 1,
                    locked_by_worker=worker_id,
                    started_at=now,
                    lock_expires_at=now + lock_lease,
                    execution_started_at=None,
                )
            )
            for row in chosen
        ]

    async def heartbeat_jobs(self, worker_id: UUID, lock_lease: timedelta) -> int:
        """Extend the lease of every running job ``worker_id`` holds."""
        return len(await self.renew_leases(worker_id, lock_lease))

    async def renew_leases(self, worker_id: UUID, lock_lease: timedelta) -> list[JobId]:
        """``heartbeat_jobs``, returning the ids renewed (``SupportsLeaseRenewal``; no
        row is ever held here)."""
        now = self.clock.now()
        held = self._held(worker_id)
        for row in held:
            self._store.update(row, lock_expires_at=now + lock_lease)
        return [row.id for row in held]

    async def held_jobs(self, worker_id: UUID) -> list[tuple[JobId, int]]:
        """``(id, attempt)`` of every running job ``worker_id`` holds (``SupportsHeldJobs``)."""
        return [(row.id, row.attempt) for row in self._held(worker_id)]

    async def record_late_outcome(
        self, job_id: JobId, attempt: int, worker_id: UUID, outcome: str, error: ErrorInfo | None
    ) -> bool:
        """A ``late_outcome`` event in the job's history (``SupportsLateOutcomes``)."""
        if job_id not in self._jobs:
            return False
        said = late_outcome_detail(attempt, worker_id, outcome, None).items()
        if not any(
            event.kind == "late_outcome" and said <= event.detail.items()
            for event in self._store.events.get(job_id, [])
        ):
            detail = late_outcome_detail(attempt, worker_id, outcome, error)
            self._store.event(job_id, "late_outcome", detail, self.clock.now())
        return True

    def _held(self, worker_id: UUID) -> list[JobRow]:
        return [
            row
            for row in self._jobs.values()
            if row.status is _S.RUNNING and row.locked_by_worker == worker_id
        ]

    async def extend_reservation_leases(self, worker_id: UUID, lock_lease: timedelta) -> int:
        """Always 0: the in-memory backend holds no reservation slots."""
        return 0

    async def record_progress(
        self,
        job_id: JobId,
        worker_id: UUID,
        progress_seq: int,
        progress_state: dict[str, Any] | None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """Store newer progress for the owner of a running job."""
        _refuse_unstorable(progress_state)
        row = self._store.owned(job_id, worker_id, attempt)
        if row is None:
            return False
        if progress_seq > row.progress_seq:
            self._store.update(
                row, progress_seq=progress_seq, progress_state=stored_json(progress_state)
            )
        return True

    # -- terminal writes -----------------------------------------------------------------
    async def mark_succeeded(
        self,
        job_id: JobId,
        worker_id: UUID,
        result: Any,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        fallback_result_ttl: timedelta | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """``running -> succeeded`` storing ``result``; False on a no-op."""
        _refuse_unstorable(result, progress_state)
        row = self._store.owned(job_id, worker_id, attempt)
        if row is None:
            return False
        now = self.clock.now()
        ttl = row.result_ttl if row.result_ttl is not None else fallback_result_ttl
        self._store.end_attempt(
            row,
            _S.SUCCEEDED,
            now,
            worker_id=worker_id,
            outcome="succeeded",
            progress_seq=progress_seq,
            progress_state=progress_state,
            result=stored_json(result),
            result_expires_at=now + ttl if ttl is not None else None,
            error=None,  # an earlier attempt's: the job did not fail (its attempts keep it)
        )
        return True

    async def mark_succeeded_many(
        self,
        worker_id: UUID,
        items: Sequence[SuccessWrite],
        fallback_result_ttl: timedelta | None = None,
    ) -> list[bool]:
        """``mark_succeeded`` for each item, in order; one flag per item. An unstorable
        value in any item refuses the whole call before anything is written."""
        for item in items:
            _refuse_unstorable(item.result, item.progress_state)
        return [
            await self.mark_succeeded(
                item.job_id,
                worker_id,
                item.result,
                item.progress_seq,
                item.progress_state,
                fallback_result_ttl,
                attempt=item.attempt,
            )
            for item in items
        ]

    async def mark_succeeded_with_conn(
        self,
        conn: Connection,
        job_id: JobId,
        worker_id: UUID,
        result: Any,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        fallback_result_ttl: timedelta | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """``mark_succeeded``; ``conn`` is ignored."""
        return await self.mark_succeeded(
            job_id,
            worker_id,
            result,
            progress_seq,
            progress_state,
            fallback_result_ttl,
            attempt=attempt,
        )

    async def mark_failed_or_retry(
        self,
        job_id: JobId,
        worker_id: UUID,
        error_info: ErrorInfo,
        retry_delay: timedelta | None,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        *,
        attempt: int | None = None,
    ) -> JobRow:
        """Record a failed attempt, then retry (``scheduled``/``pending``) or fail.

        Returns the row after the write, the unchanged row on a no-op, and raises
        ``KeyError`` for an unknown job.
        """
        if retry_delay is not None:
            check_delay(retry_delay)
        _refuse_unstorable(progress_state)
        row = self._store.owned(job_id, worker_id, attempt)
        if row is None:
            if job_id not in self._jobs:
                raise KeyError(f"no job with id {job_id}")
            return _copy(self._jobs[job_id])
        now = self.clock.now()
        changes: dict[str, Any] = {}
        detail: dict[str, Any] | None = None
        if retry_delay is None:
            # Failed by its deadline (its worker saw it pass), not by the actor's choice.
            deadline = error_info.error_class == DEADLINE_EXCEEDED.error_class
            detail = {"reason": "deadline_exceeded" if deadline else "no_retry"}
        elif row.attempt >= row.max_attempts:
            detail = {"reason": "attempts_exhausted"}
        elif row.deadline_at is not None and now + retry_delay > row.deadline_at:
            detail = {"reason": "retry_past_deadline"}
        # A failed job's event says why it was not retried (its error is the actor's).
        if retry_delay is None or detail is not None:
            to = _S.FAILED
        else:
            to = _requeue(row, now, retry_delay, changes)
            detail = {"reason": _requeued_because(to, "retry")}
        error = stored_error(error_info)
        return _copy(
            self._store.end_attempt(
                row,
                to,
                now,
                worker_id=worker_id,
                outcome="failed",
                attempt_error=error,
                progress_seq=progress_seq,
                progress_state=progress_state,
                error=error,
                detail=detail,
                **changes,
            )
        )

    async def mark_cancelled(
        self,
        job_id: JobId,
        worker_id: UUID,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """``running -> cancelled`` (the actor honoured a cancel); False on a no-op."""
        _refuse_unstorable(progress_state)
        row = self._store.owned(job_id, worker_id, attempt)
        if row is None:
            return False
        self._store.end_attempt(
            row,
            _S.CANCELLED,
            self.clock.now(),
            worker_id=worker_id,
            outcome="cancelled",
            progress_seq=progress_seq,
            progress_state=progress_state,
            # The cancel's reason, as a pending job's cancel event gives it.
            detail={"reason": row.cancel_reason} if row.cancel_reason is not None else None,
        )
        return True

    async def write_cancel_escalation(
        self,
        job_id: JobId,
        worker_id: UUID,
        phase: Literal[2],
        *,
        attempt: int | None = None,
    ) -> bool:
        """Cancel phase 1 -> 2 for the owner, with a ``cancel_escalated`` event."""
        if phase != 2:
            raise ValueError(f"a cancel can only be escalated to phase 2, not {phase}")
        row = self._store.owned(job_id, worker_id, attempt)
        if row is None or row.cancel_phase != CancelPhase.COOPERATIVE:
            return False
        now = self.clock.now()
        self._store.update(row, cancel_phase=CancelPhase.FORCED)
        self._store.event(job_id, "cancel_escalated", {"from_phase": 1, "to_phase": 2}, now)
        return True

    async def mark_abandoned(
        self,
        job_id: JobId,
        worker_id: UUID,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """``running -> abandoned`` while ``cancel_phase = 2``, for the owner only: its
        heartbeat writes it after the forced cancel did not finish in time."""
        _refuse_unstorable(progress_state)
        row = self._store.owned(job_id, worker_id, attempt)
        if row is None or row.cancel_phase != CancelPhase.FORCED:
            return False
        self._store.end_attempt(
            row,
            _S.ABANDONED,
            self.clock.now(),
            worker_id=row.locked_by_worker,
            outcome="abandoned",
            progress_seq=progress_seq,
            progress_state=progress_state,
        )
        return True

    async def mark_snoozed(
        self,
        job_id: JobId,
        worker_id: UUID,
        delay: timedelta,
        *,
        metadata_update: dict[str, Any] | None = None,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        outcome: AttemptOutcome = "snoozed",
        attempt: int | None = None,
    ) -> Literal["scheduled", "failed", "cancelled", "noop"]:
        """Run again after ``delay`` without using an attempt: ``max_attempts`` grows by
        one so the attempt numbers stay unique. ``failed`` past the deadline,
        ``cancelled`` when a cancel was requested."""
        check_delay(delay)
        _refuse_unstorable(metadata_update, progress_state)
        row = self._store.owned(job_id, worker_id, attempt)
        if row is None:
            return "noop"
        now = self.clock.now()
        changes: dict[str, Any] = {}
        if metadata_update:
            changes["metadata"] = {**row.metadata, **stored_json(metadata_update)}
        attempt_error = None
        detail = None
        if row.deadline_at is not None and now + delay > row.deadline_at:
            to = _S.FAILED
            attempt_error = changes["error"] = DEADLINE_EXCEEDED
            detail = {"reason": "deadline_exceeded"}
        else:
            to = _requeue(row, now, delay, changes)
            detail = {"reason": _requeued_because(to, outcome)}
        if to not in (_S.FAILED, _S.CANCELLED):  # given back only to a job that runs again
            changes["max_attempts"] = min(row.max_attempts + 1, INT32_MAX)
        self._store.end_attempt(
            row,
            to,
            now,
            worker_id=worker_id,
            outcome=outcome,
            attempt_error=attempt_error,
            progress_seq=progress_seq,
            progress_state=progress_state,
            detail=detail,
            **changes,
        )
        if to in (_S.FAILED, _S.CANCELLED):
            return "failed" if to is _S.FAILED else "cancelled"
        return "scheduled"

    async def hand_back_unstarted(
        self,
        worker_id: UUID,
        jobs: Sequence[tuple[JobId, int | None]],
        *,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> int:
        """``mark_snoozed`` with no delay and outcome ``unstarted`` for each job (locked
        by the worker, never started); how many moved. ``batch_ends``: each job of a
        batch it failed or cancelled is appended to it."""
        moved = 0
        for job_id, attempt in jobs:
            verdict = await self.mark_snoozed(
                job_id, worker_id, timedelta(0), outcome="unstarted", attempt=attempt
            )
            moved += verdict != "noop"
            if verdict in ("failed", "cancelled"):
                report_batch_end(batch_ends, self._store.jobs[job_id], JobStatus(verdict))
        return moved

    async def mark_retry_after(
        self,
        job_id: JobId,
        worker_id: UUID,
        delay: timedelta,
        *,
        consume_budget: bool = True,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        attempt: int | None = None,
    ) -> Literal[
        "scheduled", "failed:DeadlineExceeded", "failed:MaxAttemptsExceeded", "cancelled", "noop"
    ]:
        """Run again after ``delay``. With ``consume_budget=False`` (a rate-limit
        denial) the attempt does not count: ``max_attempts`` grows by one.
        ``cancelled`` when a cancel was requested."""
        check_delay(delay)
        _refuse_unstorable(progress_state)
        row = self._store.owned(job_id, worker_id, attempt)
        if row is None:
            return "noop"
        now = self.clock.now()
        changes: dict[str, Any] = {}
        result: Literal[
            "scheduled", "failed:DeadlineExceeded", "failed:MaxAttemptsExceeded", "cancelled"
        ]
        attempt_error = None
        detail = None
        if row.deadline_at is not None and now + delay > row.deadline_at:
            to, result = _S.FAILED, "failed:DeadlineExceeded"
            attempt_error = changes["error"] = DEADLINE_EXCEEDED
            detail = {"reason": "deadline_exceeded"}
        elif consume_budget and row.attempt >= row.max_attempts:
            to, result = _S.FAILED, "failed:MaxAttemptsExceeded"
            attempt_error = changes["error"] = ErrorInfo(
                error_class="MaxAttemptsExceeded",
                message=f"attempt {row.attempt} of {row.max_attempts} asked to retry",
            )
            detail = {"reason": "attempts_exhausted"}
        else:
            to = _requeue(row, now, delay, changes)
            result = "cancelled" if to is _S.CANCELLED else "scheduled"
            outcome = "retry_after" if consume_budget else "rate_limit_denied"
            detail = {"reason": _requeued_because(to, outcome)}
            if not consume_budget and to is not _S.CANCELLED:  # runs again: given back
                changes["max_attempts"] = min(row.max_attempts + 1, INT32_MAX)
        self._store.end_attempt(
            row,
            to,
            now,
            worker_id=worker_id,
            outcome="retry_after" if consume_budget else "rate_limit_denied",
            attempt_error=attempt_error,
            progress_seq=progress_seq,
            progress_state=progress_state,
            detail=detail,
            **changes,
        )
        return result

    # -- history -------------------------------------------------------------------
    async def write_attempt(self, attempt: AttemptRow) -> None:
        """Insert or replace the attempt row keyed by ``(job_id, attempt)``; ``KeyError``
        when the job does not exist. Stored as every write stores: times in UTC, NULs
        in its error replaced."""
        if attempt.job_id not in self._jobs:
            raise KeyError(f"no job with id {attempt.job_id}")
        stored = attempt.model_copy(
            update={
                "started_at": _in_utc(attempt.started_at),
                "finished_at": _in_utc(attempt.finished_at),
                "error": None if attempt.error is None else stored_error(attempt.error),
            }
        )
        self._store.attempts.setdefault(attempt.job_id, {})[attempt.attempt] = stored

    async def get_attempts(self, job_id: JobId) -> list[AttemptRow]:
        """Attempts of a job by attempt number."""
        attempts = self._store.attempts.get(job_id, {})
        return [_copy(attempts[n]) for n in sorted(attempts)]

    async def get_events(self, job_id: JobId) -> list[EventRow]:
        """Events of a job by event id (they are appended in id order)."""
        return [_copy(event) for event in self._store.events.get(job_id, [])]

    async def poll_reclaim_events(
        self,
        after_id: int,
        limit: int = 100,
        *,
        visibility_delay: timedelta | None = None,
    ) -> list[EventRow]:
        """``reclaimed`` events after ``after_id`` that are at least the visibility
        delay old, in id order. (One process has no commit-order gap to wait out;
        the delay is kept so callers see the same timing as on Postgres.)"""
        delay = (
            visibility_delay
            if visibility_delay is not None
            else self.reclaim_event_visibility_delay
        )
        visible_until = self.clock.now() - delay
        visible = [
            event
            for event in self._store.reclaim_events
            if event.event_id > after_id and event.occurred_at <= visible_until
        ]
        return [_copy(event) for event in visible[: max(limit, 0)]]

    # -- cancellation -----------------------------------------------------------------
    def _request_cancel(self, row: JobRow, reason: str | None, now: datetime) -> bool:
        """The cancel request on one job; returns whether it ended the job at once."""
        reason = clean_text(reason)
        if row.status in _WAITING:
            self._store.move(
                row,
                _S.CANCELLED,
                now,
                detail={"reason": reason} if reason is not None else None,
                finished_at=now,
                cancel_requested_at=now,
                cancel_reason=reason,
            )
            return True
        # Running: flag phase 1 for the worker's heartbeat. A repeated request keeps
        # the first timestamp and phase (it may already be 2) and the reason given.
        self._store.update(
            row,
            cancel_phase=max(row.cancel_phase, CancelPhase.COOPERATIVE),
            cancel_requested_at=row.cancel_requested_at or now,
            cancel_reason=reason if reason is not None else row.cancel_reason,
        )
        self._store.event(
            row.id, "cancel_requested", {"reason": reason} if reason is not None else {}, now
        )
        wake(self._store.cancel_wake_subscribers)
        if row.locked_by_worker is not None:
            wake(self._store.worker_cancel_wake_subscribers.get(row.locked_by_worker, set()))
        return False

    async def write_cancel_request(
        self,
        job_id: JobId,
        reason: str | None,
        *,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> bool:
        """Cancel a waiting job at once, or flag a running one; False when the job is
        terminal or unknown. A batch child cancelled at once goes to ``batch_ends``."""
        row = self._jobs.get(job_id)
        if row is None or row.is_terminal:
            return False
        if self._request_cancel(row, reason, self.clock.now()):
            report_batch_end(batch_ends, row, _S.CANCELLED)
        return True

    async def cancel_where(
        self,
        filter: JobFilter,
        reason: str | None,
        *,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> BulkCancelResult:
        """``write_cancel_request`` on every job ``filter`` selects (its limit ignored), in
        the filter's order."""
        now = self.clock.now()
        result = BulkCancelResult()
        for row in select_jobs(self._jobs.values(), filter, paged=False):
            if row.is_terminal:
                continue
            ended = self._request_cancel(row, reason, now)
            (result.cancelled if ended else result.requested).append(row.id)
            if ended:
                report_batch_end(batch_ends, row, _S.CANCELLED)
        return result

    async def poll_cancel_flags(self, worker_id: UUID) -> list[CancelFlag]:
        """Running jobs of ``worker_id`` with a cancel request, oldest request first."""
        flags = [
            CancelFlag(
                job_id=row.id,
                cancel_phase=row.cancel_phase,
                cancel_requested_at=row.cancel_requested_at,
                reason=row.cancel_reason,
            )
            for row in self._jobs.values()
            if row.status is _S.RUNNING
            and row.locked_by_worker == worker_id
            and row.cancel_phase >= CancelPhase.COOPERATIVE
            and row.cancel_requested_at is not None
        ]
        flags.sort(key=lambda flag: (flag.cancel_requested_at, flag.job_id))
        return flags

    # -- admin ---------------------------------------------------------------------------
    async def retry_job(self, job_id: JobId) -> bool:
        """Give a failed/crashed/cancelled/abandoned job a new life as ``pending``;
        ``SingletonCollisionError`` for a singleton whose identity another active job
        holds (it would be a second one)."""
        row = self._jobs.get(job_id)
        if row is None or row.status not in _RETRYABLE:
            return False
        holder = self._store.singleton_holder(row)
        if holder is not None:
            raise SingletonCollisionError.on_retry(job_id, row.actor, row.identity_key, holder.id)
        now = self.clock.now()
        if row.deadline_at is not None and row.deadline_at <= now:
            raise RetryRefusedError.past_deadline(job_id, row.deadline_at.isoformat())
        batch = None if row.batch_id is None else self._batches.get(row.batch_id)
        if batch is not None and batch.status == "aborted":
            raise RetryRefusedError.in_aborted_batch(job_id, batch.id)
        # An operator reset, not a state-machine transition (terminal statuses have
        # none), so it is written without the transition check.
        self._store.write_status(
            row,
            _S.PENDING,
            now,
            detail={"reason": "retried"},
            scheduled_at=now,
            max_attempts=max(row.max_attempts, row.attempt + 1),
            locked_by_worker=None,
            lock_expires_at=None,
            cancel_phase=CancelPhase.NONE,
            cancel_requested_at=None,
            cancel_reason=None,
            finished_at=None,
            result=None,
            result_expires_at=None,
            error=None,
        )
        return True

    # -- sweeps ------------------------------------------------------------------------
    async def scheduled_to_pending(self) -> int:
        """Promote scheduled jobs that are due; wakes workers when any moved."""
        return promote_due(self._store, self.clock.now())

    async def deadline_sweep(self, *, batch_ends: list[BatchChildEnd] | None = None) -> int:
        """Fail pending/scheduled jobs whose ``schedule_to_close`` deadline passed; the
        batch children failed go to ``batch_ends``."""
        return fail_past_deadline(self._store, self.clock.now(), batch_ends)

    async def reclaim_expired_locks(
        self,
        cancel_grace: timedelta,
        cleanup_grace: timedelta,
        *,
        worker_silence: timedelta | None = None,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> int:
        """Reclaim running jobs whose lease expired: cancel requested -> ``cancelled``,
        attempts left -> ``pending``, else ``crashed``. A job with a cancel in progress
        waits ``cancel_grace + cleanup_grace + cancel_reclaim_headroom`` past its lease;
        with ``worker_silence``, a job whose worker was seen within it is left. The
        batch children ended go to ``batch_ends``."""
        cancel_wait = cancel_grace + cleanup_grace + self.cancel_reclaim_headroom
        now = self.clock.now()
        alive = (
            frozenset()
            if worker_silence is None
            else frozenset(
                wid
                for wid, seen in self.workers.items()
                if seen.last_seen_at > now - worker_silence
            )
        )
        return reclaim_expired(self._store, now, cancel_wait, alive, batch_ends)

    async def sweep_expired_results(self) -> int:
        """Clear the result of every job whose ``result_expires_at`` has passed
        (``SupportsResultExpiry``); the expiry time itself is kept."""
        now = self.clock.now()
        expired = [
            row
            for row in self._jobs.values()
            if row.result is not None
            and row.result_expires_at is not None
            and row.result_expires_at <= now
        ]
        for row in expired:
            self._store.update(row, result=None)
        return len(expired)

    async def prune_terminal_jobs(
        self,
        retention: Mapping[str, timedelta],
        *,
        archive_retention: timedelta,
        batch_size: int = 10_000,
    ) -> int:
        """Move terminal jobs past their status's retention (with their attempts) into
        the archive and delete their events, ``batch_size`` at a time (``SupportsPrune``);
        archived jobs expire ``archive_retention`` later. Returns the jobs moved."""
        return self._archive.prune(retention, archive_retention, batch_size)

    async def expire_archive(self, *, batch_size: int = 10_000) -> int:
        """Delete archived jobs (and their attempts) past ``expire_at``, ``batch_size``
        at a time (``SupportsPrune``); returns how many."""
        return self._archive.expire(batch_size)

    async def now(self) -> datetime:
        """This backend's clock (``SupportsPrune``)."""
        return self.clock.now()

    async def last_maintenance_run(self, loop: str) -> datetime | None:
        """The latest slot recorded for the leader loop ``loop``
        (``SupportsMaintenanceRuns``)."""
        check_names(loop)
        return self._maintenance_runs.get(loop)

    async def record_maintenance_run(self, loop: str, slot: datetime) -> bool:
        """Record ``slot`` as run for ``loop``, unless that slot or a later one is
        (``SupportsMaintenanceRuns``); nothing awaits in between. Stored in UTC, as a
        ``timestamptz`` reads back."""
        check_names(loop)
        slot = _utc(slot)
        recorded = self._maintenance_runs.get(loop)
        if recorded is not None and recorded >= slot:
            return False
        self._maintenance_runs[loop] = slot
        return True

    # -- fleet statistics and the worker registry ---------------------------------------
    async def queue_depths(self) -> dict[str, dict[str, int]]:
        """Pending, scheduled and running jobs per queue (``SupportsFleetStats``)."""
        counted = (_S.PENDING, _S.SCHEDULED, _S.RUNNING)
        depths: dict[str, dict[str, int]] = {}
        for row in self._jobs.values():
            if row.status in counted:
                counts = depths.setdefault(row.queue, {s.value: 0 for s in counted})
                counts[row.status.value] += 1
        return depths

    async def stranded_jobs(self) -> dict[str, dict[str, int]]:
        """Pending and scheduled jobs per actor and queue, of an actor with no
        registered config or, while workers are registered, that no worker both runs
        and works the queue of (``SupportsFleetStats``)."""
        waiting: dict[tuple[str, str], int] = {}
        for row in self._jobs.values():
            if row.status in _WAITING:
                key = (row.actor, row.queue)
                waiting[key] = waiting.get(key, 0) + 1
        stranded: dict[str, dict[str, int]] = {}
        for (actor, queue), jobs in sorted(waiting.items()):
            if self._stranded(actor, queue):
                stranded.setdefault(actor, {})[queue] = jobs
        return stranded

    def _stranded(self, actor: str, queue: str) -> bool:
        # Configs outlive every release (register_actors only adds): only the live
        # workers' actors and queues show one since removed, or a queue nobody works.
        # A worker that did not say its actors runs any, on its own queues.
        if actor not in self._actors:
            return True
        return bool(self.workers) and not any(
            (w.actors is None or actor in w.actors) and queue in w.queues
            for w in self.workers.values()
        )

    async def register_worker(
        self,
        worker_id: UUID,
        hostname: str,
        pid: int,
        queues: list[str],
        *,
        actors: Sequence[str] | None = None,
    ) -> None:
        """Upsert the worker's row on this backend's clock (``SupportsWorkerRegistry``)."""
        check_names(hostname, *queues, *(actors or ()))
        now = self.clock.now()
        self.workers[worker_id] = WorkerRecord(
            id=worker_id,
            hostname=hostname,
            pid=pid,
            queues=list(queues),
            actors=None if actors is None else frozenset(actors),
            started_at=now,
            last_seen_at=now,
        )

    async def touch_worker(self, worker_id: UUID) -> bool:
        """Refresh the worker's ``last_seen_at``; False when its row is gone."""
        record = self.workers.get(worker_id)
        if record is None:
            return False
        self.workers[worker_id] = replace(record, last_seen_at=self.clock.now())
        return True

    async def deregister_worker(self, worker_id: UUID) -> None:
        """Delete the worker's row (no-op when it is gone)."""
        self.workers.pop(worker_id, None)

    async def cleanup_stale_workers(self, older_than: timedelta) -> int:
        """Delete workers not seen for more than ``older_than``; returns how many."""
        cutoff = self.clock.now() - older_than
        stale = [wid for wid, record in self.workers.items() if record.last_seen_at < cutoff]
        for wid in stale:
            del self.workers[wid]
        return len(stale)

    # -- reads -------------------------------------------------------------------------
    async def get(self, job_id: JobId) -> JobRow | None:
        """One job, or None."""
        row = self._jobs.get(job_id)
        return None if row is None else _copy(row)

    async def list_jobs(self, filters: JobFilter) -> list[JobRow]:
        """One page of the jobs ``filters`` selects, in ``(created_at, id)`` order."""
        return [_copy(row) for row in select_jobs(self._jobs.values(), filters)]

    async def count_pending_jobs(
        self, actors: list[str], *, up_to: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """Waiting (pending + scheduled) jobs of each actor asked for, each stopped at
        its ``up_to`` if it has one."""
        check_names(*actors)
        check_up_to(up_to)
        counts = self._count_waiting(actors)
        if up_to:
            counts = {a: min(n, up_to[a]) if a in up_to else n for a, n in counts.items()}
        return counts

    def _count_waiting(self, actors: list[str]) -> dict[str, int]:
        counts = Counter(row.actor for row in self._jobs.values() if row.status in _WAITING)
        return {actor: counts[actor] for actor in actors}

    async def get_actor_max_pending(self) -> dict[str, int | None]:
        """``max_pending`` of every registered actor."""
        return {name: config.max_pending for name, config in self._actors.items()}

    async def get_actor_queues(self) -> dict[str, str]:
        """The queue of every actor registered with one (``SupportsCron``)."""
        return {name: c.queue for name, c in self._actors.items() if c.queue is not None}

    async def get_actor_job_defaults(self) -> dict[str, dict[str, Any]]:
        """The job defaults of every actor registered with them (``SupportsCron``)."""
        return {
            name: dict(c.job_defaults)
            for name, c in self._actors.items()
            if c.job_defaults is not None
        }

    async def count_active_jobs(self, queues: list[str]) -> int:
        """Non-terminal jobs in ``queues``."""
        check_names(*queues)
        wanted = set(queues)
        return sum(
            1
            for row in self._jobs.values()
            if row.queue in wanted and row.status in ACTIVE_STATUSES
        )

    # -- wake-ups ------------------------------------------------------------------------
    @staticmethod
    @asynccontextmanager
    async def _subscribe(subscribers: set[asyncio.Event]) -> AsyncIterator[asyncio.Event]:
        event = asyncio.Event()
        subscribers.add(event)
        try:
            yield event
        finally:
            subscribers.discard(event)

    def subscribe_wake(self) -> AbstractAsyncContextManager[asyncio.Event]:
        """An event set whenever a job may have become dispatchable (enqueue, promotion,
        retry, reclaim, batch finalizer release). The consumer clears it."""
        return self._subscribe(self._store.wake_subscribers)

    def subscribe_cancel_wake(self) -> AbstractAsyncContextManager[asyncio.Event]:
        """An event set whenever a running job receives a cancel request."""
        return self._subscribe(self._store.cancel_wake_subscribers)

    def subscribe_worker_cancel_wake(
        self, worker_id: UUID
    ) -> AbstractAsyncContextManager[asyncio.Event]:
        """An event set when a running job ``worker_id`` holds receives a cancel request."""
        return self._subscribe(self._store.worker_cancel_wake_subscribers[worker_id])

    # -- schedules -----------------------------------------------------------------------
    async def create_schedule(self, args: ScheduleCreateArgs) -> ScheduleRecord:
        """Store a schedule; ``ValueError`` when its name is taken."""
        return _copy(self._schedules.create(args))

    async def list_schedules(
        self, *, actor: str | None = None, enabled: bool | None = None
    ) -> list[ScheduleRecord]:
        """Schedules by name."""
        if actor is not None:
            check_names(actor)
        return [_copy(record) for record in self._schedules.list(actor=actor, enabled=enabled)]

    async def update_schedule(self, schedule_id: UUID, args: ScheduleUpdateArgs) -> ScheduleRecord:
        """Apply the fields of ``args`` that are set; ``KeyError`` if unknown."""
        return _copy(self._schedules.update(schedule_id, args))

    async def delete_schedule(self, schedule_id: UUID) -> None:
        """Remove a schedule; ``KeyError`` if unknown."""
        self._schedules.delete(schedule_id)

    # -- maintenance leader ---------------------------------------------------------------
    def leader_elector(self, worker_id: UUID, *, lease: timedelta) -> _MemoryLeaderElector:
        """An elector among the workers sharing this backend (one process: nothing can
        freeze a leader without freezing them all, so ``lease`` is not needed)."""
        del lease
        return _MemoryLeaderElector(self, worker_id)

    async def fire_due_schedules(self, build: ScheduleFire, *, catch_up: timedelta) -> int:
        """Enqueue each due slot of each enabled schedule (up to its actor's
        ``max_pending``) and advance it; nothing awaits between reading a schedule and
        advancing it, so no slot fires twice."""
        now = self.clock.now()
        fired = 0
        for schedule in self._schedules.list(actor=None, enabled=True):
            if schedule.next_fire_at is None or schedule.next_fire_at > now:
                continue
            slots, following = cron_slots(schedule, now, catch_up)
            jobs = [args for slot in slots if (args := build(schedule, slot)) is not None]
            jobs = one_per_singleton(schedule, slots, jobs)
            config = self._actors.get(schedule.actor)
            if config is not None and config.max_pending is not None:
                waiting = self._count_waiting([schedule.actor])[schedule.actor]
                jobs = within_max_pending(schedule, slots, jobs, config.max_pending, waiting)
            try:
                plan = self._store.plan_inserts(jobs, now, idempotent=True)
            except (TaskQError, ValueError) as exc:
                skipped_slots(schedule, slots, exc)
                jobs = []
            else:
                self._store.insert(plan)
            self._schedules.advance(schedule.id, following, slots[-1] if slots else None)
            fired += len(jobs)
        return fired

    # -- batches -------------------------------------------------------------------------
    async def enqueue_batch_atomic(
        self,
        items: Iterable[EnqueueArgs],
        *,
        batch_id: UUID,
        queue: str,
        batch_row: BatchRow | None,
        finalizer_args: EnqueueArgs | None,
        chunk_size: int = 1000,
    ) -> list[JobRow]:
        """Children (tagged ``metadata.batch_id``), the batch row and the parked
        finalizer, all or nothing; returns the children's rows.

        Children and finalizer keep the queue their own args name (``queue`` is
        the batch's, carried by ``batch_row``). ``chunk_size`` has no effect here:
        the whole call is one step.
        """
        return [
            _copy(row)
            for row in self._batches.enqueue_atomic(items, batch_id, batch_row, finalizer_args)
        ]

    async def create_batch(
        self,
        batch_id: UUID,
        queue: str,
        expected_size: int,
        failure_threshold: int | None,
        finalizer_job_id: UUID | None,
        originating_actor: str | None,
        *,
        connection: Connection = None,
    ) -> None:
        """Insert an ``active`` batch row; ``ValueError`` if the id exists."""
        self._batches.create(
            batch_id, queue, expected_size, failure_threshold, finalizer_job_id, originating_actor
        )

    async def increment_batch_failures(
        self, batch_id: UUID, *, connection: Connection = None
    ) -> tuple[int, int | None, int]:
        """``(consecutive_failures, failure_threshold, non_terminal_children)`` after
        the increment; ``KeyError`` for an unknown or finished batch."""
        return self._batches.add_failures(batch_id, 1)

    async def add_batch_failures(self, batch_id: UUID, count: int) -> tuple[int, int | None, int]:
        """``count`` increments at once, stopping at the threshold
        (``SupportsBatchFailureCount``); ``KeyError`` for an unknown or finished batch."""
        check_failure_count(count)
        return self._batches.add_failures(batch_id, count)

    async def reset_batch_failures(self, batch_id: UUID, *, connection: Connection = None) -> int:
        """Reset an active batch's failure streak short of its threshold; 1 when it
        did, else 0."""
        return self._batches.reset_failures(batch_id)

    async def abort_batch(self, batch_id: UUID, *, connection: Connection = None) -> int:
        """Abort an active batch; returns how many waiting children were cancelled."""
        return self._batches.abort(batch_id)

    async def complete_batch(self, batch_id: UUID, *, connection: Connection = None) -> None:
        """Complete an active batch (aborted, when its last children's failures reached
        its threshold) and release its finalizer; a no-op otherwise, and for one whose
        failure streak reached its threshold (abort_batch ends that one)."""
        self._batches.complete(batch_id)

    async def get_batch(self, batch_id: UUID) -> BatchRow | None:
        """One batch row, or None."""
        found = self._batches.get(batch_id)
        return None if found is None else _copy(found)

    async def list_batches(self, filter: BatchFilter) -> list[tuple[BatchRow, BatchCounts]]:
        """Batches with their children's counts, newest first."""
        return [(_copy(row), counts) for row, counts in self._batches.list(filter)]

    async def count_batch_non_terminal(
        self, batch_id: UUID, *, connection: Connection = None
    ) -> int:
        """Children of the batch (finalizer excluded) not yet terminal."""
        return self._batches.count_non_terminal(batch_id)

    async def batch_has_active_children(self, batch_id: UUID) -> bool:
        """Whether a child of the batch (finalizer excluded) is still to run
        (``SupportsBatchChildCheck``)."""
        return self._batches.count_non_terminal(batch_id) > 0

    async def complete_stale_batches(self) -> int:
        """Complete every active batch with no active child, none ended within
        ``stale_batch_grace``, and release its finalizer (``SupportsStaleBatchSweep``);
        returns the batches completed."""
        return self._batches.complete_stale(self.stale_batch_grace)

    async def prune_old_batches(self, cutoff: datetime) -> int:
        """Delete batches completed before ``cutoff`` (a naive one taken as UTC) with no
        children left."""
        return self._batches.prune(_utc(cutoff))


class _MemoryLeaderElector:
    """``LeaderElector`` over :attr:`InMemoryBackend.leader`."""

    def __init__(self, backend: InMemoryBackend, worker_id: UUID) -> None:
        self._backend = backend
        self._worker_id = worker_id

    async def try_acquire(self) -> bool:
        if self._backend.leader is None:
            self._backend.leader = self._worker_id
        return self._backend.leader == self._worker_id

    async def release(self) -> None:
        if self._backend.leader == self._worker_id:
            self._backend.leader = None


# Fail at import, not at the first misbehaving call, if this module and core's
# protocol disagree about the contract (see the history in _protocol.py).
check_protocol_version(InMemoryBackend)
