"""The data carriers that cross the Backend protocol and the public API.

All models are pydantic v2 and immutable (``frozen``). Times are
timezone-aware UTC datetimes produced by the backend's own clock; durations
are ``timedelta`` and are turned into absolute times by the backend, never
by the caller (one arbiter per predicate).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime, timedelta
from typing import Annotated, Any, Final, Literal, NamedTuple, Self, TypeAlias, TypeVar
from uuid import UUID, uuid4

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from taskq.backend.statemachine import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    CancelPhase,
    JobStatus,
)

__all__ = [
    "FREE_OUTCOMES",
    "INT32_MAX",
    "INT32_MIN",
    "MAX_DURATION",
    "RANDOM_CRON_FIELD",
    "UNRUN_OUTCOMES",
    "UNTIMED_OUTCOMES",
    "ActorConfig",
    "AttemptOutcome",
    "AttemptRow",
    "BatchChildEnd",
    "BatchCounts",
    "BatchFilter",
    "BatchRow",
    "BatchStatus",
    "BulkCancelResult",
    "CancelFlag",
    "EnqueueArgs",
    "EnqueueItem",
    "ErrorInfo",
    "EventKind",
    "EventRow",
    "JobFilter",
    "JobId",
    "JobRow",
    "JobStatus",
    "QueueConfig",
    "QueueMode",
    "ScheduleCreateArgs",
    "ScheduleRecord",
    "ScheduleUpdateArgs",
    "SuccessWrite",
    "check_key_text",
    "check_name",
    "check_names",
    "from_valid_values",
    "registered_over",
]

JobId: TypeAlias = UUID
"""A job's identity."""

AttemptOutcome: TypeAlias = Literal[
    "succeeded",
    "failed",
    "snoozed",
    "retry_after",
    "rate_limit_denied",
    "reservation_denied",
    "cancelled",
    "abandoned",
    "crashed",
    "interrupted",
    "unstarted",
    "unknown_actor",
]
"""What happened to one execution attempt (``job_attempts.outcome``). ``interrupted``:
its code was stopped by a stopping worker and handed back; ``unstarted``: locked by a
worker and handed back before its code began (prefetched when the worker stopped, a
dispatch the worker never heard of, let go by the lease fence); ``unknown_actor``:
handed back unrun by a worker that does not have the job's actor (a rolling deploy);
none of the three uses an attempt."""

FREE_OUTCOMES: Final[frozenset[str]] = frozenset(
    {
        "snoozed",
        "rate_limit_denied",
        "reservation_denied",
        "interrupted",
        "unstarted",
        "unknown_actor",
    }
)
"""The outcomes that do not use an attempt: the job runs again with ``max_attempts``
raised by one, so its ``attempt`` number grows without bringing it nearer its end."""

UNRUN_OUTCOMES: Final[frozenset[str]] = frozenset({"unstarted", "unknown_actor"})
"""The outcomes of an attempt whose code never ran: the job was locked, then given
back. Its times span that hold, not a run, so it has no duration."""

UNTIMED_OUTCOMES: Final[frozenset[str]] = UNRUN_OUTCOMES | {"crashed"}
"""The outcomes with no known duration: the unrun ones, and ``crashed`` (when its worker
stopped is not known; its ``finished_at`` is when the reclaim found the lease lapsed,
a lease or more later)."""

EventKind: TypeAlias = Literal[
    "state_change",
    "reclaimed",
    "cancel_requested",
    "cancel_escalated",
    "late_outcome",
]
"""``job_events.kind``. ``reclaimed`` rows are the crash-reclaim outbox that
``poll_reclaim_events`` reads. A ``late_outcome`` row is what an attempt came to after
it stopped being its worker's (a reclaim took the job while the worker, frozen or cut
off, still ran it): its ``detail`` names the attempt, the worker and the outcome, which
changed nothing else (the job may have run again meanwhile)."""

QueueMode: TypeAlias = Literal["strict_fifo", "round_robin"]
BatchStatus: TypeAlias = Literal["active", "complete", "aborted"]

JsonDict: TypeAlias = dict[str, Any]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


_M = TypeVar("_M", bound=_Model)
_ALL_FIELDS: dict[type[BaseModel], set[str]] = {}
_SET: Final = object.__setattr__


