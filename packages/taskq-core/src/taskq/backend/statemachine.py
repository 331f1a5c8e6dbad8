"""The job state machine: the one home of statuses and transitions.

Every job is in exactly one of eight statuses. Three are *active* (the job
may still run): ``pending``, ``scheduled`` and ``running``. Five are
*terminal*: once a job reaches one of them it never changes again, except
through an explicit operator :func:`retry <taskq.backend.Backend.retry_job>`,
which is a new life for the job rather than a transition of the old one.

The Postgres enum ``{schema}.job_status`` mirrors :class:`JobStatus`; a
meta-test checks the two are equal after migrating.

``VALID_TRANSITIONS`` is authoritative for application code
(:func:`assert_valid_transition`). In SQL the ``WHERE status = 'from'``
predicate on every terminal write is the serialization gate: two writers
cannot both move a row out of ``running`` because only one UPDATE can match.
``TRANSITION_DRIVERS`` records which component is allowed to drive each
transition (architecture: "Which component drives each transition").

Cancellation phases (:class:`CancelPhase`) are a second, orthogonal axis on
a running job: NONE → COOPERATIVE (cancel requested, the actor's
``cancel_event`` is set) → FORCED (grace elapsed, the asyncio task is
cancelled). ``ABANDON_PENDING`` is an in-process sentinel only; storage
never holds it (``CHECK (cancel_phase BETWEEN 0 AND 2)``), and
:func:`parse_cancel_phase` refuses it when reading rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum, StrEnum
from types import MappingProxyType
from typing import Final

from taskq.errors import InvalidTransition

__all__ = [
    "ACTIVE_STATUSES",
    "TERMINAL_STATUSES",
    "TRANSITION_DRIVERS",
    "VALID_TRANSITIONS",
    "CancelPhase",
    "JobStatus",
    "assert_valid_transition",
    "is_valid_transition",
    "parse_cancel_phase",
    "parse_status",
    "to_mermaid",
]


class JobStatus(StrEnum):
    """The eight statuses of a job."""

    PENDING = "pending"
    """Queued and ready for dispatch."""
    SCHEDULED = "scheduled"
    """Deferred: ``scheduled_at`` is in the future (delay, snooze, retry backoff)."""
    RUNNING = "running"
    """Dispatched and held by a worker's lock lease."""
    SUCCEEDED = "succeeded"
    """The actor returned. Terminal."""
    FAILED = "failed"
    """Non-retryable error, retry budget exhausted, or deadline passed. Terminal."""
    CANCELLED = "cancelled"
    """Cancelled before or during execution. Terminal."""
    CRASHED = "crashed"
    """The worker died (lock expired) and no attempts were left. Terminal."""
    ABANDONED = "abandoned"
    """Forced cancellation did not finish within the cleanup grace. Terminal."""


_STATUS_BY_VALUE: Final[Mapping[str, JobStatus]] = MappingProxyType({s.value: s for s in JobStatus})

_S = JobStatus

VALID_TRANSITIONS: Final[Mapping[JobStatus, frozenset[JobStatus]]] = MappingProxyType(
    {
        _S.PENDING: frozenset({_S.RUNNING, _S.CANCELLED, _S.FAILED}),
        _S.SCHEDULED: frozenset({_S.PENDING, _S.CANCELLED, _S.FAILED}),
        # running -> pending is the crash-reclaim retry branch (Sweep 1); the
        # architecture uses it there without listing it among the transitions.
        _S.RUNNING: frozenset(
            {
                _S.SUCCEEDED,
                _S.FAILED,
                _S.CANCELLED,
                _S.CRASHED,
                _S.ABANDONED,
                _S.SCHEDULED,
                _S.PENDING,
            }
        ),
        _S.SUCCEEDED: frozenset(),
        _S.FAILED: frozenset(),
        _S.CANCELLED: frozenset(),
        _S.CRASHED: frozenset(),
        _S.ABANDONED: frozenset(),
    }
)
"""from-status -> the statuses it may move to. Terminal statuses map to nothing."""

TERMINAL_STATUSES: Final[frozenset[JobStatus]] = frozenset(
    s for s, targets in VALID_TRANSITIONS.items() if not targets
)
"""Statuses with no outgoing transition."""

ACTIVE_STATUSES: Final[frozenset[JobStatus]] = frozenset(JobStatus) - TERMINAL_STATUSES
"""Non-terminal statuses (``pending``, ``scheduled``, ``running``), derived from the
transitions so a new non-terminal status extends ``JobFilter(active=True)`` for free."""

