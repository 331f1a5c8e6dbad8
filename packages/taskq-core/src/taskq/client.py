"""``JobsClient``: what producers and operators call (``tq.client``)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Final
from uuid import UUID, SafeUUID, uuid4

import structlog

from taskq.actor import Actor
from taskq.backend import Backend, Connection
from taskq.backend.statemachine import TERMINAL_STATUSES, JobStatus
from taskq.errors import JobFailedError, MaxPendingExceededError, UnknownActorError
from taskq.models import (
    AttemptRow,
    BulkCancelResult,
    EnqueueArgs,
    EnqueueItem,
    EventRow,
    JobFilter,
    JobRow,
    ScheduleCreateArgs,
    ScheduleRecord,
    ScheduleUpdateArgs,
    from_valid_values,
)

__all__ = ["JobsClient"]

_log = structlog.get_logger("taskq.client")

ActorRef = Actor[..., Any] | str


_VERSION_4: Final = (0x4000 << 64) | (0x8000 << 48)
_NOT_VERSION_BITS: Final = ~((0xF000 << 64) | (0xC000 << 48))
# Looked up once: an enum member's attribute access alone costs a fresh id a fifth.
_NEW_UUID: Final = UUID.__new__
_SET_SLOT: Final = object.__setattr__
_UNKNOWN_SAFETY: Final = SafeUUID.unknown


def _fresh_id() -> UUID:
    """A random (version 4) UUID, as ``uuid4`` makes it but without the checks of
    ``UUID.__init__`` (a version 4 value is in range by construction)."""
    # As CPython's own UUID._from_int (3.14) does: set the two slots directly.
    fresh = _NEW_UUID(UUID)
    _SET_SLOT(fresh, "int", (int.from_bytes(os.urandom(16)) & _NOT_VERSION_BITS) | _VERSION_4)
    _SET_SLOT(fresh, "is_safe", _UNKNOWN_SAFETY)
    return fresh


def _fresh_ids(n: int) -> list[UUID]:
    """``n`` fresh ids, as :func:`_fresh_id` makes them, from one ``os.urandom`` call."""
    blob = os.urandom(16 * n)
    take, new, set_slot, unknown = int.from_bytes, _NEW_UUID, _SET_SLOT, _UNKNOWN_SAFETY
    ids: list[UUID] = []
    for i in range(0, 16 * n, 16):
        fresh = new(UUID)
        set_slot(fresh, "int", (take(blob[i : i + 16]) & _NOT_VERSION_BITS) | _VERSION_4)
        set_slot(fresh, "is_safe", unknown)
        ids.append(fresh)
    return ids


def _seconds(value: timedelta | float | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=value)


def _item_parts(
    item: EnqueueItem | tuple[ActorRef, Any],
) -> tuple[ActorRef, Any, Mapping[str, Any]]:
    """A batch item's actor, payload and options (none for an ``(actor, payload)`` pair)."""
    # The tuple test first: a model class's isinstance goes through ABCMeta.
    if isinstance(item, tuple) or not isinstance(item, EnqueueItem):
        ref, payload = item
        return ref, payload, _NO_OPTIONS
    return item.actor, item.payload, item.options


_NO_OPTIONS: Final[Mapping[str, Any]] = MappingProxyType({})