def from_valid_values(cls: type[_M], values: dict[str, Any]) -> _M:
    """An instance of ``cls`` holding ``values`` as they are, without validation.

    For hot paths whose values already are what validation would produce:
    typed database columns, or the fields of a model validated before
    (validating a job row costs about as much as the rest of its decoding).
    ``values`` must name every field, and becomes the instance's own: do not
    reuse it. Anything else goes through the constructor.
    """
    fields = _ALL_FIELDS.get(cls)
    if fields is None:
        if cls.__private_attributes__:
            raise TypeError(f"{cls.__name__} has private attributes: build it validated")
        fields = _ALL_FIELDS[cls] = set(cls.model_fields)
    if len(values) != len(fields):  # a count: the hot paths pass literal key sets
        raise TypeError(
            f"{cls.__name__} needs exactly its fields: missing {sorted(fields - values.keys())}, "
            f"unknown {sorted(values.keys() - fields)}"
        )
    instance = cls.__new__(cls)
    # What pydantic's own model_construct sets, without its per-field loop. The
    # fields-set is shared: frozen models never change it (model_copy copies it).
    _SET(instance, "__dict__", values)
    _SET(instance, "__pydantic_fields_set__", fields)
    _SET(instance, "__pydantic_extra__", None)
    _SET(instance, "__pydantic_private__", None)
    return instance


def _actor_as_name(value: object) -> object:
    """An ``@actor`` function as its name, as enqueue takes one: a model's actor field
    refused it with pydantic's "Input should be a valid string"."""
    from taskq.actor import Actor  # taskq.actor imports this module

    return value.name if isinstance(value, Actor) else value


def refuse_a_flag(value: object, expected: str = "must be a whole number") -> object:
    """``value``, unless it is ``True`` or ``False``: pydantic's lax numbers read those as
    1 and 0 (``JobFilter(limit=True)`` listed one job, ``concurrency=True`` ran one at a
    time). Refused with a ``ValueError`` saying ``expected``, the one error pydantic
    turns into a validation error."""
    if isinstance(value, bool):
        raise ValueError(f"{expected}, not {value!r}")  # noqa: TRY004
    return value


_Count: TypeAlias = Annotated[int, BeforeValidator(refuse_a_flag)]
"""A whole number a caller gives (a page size, a cap): ``True`` and ``False`` are
refused, not read as 1 and 0."""


class ErrorInfo(_Model):
    """An error recorded on a job or an attempt."""

    error_class: str
    message: str
    traceback: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException, *, traceback: str | None = None) -> ErrorInfo:
        """Describe ``exc`` (qualified class name and message). An exception whose own
        ``__str__`` raises is described as the traceback module does: its error was
        lost, and the attempt failed for good as an outcome that could not be recorded."""
        kind = type(exc)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        try:
            message = str(exc)
        except Exception as failed:  # noqa: BLE001 - the user's __str__, whatever it raises
            message = f"<exception str() failed: {type(failed).__qualname__}>"
        return cls(error_class=name, message=message, traceback=traceback)


DEADLINE_EXCEEDED: Final = ErrorInfo(
    error_class="DeadlineExceeded", message="the job's schedule_to_close deadline passed"
)
"""The error of a job failed because its ``schedule_to_close`` deadline passed, whoever
noticed (the deadline sweep, a retry past it, the worker running it)."""


INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
"""Bounds of the integers a job stores (priority, attempts): Postgres ``integer``."""

MAX_DURATION: Final = timedelta(days=36_500)
"""The longest delay, deadline, timeout or result TTL: a century."""

MAX_NAME_BYTES: Final = 256
"""The longest actor, queue or schedule name, in UTF-8 bytes."""
MAX_KEY_BYTES: Final = 1000
"""The longest idempotency, identity or fairness key, in UTF-8 bytes. With two names
they fit one Postgres index entry (at most 2,704 bytes): a longer one could not be
indexed, and a job delayed past the check would stop every scheduled job's promotion."""


def _at_most_bytes(value: str, limit: int) -> str:
    size = len(value.encode())
    if size > limit:
        raise ValueError(f"must be at most {limit} bytes of UTF-8, got {size}")
    return value


