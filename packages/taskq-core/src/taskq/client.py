"""``JobsClient``: what producers and operators call (``tq.client``)."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Final, TypeVar
from uuid import UUID

import structlog
from pydantic import BaseModel

from taskq.actor import Actor
from taskq.args_builder import (
    ActorRef,
    ArgsBuilder,
    BatchItem,
    MaxPendingLimits,
    check_capacity,
    one_per_key,
)
from taskq.backend import Backend, Connection, SupportsPrune
from taskq.backend.statemachine import TERMINAL_STATUSES, JobStatus
from taskq.batch_outcomes import apply_batch_child_ends
from taskq.errors import (
    ConfigurationError,
    JobFailedError,
    MaxPendingExceededError,
    ResultExpiredError,
)
from taskq.models import (
    AttemptRow,
    BatchChildEnd,
    BatchCounts,
    BatchFilter,
    BatchRow,
    BulkCancelResult,
    EnqueueArgs,
    EventRow,
    JobFilter,
    JobRow,
    ScheduleCreateArgs,
    ScheduleRecord,
    ScheduleUpdateArgs,
    check_key_text,
)

__all__ = ["ActorRef", "JobsClient"]

_ArgsModel = TypeVar("_ArgsModel", bound=BaseModel)

_log = structlog.get_logger("taskq.client")

_WAIT_RETRY_FIRST: Final = 0.1
_WAIT_RETRY_MOST: Final = 5.0
"""Seconds ``wait_for_result`` waits before reading again after a transient failure:
the first, doubling up to the most."""


class _CapacityCache:
    """:class:`~taskq.args_builder.MaxPendingLimits` read from the backend.

    A backend that lacks ``get_actor_max_pending`` altogether is a protocol
    mismatch, not a hiccup: that fails loudly, since enforcing the code literals
    forever in silence would hide it. So does a read the backend refused with a
    ``ConfigurationError`` (not open, an unmigrated schema, a missing right).
    """

    def __init__(self, backend: Backend, ttl: float) -> None:
        self._backend = backend
        self._known = MaxPendingLimits(ttl)
        self.cached = self._known.cached

    async def limits(self) -> Mapping[str, int | None]:
        limits = self._known.cached()
        if limits is not None:
            return limits
        if not callable(getattr(self._backend, "get_actor_max_pending", None)):
            raise TypeError(
                f"{type(self._backend).__qualname__} lacks get_actor_max_pending (backend "
                f"protocol v3); upgrade the backend so max_pending is enforced fleet-wide"
            )
        try:
            read: Mapping[str, int | None] | Exception = await self._backend.get_actor_max_pending()
        except ConfigurationError:
            # No hiccup: a backend not open, a schema or a right missing, which the error
            # says how to fix (failed open, the limits went unchecked for good), as
            # SyncJobsClient judges it.
            raise
        except Exception as exc:  # noqa: BLE001 - fails open, logged by update()
            read = exc
        return self._known.update(read)


_SLOT_OWNED: Final = frozenset({"idempotency_key", "metadata", "job_id", "queue"})
"""Enqueue options a cron slot sets itself (``SlotJobBuilder``)."""


_SELECTING: Final = set(JobFilter.model_fields) - {"order", "limit"}
"""The JobFilter fields that narrow a selection (its order and page size do not)."""
_SELECTS_ALL: Final = JobFilter().model_dump(include=_SELECTING)


def _job_filter(filters: JobFilter | None, fields: Mapping[str, Any]) -> JobFilter:
    """``filters``, or one made of ``fields``; both at once would leave one unused."""
    if filters is None:
        return JobFilter(**fields)
    if not isinstance(filters, JobFilter):
        # A dict or a name failed deep in the backend with AttributeError ('statuses').
        raise TypeError(
            f"filters is a JobFilter, not {type(filters).__name__}: pass JobFilter(...) "
            f"or its fields as keywords (actor=..., status=...)"
        )
    if fields:
        raise TypeError(
            f"give a JobFilter or filter keywords, not both (got a JobFilter and "
            f"{', '.join(sorted(fields))}): put every condition in the JobFilter"
        )
    return filters


def _as_id(value: UUID | str, kind: str = "job") -> UUID:
    """A job (or schedule) id given as a UUID or as its text (from a URL, a command
    line): the in-memory backend found nothing by the text, Postgres found it."""
    if isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a {kind} id; {kind} ids are UUIDs") from None
    raise TypeError(f"a {kind} id is a UUID (or its text), not {type(value).__name__}")


def _reason(reason: str | None) -> str | None:
    """A cancel reason: text or None (stored with NULs and lone surrogates replaced)."""
    if reason is not None and not isinstance(reason, str):
        raise TypeError(f"a cancel reason is a string or None, not {type(reason).__name__}")
    return reason


def _as_model(model: type[_ArgsModel], value: _ArgsModel | Mapping[str, Any]) -> _ArgsModel:
    """``value`` as ``model``: an instance as it is, a mapping validated into one."""
    if isinstance(value, model):
        return value
    if isinstance(value, Mapping):
        return model.model_validate(value)
    raise TypeError(
        f"expected a {model.__name__} (or a dict of its fields), not {type(value).__name__}"
    )


class JobsClient:
    """Enqueue jobs and inspect, retry or wait for them.

    Built by :class:`taskq.TaskQ`; ``actors`` maps names to the actors this
    application knows, which is what payloads are validated against.
    """

    def __init__(
        self,
        backend: Backend,
        actors: Mapping[str, Actor[..., Any]],
        *,
        max_pending_cache_ttl: float = 5.0,
    ) -> None:
        self._backend = backend
        self._build = ArgsBuilder(actors)
        self._actors = actors
        self._capacity = _CapacityCache(backend, max_pending_cache_ttl)
        self.build_args = self._build.build
        """Validate a payload and merge the actor's defaults with per-call options
        (:meth:`~taskq.args_builder.ArgsBuilder.build`)."""

    # -- enqueue ---------------------------------------------------------------
    async def _check_capacity(self, counts: Mapping[str, int]) -> None:
        """Refuse when an actor's waiting jobs plus ``counts[actor]`` would pass ``max_pending``."""
        # Fresh limits without a coroutine of their own: this runs on every enqueue.
        limits = self._capacity.cached()
        if limits is None:
            limits = await self._capacity.limits()
        bounded = self._build.bounded(counts, limits)
        if bounded:
            # Counted up to each limit: check_capacity needs no more to refuse.
            waiting = await self._backend.count_pending_jobs(sorted(bounded), up_to=bounded)
            check_capacity(counts, bounded, waiting)

    async def enqueue(self, actor: ActorRef, payload: Any, **options: Any) -> JobRow:
        """Enqueue one job; options as :meth:`build_args`. Returns the stored row
        (the existing one for a repeated ``idempotency_key``)."""
        args = self._build.args(actor, payload, options)
        # An actor without a limit (the usual one) skips the check's coroutine.
        limits = self._capacity.cached()
        if limits is None or self._build.limit(args.actor, limits) is not None:
            try:
                await self._check_capacity({args.actor: 1})
            except MaxPendingExceededError as refused:
                return await self._existing_or(args, refused)
        return await self._backend.enqueue(args)

    async def check_capacity(self, args_list: Sequence[EnqueueArgs]) -> None:
        """``MaxPendingExceededError`` when enqueueing these jobs would take an actor past
        its ``max_pending``, as :meth:`enqueue_batch` judges it (past the limit, a job
        whose idempotency key is stored inserts nothing and does not count): for jobs
        written another way (a worker's sub-jobs, in its success transaction)."""
        try:
            await self._check_capacity(Counter(args.actor for args in one_per_key(args_list)))
        except MaxPendingExceededError as refused:
            new = Counter(
                [a.actor for a in one_per_key(args_list) if await self._existing(a) is None]
            )
            try:
                await self._check_capacity(new)
            except MaxPendingExceededError:
                raise refused from None

    async def _existing_or(self, args: EnqueueArgs, refused: MaxPendingExceededError) -> JobRow:
        """Past ``max_pending``, an idempotent retry gets the committed job of its key
        back (a producer retrying under backpressure: nothing is inserted); else
        ``refused`` is raised."""
        existing = await self._existing(args)
        if existing is None:
            raise refused
        return existing

    async def _existing(self, args: EnqueueArgs) -> JobRow | None:
        """The stored job of ``args``'s idempotency key, if it has one and it exists."""
        if args.idempotency_key is None:
            return None
        found = await self._backend.list_jobs(
            JobFilter(actor=args.actor, idempotency_key=args.idempotency_key, limit=1)
        )
        # Checked again: a backend that does not know the filter would list any job.
        if found and found[0].idempotency_key == args.idempotency_key:
            return found[0]
        return None

    async def enqueue_with_conn(
        self, conn: Connection, actor: ActorRef, payload: Any, **options: Any
    ) -> JobRow:
        """Enqueue inside the caller's own transaction (asyncpg connection on Postgres):
        the job exists if and only if that transaction commits. ``max_pending`` counts
        committed jobs: the ones this transaction has not committed yet are not seen."""
        if conn is None:  # on every backend: the in-memory one has no use for it
            raise TypeError("enqueue_with_conn needs the caller's connection; use enqueue")
        args = self._build.args(actor, payload, options)
        try:
            await self._check_capacity({args.actor: 1})
        except MaxPendingExceededError as refused:
            return await self._existing_or(args, refused)
        return await self._backend.enqueue_with_conn(conn, args)

    async def enqueue_batch(
        self, items: Iterable[BatchItem], *, connection: Connection = None
    ) -> list[JobRow]:
        """Enqueue many jobs atomically (all or none); one row per item, in order.
        Every payload is validated before anything is written. Of one priority on a
        strict FIFO queue, the jobs are dispatched in the order given."""
        listed = list(items)
        try:
            await self._check_capacity(self._build.counts(listed))
        except MaxPendingExceededError as refused:
            # Past max_pending, the items whose keys are stored insert nothing (a producer
            # retrying its batch under backpressure): only the others count.
            args_list = list(self._build.each(listed))
            new = Counter(
                [a.actor for a in one_per_key(args_list) if await self._existing(a) is None]
            )
            try:
                await self._check_capacity(new)
            except MaxPendingExceededError:
                raise refused from None
            return await self._backend.enqueue_batch(args_list, connection=connection)
        return await self._backend.enqueue_batch(
            list(self._build.each(listed)), connection=connection
        )

    async def enqueue_batch_fast(
        self, items: Iterable[BatchItem], *, connection: Connection = None
    ) -> int:
        """Bulk enqueue (COPY on Postgres): the fastest path, without idempotency
        handling or returned rows. Returns the count inserted. Payloads are validated
        as the rows are written (on Postgres, while the server takes the rows sent
        before); an invalid one fails the call and nothing is written. Dispatched in
        the order given, as :meth:`enqueue_batch`'s."""
        listed = list(items)
        await self._check_capacity(self._build.counts(listed))
        return await self._backend.enqueue_batch_fast(
            self._build.each(listed), connection=connection
        )

    # -- reads and admin -----------------------------------------------------------
    async def get(self, job_id: UUID | str) -> JobRow | None:
        """One job, or None."""
        return await self._backend.get(_as_id(job_id))

    async def list_jobs(self, filters: JobFilter | None = None, **fields: Any) -> list[JobRow]:
        """Jobs matching a :class:`JobFilter` (or its fields as keywords), one page."""
        return await self._backend.list_jobs(_job_filter(filters, fields))

    async def get_batch(self, batch_id: UUID | str) -> BatchRow | None:
        """One tracked batch (enqueued with a failure policy or a finalizer), or None."""
        return await self._backend.get_batch(_as_id(batch_id, "batch"))

    async def list_batches(
        self, filters: BatchFilter | None = None, **fields: Any
    ) -> list[tuple[BatchRow, BatchCounts]]:
        """Tracked batches a :class:`BatchFilter` (or its fields as keywords) selects,
        newest first, each with its children's counts."""
        if filters is None:
            filters = BatchFilter(**fields)
        elif not isinstance(filters, BatchFilter):
            raise TypeError(
                f"filters is a BatchFilter, not {type(filters).__name__}: pass "
                f"BatchFilter(...) or its fields as keywords (queue=..., active=...)"
            )
        elif fields:
            raise TypeError(
                f"give a BatchFilter or filter keywords, not both (got a BatchFilter and "
                f"{', '.join(sorted(fields))}): put every condition in the BatchFilter"
            )
        return await self._backend.list_batches(filters)

    async def get_attempts(self, job_id: UUID | str) -> list[AttemptRow]:
        """Every attempt of a job, oldest first."""
        return await self._backend.get_attempts(_as_id(job_id))

    async def get_events(self, job_id: UUID | str) -> list[EventRow]:
        """The job's audit trail, oldest first."""
        return await self._backend.get_events(_as_id(job_id))

    async def retry(self, job_id: UUID | str) -> bool:
        """Run a failed, crashed, cancelled or abandoned job again. False otherwise;
        ``SingletonCollisionError`` for a singleton whose identity another active job
        holds (retry it once that one has ended); ``RetryRefusedError`` for a job past
        its ``schedule_to_close`` deadline (it would fail at once: enqueue it anew)."""
        return await self._backend.retry_job(_as_id(job_id))

    async def cancel(self, job_id: UUID | str, *, reason: str | None = None) -> bool:
        """Cancel a job: a pending or scheduled one ends ``cancelled`` at once; a running
        one gets a cancel request its actor sees as ``ctx.cancel_event``. False when the
        job is already finished or unknown.

        True for a running job means the request is recorded, not that the job will end
        ``cancelled``: an actor that returns before its worker sees the request (the
        worker reads requests each heartbeat), or without looking at
        ``ctx.cancel_event``, or whose outcome is already being written, ends as it
        returned (its work is done); a retry or snooze requested after it ends
        ``cancelled``. Read the job (or wait for it) for how it ended.

        A child of a tracked batch cancelled at once counts for its batch before this
        returns: the batch completes when no other child is left to run."""
        ends: list[BatchChildEnd] = []
        requested = await self._backend.write_cancel_request(
            _as_id(job_id), _reason(reason), batch_ends=ends
        )
        await apply_batch_child_ends(self._backend, ends)
        return requested

    async def cancel_where(
        self, filters: JobFilter | None = None, *, reason: str | None = None, **fields: Any
    ) -> BulkCancelResult:
        """:meth:`cancel` every job a filter selects.

        With neither a filter nor a keyword it refuses (``TypeError``): one call
        would cancel every job in the schema. Pass ``JobFilter()`` to mean every job.
        A filter with a ``limit`` is refused (``ValueError``): the call cancels every
        job the filter selects, however many.
        The batch children cancelled at once count for their batches, as at
        :meth:`cancel`.
        """
        selected = _job_filter(filters, fields)
        # Keywords that select nothing (queue=None: an unset variable) count as none.
        if filters is None and selected.model_dump(include=_SELECTING) == _SELECTS_ALL:
            raise TypeError(
                "cancel_where() needs a filter: without one it would cancel every job. "
                "Select jobs (cancel_where(actor=..., queue=..., status=...)), or pass "
                "JobFilter() to cancel every job"
            )
        if "limit" in selected.model_fields_set:
            # Ignored, cancel_where(JobFilter(status="pending", limit=10)) cancelled every
            # pending job, where ten were meant.
            raise ValueError(
                f"cancel_where() cancels every job the filter selects: its limit "
                f"({selected.limit}) would not apply. Leave the limit out, or cancel the "
                f"jobs list_jobs() returns one by one with cancel()"
            )
        ends: list[BatchChildEnd] = []
        result = await self._backend.cancel_where(selected, _reason(reason), batch_ends=ends)
        await apply_batch_child_ends(self._backend, ends)
        return result

    # -- schedules ---------------------------------------------------------------
    async def create_schedule(self, args: ScheduleCreateArgs | Mapping[str, Any]) -> ScheduleRecord:
        """Store a cron schedule the maintenance leader fires; its first ``next_fire_at``
        follows the backend's clock. The actor is given as an ``@actor`` function or its
        name. ``UnknownActorError`` for an actor this application does not know,
        ``ValueError`` when the name is taken. The payload and options are checked as
        each slot's job will be (``PayloadValidationError``, ``EnqueueOptionsError``)."""
        args = _as_model(ScheduleCreateArgs, args)
        self._check_slot_job(args.actor, args.payload, args.queue, args.options)
        return await self._backend.create_schedule(args)

    async def list_schedules(
        self, *, actor: ActorRef | None = None, enabled: bool | None = None
    ) -> list[ScheduleRecord]:
        """Schedules by name, optionally only one actor's (the ``@actor`` function or its
        name) or only (dis)abled ones."""
        if enabled is not None and not isinstance(enabled, bool):
            raise TypeError(f"enabled is True, False or None, not {enabled!r}")
        if isinstance(actor, Actor):
            actor = actor.name
        if actor is not None:
            if not isinstance(actor, str):
                raise TypeError(
                    f"actor is an @actor function or its name, not {type(actor).__name__}"
                )
            # Checked as a schedule's actor is: text no store can hold matches nothing.
            try:
                check_key_text(actor)
            except ValueError as exc:
                raise ValueError(f"actor {actor!r} {exc}") from None
        return await self._backend.list_schedules(actor=actor, enabled=enabled)

    async def update_schedule(
        self, schedule_id: UUID | str, args: ScheduleUpdateArgs | Mapping[str, Any]
    ) -> ScheduleRecord:
        """Change the fields of ``args`` that are set (``actor_queue=True``: back to the
        actor's own queue); ``next_fire_at`` is recomputed.
        ``KeyError`` for an unknown schedule; a new payload, queue or options are
        checked as in :meth:`create_schedule`."""
        schedule_id = _as_id(schedule_id, "schedule")
        args = _as_model(ScheduleUpdateArgs, args)
        changes = args.changes()
        if changes.keys() & {"payload", "queue", "options"}:
            current = next(
                (s for s in await self._backend.list_schedules() if s.id == schedule_id), None
            )
            if current is None:
                raise KeyError(f"no schedule with id {schedule_id}")
            if current.actor in self._actors:  # another application's actor: its own check
                self._check_slot_job(
                    current.actor,
                    changes.get("payload", current.payload),
                    changes.get("queue", current.queue),
                    changes.get("options", current.options),
                )
        return await self._backend.update_schedule(schedule_id, args)

    def _check_slot_job(
        self, actor: str, payload: Any, queue: str | None, options: Mapping[str, Any]
    ) -> None:
        """What the cron loop will build for each slot, built once now: a bad stored
        payload or option would otherwise skip every slot, with only a log line."""
        owned = _SLOT_OWNED & options.keys()
        if owned:
            raise ValueError(
                f"schedule options cannot set {', '.join(sorted(owned))}: each slot sets its "
                f"own (give the schedule's queue= for a queue)"
            )
        self._build.args(actor, payload, {**options, "queue": queue})

    async def delete_schedule(self, schedule_id: UUID | str) -> None:
        """Remove a schedule; ``KeyError`` for an unknown one."""
        await self._backend.delete_schedule(_as_id(schedule_id, "schedule"))

    async def wait_for_result(
        self,
        job_id: UUID | str,
        timeout: timedelta | float | None = 30.0,  # noqa: ASYNC109 - the public API takes a timeout
    ) -> Any:
        """Wait until the job is terminal and return its result (``timeout=None``: for as
        long as it takes).

        Raises :class:`JobFailedError` (with the row) when it ended in any
        status but ``succeeded``, :class:`ResultExpiredError` when it succeeded but its
        result outlived ``result_ttl`` (the backend's clock decides), ``TimeoutError``
        after ``timeout``, ``KeyError`` for an unknown job, ``ValueError`` for a
        negative or NaN ``timeout`` and ``TypeError`` for one that is no number of
        seconds nor a ``timedelta`` (a string was read as seconds). A read that fails
        transiently (the database restarting) is tried again within ``timeout``, logged
        ``taskq.wait-for-result-retry``; any other error is raised at once.
        """
        limit: float | None
        if timeout is None:
            limit = None
        elif isinstance(timeout, timedelta):
            limit = timeout.total_seconds()
        elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
            limit = float(timeout)
        else:
            raise TypeError(
                f"wait_for_result timeout takes seconds (a number), a timedelta or None, "
                f"not {type(timeout).__name__}"
            )
        if limit is not None and (math.isnan(limit) or limit < 0):
            raise ValueError(
                f"wait_for_result timeout must be a number of seconds, 0 or more, not {limit}"
            )
        job_id = _as_id(job_id)
        # Here, not at the top: `import taskq` stays without the worker runtime.
        from taskq.worker._transient import transient_cause

        pause, retry_in = 0.01, _WAIT_RETRY_FIRST / 2
        row: JobRow | None = None
        read = expired = False
        failed: BaseException | None = None
        try:
            # The first read too is within the limit: outside it, a stalled database (a
            # black-holed network, a pool none of whose connections came back) held the
            # call past its timeout, for good without a command_timeout. Only timeout=0
            # ("is it done?") takes its one read unbounded, on every backend.
            async with asyncio.timeout(limit or None) as budget:
                while True:
                    try:
                        got = await self._backend.get(job_id)
                        # Within the limit and its retries too: the clock's read is the
                        # database's as well (a stall there held a finished job's
                        # answer past the timeout, a blip there was raised).
                        gone = await self._result_expired(got)
                        row, read, expired, failed = got, True, gone, None
                    except Exception as exc:
                        if limit == 0 or transient_cause(exc) is None:
                            raise
                        # A blip (a restart, a failover) is waited out within the limit,
                        # as the reclaims feed does: the wait is on the job, and one
                        # failed read ended a wait of minutes (timeout=None: for good).
                        # Slower each time: many waiters through an outage log little.
                        failed, retry_in = exc, min(retry_in * 2, _WAIT_RETRY_MOST)
                        _log.warning(
                            "taskq.wait-for-result-retry",
                            job_id=str(job_id),
                            error=repr(exc),
                            retry_in=retry_in,
                        )
                        await asyncio.sleep(retry_in)
                        continue
                    if limit == 0 or row is None or row.status in TERMINAL_STATUSES:
                        break
                    retry_in = _WAIT_RETRY_FIRST / 2
                    await asyncio.sleep(pause)
                    pause = min(pause * 1.5, 0.5)
        except TimeoutError:
            if not budget.expired():
                raise
        if failed is not None or not read or (row is not None and not row.is_terminal):
            assert limit is not None  # without one, only a terminal row or none ends the loop
            if failed is not None:
                state = f"its last read failed: {failed!r}"
            elif row is not None:
                state = f"it is {row.status.value}"
            else:
                state = (
                    "its status could not be read in that time: give a longer timeout, or "
                    "check that the database is reachable"
                )
            raise TimeoutError(f"job {job_id} did not finish within {limit:g} s ({state})")
        if row is None:
            # Said as `taskq jobs show` says it: a finished job's id stops being found.
            raise KeyError(
                f"no job {job_id}: unknown, or finished and moved to the archive once its "
                f"status's retention (TASKQ_PRUNE_RETENTION_<STATUS>) passed; read results "
                f"within it"
            )
        if row.status is not JobStatus.SUCCEEDED:
            raise JobFailedError(row)
        if expired:
            raise ResultExpiredError(row)
        return row.result

    async def _result_expired(self, row: JobRow | None) -> bool:
        """Whether ``row`` succeeded with a result past its ``result_expires_at``. Past it
        the sweep clears the result whenever it runs: the answer must not depend on
        whether it ran yet. The backend's clock is the arbiter (without
        SupportsPrune.now, what the row holds is the answer)."""
        if row is None or row.status is not JobStatus.SUCCEEDED:
            return False
        expires, backend = row.result_expires_at, self._backend
        return (
            expires is not None
            and isinstance(backend, SupportsPrune)
            and expires <= await backend.now()
        )