TRANSITION_DRIVERS: Final[Mapping[tuple[JobStatus, JobStatus], tuple[str, ...]]] = MappingProxyType(
    {
        (_S.PENDING, _S.RUNNING): ("dispatch_batch",),
        (_S.SCHEDULED, _S.PENDING): ("scheduled_to_pending", "complete_batch", "abort_batch"),
        (_S.RUNNING, _S.SUCCEEDED): (
            "mark_succeeded",
            "mark_succeeded_with_conn",
            "mark_succeeded_many",
        ),
        (_S.RUNNING, _S.FAILED): (
            "mark_failed_or_retry",
            "mark_snoozed",
            "mark_retry_after",
            "hand_back_unstarted",
        ),
        (_S.RUNNING, _S.SCHEDULED): ("mark_failed_or_retry", "mark_snoozed", "mark_retry_after"),
        (_S.RUNNING, _S.CANCELLED): ("mark_cancelled", "reclaim_expired_locks"),
        (_S.RUNNING, _S.ABANDONED): ("mark_abandoned",),
        (_S.RUNNING, _S.CRASHED): ("reclaim_expired_locks",),
        (_S.RUNNING, _S.PENDING): (
            "reclaim_expired_locks",
            "mark_failed_or_retry",
            "mark_snoozed",
            "mark_retry_after",
            "hand_back_unstarted",
        ),
        (_S.PENDING, _S.CANCELLED): ("write_cancel_request", "cancel_where", "abort_batch"),
        (_S.SCHEDULED, _S.CANCELLED): ("write_cancel_request", "cancel_where", "abort_batch"),
        (_S.PENDING, _S.FAILED): ("deadline_sweep",),
        (_S.SCHEDULED, _S.FAILED): ("deadline_sweep",),
    }
)
"""(from, to) -> the Backend methods allowed to drive that transition."""


def is_valid_transition(from_status: JobStatus | str, to_status: JobStatus | str) -> bool:
    """Whether ``from_status -> to_status`` is in :data:`VALID_TRANSITIONS`."""
    return JobStatus(to_status) in VALID_TRANSITIONS[JobStatus(from_status)]


def assert_valid_transition(
    from_status: JobStatus | str, to_status: JobStatus | str, job_id: object = None
) -> None:
    """Raise :class:`~taskq.errors.InvalidTransition` unless the move is valid."""
    if not is_valid_transition(from_status, to_status):
        who = f"job {job_id}: " if job_id is not None else ""
        raise InvalidTransition(
            f"{who}invalid transition {JobStatus(from_status).value} -> "
            f"{JobStatus(to_status).value}; allowed from {JobStatus(from_status).value}: "
            f"{sorted(s.value for s in VALID_TRANSITIONS[JobStatus(from_status)]) or 'none (terminal)'}"
        )


class CancelPhase(IntEnum):
    """Where a running job is in the three-phase cancellation protocol."""

    NONE = 0
    """No cancellation requested."""
    COOPERATIVE = 1
    """Cancel requested; the actor's ``cancel_event`` is set."""
    FORCED = 2
    """Grace elapsed; the escalation row is written, then the task is cancelled."""
    ABANDON_PENDING = 3
    """In-process only: queued for ``mark_abandoned`` after the heartbeat commits."""


def parse_status(text: str) -> JobStatus:
    """Read a stored status. A dict lookup: a thirtieth of ``JobStatus(text)``, which
    goes through the enum's metaclass (paid for every job row decoded)."""
    try:
        return _STATUS_BY_VALUE[text]
    except KeyError:
        raise ValueError(
            f"unknown job status {text!r}: the database holds a status this TaskQ does not "
            f"know (written by a newer release?); upgrade taskq-core to read it"
        ) from None


_STORED_CANCEL_PHASES: Final[Mapping[int, CancelPhase]] = MappingProxyType(
    {p.value: p for p in CancelPhase if p is not CancelPhase.ABANDON_PENDING}
)


def parse_cancel_phase(value: int) -> CancelPhase:
    """Read a stored cancel phase; storage never holds ABANDON_PENDING (3). A dict
    lookup, as :func:`parse_status` (paid for every job row decoded)."""
    try:
        return _STORED_CANCEL_PHASES[value]
    except KeyError:
        if value == CancelPhase.ABANDON_PENDING:
            raise ValueError(
                "cancel_phase 3 (ABANDON_PENDING) is in-process only and must never be stored"
            ) from None
        raise ValueError(
            f"unknown cancel phase {value!r}: the database holds a phase this TaskQ does not "
            f"know (written by a newer release?); upgrade taskq-core to read it"
        ) from None


def to_mermaid() -> str:
    """The state diagram as Mermaid text (``docs/state_machine.md`` is generated from it)."""
    lines = ["stateDiagram-v2", "    [*] --> pending", "    [*] --> scheduled"]
    for src in JobStatus:
        for dst in sorted(VALID_TRANSITIONS[src], key=list(JobStatus).index):
            drivers = ", ".join(TRANSITION_DRIVERS[(src, dst)])
            lines.append(f"    {src.value} --> {dst.value}: {drivers}")
    lines.extend(f"    {s.value} --> [*]" for s in JobStatus if s in TERMINAL_STATUSES)
    return "\n".join(lines) + "\n"
