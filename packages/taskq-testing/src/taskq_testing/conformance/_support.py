"""Shared vocabulary of the conformance suite: job builders, waits, skips and checks.

Every helper reaches states through the ``Backend`` protocol only (enqueue,
dispatch, terminal writes, sweeps), so the suite needs nothing from a backend
beyond the protocol and two fixtures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final, TypeAlias, TypeVar
from uuid import UUID, uuid4

import pytest

from taskq.backend import (
    OPTIONAL_PROTOCOLS,
    TERMINAL_STATUSES,
    VALID_TRANSITIONS,
    Backend,
    Connection,
    JobStatus,
)
from taskq.models import AttemptRow, EnqueueArgs, ErrorInfo, EventRow, JobRow

AdvanceTime: TypeAlias = Callable[[timedelta], Awaitable[None]]
"""``await advance_time(delta)``: let the backend's clock move forward by at least ``delta``."""

ACTOR: Final = "conformance.echo"
FAR: Final = timedelta(hours=1)
"""A delay no test outlives: "not yet due" without waiting."""
LONG_LEASE: Final = timedelta(minutes=10)
SHORT_LEASE: Final = timedelta(seconds=0.1)
"""A lease the suite lets expire. Kept tiny because on a real database every
expiry is a real wait; the sum of all waits must stay a few seconds."""
_EXPIRY_MARGIN: Final = timedelta(seconds=0.05)
TICK: Final = timedelta(milliseconds=5)
"""Enough for two statements to get distinct timestamps."""
SAME_INSTANT: Final = timedelta(seconds=1)
"""Tolerance between two readings of "now" that the contract calls equal but a
real database may take in separate statements (e.g. ``created_at`` and an
event's ``occurred_at``). The in-memory backend's fake clock makes them exact."""
_WAKE_TIMEOUT_S: Final = 5.0
ERROR: Final = ErrorInfo(error_class="conformance.Boom", message="boom")

STATUSES_WITHOUT_WAIT: Final = (
    JobStatus.RUNNING,
    JobStatus.SUCCEEDED,
    JobStatus.FAILED,
    JobStatus.ABANDONED,
    JobStatus.PENDING,
    JobStatus.SCHEDULED,
    JobStatus.CANCELLED,
)
"""Every status :func:`reach` gets to without letting time pass (all but ``crashed``).
Those reached through a dispatch come first, so when a test puts them all in one
queue no older pending job can be dispatched in their place."""

COVERS_ATTRIBUTE: Final = "__taskq_covers__"


class TimeLimits:
    """Mixin base for tests that may have to let time pass."""

    max_advance: ClassVar[timedelta] = timedelta(seconds=2)
    """The longest single ``advance_time`` a test may ask for; tests that would need
    more skip and say so. Raise it when ``advance_time`` moves a fake clock."""


_F = TypeVar("_F", bound=Callable[..., Any])


def covers(*members: str) -> Callable[[_F], _F]:
    """Record which members of ``Backend`` and of its optional protocols
    (``OPTIONAL_PROTOCOLS``) a conformance test exercises.

    The coverage meta-test requires every such member to be covered by at least
    one test. Unknown names fail at import, so a typo cannot hide a gap.
    """
    unknown = [
        m
        for m in members
        if m.startswith("_")
        or not any(hasattr(protocol, m) for protocol in (Backend, *OPTIONAL_PROTOCOLS))
    ]
    if unknown:
        raise ValueError(
            f"covers(): {unknown} are not members of taskq.backend.Backend "
            f"or of an optional protocol (taskq.backend.OPTIONAL_PROTOCOLS)"
        )

    def mark(test: _F) -> _F:
        setattr(test, COVERS_ATTRIBUTE, frozenset(members) | getattr(test, COVERS_ATTRIBUTE, set()))
        return test

    return mark


def make_args(**overrides: Any) -> EnqueueArgs:
    """``EnqueueArgs`` for the suite's actor on the ``default`` queue, with overrides."""
    fields: dict[str, Any] = {"actor": ACTOR, "queue": "default", "payload": {"n": 1}}
    fields.update(overrides)
    return EnqueueArgs.model_validate(fields)


def _solo_queue() -> str:
    return f"solo-{uuid4().hex[:12]}"


async def enqueue_and_dispatch(
    backend: Backend, *, worker_id: UUID, lease: timedelta = LONG_LEASE, **overrides: Any
) -> JobRow:
    """Enqueue one job and dispatch exactly it to ``worker_id``; returns the running row.

    Unless a queue is given the job gets a queue of its own, so other pending
    jobs of the test cannot be dispatched in its place.
    """
    overrides.setdefault("queue", _solo_queue())
    job = await backend.enqueue(make_args(**overrides))
    dispatched = await backend.dispatch_batch(worker_id, [job.queue], 1, lease)
    assert [row.id for row in dispatched] == [job.id], "the enqueued job was not dispatched"
    return dispatched[0]