class EnqueueArgs(_Model):
    """Everything a backend needs to insert one job.

    Relative times (``delay``, ``schedule_to_close``, ``result_ttl``) are
    resolved against the backend's clock at insert.
    """

    id: JobId = Field(default_factory=uuid4)
    actor: str = Field(min_length=1)
    queue: str = Field(default="default", min_length=1)
    payload: JsonDict = Field(default_factory=dict)
    priority: int = Field(default=0, ge=INT32_MIN, le=INT32_MAX)
    delay: timedelta | None = None
    """Run no earlier than this long after enqueue (the job starts ``scheduled``)."""
    max_attempts: int = Field(default=3, ge=1, le=INT32_MAX)
    idempotency_key: str | None = None
    """Enqueueing the same (actor, key) again returns the existing job instead."""
    identity_key: str | None = None
    """At most one job per (actor, identity_key) runs at a time."""
    singleton: bool = False
    """With ``identity_key``: refuse (SingletonCollisionError) while an active job has the key."""
    fairness_key: str | None = None
    """Round-robin queues interleave jobs by this key (e.g. a tenant id)."""
    schedule_to_close: timedelta | None = None
    """Whole-job deadline measured from enqueue; past it the job fails."""
    timeout: timedelta | None = None
    """Per-attempt execution limit, enforced by the worker."""
    result_ttl: timedelta | None = None
    metadata: JsonDict = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    trace_id: str | None = None
    span_id: str | None = None

    @field_validator("idempotency_key", "identity_key", "fairness_key", "trace_id", "span_id")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        # Stored text cannot hold NUL; unlike in a payload, replacing it could make two
        # keys one.
        return check_key_text(value)

    @field_validator("actor", "queue")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value)

    @field_validator("tags")
    @classmethod
    def _storable_tags(cls, value: list[str]) -> list[str]:
        # A NUL is stored as U+FFFD (as in a payload); a surrogate is refused, as JSON.
        for tag in value:
            _refuse_surrogates(tag)
        return value

    @field_validator("idempotency_key", "identity_key", "fairness_key")
    @classmethod
    def _short_key(cls, value: str | None) -> str | None:
        if value == "":
            # Most often an unset variable: every job given it would share one key.
            raise ValueError("must not be empty (None for no key)")
        return None if value is None else _at_most_bytes(value, MAX_KEY_BYTES)

    @field_validator("metadata")
    @classmethod
    def _batch_id_is_a_uuid(cls, value: dict[str, Any]) -> dict[str, Any]:
        batch_id = value.get("batch_id")
        if batch_id is not None:
            try:
                canonical = str(UUID(str(batch_id)))
            except ValueError:
                raise ValueError(
                    f"metadata['batch_id'] names the job's batch and must be a UUID, "
                    f"not {batch_id!r}"
                ) from None
            if canonical != batch_id:
                # Stored in one spelling: batch reads compare the text (an upper-case
                # or hyphen-less id was left out of its batch).
                return {**value, "batch_id": canonical}
        return value

    @field_validator("delay", "schedule_to_close", "timeout", "result_ttl")
    @classmethod
    def _non_negative(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < timedelta(0):
            raise ValueError("must not be negative")
        if value is not None and value > MAX_DURATION:
            # The times derived from it must stay readable (Python's datetime ends in 9999).
            raise ValueError(f"must be at most {MAX_DURATION.days} days")
        return value

    @field_validator("schedule_to_close", "timeout")
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError("must be positive (None: no limit)")
        return value


class EnqueueItem(_Model):
    """One item of ``JobsClient.enqueue_batch``: an actor (an ``@actor`` function or its
    name, kept as the name) and its payload."""

    actor: str
    payload: Any
    options: JsonDict = Field(default_factory=dict)
    """Per-item enqueue options (``priority``, ``delay``, ``idempotency_key``, …)."""

    @field_validator("actor", mode="before")
    @classmethod
    def _actor_name(cls, value: object) -> object:
        return _actor_as_name(value)


class JobRow(_Model):
    """A job as stored: the current snapshot (history lives in attempts and events)."""

    id: JobId
    actor: str
    queue: str
    status: JobStatus
    payload: JsonDict
    priority: int
    attempt: int
    max_attempts: int
    created_at: datetime
    scheduled_at: datetime
    started_at: datetime | None = None
    """When the current attempt was dispatched."""
    execution_started_at: datetime | None = None
    """Always None today: dispatch clears it and nothing writes it (docs/adr/0004); the
    worker tracks which of its jobs have started in memory."""
    finished_at: datetime | None = None
    locked_by_worker: UUID | None = None
    lock_expires_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    cancel_reason: str | None = None
    cancel_phase: CancelPhase = CancelPhase.NONE
    idempotency_key: str | None = None
    identity_key: str | None = None
    fairness_key: str | None = None
    deadline_at: datetime | None = None
    """The ``schedule_to_close`` deadline as an absolute time."""
    timeout: timedelta | None = None
    result: Any = None
    result_ttl: timedelta | None = None
    result_expires_at: datetime | None = None
    progress_seq: int = 0
    progress_state: JsonDict | None = None
    error: ErrorInfo | None = None
    metadata: JsonDict = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    trace_id: str | None = None
    span_id: str | None = None

    @property
    def is_terminal(self) -> bool:
        """Whether the job reached a terminal status."""
        return self.status in TERMINAL_STATUSES

    @property
    def batch_id(self) -> UUID | None:
        """The batch this job belongs to (``metadata.batch_id``), if any."""
        raw = self.metadata.get("batch_id")
        return UUID(str(raw)) if raw is not None else None


class AttemptRow(_Model):
    """One execution attempt of a job."""

    job_id: JobId
    attempt: int
    worker_id: UUID | None
    started_at: datetime | None
    """When the attempt was dispatched (locked for ``worker_id``)."""
    finished_at: datetime | None
    outcome: AttemptOutcome
    error: ErrorInfo | None = None

    @property
    def duration(self) -> timedelta | None:
        """Wall time the attempt ran, when both ends are known; None for one whose run
        time is not (``UNTIMED_OUTCOMES``: its code never ran, or its worker crashed)."""
        if self.started_at is None or self.finished_at is None:
            return None
        if self.outcome in UNTIMED_OUTCOMES:
            return None
        return self.finished_at - self.started_at


class EventRow(_Model):
    """An immutable audit record: a transition, a cancel request, a reclaim."""

    event_id: int
    job_id: JobId
    occurred_at: datetime
    kind: EventKind
    detail: JsonDict = Field(default_factory=dict)


class CancelFlag(_Model):
    """A running job of this worker that someone asked to cancel."""

    job_id: JobId
    cancel_phase: CancelPhase
    cancel_requested_at: datetime
    reason: str | None = None


class BulkCancelResult(_Model):
    """What ``cancel_where`` did."""

    cancelled: list[JobId] = Field(default_factory=list)
    """Pending/scheduled jobs moved to ``cancelled`` at once."""
    requested: list[JobId] = Field(default_factory=list)
    """Running jobs flagged for cooperative cancellation."""


class BatchChildEnd(NamedTuple):
    """A job tagged ``metadata.batch_id`` that a call ended outside its worker (a cancel,
    a sweep): what the caller needs to apply the end to the job's batch. Appended to the
    ``batch_ends`` list the backend's cancel and sweep methods take."""

    batch_tag: str
    """The job's ``metadata.batch_id``, as stored (not necessarily a batch's id)."""
    status: JobStatus
    """The terminal status the call wrote."""


class SuccessWrite(_Model):
    """One job's success for ``mark_succeeded_many``: what ``mark_succeeded`` takes."""

    job_id: JobId
    attempt: int | None = None
    """The attempt fence; None writes whatever attempt the caller holds."""
    result: Any = None
    progress_seq: int = 0
    progress_state: dict[str, Any] | None = None


def _as_status_tuple(value: object) -> tuple[JobStatus, ...]:
    items: Sequence[object]
    if isinstance(value, str | JobStatus):
        items = [value]
    elif isinstance(value, Sequence):
        items = value
    elif isinstance(value, AbstractSet):
        # TERMINAL_STATUSES and ACTIVE_STATUSES are sets: refused, they could not select
        # what they name.
        items = list(value)
    else:
        # pydantic turns only ValueError into a ValidationError
        raise ValueError(  # noqa: TRY004
            f"status must be a status, or a sequence or set of statuses, not {value!r}"
        )
    try:
        statuses = tuple(JobStatus(str(s)) for s in items)
    except ValueError:
        known = ", ".join(s.value for s in JobStatus)
        raise ValueError(f"unknown job status in {value!r}; known statuses: {known}") from None
    if isinstance(value, AbstractSet):  # in the statuses' own order: a repr that does not vary
        order = list(JobStatus)
        return tuple(sorted(statuses, key=order.index))
    return statuses


def check_key_text(value: str | None) -> str | None:
    """``value``, a name or key, if a store can hold it: names and keys are stored as
    given and matched exactly, so a NUL or a lone surrogate is a ``ValueError`` (a
    replacement could make two keys one)."""
    if value is None:
        return value
    if "\x00" in value:
        raise ValueError("must not contain NUL characters (\\x00)")
    return _refuse_surrogates(value)


def check_names(*names: str) -> None:
    """Each of ``names``, which a backend method takes bare (queues, actors, a host, a
    loop), if a store can hold it (:func:`check_key_text`); else a ``ValueError`` naming
    it. Postgres raised its driver's error where the in-memory backend stored the name,
    or matched nothing."""
    for name in names:
        try:
            check_key_text(name)
        except ValueError as exc:
            raise ValueError(f"{name!r} {exc}") from None


def check_name(value: str) -> str:
    """``value``, an actor's or a queue's name, if a job can have it: text a store can
    hold (:func:`check_key_text`) of at most :data:`MAX_NAME_BYTES`; else a
    ``ValueError``. Not empty: no job is on the queue ``""`` (``EnqueueArgs`` refuses
    it)."""
    if not value:
        raise ValueError("must not be empty")
    check_key_text(value)
    return _at_most_bytes(value, MAX_NAME_BYTES)


def _refuse_surrogates(value: str) -> str:
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"must be valid Unicode text: {value[exc.start]!r} at position {exc.start} "
                f"is a lone surrogate (undecodable bytes?), which cannot be stored"
            ) from None
    return value


