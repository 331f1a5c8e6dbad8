"""The Backend protocol: TaskQ's single storage abstraction.

Everything the client, the worker and the maintenance leader do to jobs
goes through these methods. ``InMemoryBackend`` and ``PostgresBackend``
satisfy the protocol structurally (no inheritance), as can third-party
backends, and all of them pass the one conformance suite in
``taskq_testing.conformance``.

Rules every implementation keeps:

* **One arbiter per predicate.** No method takes a "now": a backend compares
  times against its own clock (Postgres: ``clock_timestamp()`` in the
  statement that owns the predicate; in-memory: the injected ``Clock``).
  Relative inputs (``delay``, ``lock_lease``, ``retry_delay``) are added to
  that clock by the backend.
* **Terminal writes own their row.** ``mark_*`` methods change a job only
  while it is ``running``, locked by the calling ``worker_id`` and, when
  ``attempt`` is given, still on that attempt (fencing against a paused
  worker whose job was reclaimed and re-dispatched). Otherwise they are
  no-ops and say so (``False``, ``"noop"``, or the unchanged row).
* **Every transition leaves history**: the attempt that ended gets a
  ``job_attempts`` row and the transition a ``job_events`` row, in the same
  atomic step as the status change.
* **Transitions are those of** :mod:`taskq.backend.statemachine`, driven
  only by the methods listed in ``TRANSITION_DRIVERS``.
* **Ends outside the worker are reported.** The methods that end jobs outside
  their worker (``write_cancel_request``, ``cancel_where``, ``deadline_sweep``,
  ``reclaim_expired_locks``, and ``SupportsUnstartedHandBack.hand_back_unstarted``
  for the jobs it ends instead of handing them back) take a keyword-only
  ``batch_ends`` list: when given, they append a :class:`~taskq.models.BatchChildEnd`
  (its ``metadata.batch_id`` tag, the status written) for every job they ended that
  carries the tag, so the
  caller applies each end to its batch (``taskq.batch_outcomes``) as the worker
  does after its own terminal writes. Jobs they did not end (a running job only
  flagged for cancel, one reclaimed back to ``pending``) are not reported.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Protocol, runtime_checkable
from uuid import UUID

from taskq.backend.statemachine import TERMINAL_STATUSES, JobStatus
from taskq.errors import ProtocolKeywordMissing, ProtocolVersionMismatch

if TYPE_CHECKING:
    from taskq.models import (
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
    )

__all__ = [
    "BACKEND_PROTOCOL_VERSION",
    "OPTIONAL_PROTOCOLS",
    "PROTOCOL_KEYWORDS",
    "PROTOCOL_MEMBERS",
    "Backend",
    "LeaderElector",
    "SupportsActorDispatch",
    "SupportsBatchChildCheck",
    "SupportsBatchFailureCount",
    "SupportsBatchedSuccess",
    "SupportsCredentialReload",
    "SupportsCron",
    "SupportsEnqueuePrecheck",
    "SupportsFleetStats",
    "SupportsHeldJobs",
    "SupportsLateOutcomes",
    "SupportsLeaderElection",
    "SupportsLeaseRenewal",
    "SupportsMaintenanceRuns",
    "SupportsMigrate",
    "SupportsPrune",
    "SupportsResultExpiry",
    "SupportsStaleBatchSweep",
    "SupportsStatementCancellations",
    "SupportsTransactions",
    "SupportsUnstartedHandBack",
    "SupportsWorkerCancelWake",
    "SupportsWorkerRegistry",
    "check_batch_size",
    "check_failure_count",
    "check_protocol_keywords",
    "check_protocol_version",
    "check_retention",
    "check_up_to",
    "missing_members",
]

BACKEND_PROTOCOL_VERSION: Final = 3
# Protocol history
# ----------------
# v1  The first protocol: enqueue, dispatch, heartbeat, terminal writes, sweeps.
# v2  Batches (enqueue_batch_atomic and the batch counters), schedules CRUD,
#     poll_reclaim_events with its visibility delay.
# v3  (unreleased; folds in every change since the last shipped release)
#     list_jobs with JobFilter.status widened to a sequence and the `active`
#     meta-filter; get_actor_max_pending required; mark_succeeded(_with_conn)
#     gained fallback_result_ttl; terminal writes gained the keyword-only
#     `attempt` fence; open/close, register_actors and configure_queue made
#     explicit so every state is reachable through the protocol;
#     reclaim_expired_locks gained the keyword-only `worker_silence`;
#     SupportsWorkerRegistry.register_worker gained the keyword-only `actors` (the
#     worker passes it, as it does `worker_silence`) and stranded_jobs reads it;
#     SupportsFleetStats.stranded_jobs returns dict[str, dict[str, int]] (actor ->
#     queue -> waiting jobs, was actor -> jobs) and judges the registered workers'
#     queues beside their actors; SupportsCron gained get_actor_job_defaults (and
#     ActorConfig its job_defaults), which the leader's cron loop reads;
#     increment_batch_failures and reset_batch_failures act on an active batch
#     only, and complete_batch leaves a batch whose streak reached its threshold
#     (the worker's batch hook relies on both); complete_stale_batches aborts a
#     batch whose streak reached its threshold, and leaves one created or whose
#     last child ended within the backend's grace to that hook;
#     increment_batch_failures's third value says whether a child is left (1 or
#     0), no longer how many (counting made a failing batch quadratic);
#     SupportsCron.fire_due_schedules skips the slots past their actor's registered
#     max_pending (a schedule of an actor no worker consumed piled up jobs unbounded);
#     cancel_where returns its ids (and writes its events) in the filter's order, and
#     poll_cancel_flags returns its flags oldest request first (each backend had its
#     own order);
#     write_cancel_request, cancel_where, deadline_sweep and reclaim_expired_locks
#     gained the keyword-only `batch_ends` (the batch children they end, reported so
#     that the client and the leader apply each end to its batch: a cancelled child
#     waited for the stale-batch sweep, and a child the deadline failed never counted
#     toward its batch's failure_threshold);
#     SupportsUnstartedHandBack.hand_back_unstarted gained the keyword-only
#     `batch_ends` (the children it ends failed or cancelled instead of handing them
#     back, which the worker then applies to their batches: a child failed so never
#     counted toward failure_threshold, a last one cancelled so left its batch active);
#     a backend declaring v3 without these `batch_ends` (written against a draft) is
#     refused at open and at a worker's start (PROTOCOL_KEYWORDS, since read from the
#     protocols: every keyword-only parameter, up_to, attempt, actors... too);
#     count_pending_jobs gained the keyword-only `up_to` (the client passes each
#     actor's max_pending, so that a refused enqueue no longer counts the whole backlog);
#     a limit below 0 is a ValueError (check_up_to).
#     update_schedule applies ScheduleUpdateArgs.changes(), which sets the queue back
#     to None (the actor's own) for the new actor_queue=True: the non-None fields alone
#     had no way to unset a schedule's queue.
#     reset_batch_failures leaves a streak that reached its threshold (0 rows): a
#     last child's success, its hook between another's failure and that one's abort,
#     reset it and completed the batch the policy aborts.
#     SupportsStaleBatchSweep.complete_stale_batches aborts a batch whose streak reached
#     its threshold also while children are left (and cancels the waiting ones): a lost
#     abort let them all run, the finalizer waiting for the last.
#     complete_batch (and complete_stale_batches) end a batch ``aborted`` when its
#     children's failures since its last success, in the order they ended, reached its
#     threshold: children failing at once, the first hook completed the batch before
#     the others' failures counted.
#     retry_job refuses a child of an aborted batch (RetryRefusedError): retried, the
#     stale-batch sweep cancelled it again, after retry_job had answered True.
#     SupportsLateOutcomes.record_late_outcome adds nothing when the job's history
#     has a late outcome of the same attempt, worker and outcome (a worker's retry
#     whose first try landed, its reply lost, was kept twice).
#     enqueue_batch_atomic ends a tracked batch whose children have all ended already
#     (their keys named ended jobs of the batch), as complete_batch does: it stayed
#     active, its finalizer parked.
#     enqueue_batch_atomic made again (the same batch row, finalizer and children)
#     returns what the first call stored: a retry after a lost reply raised "already
#     exists".
#     SupportsPrune.prune_terminal_jobs keeps a job whose result_expires_at has not
#     passed: a result_ttl longer than the status's retention lost its result early.
#     prune_old_batches keeps a batch whose finalizer is still a job: pruned while its
#     finalizer waited or ran, the finalizer ran against a batch that no longer existed.
#     mark_abandoned gained `worker_id` and the keyword-only `attempt` fence, as every
#     other terminal write: unguarded, a worker frozen after deciding to abandon its
#     attempt abandoned the job's next attempt, held by another worker, once that one's
#     cancel reached phase 2.
#     Additive (optional protocols, no bump): SupportsBatchedSuccess,
#     SupportsUnstartedHandBack, SupportsWorkerCancelWake, SupportsHeldJobs,
#     SupportsActorDispatch, SupportsLeaseRenewal, SupportsEnqueuePrecheck,
#     SupportsBatchChildCheck, SupportsLateOutcomes, SupportsBatchFailureCount
#     (add_batch_failures: the failures a sweep or a cancel ended in one batch, counted
#     in one call where they took one increment_batch_failures each),
#     SupportsMaintenanceRuns (the slot each slotted leader loop last ran, so that a
#     leader elected after a slot nobody ran runs it once at start).
#
# When to bump: "increment it whenever a change alters an existing protocol
# member's observable contract such that an implementation written against
# the previous version would silently misbehave — return wrong rows, ignore
# inputs — instead of failing loudly. Purely additive changes that an old
# implementation can ignore without producing incorrect behaviour (a new
# optional method with a default, a new carrier field old code simply never
# reads) do not require a bump."

Connection = Any
"""A driver connection owned by the caller (asyncpg for Postgres). Core never
imports a driver, so it stays opaque here."""


@runtime_checkable
class Backend(Protocol):
    """Storage for jobs, their history, schedules and batches."""

    BACKEND_PROTOCOL_VERSION: ClassVar[int]
    supports_transactional_simulation: ClassVar[bool]
    """True when sub-jobs enqueued by a running job must be buffered and
    flushed on success (in-memory); False when real transactions give that
    atomicity (Postgres)."""

    # -- lifecycle ---------------------------------------------------------
    async def open(self) -> None:
        """Connect (pools, listeners). Idempotent."""
        ...

    async def close(self) -> None:
        """Release every resource. Idempotent."""
        ...

    # -- configuration written by workers at start-up ----------------------
    async def register_actors(self, configs: list[ActorConfig]) -> None:
        """Upsert fleet-wide actor settings (``max_concurrent``, ``max_pending``)."""
        ...

    async def configure_queue(self, config: QueueConfig) -> None:
        """Upsert a queue's dispatch mode and fleet-wide cap."""
        ...

    # -- enqueue -----------------------------------------------------------
    async def enqueue(self, args: EnqueueArgs) -> JobRow:
        """Insert one job (``pending``, or ``scheduled`` with a delay) and wake workers.

        An existing (actor, idempotency_key) returns the existing row.
        ``singleton`` with an active job of the same identity raises
        ``SingletonCollisionError``.
        """
        ...

    async def enqueue_batch(
        self, args_list: list[EnqueueArgs], *, connection: Connection = None
    ) -> list[JobRow]:
        """Insert many jobs atomically; one row per item, in order (idempotent items
        return the existing row). One wake for the whole batch."""
        ...

    async def enqueue_batch_fast(
        self, args_list: Iterable[EnqueueArgs], *, connection: Connection = None
    ) -> int:
        """Bulk insert (COPY on Postgres); returns the inserted count. No
        idempotency handling and no rows returned: the fast path. ``args_list`` may
        be lazy (the client validates payloads as it is pulled): a backend may pull
        it while writing, and whatever pulling raises fails the call with nothing
        written."""
        ...

    async def enqueue_with_conn(self, conn: Connection, args: EnqueueArgs) -> JobRow:
        """``enqueue`` inside the caller's transaction; the job exists iff it commits."""
        ...

    # -- dispatch and heartbeat --------------------------------------------
    async def dispatch_batch(
        self, worker_id: UUID, queues: list[str], limit: int, lock_lease: timedelta
    ) -> list[JobRow]:
        """Lock up to ``limit`` due pending jobs of ``queues`` for ``worker_id``:
        ``pending -> running``, ``attempt += 1``, lease = clock + ``lock_lease``.

        Honours priority/FIFO or round-robin per queue mode, each actor's
        ``max_concurrent`` (with the documented over-count under concurrent
        producers), and identity serialization (one running job per
        (actor, identity_key)).
        """
        ...

    async def heartbeat_jobs(self, worker_id: UUID, lock_lease: timedelta) -> int:
        """Extend the lease of every job ``worker_id`` holds; returns how many."""
        ...

    async def extend_reservation_leases(self, worker_id: UUID, lock_lease: timedelta) -> int:
        """Extend the leases of reservation slots ``worker_id`` holds; returns how many."""
        ...

    async def record_progress(
        self,
        job_id: JobId,
        worker_id: UUID,
        progress_seq: int,
        progress_state: dict[str, Any] | None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """Store progress of a running job for its owner, only when ``progress_seq`` is
        higher than the stored one (a late write never rolls progress back)."""
        ...

    # -- terminal writes (ownership-guarded) --------------------------------
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
        """``running -> succeeded`` storing ``result``. Results expire after the job's
        ``result_ttl``, else ``fallback_result_ttl``, else never. False on no-op."""
        ...

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
        """``mark_succeeded`` inside the caller's transaction."""
        ...

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
        """Record a failed attempt. With ``retry_delay`` and attempts left, and the
        retry not past the deadline, the job goes back to ``scheduled`` (``pending``
        for a zero delay), or to ``cancelled`` when a cancel was requested; otherwise
        to ``failed``. Returns the row after the write (unchanged on a no-op)."""
        ...

    async def mark_cancelled(
        self,
        job_id: JobId,
        worker_id: UUID,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """``running -> cancelled`` (the actor honoured a cancel). False on no-op."""
        ...

    async def write_cancel_escalation(
        self,
        job_id: JobId,
        worker_id: UUID,
        phase: Literal[2],
        *,
        attempt: int | None = None,
    ) -> bool:
        """Cancel phase 1 -> 2 (forced) plus its event row, for the owner only."""
        ...

    async def mark_abandoned(
        self,
        job_id: JobId,
        worker_id: UUID,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """``running -> abandoned``, only while ``cancel_phase = 2``, for the owner (its
        heartbeat, once a forced cancel overran its grace) as every terminal write."""
        ...

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
        """Reschedule after ``delay`` without using an attempt (``max_attempts`` grows by
        one). ``failed`` when the new time would pass the deadline; ``cancelled`` (the
        job ends so) when a cancel was requested: a job with a cancel request is never
        put back in the queue."""
        ...

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
        """Retry after ``delay``. ``consume_budget=False`` (rate-limit denial) does not
        use an attempt. ``cancelled`` (the job ends so) when a cancel was requested."""
        ...

    # -- history -----------------------------------------------------------
    async def write_attempt(self, attempt: AttemptRow) -> None:
        """Insert or replace the record of one attempt (keyed by job and attempt number)."""
        ...

    async def get_attempts(self, job_id: JobId) -> list[AttemptRow]:
        """Attempts of a job, oldest first."""
        ...

    async def get_events(self, job_id: JobId) -> list[EventRow]:
        """Events of a job, oldest first."""
        ...

    async def poll_reclaim_events(
        self,
        after_id: int,
        limit: int = 100,
        *,
        visibility_delay: timedelta | None = None,
    ) -> list[EventRow]:
        """Crash-reclaim events with ``event_id > after_id`` that are older than the
        visibility delay (default: the backend's setting), in id order."""
        ...

    # -- cancellation ------------------------------------------------------
    async def write_cancel_request(
        self,
        job_id: JobId,
        reason: str | None,
        *,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> bool:
        """Cancel a job: pending/scheduled -> cancelled at once; running -> cancel
        phase 1 and a wake for its worker. False when the job is terminal or unknown.
        ``batch_ends``: a job of a batch cancelled at once is appended to it."""
        ...

    async def cancel_where(
        self,
        filter: JobFilter,
        reason: str | None,
        *,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> BulkCancelResult:
        """``write_cancel_request`` for every job the filter selects (ignoring its limit).

        The work is done in the order the filter asks for, as ``list_jobs`` would list
        the jobs: ``(created_at, id)`` ascending, or descending with ``order="desc"``.
        ``cancelled`` and ``requested`` each hold their ids in that order, and the
        jobs' events (``state_change``, ``cancel_requested``) get increasing event ids
        in it.
        ``batch_ends``: each job of a batch cancelled at once is appended to it."""
        ...

    async def poll_cancel_flags(self, worker_id: UUID) -> list[CancelFlag]:
        """Running jobs of ``worker_id`` with a cancel request, oldest request first:
        ordered by ``(cancel_requested_at, job_id)``, so the worker observes (and logs)
        the requests in the order they were made, the same on every backend."""
        ...

    # -- admin -------------------------------------------------------------
    async def retry_job(self, job_id: JobId) -> bool:
        """Put a failed/crashed/cancelled/abandoned job back to ``pending`` (with at
        least one attempt left). False for any other status; ``SingletonCollisionError``
        for a singleton whose identity another active job holds; ``RetryRefusedError``
        for a job whose ``schedule_to_close`` deadline has passed (on the backend's
        clock): it could only fail again at once, and for a child of an aborted batch:
        the stale-batch sweep cancels an aborted batch's waiting children."""
        ...

    # -- sweeps (the backend's clock is the arbiter) ------------------------
    async def scheduled_to_pending(self) -> int:
        """Promote due scheduled jobs; wakes workers when any moved."""
        ...

    async def deadline_sweep(self, *, batch_ends: list[BatchChildEnd] | None = None) -> int:
        """Fail pending/scheduled jobs whose ``schedule_to_close`` deadline passed;
        ``batch_ends``: each job of a batch failed is appended to it."""
        ...

    async def reclaim_expired_locks(
        self,
        cancel_grace: timedelta,
        cleanup_grace: timedelta,
        *,
        worker_silence: timedelta | None = None,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> int:
        """Reclaim running jobs whose lease expired: cancel requested -> ``cancelled``;
        attempts left and the deadline not passed -> ``pending``; else ``crashed``. Jobs
        with a cancel in progress get ``cancel_grace + cleanup_grace`` plus the backend's
        headroom first. Each reclaim writes a ``reclaimed`` outbox event and a ``crashed``
        attempt.

        With ``worker_silence`` (a backend with a worker registry), a job whose worker's
        row was touched within it is left: that worker is alive, and its lease lapsed
        only because another transaction held the job's row (or the table) past it.

        ``batch_ends``: each job of a batch reclaimed to ``cancelled`` or ``crashed`` is
        appended to it (one put back to ``pending`` has not ended)."""
        ...

    # -- reads -------------------------------------------------------------
    async def get(self, job_id: JobId) -> JobRow | None:
        """One job, or None."""
        ...

    async def list_jobs(self, filters: JobFilter) -> list[JobRow]:
        """Jobs matching the filter, ordered by (created_at, id), one page."""
        ...

    async def count_pending_jobs(
        self, actors: list[str], *, up_to: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """Waiting (pending + scheduled) jobs per actor, for every actor asked; for an
        actor in ``up_to`` the count stops there (``min(waiting, up_to[actor])``), so
        checking a limit does not count a backlog far past it. ``ValueError`` for a
        limit below 0 (:func:`check_up_to`)."""
        ...

    async def get_actor_max_pending(self) -> dict[str, int | None]:
        """Each configured actor's ``max_pending``."""
        ...

    async def count_active_jobs(self, queues: list[str]) -> int:
        """Non-terminal jobs in ``queues``."""
        ...

    # -- wake-ups ------------------------------------------------------------
    def subscribe_wake(self) -> AbstractAsyncContextManager[asyncio.Event]:
        """An event set whenever new work may be dispatchable."""
        ...

    def subscribe_cancel_wake(self) -> AbstractAsyncContextManager[asyncio.Event]:
        """An event set whenever a cancel request arrives for a running job."""
        ...

    # -- schedules -------------------------------------------------------------
    async def create_schedule(self, args: ScheduleCreateArgs) -> ScheduleRecord:
        """Store a schedule; its first ``next_fire_at`` comes from the backend's clock."""
        ...

    async def list_schedules(
        self, *, actor: str | None = None, enabled: bool | None = None
    ) -> list[ScheduleRecord]:
        """Schedules, by name."""
        ...

    async def update_schedule(self, schedule_id: UUID, args: ScheduleUpdateArgs) -> ScheduleRecord:
        """Change a schedule (``KeyError`` if unknown); recomputes ``next_fire_at``."""
        ...

    async def delete_schedule(self, schedule_id: UUID) -> None:
        """Remove a schedule (``KeyError`` if unknown)."""
        ...

    # -- batches ---------------------------------------------------------------
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
        """Children (tagged ``metadata.batch_id``), the batch row and the finalizer,
        all or nothing. The finalizer waits (``scheduled`` with no due time) until
        the batch completes or aborts; a finalizer without a batch row, which nothing
        would release, is refused with ``ValueError``. A tracked batch whose children
        have all ended already (their idempotency keys named ended jobs of this batch)
        is ended at once, as :meth:`complete_batch` ends it: no child's end is left to
        come and end it. The same call again (a retry after a lost reply: the same
        batch row, finalizer and children, each by its id or its idempotency key)
        returns the children the first call stored, as they are now; another call with
        the id of a stored batch is refused (``ValueError``: it already exists)."""
        ...

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
        """Insert an ``active`` batch row."""
        ...

    async def increment_batch_failures(
        self, batch_id: UUID, *, connection: Connection = None
    ) -> tuple[int, int | None, int]:
        """``consecutive_failures += 1`` of an active batch; returns (failures, threshold,
        children left: 1 when a child is still pending, scheduled or running, else 0).
        ``KeyError`` for an unknown or finished batch (its streak is over)."""
        ...

    async def reset_batch_failures(self, batch_id: UUID, *, connection: Connection = None) -> int:
        """``consecutive_failures = 0`` of an active batch; returns rows changed (0 for an
        unknown or finished batch, and for one whose streak reached its threshold: that
        one aborts, and a success whose hook came between the failure's and its abort
        must not undo it, or complete the batch)."""
        ...

    async def abort_batch(self, batch_id: UUID, *, connection: Connection = None) -> int:
        """Mark ``aborted``, cancel pending/scheduled children, release the finalizer;
        returns the children cancelled."""
        ...

    async def complete_batch(self, batch_id: UUID, *, connection: Connection = None) -> None:
        """Mark an active batch ``complete`` and release its finalizer; nothing for a
        finished batch, or for one whose failure streak reached its threshold
        (:meth:`abort_batch` ends that one). ``aborted`` instead when its children's
        failures since its last success, in the order they ended (``finished_at``),
        reached its threshold: the streak its children's hooks keep lags behind their
        ends (two last children failing at once each found no child left, and the first
        hook completed the batch before the other's failure counted)."""
        ...

    async def get_batch(self, batch_id: UUID) -> BatchRow | None:
        """One batch row, or None."""
        ...

    async def list_batches(self, filter: BatchFilter) -> list[tuple[BatchRow, BatchCounts]]:
        """Batches with their child counts, newest first."""
        ...

    async def count_batch_non_terminal(
        self, batch_id: UUID, *, connection: Connection = None
    ) -> int:
        """Children of the batch (finalizer excluded) not yet terminal."""
        ...

    async def prune_old_batches(self, cutoff: datetime) -> int:
        """Delete finished batches completed before ``cutoff`` with neither children
        nor their finalizer left in the jobs."""
        ...


@runtime_checkable
class SupportsActorDispatch(Protocol):
    """A backend that dispatches only the jobs of the actors a worker can run.

    Without it a worker locks the jobs of actors it does not know (those of a
    newer release during a rolling deploy, or of an actor since removed) and
    hands each back a few seconds later: a new actor's jobs wait while the
    workers that know it idle, and an orphan backlog cycles through the fleet
    for ever. With it those jobs stay ``pending``, untouched, for a worker that
    knows their actor.
    """

    async def dispatch_actors_batch(
        self,
        worker_id: UUID,
        queues: list[str],
        limit: int,
        lock_lease: timedelta,
        actors: Sequence[str],
    ) -> list[JobRow]:
        """:meth:`Backend.dispatch_batch` over the jobs whose actor is one of ``actors``
        only: the others' pending jobs take no place in the batch, its order or its
        fairness ranks, and stay as they are. Their running jobs count as any running
        job does: against their queue's ``max_concurrent``, and in their fairness
        cohort (whose ranks start after its running jobs, whatever their actor)."""
        ...


@runtime_checkable
class SupportsLeaseRenewal(Protocol):
    """A backend that says which leases a heartbeat renewed, and renews the others'
    without waiting for a job whose row another transaction holds.

    :meth:`Backend.heartbeat_jobs` renews every lock of a worker at once and says
    only how many: one row held by a long transaction (an operator's, a bulk
    cancel) stopped every renewal of that worker until it ended, and the reclaim
    sweep then took its other jobs, finished ones included, to run again.
    """

    async def renew_leases(self, worker_id: UUID, lock_lease: timedelta) -> list[JobId]:
        """Extend the lease of every running job ``worker_id`` holds that no other
        transaction holds at the moment, as ``heartbeat_jobs`` does; the ids renewed.
        A held one is left for the next call."""
        ...


@runtime_checkable
class SupportsStatementCancellations(Protocol):
    """A backend that names the errors by which its database cancels one statement on
    its own account (a ``statement_timeout``), among its transient errors.

    Transient for a statement of other values, they repeat at every try of one that
    carries too much (a result too large to write within the timeout). The worker
    stops retrying an outcome write that keeps failing with one of them while the
    job's lease is renewed between its tries, and fails the job with
    :class:`OutcomeNotRecorded` if that write lands (held up too, the outcome write is
    tried again): retried forever, the job stayed ``running`` and held its slot for the
    worker's life.
    Errors of reaching the database (a dead socket, a client-side timeout) must not
    be listed: a write stuck on a broken connection lands once it is replaced. Read
    only with :class:`SupportsLeaseRenewal`: a renewal count does not say which jobs
    were renewed.
    """

    statement_cancellations: ClassVar[tuple[type[BaseException], ...]]


@runtime_checkable
class SupportsEnqueuePrecheck(Protocol):
    """A backend that simulates transactions (``supports_transactional_simulation``)
    and can tell, before a job's success is written, whether the sub-jobs to be
    enqueued after it would be refused.

    Without it a refused sub-job (a singleton's identity held) was found only after
    the parent's success had been stored; with real transactions both roll back and
    the attempt fails. The worker calls this first, so the two agree.
    """

    async def precheck_enqueue(
        self, args_list: list[EnqueueArgs], *, finishing: JobId | None = None
    ) -> None:
        """Raise what ``enqueue_batch(args_list)`` would raise once the job ``finishing``
        (the parent whose success comes first) has ended; write nothing. A singleton
        re-enqueueing itself is no collision: on Postgres its success frees the
        identity before, in the same transaction, the sub-job is inserted."""
        ...


@runtime_checkable
class SupportsBatchedSuccess(Protocol):
    """A backend that records many successes in one step (the worker's completer).

    Each item is judged on its own exactly as :meth:`Backend.mark_succeeded`
    judges it (running, held by ``worker_id``, on ``item.attempt`` when given)
    and, when it acts, leaves the same attempt row and event. One item that
    is not the caller's does not stop the others.
    """

    async def mark_succeeded_many(
        self,
        worker_id: UUID,
        items: Sequence[SuccessWrite],
        fallback_result_ttl: timedelta | None = None,
    ) -> list[bool]:
        """``running -> succeeded`` for every item the caller owns; one flag per item,
        in order (False: a no-op). Items of one job are judged as if written one after
        another: a stale attempt's item is a no-op beside the current attempt's."""
        ...


@runtime_checkable
class SupportsUnstartedHandBack(Protocol):
    """A backend that hands back, in one step, the jobs a worker locked but never
    started (architecture.md, "Drain phase"; the worker's dispatches it never heard of).

    Each job is judged on its own exactly as :meth:`Backend.mark_snoozed` with no
    delay and outcome ``unstarted`` judges it (running, held by ``worker_id``, on
    the given attempt when not None), and, when it acts, ends the same way: pending
    again at once with its retry budget untouched (failed if its deadline passed,
    cancelled if a cancel was requested), one attempt row and one event. The attempt's
    outcome ``unstarted`` (the event's reason when it is put back) says its code never
    ran, so the history does not read as a run from dispatch to hand-back.
    """

    async def hand_back_unstarted(
        self,
        worker_id: UUID,
        jobs: Sequence[tuple[JobId, int | None]],
        *,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> int:
        """Hand back every ``(job id, attempt)`` the caller holds; how many moved.
        ``batch_ends``: each job of a batch it ended (``failed`` past its deadline,
        ``cancelled`` on a request) is appended to it, for the caller to apply to its
        batch (one put back to ``pending`` has not ended)."""
        ...


@runtime_checkable
class SupportsLateOutcomes(Protocol):
    """A backend that keeps, in a job's history, an outcome its worker could not write
    any more: the attempt it came from was reclaimed while it ran (the worker frozen or
    cut off), and the history said ``crashed`` of an attempt that in fact finished."""

    async def record_late_outcome(
        self, job_id: JobId, attempt: int, worker_id: UUID, outcome: str, error: ErrorInfo | None
    ) -> bool:
        """Add a ``late_outcome`` event (``detail``: attempt, worker_id, outcome and the
        error's class and message); nothing else changes. False for an unknown job.

        Idempotent: one the job's history already has for this attempt, worker and
        outcome is not added again (a retry whose first try landed, its reply lost)."""
        ...


@runtime_checkable
class SupportsHeldJobs(Protocol):
    """A backend that lists the jobs a worker holds, so that a worker can find the
    ones it never heard of: a dispatch that committed but whose reply was lost (the
    connection dropped) leaves jobs locked by a worker that does not know it has
    them, and its heartbeat, which renews every job it locks, would keep them
    ``running`` for as long as it lives."""

    async def held_jobs(self, worker_id: UUID) -> list[tuple[JobId, int]]:
        """``(job id, attempt)`` of every ``running`` job locked by ``worker_id``."""
        ...


@runtime_checkable
class SupportsWorkerCancelWake(Protocol):
    """A backend that wakes only the worker a cancel request concerns (architecture.md,
    "NOTIFY / Wake Mechanism": the per-worker channel), where
    :meth:`Backend.subscribe_cancel_wake` wakes every worker on any cancel request.
    """

    def subscribe_worker_cancel_wake(
        self, worker_id: UUID
    ) -> AbstractAsyncContextManager[asyncio.Event]:
        """An event set when a cancel request arrives for a running job ``worker_id``
        holds, not for other workers' jobs. Like every wake it is a hint to poll: it
        may also be set after a lost notification connection comes back."""
        ...


@runtime_checkable
class SupportsMigrate(Protocol):
    """A backend with schema migrations (``taskq-worker --migrate``)."""

    async def migrate(self) -> list[str]:
        """Apply pending migrations; returns the names applied. Run by a worker at
        start-up, so a destructive step old workers could still trip on may wait for
        an explicit migration command."""
        ...


@runtime_checkable
class SupportsCredentialReload(Protocol):
    """A backend that can pick up rotated credentials without a restart (SIGHUP)."""

    async def reload_credentials(self) -> None:
        """Replace connections so new ones authenticate with fresh credentials; raises,
        replacing nothing, when the fresh credentials cannot connect."""
        ...


@runtime_checkable
class SupportsTransactions(Protocol):
    """A backend whose ``*_with_conn`` methods can share one real transaction.

    The worker uses it to write a job's success and the sub-jobs it enqueued
    atomically: both happen, or neither does.
    """

    def transaction(self) -> AbstractAsyncContextManager[Connection]:
        """A connection inside a transaction; commits on a clean exit, rolls back on error."""
        ...


@runtime_checkable
class LeaderElector(Protocol):
    """One worker's candidacy for maintenance leader, from a backend that elects.

    At most one elector per schema leads at a time. Leadership is a lease the
    elector renews on each :meth:`try_acquire`: a leader that stops calling it
    (killed, frozen, partitioned) loses leadership within the lease, and only
    then can another elector acquire it.
    """

    async def try_acquire(self) -> bool:
        """Acquire leadership if it is free, or confirm (and renew) it if held.

        True while this elector leads. A False after a True means leadership
        was lost (the lease ran out, the connection died): the caller must stop
        leader-only work at once. Failures to reach the backend raise.
        """
        ...

    async def release(self) -> None:
        """Step down (idempotent); another elector may acquire at once. Also lets go
        of what the elector holds to try (Postgres: its session): call it when done
        with an elector, even one that never led."""
        ...


@runtime_checkable
class SupportsLeaderElection(Protocol):
    """A backend that can elect one maintenance leader among its workers.

    Without it a worker assumes it is alone and leads unconditionally.
    """

    def leader_elector(self, worker_id: UUID, *, lease: timedelta) -> LeaderElector:
        """A new elector for ``worker_id``; ``lease`` bounds how long a leader that
        stops renewing keeps leadership."""
        ...


ScheduleFire = Callable[["ScheduleRecord", datetime], "EnqueueArgs | None"]
"""Builds the job of one schedule slot (``None``: skip the slot, e.g. unknown actor)."""


@runtime_checkable
class SupportsCron(Protocol):
    """A backend that fires cron schedules (the leader's cron loop)."""

    async def fire_due_schedules(self, build: ScheduleFire, *, catch_up: timedelta) -> int:
        """Enqueue one job per due slot of every enabled schedule; returns the jobs
        enqueued.

        The backend's clock decides what is due. Slots older than ``catch_up``
        are skipped (``next_fire_at`` is recomputed from ``now - catch_up``).
        Each schedule's slots are enqueued and its ``next_fire_at`` advanced in
        one atomic step that also excludes concurrent callers, so no slot fires
        twice even when two leaders overlap.

        A slot that would take its actor past the ``max_pending`` registered for it
        (``register_actors``), beside its waiting (pending + scheduled) jobs counted
        in that step, is skipped: no job, the schedule advanced past it as past the
        others (never fired later), and a ``taskq.schedule-slot-skipped`` warning. Slots
        fill the room left in slot order.
        """
        ...

    async def get_actor_queues(self) -> dict[str, str]:
        """The queue of each actor registered with one (``register_actors``): where a
        slot of an actor the leader does not have goes, unless its schedule names one."""
        ...

    async def get_actor_job_defaults(self) -> dict[str, dict[str, Any]]:
        """The ``job_defaults`` of each actor registered with them (``register_actors``):
        the options a slot of an actor the leader does not have takes, under its
        schedule's own."""
        ...


@runtime_checkable
class SupportsPrune(Protocol):
    """A backend with a job archive: Sweep 5 (prune) and Sweep 6 (archive expiry)."""

    async def prune_terminal_jobs(
        self,
        retention: Mapping[str, timedelta],
        *,
        archive_retention: timedelta,
        batch_size: int = 10_000,
    ) -> int:
        """Move terminal jobs finished longer than their status's ``retention`` ago
        (statuses absent from the mapping are kept), and whose ``result_expires_at`` is
        None or has passed (a longer ``result_ttl`` wins), with their attempts into the
        archive, in atomic batches of ``batch_size``; their events are deleted.
        Archived rows expire ``archive_retention`` later. Returns the jobs moved."""
        ...

    async def expire_archive(self, *, batch_size: int = 10_000) -> int:
        """Delete archived jobs (and their attempts) past ``expire_at``; returns how many."""
        ...

    async def now(self) -> datetime:
        """The backend's clock, read now: the arbiter of its time predicates. The
        leader takes the batch rows' prune cutoff (``prune_old_batches``) from it,
        never from its host's clock."""
        ...


@runtime_checkable
class SupportsMaintenanceRuns(Protocol):
    """A backend that records the runs of the leader's slotted loops (prune, archive
    expiry: at a time of day, every period from there).

    Without it a leader elected just after a slot's time, when no leader ran it, waits
    for the next slot (a week for a weekly period); with it, the new leader finds that
    slot unrecorded and runs it once at start. Loops are named by the leader (e.g.
    ``"leader-prune"``); slots are instants the leader computes, not clock readings.
    """

    async def last_maintenance_run(self, loop: str) -> datetime | None:
        """The latest slot recorded for ``loop``; ``None`` when none is."""
        ...

    async def record_maintenance_run(self, loop: str, slot: datetime) -> bool:
        """Record ``slot`` as run for ``loop`` in one atomic step that only moves the
        record forward: ``False``, and nothing changed, when ``slot`` or a later one is
        already recorded (another leader ran it), else ``True``."""
        ...


def check_batch_size(batch_size: int) -> None:
    """The ``batch_size`` rule of :class:`SupportsPrune`'s methods: at least 1, else
    ``ValueError`` (zero would loop for ever: an empty batch is not "fewer than
    ``batch_size``", so the loop would never see its last batch)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")


def check_failure_count(count: int) -> None:
    """The ``count`` rule of :meth:`SupportsBatchFailureCount.add_batch_failures`: at
    least 1, else ``ValueError`` (no failure to count is no call to make)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")


def check_up_to(up_to: Mapping[str, int] | None) -> None:
    """The ``up_to`` rule of :meth:`Backend.count_pending_jobs`: no limit below 0, else
    ``ValueError`` naming the actors (a count stopped below zero is no count: one
    backend returned it, another failed with its driver's error)."""
    limits = up_to or {}
    negative = sorted(actor for actor, limit in limits.items() if limit < 0)
    if negative:
        given = ", ".join(f"{actor!r}: {limits[actor]}" for actor in negative)
        raise ValueError(f"count_pending_jobs' up_to must be at least 0 (max_pending), not {given}")


def check_retention(retention: Mapping[str, timedelta]) -> None:
    """The ``retention`` rule of :meth:`SupportsPrune.prune_terminal_jobs`: its keys are
    job status names, else ``ValueError`` naming them (a misspelt status would keep
    its jobs for ever)."""
    unknown = sorted(set(retention) - {status.value for status in JobStatus})
    if unknown:
        raise ValueError(
            f"unknown job status(es) {', '.join(map(repr, unknown))} in the prune retention; "
            f"the terminal statuses are {', '.join(sorted(s.value for s in TERMINAL_STATUSES))}"
        )


@runtime_checkable
class SupportsResultExpiry(Protocol):
    """A backend that drops stored results once they expire (a leader sweep)."""

    async def sweep_expired_results(self) -> int:
        """Clear ``result`` of every job whose ``result_expires_at`` has passed on the
        backend's clock (``result_expires_at`` is kept); returns the jobs cleared."""
        ...


@runtime_checkable
class SupportsStaleBatchSweep(Protocol):
    """A backend whose leader completes batches a lost terminal hook left active."""

    async def complete_stale_batches(self) -> int:
        """Mark every ``active`` batch with no non-terminal child ``complete`` (or
        ``aborted``, when its failure streak reached its threshold: the abort was lost)
        and release its finalizer, as :meth:`Backend.complete_batch` does for one
        batch; returns the batches ended. A batch created, or whose last child ended,
        within the backend's grace (``stale_batch_grace`` on TaskQ's backends) is left
        alone: the worker applies a child's end to its batch just after writing it.
        One whose streak reached its threshold is ``aborted`` at once, children left or
        not, and its waiting children cancelled, as :meth:`Backend.abort_batch` does:
        nothing else would end it before they had all run. One with no child left whose
        children's failures reached its threshold as :meth:`Backend.complete_batch`
        counts them is ``aborted`` too."""
        ...


@runtime_checkable
class SupportsBatchChildCheck(Protocol):
    """A backend that tells at once whether a batch has a child left to run: the worker
    asks after each child's end, and counting them all cost a large batch its size
    at every end (:meth:`Backend.count_batch_non_terminal`)."""

    async def batch_has_active_children(self, batch_id: UUID) -> bool:
        """Whether any child of the batch (its finalizer excluded) is pending, scheduled
        or running, as :meth:`Backend.count_batch_non_terminal` counts them: a batch of
        tags only (no batch row) too; False for a batch no job is tagged with."""
        ...


@runtime_checkable
class SupportsBatchFailureCount(Protocol):
    """A backend that counts several failed children of a batch in one call: a sweep or
    a cancel that ends many children of one batch (reported in ``batch_ends``) applied
    their failures one :meth:`Backend.increment_batch_failures` round trip each."""

    async def add_batch_failures(self, batch_id: UUID, count: int) -> tuple[int, int | None, int]:
        """What ``count`` calls of :meth:`Backend.increment_batch_failures` in a row leave,
        in one atomic step: ``consecutive_failures`` of an active batch grows by
        ``count``, but by no more than reaches its ``failure_threshold`` (by one when the
        streak already reached it), for those calls stop there (the batch aborts, and a
        finished batch's streak is over); returns (failures, threshold, children left: 1
        or 0) as that method does. ``KeyError`` for an unknown or finished batch,
        ``ValueError`` for a ``count`` below 1."""
        ...


@runtime_checkable
class SupportsFleetStats(Protocol):
    """A backend that reports queue depths and stranded jobs (leader sampling loops)."""

    async def queue_depths(self) -> dict[str, dict[str, int]]:
        """Per queue with any such job, how many jobs are ``pending``, ``scheduled``
        and ``running`` (all three keys present, zero when none)."""
        ...

    async def stranded_jobs(self) -> dict[str, dict[str, int]]:
        """Per actor and queue whose waiting jobs nothing will dispatch, how many of
        those jobs are ``pending`` or ``scheduled`` (actor -> queue -> jobs); pairs
        with none are omitted, and so are actors with no such pair.

        Jobs are stranded when their actor has no registered config (no
        ``actor_config`` row), or when workers are registered
        (:class:`SupportsWorkerRegistry`) and none of them both runs their actor (its
        ``actors``) and works their queue (its ``queues``). Configs outlive every
        release, so only the second rule sees an actor since removed or renamed, or a
        queue no live worker works (a misspelt ``queue=``). A worker registered
        without ``actors`` (an older release's) counts as running every actor, on
        its queues only; with no worker registered, only the first rule applies."""
        ...


@runtime_checkable
class SupportsWorkerRegistry(Protocol):
    """A backend that keeps a row per live worker (the ``workers`` table)."""

    async def register_worker(
        self,
        worker_id: UUID,
        hostname: str,
        pid: int,
        queues: list[str],
        *,
        actors: Sequence[str] | None = None,
    ) -> None:
        """Upsert the worker's row; ``started_at`` and ``last_seen_at`` are set to the
        backend's clock (on a re-registration too). ``actors``: the actors the worker
        runs, stored for :meth:`SupportsFleetStats.stranded_jobs` (None: not said, the
        worker counts as running every actor)."""
        ...

    async def touch_worker(self, worker_id: UUID) -> bool:
        """Set the worker's ``last_seen_at`` to the backend's clock; False when the row
        is gone (swept as stale, or never registered): the worker registers again."""
        ...

    async def deregister_worker(self, worker_id: UUID) -> None:
        """Delete the worker's row (no-op when it is gone)."""
        ...

    async def cleanup_stale_workers(self, older_than: timedelta) -> int:
        """Delete every worker row whose ``last_seen_at`` is more than ``older_than``
        before the backend's clock; returns how many were deleted."""
        ...


PROTOCOL_MEMBERS: Final[frozenset[str]] = frozenset(
    name for name in (*vars(Backend), *Backend.__annotations__) if not name.startswith("_")
)
"""Every attribute and method a backend must have (for diagnostics and meta-tests)."""


OPTIONAL_PROTOCOLS: Final[tuple[type, ...]] = (
    SupportsActorDispatch,
    SupportsBatchedSuccess,
    SupportsEnqueuePrecheck,
    SupportsUnstartedHandBack,
    SupportsHeldJobs,
    SupportsLateOutcomes,
    SupportsLeaseRenewal,
    SupportsWorkerCancelWake,
    SupportsLeaderElection,
    SupportsCron,
    SupportsPrune,
    SupportsMaintenanceRuns,
    SupportsResultExpiry,
    SupportsStaleBatchSweep,
    SupportsBatchChildCheck,
    SupportsBatchFailureCount,
    SupportsFleetStats,
    SupportsWorkerRegistry,
)
"""The optional protocols whose behaviour the conformance suite specifies (a backend
without one skips its tests). ``SupportsMigrate``, ``SupportsCredentialReload``,
``SupportsStatementCancellations`` and ``SupportsTransactions`` are left out: what they
do is the store's own business."""


def missing_members(obj: object) -> list[str]:
    """Protocol members ``obj`` lacks, sorted; empty when it satisfies ``Backend``.
    A backend that does not simulate transactions (``supports_transactional_simulation``
    False) must offer real ones: ``transaction`` (:class:`SupportsTransactions`)."""
    missing = [name for name in PROTOCOL_MEMBERS if not hasattr(obj, name)]
    simulates = getattr(obj, "supports_transactional_simulation", True)
    if simulates is False and not isinstance(obj, SupportsTransactions):
        missing.append("transaction (supports_transactional_simulation is False)")
    return sorted(missing)


def _keyword_only(protocols: tuple[type, ...]) -> dict[str, tuple[str, ...]]:
    """Each protocol method's keyword-only parameters, by method name (read from the
    protocols themselves: a keyword added to one is checked without a second list)."""
    table: dict[str, tuple[str, ...]] = {}
    for protocol in protocols:
        for name, member in vars(protocol).items():
            if name.startswith("_") or not inspect.isfunction(member):
                continue
            keywords = tuple(
                p.name
                for p in inspect.signature(member).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY
            )
            if keywords:
                table[name] = keywords
    return table


PROTOCOL_KEYWORDS: Final[Mapping[str, tuple[str, ...]]] = _keyword_only(
    (Backend, *OPTIONAL_PROTOCOLS)
)
"""Every keyword-only parameter of the protocol's methods, which core passes by name.
Protocol 3 gave several methods theirs after its first drafts, without a version bump
(it was unreleased): ``batch_ends``, ``up_to``, ``worker_silence``, ``attempt``,
``actors``. A backend written against a draft declares version 3 and lacks them
(:func:`check_protocol_keywords`)."""


def check_protocol_keywords(backend: object, *, distribution: str | None = None) -> None:
    """Raise :class:`ProtocolKeywordMissing` when a method of ``backend`` named in
    :data:`PROTOCOL_KEYWORDS` takes no keyword it lists (a method it lacks is
    :func:`missing_members`' business, or an optional protocol it does not offer).
    ``open_backend`` calls it, and a worker at its start: a backend given as an
    instance passes no loader."""
    missing: list[str] = []
    for name, keywords in PROTOCOL_KEYWORDS.items():
        method = getattr(backend, name, None)
        if method is None:
            continue
        try:
            parameters = inspect.signature(method).parameters
        except (TypeError, ValueError):  # a callable without a signature: the call tells
            continue
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            continue  # a wrapper passing **kwargs through
        takes = {
            n
            for n, p in parameters.items()
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        }
        missing += [f"{name}(*, {keyword})" for keyword in keywords if keyword not in takes]
    if missing:
        source = f" from {distribution}" if distribution else ""
        kind = type(backend)
        raise ProtocolKeywordMissing(
            f"{kind.__module__}.{kind.__qualname__}{source} declares backend protocol "
            f"{BACKEND_PROTOCOL_VERSION} but lacks its keyword-only {', '.join(sorted(missing))}: "
            f"TaskQ passes them by name (when a worker stops, in its leader's sweeps, in a "
            f"cancel, an enqueue past max_pending), where each such call fails with a "
            f"TypeError (a stopping worker's prefetched jobs stay locked until their leases "
            f"run out, the sweep stops there); upgrade the backend to a release written for "
            f"this taskq-core, or give those methods the keywords (docs/backend-contract.md)"
        )


def check_protocol_version(backend_type: type, *, distribution: str | None = None) -> None:
    """Raise :class:`ProtocolVersionMismatch` unless ``backend_type`` speaks this core's
    protocol version. Backends call it at import; ``open_backend`` again at open."""
    declared = getattr(backend_type, "BACKEND_PROTOCOL_VERSION", None)
    if declared != BACKEND_PROTOCOL_VERSION:
        source = f" from {distribution}" if distribution else ""
        raise ProtocolVersionMismatch(
            f"{backend_type.__module__}.{backend_type.__qualname__}{source} implements backend "
            f"protocol {declared}, but this taskq-core speaks protocol {BACKEND_PROTOCOL_VERSION}; "
            f"install versions of the two that match"
        )