async def running_job(
    backend: Backend,
    *,
    worker_id: UUID,
    cancel_phase: int = 0,
    lease: timedelta = LONG_LEASE,
    **overrides: Any,
) -> JobRow:
    """A running job of ``worker_id`` in ``cancel_phase`` (0, 1 or 2), read back fresh."""
    job = await enqueue_and_dispatch(backend, worker_id=worker_id, lease=lease, **overrides)
    if cancel_phase >= 1:
        assert await backend.write_cancel_request(job.id, "conformance")
    if cancel_phase >= 2:
        assert await backend.write_cancel_escalation(job.id, worker_id, 2)
    return await fetch(backend, job.id)


async def fetch(backend: Backend, job_id: UUID) -> JobRow:
    """``get`` that must find the job."""
    row = await backend.get(job_id)
    assert row is not None, f"job {job_id} vanished"
    return row


async def reach(
    backend: Backend,
    status: JobStatus,
    *,
    worker_id: UUID | None = None,
    advance_time: AdvanceTime | None = None,
    **overrides: Any,
) -> JobRow:
    """A job in ``status``, reached through the protocol; the fresh row.

    ``worker_id`` is the worker that runs it when the path goes through
    ``running``. ``crashed`` needs ``advance_time`` (a lease has to expire).
    """
    worker = worker_id or uuid4()
    if status is JobStatus.PENDING:
        return await backend.enqueue(make_args(**overrides))
    if status is JobStatus.SCHEDULED:
        return await backend.enqueue(make_args(delay=FAR, **overrides))
    if status is JobStatus.CANCELLED:
        job = await backend.enqueue(make_args(**overrides))
        assert await backend.write_cancel_request(job.id, "conformance")
        return await fetch(backend, job.id)
    if status is JobStatus.CRASHED:
        if advance_time is None:
            raise TypeError("reaching crashed needs advance_time (a lease must expire)")
        overrides["max_attempts"] = 1
        job = await enqueue_and_dispatch(backend, worker_id=worker, lease=SHORT_LEASE, **overrides)
        await expire_short_leases(advance_time)
        assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) >= 1
        return await fetch(backend, job.id)
    job = await running_job(
        backend,
        worker_id=worker,
        cancel_phase=2 if status is JobStatus.ABANDONED else 0,
        **overrides,
    )
    if status is JobStatus.SUCCEEDED:
        assert await backend.mark_succeeded(job.id, worker, {"ok": True})
    elif status is JobStatus.FAILED:
        await backend.mark_failed_or_retry(job.id, worker, ERROR, None)
    elif status is JobStatus.ABANDONED:
        assert await backend.mark_abandoned(job.id, worker)
    row = await fetch(backend, job.id)
    assert row.status is status, f"could not reach {status}: the job is {row.status}"
    return row


async def expire_short_leases(advance_time: AdvanceTime) -> None:
    """Wait until every lease of ``SHORT_LEASE`` taken so far has expired."""
    await advance_time(SHORT_LEASE + _EXPIRY_MARGIN)


def skip_unless_can_wait(needed: timedelta, max_advance: timedelta, what: str) -> None:
    """Skip (saying why) when a test would have to wait longer than the class allows."""
    if needed > max_advance:
        pytest.skip(
            f"{what} needs advance_time({needed.total_seconds():g} s), more than max_advance "
            f"({max_advance.total_seconds():g} s); construct the backend with a shorter setting "
            f"for tests, or raise max_advance when advance_time moves a fake clock"
        )


def backend_setting(backend: Backend, name: str) -> timedelta:
    """A duration setting the contract requires beside the protocol (e.g. the cancel headroom)."""
    value = getattr(backend, name, None)
    assert isinstance(value, timedelta), (
        f"the contract requires a timedelta attribute {name!r} on the backend, found {value!r}"
    )
    return value


def cancel_reclaim_wait(backend: Backend, max_advance: timedelta) -> timedelta:
    """How long a short-leased job with a cancel in progress (zero graces) must wait to be
    reclaimable; skips when that exceeds ``max_advance``."""
    wait = SHORT_LEASE + backend_setting(backend, "cancel_reclaim_headroom") + _EXPIRY_MARGIN
    skip_unless_can_wait(wait, max_advance, "reclaiming a job with a cancel in progress")
    return wait


def require_conn(backend: Backend, conn: Connection) -> None:
    """Skip a ``*_with_conn`` test when there is no connection and the backend needs one."""
    if conn is None and not type(backend).supports_transactional_simulation:
        pytest.skip(
            "this backend's *_with_conn methods need a driver connection: "
            "override the transaction_conn fixture"
        )


async def wait_for_wake(event: asyncio.Event) -> None:
    """The subscription fired (a real listener may deliver a moment later)."""
    try:
        await asyncio.wait_for(event.wait(), _WAKE_TIMEOUT_S)
    except TimeoutError:
        raise AssertionError(f"no wake-up within {_WAKE_TIMEOUT_S} s") from None


def assert_utc(*values: datetime | None) -> None:
    """Stored datetimes are timezone-aware UTC."""
    for value in values:
        assert value is not None
        assert value.utcoffset() == timedelta(0), f"{value!r} is not timezone-aware UTC"