class JobFilter(_Model):
    """Selects jobs for ``list_jobs`` and ``cancel_where``.

    ``status`` takes one status, or a sequence or set (``TERMINAL_STATUSES``); an empty one matches
    nothing. ``active=True`` selects the non-terminal statuses,
    ``active=False`` the terminal ones; it cannot be combined with
    ``status``. Results are ordered by ``(created_at, id)``; pass the last
    row to :meth:`after` to get the next page.
    """

    status: tuple[JobStatus, ...] | None = None
    active: bool | None = None
    actor: str | None = None
    queue: str | None = None
    identity_key: str | None = None
    idempotency_key: str | None = None
    batch_id: UUID | None = None
    tags: tuple[str, ...] = ()
    """Jobs carrying every one of these tags."""
    order: Literal["asc", "desc"] = "asc"
    cursor: tuple[AwareDatetime, UUID] | None = None
    """Keyset cursor: only rows strictly after this (created_at, id) in ``order``
    (a time with its zone: a naive one would mean UTC to one backend, nothing to another)."""
    limit: _Count = Field(default=100, ge=1, le=10_000)

    @field_validator("status", mode="before")
    @classmethod
    def _parse_status(cls, value: object) -> tuple[JobStatus, ...] | None:
        return None if value is None else _as_status_tuple(value)

    @field_validator("actor", mode="before")
    @classmethod
    def _actor_name(cls, value: object) -> object:
        return _actor_as_name(value)

    @field_validator("actor", "queue", "identity_key", "idempotency_key")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        # No stored name or key holds one (refused at enqueue): Postgres raised a driver
        # error, the in-memory backend matched nothing.
        return check_key_text(value)

    @field_validator("tags")
    @classmethod
    def _no_nul_in_tags(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for tag in value:
            if "\x00" in tag:
                raise ValueError(
                    "must not contain NUL characters (\\x00): a tag is stored with each NUL "
                    "replaced by U+FFFD; search for that"
                )
            _refuse_surrogates(tag)  # no tag holds one: refused at enqueue
        return value

    @model_validator(mode="after")
    def _status_xor_active(self) -> Self:
        if self.status is not None and self.active is not None:
            raise ValueError("JobFilter: give either status or active, not both")
        return self

    def statuses(self) -> frozenset[JobStatus] | None:
        """The statuses selected, or None for all."""
        if self.status is not None:
            return frozenset(self.status)
        if self.active is True:
            return ACTIVE_STATUSES
        if self.active is False:
            return TERMINAL_STATUSES
        return None

    def after(self, row: JobRow) -> JobFilter:
        """This filter, continuing after ``row`` (the last row of the previous page)."""
        return self.model_copy(update={"cursor": (row.created_at, row.id)})


class ActorConfig(_Model):
    """Fleet-wide settings of one actor, written by workers at start-up."""

    actor: str
    max_concurrent: int | None = Field(default=None, ge=1)
    max_pending: int | None = Field(default=None, ge=0)
    queue: str | None = Field(default=None, min_length=1)
    """The actor's queue: where a leader that lacks the actor puts its cron slots' jobs."""
    job_defaults: JsonDict | None = None
    """The options the actor declares for its jobs, as enqueue options (``priority``,
    ``max_attempts``, and ``timeout``, ``schedule_to_close``, ``result_ttl`` in
    seconds): what a leader that lacks the actor gives its cron slots' jobs; and
    ``identity_key_from_payload: true`` for an actor that computes its jobs' identity
    key, whose slots such a leader skips. None: not given (an older worker), the
    registered ones stay."""

    @field_validator("actor", "queue")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        # As @actor refuses them: Postgres raised a driver error, memory stored them.
        return check_key_text(value)


def registered_over(config: ActorConfig, earlier: ActorConfig | None) -> ActorConfig:
    """``config`` as ``register_actors`` stores it over the ``earlier`` registration of
    its actor: a queue or job defaults it leaves None keep the earlier ones (an older
    worker's registration does not erase them)."""
    if earlier is None:
        return config
    kept = {
        field: getattr(earlier, field)
        for field in ("queue", "job_defaults")
        if getattr(config, field) is None
    }
    return config.model_copy(update=kept) if kept else config


class QueueConfig(_Model):
    """Dispatch mode and fleet-wide cap of one queue."""

    queue: str
    mode: QueueMode = "strict_fifo"
    max_concurrent: _Count | None = Field(default=None, ge=1)

    @field_validator("queue")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        return check_key_text(value)


class BatchRow(_Model):
    """A tracked batch (created only with a failure policy or a finalizer)."""

    id: UUID
    queue: str
    status: BatchStatus = "active"
    expected_size: int = Field(ge=0)
    consecutive_failures: int = Field(default=0, ge=0)
    failure_threshold: int | None = Field(default=None, ge=1)
    """Aborted at this many consecutive child failures (None: never)."""
    finalizer_job_id: JobId | None = None
    originating_actor: str | None = None
    created_at: datetime | None = None
    completed_at: datetime | None = None
    """Set exactly when ``status`` is not ``active`` (the table's CHECK constraint)."""
    metadata: JsonDict = Field(default_factory=dict)

    @field_validator("queue", "originating_actor")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        # As a job's: Postgres raised a driver error, the in-memory backend stored it.
        return check_key_text(value)

    @model_validator(mode="after")
    def _completed_at_iff_finished(self) -> Self:
        # The in-memory backend stored a finished row without the time; Postgres
        # raised CheckViolationError (batches_completed_at_iff_done).
        if (self.status == "active") != (self.completed_at is None):
            raise ValueError(
                f"a batch with status {self.status!r} "
                + (
                    "takes no completed_at: only a complete or aborted batch has one"
                    if self.status == "active"
                    else "needs completed_at, the time it finished"
                )
            )
        return self


class BatchCounts(_Model):
    """Child-job counts of a batch (the finalizer excluded)."""

    total: int = 0
    by_status: dict[JobStatus, int] = Field(default_factory=dict)

    @property
    def non_terminal(self) -> int:
        """Children not yet finished."""
        return sum(n for s, n in self.by_status.items() if s in ACTIVE_STATUSES)


class BatchFilter(_Model):
    """Selects batches: only batch fields, never job fields."""

    queue: str | None = None
    active: bool | None = None
    """True: status ``active``; False: ``complete`` or ``aborted``."""
    batch_id: UUID | None = None
    limit: _Count = Field(default=100, ge=1, le=10_000)

    @field_validator("queue")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        # No batch's queue holds one (BatchRow refuses it): Postgres raised a driver
        # error, the in-memory backend matched nothing.
        return check_key_text(value)


_CRON_CHECK_ANCHORS: Final = (datetime(2000, 1, 1), datetime(2049, 1, 1))
"""Where an expression is tried from: together, croniter's years up to 2099."""
RANDOM_CRON_FIELD: Final = re.compile(r"^r(\(\d+-\d+\))?(/\d+)?$", re.ASCII | re.IGNORECASE)
"""A field croniter fills with a random value (``R``, ``R(0-29)``, ``R/15``): its own
pattern for one, which it matches against each whole field."""
_CRON_STEP_PART: Final = re.compile(r"^(?P<start>[^/]+)/(?P<step>\d+)$", re.ASCII)
"""One part of a cron field (between commas) with a step: ``*/15``, ``0-59/30``, ``5/10``."""
_CRON_FIELDS: Final = (
    ("minute", "minutes", "hour"),
    ("hour", "hours", "day"),
    ("day-of-month", "days", "month"),
    ("month", "months", "year"),
    ("day-of-week", "days", "week"),
    ("second", "seconds", "minute"),
    ("year", "years", None),
)
"""Each field of croniter's layout (its ``RANGES``, in order): its name, its unit, and
the period a step in it starts again at."""


def _check_cron_steps(value: str) -> None:
    """Refuse a step longer than its field's whole range, which matches only its start:
    croniter takes "*/61" in the minute field as minute 0 alone (an hourly schedule, not
    one every 61 minutes), "*/25" in the hour field as midnight, "*/32" as the 1st. A
    step equal to the range is kept: "*/60" is minute 0, which is every 60 minutes."""
    from croniter import croniter

    for (low, high), (name, unit, period), field in zip(
        croniter.RANGES, _CRON_FIELDS, value.split(), strict=False
    ):
        for part in field.split(","):
            found = _CRON_STEP_PART.match(part)
            if found is None or int(found["step"]) <= high - low + 1:
                continue
            start = found["start"]
            start = str(low) if start == "*" else start.split("-")[0]
            restart = f" (a step starts again at each {period})" if period else ""
            raise ValueError(
                f"cron expression {value!r}: the step of {part!r} in its {name} field is "
                f"more than the field's {high - low + 1} {unit} ({low}-{high}), so it would "
                f"match only {name} {start}, not every {found['step']} {unit}{restart}: "
                f"write {start} in its place if that is what you mean (no cron step can "
                f"say every {found['step']} {unit})"
            )


def _check_cron(value: str) -> str:
    from croniter import CroniterBadDateError, croniter

    if not croniter.is_valid(value):
        raise ValueError(
            f"invalid cron expression {value!r}: expected minute hour day-of-month month "
            f"day-of-week, e.g. '*/5 * * * *' (a 6th field gives seconds, a 7th the year)"
        )
    if any(RANDOM_CRON_FIELD.match(field) for field in value.split()):
        # croniter draws the value again at each computation of the next slot: "R 3 * * *"
        # fired at two or three random minutes of 03:00 each night, not at one.
        raise ValueError(
            f"cron expression {value!r} has a random field (R), which would be drawn again "
            f"after every fire and fire the schedule at random, several times a period: "
            f"write the value you want in its place"
        )
    _check_cron_steps(value)
    # From fixed instants (no clock): an expression such as "0 0 30 2 *" parses but
    # names no date, and would fail at every computation of its next slot. croniter
    # looks 50 years ahead, and takes years up to 2099: a year field past 2050 was
    # refused from 2000 alone.
    for anchor in _CRON_CHECK_ANCHORS:
        try:
            croniter(value, anchor).get_next(datetime)
        except (CroniterBadDateError, ValueError):
            continue
        return value
    raise ValueError(f"cron expression {value!r} never fires (no such date)")


_HOST_ZONES: Final = frozenset({"localtime", "posixrules", "factory"})
"""Zone names (case-folded) that ``ZoneInfo`` may find in a host's zone files but that
name no place: their meaning (the host's own zone, the tz compiler's default rules, a
placeholder) is whichever host reads them, and the leader, which fires the schedule,
changes host."""


def _check_timezone(value: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if value.casefold() in _HOST_ZONES:
        raise ValueError(
            f"timezone {value!r} means whatever the host reading it says, and the leader that "
            f"fires the schedule changes host: name an IANA zone (e.g. 'Europe/Paris') or 'UTC'"
        )
    try:
        ZoneInfo(value)
    # OSError: the lookup opens a file named by the value, so a region ('Europe', a
    # directory of zones) or a name past the file system's limit raised the OS's error.
    except (ZoneInfoNotFoundError, ValueError, OSError):
        from zoneinfo import available_timezones

        zones = available_timezones()
        # Zone names are case-sensitive: 'utc' or 'europe/paris' said only "unknown".
        same = sorted(
            zone
            for zone in zones
            if zone.casefold() == value.casefold() and zone.casefold() not in _HOST_ZONES
        )
        within = sorted(zone for zone in zones if zone.startswith(f"{value}/"))
        hint = (
            f"did you mean {same[0]!r}?"
            if same
            else f"{value!r} is a region: name one of its zones, e.g. {within[0]!r}"
            if within
            else "name an IANA zone (e.g. 'Europe/Paris') or 'UTC'"
        )
        raise ValueError(f"unknown timezone {value!r}: {hint}") from None
    return value


class ScheduleCreateArgs(_Model):
    """A new cron schedule; its actor is given as an ``@actor`` function or its name
    (kept as the name)."""

    name: str = Field(min_length=1)
    actor: str = Field(min_length=1)
    cron: str = Field(min_length=1)
    """Cron expression; a sixth field gives seconds (croniter syntax)."""
    payload: JsonDict = Field(default_factory=dict)
    queue: str | None = Field(default=None, min_length=1)
    """The fired jobs' queue; None: the actor's own (as it is when each slot fires)."""
    timezone: str = "UTC"
    enabled: bool = True
    options: JsonDict = Field(default_factory=dict)
    """Enqueue options for each fired job (priority, max_attempts, …)."""

    @field_validator("name")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        # Bounded too: Postgres indexes the name (unique), and one past an index entry's
        # size failed the insert with the driver's ProgramLimitExceededError.
        checked = check_key_text(value)
        return None if checked is None else _at_most_bytes(checked, MAX_NAME_BYTES)

    @field_validator("actor", mode="before")
    @classmethod
    def _actor_name(cls, value: object) -> object:
        return _actor_as_name(value)

    @field_validator("actor", "queue")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        # The rule each fired job's actor and queue meet at enqueue: a name no job can
        # have was stored, and every slot's fire failed on it.
        return None if value is None else check_name(value)

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        return _check_cron(value)

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, value: str) -> str:
        return _check_timezone(value)


class ScheduleUpdateArgs(_Model):
    """Changes to a schedule; fields left as None are kept. ``queue=None`` therefore
    keeps the queue: ``actor_queue=True`` is how a schedule goes back to its actor's
    own queue (the stored queue NULL). A backend applies :meth:`changes`."""

    cron: str | None = None
    payload: JsonDict | None = None
    queue: str | None = Field(default=None, min_length=1)
    timezone: str | None = None
    enabled: bool | None = None
    options: JsonDict | None = None
    actor_queue: bool = False
    """True: the fired jobs go to the actor's own queue again, as when each slot
    fires (``ScheduleRecord.queue`` None); not with ``queue``."""

    @model_validator(mode="after")
    def _queue_xor_actor_queue(self) -> Self:
        if self.actor_queue and self.queue is not None:
            raise ValueError("ScheduleUpdateArgs: give either queue or actor_queue=True, not both")
        return self

    def changes(self) -> dict[str, Any]:
        """The stored schedule's fields this update sets, by name: the fields given
        (not None), and ``queue: None`` for ``actor_queue``."""
        changes = self.model_dump(exclude_none=True, exclude={"actor_queue"})
        if self.actor_queue:
            changes["queue"] = None
        return changes

    @field_validator("queue")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value)

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str | None) -> str | None:
        return None if value is None else _check_cron(value)

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, value: str | None) -> str | None:
        return None if value is None else _check_timezone(value)


class ScheduleRecord(_Model):
    """A stored cron schedule."""

    id: UUID
    name: str
    actor: str
    cron: str
    payload: JsonDict
    queue: str | None
    """None: the actor's own queue."""
    timezone: str
    enabled: bool
    options: JsonDict = Field(default_factory=dict)
    next_fire_at: datetime | None
    last_fired_at: datetime | None = None
    created_at: datetime
    updated_at: datetime