class _CapacityCache:
    """Fleet-wide ``max_pending`` limits, re-read from the backend every ``ttl`` seconds.

    Workers write each actor's limit to the backend at start-up, so the
    stored value wins over the decorator's literal; the literal applies to
    actors no worker has registered yet. Reading the limits fails open (a
    backend hiccup must not stop producers) except when the backend lacks
    ``get_actor_max_pending`` altogether: that is a protocol mismatch, and
    enforcing code literals forever in silence would hide it.
    """

    def __init__(self, backend: Backend, ttl: float) -> None:
        self._backend = backend
        self._ttl = ttl
        self._limits: dict[str, int | None] = {}
        self._read_at: float | None = None

    def cached(self) -> Mapping[str, int | None] | None:
        """The limits if read less than ``ttl`` ago, else None (await :meth:`limits`)."""
        if self._read_at is not None and time.monotonic() - self._read_at < self._ttl:
            return self._limits
        return None

    async def limits(self) -> Mapping[str, int | None]:
        now = time.monotonic()
        if self._read_at is not None and now - self._read_at < self._ttl:
            return self._limits
        if not callable(getattr(self._backend, "get_actor_max_pending", None)):
            raise TypeError(
                f"{type(self._backend).__qualname__} lacks get_actor_max_pending (backend "
                f"protocol v3); upgrade the backend so max_pending is enforced fleet-wide"
            )
        try:
            self._limits = dict(await self._backend.get_actor_max_pending())
        except Exception as exc:  # noqa: BLE001 - fail open, loudly
            _log.warning("taskq.max-pending-read-failed", error=repr(exc))
        self._read_at = now
        return self._limits


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
        self._actors = actors
        self._capacity = _CapacityCache(backend, max_pending_cache_ttl)
        self._defaults: dict[str, dict[str, Any]] = {}
        """Per actor without an identity key: the fields of its option-less args."""

    # -- enqueue ---------------------------------------------------------------
    def _actor(self, ref: ActorRef) -> Actor[..., Any]:
        name = ref if isinstance(ref, str) else ref.name
        found = self._actors.get(name)
        if found is None:
            known = ", ".join(sorted(self._actors)) or "none"
            raise UnknownActorError(
                f"unknown actor {name!r}; registered actors: {known}. "
                f"Pass it to TaskQ(actors=[...])"
            )
        return found

    def build_args(
        self,
        actor: ActorRef,
        payload: Any,
        *,
        delay: timedelta | float | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        identity_key: str | None = None,
        singleton: bool = False,
        fairness_key: str | None = None,
        schedule_to_close: timedelta | float | None = None,
        timeout: timedelta | float | None = None,
        result_ttl: timedelta | float | None = None,
        metadata: Mapping[str, Any] | None = None,
        tags: Iterable[str] = (),
        job_id: UUID | None = None,
    ) -> EnqueueArgs:
        """Validate a payload and merge the actor's defaults with per-call options."""
        target = self._actor(actor)
        opts = target.options
        value = target.validate_payload(payload)
        return EnqueueArgs(
            id=job_id or uuid4(),
            actor=target.name,
            queue=queue or opts.queue,
            payload=target.dump_payload(value),
            priority=opts.priority if priority is None else priority,
            delay=_seconds(delay),
            max_attempts=max_attempts or opts.max_attempts,
            idempotency_key=idempotency_key,
            identity_key=identity_key if identity_key is not None else target.identity_for(value),
            singleton=singleton,
            fairness_key=fairness_key,
            schedule_to_close=_seconds(schedule_to_close) or opts.schedule_to_close,
            timeout=_seconds(timeout) or opts.timeout,
            result_ttl=_seconds(result_ttl) or opts.result_ttl,
            metadata=dict(metadata or {}),
            tags=list(tags),
        )

    def _args(
        self, ref: ActorRef, payload: Any, options: Mapping[str, Any], job_id: UUID | None = None
    ) -> EnqueueArgs:
        """:meth:`build_args`, cheaper without options: then every field but the id and
        the payload is the actor's default, validated once and copied since.
        ``job_id`` (else a fresh one) unless the options name one."""
        if options:
            return self.build_args(ref, payload, **{"job_id": job_id, **options})
        target = self._actor(ref)
        defaults = self._defaults.get(target.name)
        if defaults is None or target.options.identity_key is not None:
            # The identity key follows the payload: no copy can stand for it.
            args = self.build_args(target, payload, job_id=job_id)
            if target.options.identity_key is None:
                self._defaults[target.name] = dict(args)
            return args
        # Nothing to validate again: the payload is the actor's own dump, the id a
        # fresh UUID. Fresh containers: no two jobs share a mutable value.
        return from_valid_values(
            EnqueueArgs,
            {
                **defaults,
                "id": job_id or _fresh_id(),
                "payload": target.dump_payload(payload),
                "metadata": {},
                "tags": [],
            },
        )

    async def _check_capacity(self, counts: Mapping[str, int]) -> None:
        """Refuse when an actor's waiting jobs plus ``counts[actor]`` would pass ``max_pending``."""
        # Fresh limits without a coroutine of their own: this runs on every enqueue.
        limits = self._capacity.cached()
        if limits is None:
            limits = await self._capacity.limits()
        bounded = {
            name: limit
            for name in counts
            if (limit := limits.get(name, self._actors[name].options.max_pending)) is not None
        }
        if not bounded:
            return
        waiting = await self._backend.count_pending_jobs(sorted(bounded))
        for name, limit in bounded.items():
            if waiting.get(name, 0) + counts[name] > limit:
                raise MaxPendingExceededError(
                    f"actor {name!r} already has {waiting.get(name, 0)} waiting jobs "
                    f"(max_pending={limit}); retry later or raise its max_pending"
                )

    async def enqueue(self, actor: ActorRef, payload: Any, **options: Any) -> JobRow:
        """Enqueue one job; options as :meth:`build_args`. Returns the stored row
        (the existing one for a repeated ``idempotency_key``)."""
        args = self._args(actor, payload, options)
        await self._check_capacity({args.actor: 1})
        return await self._backend.enqueue(args)

    async def enqueue_with_conn(
        self, conn: Connection, actor: ActorRef, payload: Any, **options: Any
    ) -> JobRow:
        """Enqueue inside the caller's own transaction (asyncpg connection on Postgres):
        the job exists if and only if that transaction commits."""
        args = self._args(actor, payload, options)
        await self._check_capacity({args.actor: 1})
        return await self._backend.enqueue_with_conn(conn, args)

    def _each_args(self, listed: list[EnqueueItem | tuple[ActorRef, Any]]) -> Iterator[EnqueueArgs]:
        """The args of each item, validated one by one as they are pulled."""
        for item, job_id in zip(listed, _fresh_ids(len(listed)), strict=True):
            ref, payload, options = _item_parts(item)
            yield self._args(ref, payload, options, job_id)

    async def _check_batch_capacity(self, listed: list[EnqueueItem | tuple[ActorRef, Any]]) -> None:
        counts: dict[str, int] = {}
        for item in listed:
            name = self._actor(_item_parts(item)[0]).name
            counts[name] = counts.get(name, 0) + 1
        await self._check_capacity(counts)

    async def enqueue_batch(
        self, items: Iterable[EnqueueItem | tuple[ActorRef, Any]], *, connection: Connection = None
    ) -> list[JobRow]:
        """Enqueue many jobs atomically (all or none); one row per item, in order.
        Every payload is validated before anything is written."""
        listed = list(items)
        await self._check_batch_capacity(listed)
        return await self._backend.enqueue_batch(
            list(self._each_args(listed)), connection=connection
        )

    async def enqueue_batch_fast(
        self, items: Iterable[EnqueueItem | tuple[ActorRef, Any]], *, connection: Connection = None
    ) -> int:
        """Bulk enqueue (COPY on Postgres): the fastest path, without idempotency
        handling or returned rows. Returns the count inserted. Payloads are validated
        as the rows are written (on Postgres, while the server takes the rows sent
        before); an invalid one fails the call and nothing is written."""
        listed = list(items)
        await self._check_batch_capacity(listed)
        return await self._backend.enqueue_batch_fast(
            self._each_args(listed), connection=connection
        )

    # -- reads and admin -----------------------------------------------------------
    async def get(self, job_id: UUID) -> JobRow | None:
        """One job, or None."""
        return await self._backend.get(job_id)

    async def list_jobs(self, filters: JobFilter | None = None, **fields: Any) -> list[JobRow]:
        """Jobs matching a :class:`JobFilter` (or its fields as keywords), one page."""
        return await self._backend.list_jobs(filters or JobFilter(**fields))

    async def get_attempts(self, job_id: UUID) -> list[AttemptRow]:
        """Every attempt of a job, oldest first."""
        return await self._backend.get_attempts(job_id)

    async def get_events(self, job_id: UUID) -> list[EventRow]:
        """The job's audit trail, oldest first."""
        return await self._backend.get_events(job_id)

    async def retry(self, job_id: UUID) -> bool:
        """Run a failed, crashed, cancelled or abandoned job again. False otherwise."""
        return await self._backend.retry_job(job_id)

    async def cancel(self, job_id: UUID, *, reason: str | None = None) -> bool:
        """Cancel a job: a pending or scheduled one ends ``cancelled`` at once; a running
        one gets a cancel request its actor sees as ``ctx.cancel_event``. False when the
        job is already finished or unknown."""
        return await self._backend.write_cancel_request(job_id, reason)

    async def cancel_where(
        self, filters: JobFilter | None = None, *, reason: str | None = None, **fields: Any
    ) -> BulkCancelResult:
        """:meth:`cancel` every job a filter selects (its ``limit`` is ignored)."""
        return await self._backend.cancel_where(filters or JobFilter(**fields), reason)

    # -- schedules ---------------------------------------------------------------
    async def create_schedule(self, args: ScheduleCreateArgs) -> ScheduleRecord:
        """Store a cron schedule the maintenance leader fires; its first ``next_fire_at``
        follows the backend's clock. ``UnknownActorError`` for an actor this
        application does not know, ``ValueError`` when the name is taken."""
        self._actor(args.actor)
        return await self._backend.create_schedule(args)

    async def list_schedules(
        self, *, actor: str | None = None, enabled: bool | None = None
    ) -> list[ScheduleRecord]:
        """Schedules by name, optionally only one actor's or only (dis)abled ones."""
        return await self._backend.list_schedules(actor=actor, enabled=enabled)

    async def update_schedule(self, schedule_id: UUID, args: ScheduleUpdateArgs) -> ScheduleRecord:
        """Change the fields of ``args`` that are set; ``next_fire_at`` is recomputed.
        ``KeyError`` for an unknown schedule."""
        return await self._backend.update_schedule(schedule_id, args)

    async def delete_schedule(self, schedule_id: UUID) -> None:
        """Remove a schedule; ``KeyError`` for an unknown one."""
        await self._backend.delete_schedule(schedule_id)

    async def wait_for_result(
        self,
        job_id: UUID,
        timeout: timedelta | float = 30.0,  # noqa: ASYNC109 - the public API takes a timeout
    ) -> Any:
        """Wait until the job is terminal and return its result.

        Raises :class:`JobFailedError` (with the row) when it ended in any
        status but ``succeeded``, ``TimeoutError`` after ``timeout``, and
        ``KeyError`` for an unknown job.
        """
        limit = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        pause = 0.01
        async with asyncio.timeout(limit):
            while True:
                row = await self._backend.get(job_id)
                if row is None:
                    raise KeyError(f"no job {job_id}")
                if row.status in TERMINAL_STATUSES:
                    if row.status is JobStatus.SUCCEEDED:
                        return row.result
                    raise JobFailedError(row)
                await asyncio.sleep(pause)
                pause = min(pause * 1.5, 0.5)