def assert_close(actual: datetime | None, expected: datetime | None) -> None:
    """``actual`` is ``expected`` up to the tolerance between two readings of "now"."""
    assert actual is not None and expected is not None, (actual, expected)
    assert abs(actual - expected) <= SAME_INSTANT, f"{actual} is not {expected}"


def error_class_name(error: ErrorInfo | None) -> str | None:
    """The unqualified error class (the contract names ``DeadlineExceeded``, ``WorkerCrashed``
    without fixing a module prefix)."""
    return None if error is None else error.error_class.rsplit(".", 1)[-1]


def transitions(events: Iterable[EventRow]) -> list[tuple[str, str]]:
    """``(from_state, to_state)`` of each status-changing event, oldest first."""
    return [
        (e.detail["from_state"], e.detail["to_state"])
        for e in events
        if e.kind in ("state_change", "reclaimed")
    ]


async def last_event(backend: Backend, job_id: UUID) -> EventRow:
    """The newest event of a job."""
    events = await backend.get_events(job_id)
    assert events, f"job {job_id} has no events"
    return events[-1]


async def assert_history_consistent(backend: Backend, job_id: UUID) -> None:
    """The job's events tell a valid story ending in its current status.

    Ids increase; every status change is in ``VALID_TRANSITIONS`` (or is an
    operator retry of a terminal job), each starts where the previous ended,
    and the last ends in the job's status.
    """
    job = await fetch(backend, job_id)
    events = await backend.get_events(job_id)
    ids = [e.event_id for e in events]
    assert ids == sorted(set(ids)), f"event ids are not strictly increasing: {ids}"
    previous: str | None = None
    for event in events:
        if event.kind not in ("state_change", "reclaimed"):
            continue
        source, target = event.detail["from_state"], event.detail["to_state"]
        if event.detail.get("reason") == "retried":
            assert JobStatus(source) in TERMINAL_STATUSES, f"retry from non-terminal {source}"
        else:
            assert JobStatus(target) in VALID_TRANSITIONS[JobStatus(source)], (
                f"event {event.event_id} records invalid transition {source} -> {target}"
            )
        assert previous is None or previous == source, (
            f"event {event.event_id} starts at {source} but the job was {previous}"
        )
        previous = target
    assert previous is None or previous == job.status, (
        f"the last transition ends at {previous} but the job is {job.status}"
    )
    await _assert_attempts_match(backend, job, events)


_DISPATCH: Final = (JobStatus.PENDING, JobStatus.RUNNING)
_OUTCOME_OF_END: Final[dict[str, str]] = {
    JobStatus.SUCCEEDED: "succeeded",
    JobStatus.ABANDONED: "abandoned",
}


async def _assert_attempts_match(backend: Backend, job: JobRow, events: list[EventRow]) -> None:
    """Each dispatch opened an attempt and each move out of ``running`` closed it with
    its row: finished, of the worker the dispatch named; none for a running attempt. A
    reclaim's attempt crashed; a success's and an abandonment's are what the job became."""
    moves = [e for e in events if e.kind in ("state_change", "reclaimed")]
    dispatches = [e for e in moves if (e.detail["from_state"], e.detail["to_state"]) == _DISPATCH]
    closes = [e for e in moves if e.detail["from_state"] == JobStatus.RUNNING]
    attempts = {a.attempt: a for a in await backend.get_attempts(job.id)}
    running = job.status is JobStatus.RUNNING
    assert len(dispatches) == job.attempt, (
        f"job {job.id} is on attempt {job.attempt} after {len(dispatches)} dispatch events"
    )
    assert len(closes) == job.attempt - running, (
        f"job {job.id} ({job.status}, attempt {job.attempt}) left running {len(closes)} times"
    )
    for number, (dispatch, close) in enumerate(
        zip(dispatches, [*closes, None][: len(dispatches)], strict=True), start=1
    ):
        row = attempts.get(number)
        if close is None:
            assert row is None, f"the running attempt {number} of {job.id} has a row: {row}"
            continue
        assert row is not None, f"attempt {number} of {job.id} ({job.status}) has no row"
        assert row.finished_at is not None, f"attempt {number} of {job.id} is left open: {row}"
        assert str(row.worker_id) == dispatch.detail.get("worker_id"), (
            f"attempt {number} of {job.id} has worker {row.worker_id}, "
            f"dispatched to {dispatch.detail.get('worker_id')}"
        )
        if close.kind == "reclaimed":
            expected: str | None = "crashed"
        else:
            expected = _OUTCOME_OF_END.get(close.detail["to_state"])
        assert expected is None or row.outcome == expected, (
            f"attempt {number} of {job.id} ended {close.detail['to_state']} "
            f"({close.kind}) with outcome {row.outcome}"
        )


def only_attempt(attempts: list[AttemptRow]) -> AttemptRow:
    """The one attempt row a single execution leaves."""
    assert len(attempts) == 1, f"expected one attempt row, got {attempts}"
    return attempts[0]
