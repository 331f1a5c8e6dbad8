"""Reads: ``get``, ``list_jobs`` with every ``JobFilter`` field, pagination and the counts;
the names a method takes bare."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID, uuid4

import pytest

from taskq.backend import ACTIVE_STATUSES, TERMINAL_STATUSES, Backend, JobStatus
from taskq.models import JobFilter, JobRow
from taskq_testing.conformance._support import (
    LONG_LEASE,
    STATUSES_WITHOUT_WAIT,
    TICK,
    AdvanceTime,
    covers,
    make_args,
    reach,
)

_BATCH_1, _BATCH_2 = UUID(int=1), UUID(int=2)

_NUL_NAME = "a\x00b"
_BARE_NAMES: dict[str, Callable[[Any], Awaitable[object]]] = {
    "dispatch_batch": lambda b: b.dispatch_batch(uuid4(), ["q", _NUL_NAME], 1, LONG_LEASE),
    "dispatch_actors_batch": lambda b: b.dispatch_actors_batch(
        uuid4(), ["q"], 1, LONG_LEASE, [_NUL_NAME]
    ),
    "count_pending_jobs": lambda b: b.count_pending_jobs([_NUL_NAME]),
    "count_active_jobs": lambda b: b.count_active_jobs([_NUL_NAME]),
    "list_schedules": lambda b: b.list_schedules(actor=_NUL_NAME),
    "register_worker": lambda b: b.register_worker(uuid4(), _NUL_NAME, 1, ["q"]),
    "record_maintenance_run": lambda b: b.record_maintenance_run(
        _NUL_NAME, datetime(2026, 1, 1, tzinfo=UTC)
    ),
    "last_maintenance_run": lambda b: b.last_maintenance_run(_NUL_NAME),
}
"""A call of each method taking names bare (queues, actors, a host, a loop), with one
no store holds."""


async def _one_per_status(backend: Backend) -> dict[JobStatus, UUID]:
    return {status: (await reach(backend, status)).id for status in STATUSES_WITHOUT_WAIT}


async def _ids(backend: Backend, **fields: Any) -> set[UUID]:
    return {row.id for row in await backend.list_jobs(JobFilter(**fields))}


async def _varied(backend: Backend) -> dict[str, UUID]:
    """Four jobs that differ in actor, queue, tags, keys and batch; ``b`` runs."""
    specs: dict[str, dict[str, Any]] = {
        "a": {"actor": "A", "queue": "q1", "tags": ["x", "y"], "identity_key": "i1",
              "metadata": {"batch_id": str(_BATCH_1)}},
        "b": {"actor": "A", "queue": "q2", "tags": ["x"], "priority": 1,
              "metadata": {"batch_id": str(_BATCH_2)}},
        "c": {"actor": "B", "queue": "q1", "tags": ["y"], "identity_key": "i1",
              "idempotency_key": "k1"},
        "d": {"actor": "B", "queue": "q2", "identity_key": "i2",
              "metadata": {"batch_id": str(_BATCH_1), "other": 1}},
    }  # fmt: skip
    ids = {name: (await backend.enqueue(make_args(**spec))).id for name, spec in specs.items()}
    [running] = await backend.dispatch_batch(uuid4(), ["q2"], 1, LONG_LEASE)
    assert running.id == ids["b"]
    return ids


async def _spread_population(backend: Backend, advance_time: AdvanceTime) -> list[JobRow]:
    """Seven jobs: some inserted in one call (equal ``created_at`` on a fake clock, so the id
    decides), some with time passing between them. Ids run against insertion order."""
    ids = sorted((uuid4() for _ in range(7)), reverse=True)
    rows = await backend.enqueue_batch([make_args(id=i) for i in ids[:3]])
    for job_id in ids[3:5]:
        await advance_time(TICK)
        rows.append(await backend.enqueue(make_args(id=job_id)))
    await advance_time(TICK)
    rows += await backend.enqueue_batch([make_args(id=i) for i in ids[5:]])
    return rows


def _ordered(rows: list[JobRow], order: Literal["asc", "desc"]) -> list[UUID]:
    ordered = sorted(rows, key=lambda r: (r.created_at, r.id), reverse=order == "desc")
    return [row.id for row in ordered]


class FilterTests:
    """``get``, ``list_jobs`` and ``JobFilter``; ``count_pending_jobs``, ``count_active_jobs``."""

    @covers("get")
    async def test_get_of_an_unknown_job_is_none(self, backend: Backend) -> None:
        await backend.enqueue(make_args())
        assert await backend.get(uuid4()) is None

    @pytest.mark.parametrize("status", STATUSES_WITHOUT_WAIT)
    @covers("list_jobs")
    async def test_list_jobs_by_one_status(self, backend: Backend, status: JobStatus) -> None:
        jobs = await _one_per_status(backend)
        assert await _ids(backend, status=status) == {jobs[status]}
        assert await _ids(backend, status=[status]) == {jobs[status]}

    @covers("list_jobs")
    async def test_list_jobs_by_several_statuses(self, backend: Backend) -> None:
        jobs = await _one_per_status(backend)
        wanted = [JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.ABANDONED]
        assert await _ids(backend, status=wanted) == {jobs[s] for s in wanted}

    @covers("list_jobs")
    async def test_list_jobs_by_an_empty_status_sequence_is_empty(self, backend: Backend) -> None:
        await _one_per_status(backend)
        assert await backend.list_jobs(JobFilter(status=[])) == []

    @pytest.mark.parametrize("active", [True, False])
    @covers("list_jobs")
    async def test_list_jobs_active_splits_by_terminality(
        self, backend: Backend, active: bool
    ) -> None:
        jobs = await _one_per_status(backend)
        statuses = ACTIVE_STATUSES if active else TERMINAL_STATUSES
        assert await _ids(backend, active=active) == {jobs[s] for s in statuses if s in jobs}

    @covers("list_jobs")
    async def test_list_jobs_finds_crashed_jobs(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        crashed = await reach(backend, JobStatus.CRASHED, advance_time=advance_time)
        pending = await reach(backend, JobStatus.PENDING)
        assert await _ids(backend, status="crashed") == {crashed.id}
        assert await _ids(backend, active=False) == {crashed.id}
        assert await _ids(backend, active=True) == {pending.id}

    @covers("list_jobs")
    async def test_list_jobs_without_a_filter_lists_every_job(self, backend: Backend) -> None:
        jobs = await _one_per_status(backend)
        assert await _ids(backend) == set(jobs.values())

    @pytest.mark.parametrize(
        ("fields", "expected"),
        [
            ({"actor": "A"}, {"a", "b"}),
            ({"queue": "q1"}, {"a", "c"}),
            ({"identity_key": "i1"}, {"a", "c"}),
            ({"idempotency_key": "k1"}, {"c"}),
            ({"batch_id": _BATCH_1}, {"a", "d"}),
            ({"tags": ("x",)}, {"a", "b"}),
            ({"tags": ("x", "y")}, {"a"}),
            ({"tags": ("z",)}, set()),
            ({"actor": "B", "queue": "q2"}, {"d"}),
            ({"actor": "A", "status": "pending"}, {"a"}),
            ({"status": "running"}, {"b"}),
            ({"active": True, "queue": "q2"}, {"b", "d"}),
            ({"actor": "nobody"}, set()),
        ],
        ids=[
            "actor",
            "queue",
            "identity",
            "idempotency",
            "batch",
            "one-tag",
            "all-tags",
            "unknown-tag",
            "actor-and-queue",
            "actor-and-status",
            "status",
            "active-and-queue",
            "no-match",
        ],
    )
    @covers("list_jobs")
    async def test_list_jobs_filters_are_a_conjunction(
        self, backend: Backend, fields: dict[str, Any], expected: set[str]
    ) -> None:
        jobs = await _varied(backend)
        assert await _ids(backend, **fields) == {jobs[name] for name in expected}

    @pytest.mark.parametrize("order", ["asc", "desc"])
    @covers("list_jobs")
    async def test_list_jobs_orders_by_creation_then_id(
        self, backend: Backend, advance_time: AdvanceTime, order: Literal["asc", "desc"]
    ) -> None:
        rows = await _spread_population(backend, advance_time)
        listed = await backend.list_jobs(JobFilter(order=order))
        assert [row.id for row in listed] == _ordered(rows, order)

    @pytest.mark.parametrize("order", ["asc", "desc"])
    @pytest.mark.parametrize("page_size", [1, 2, 3])
    @covers("list_jobs")
    async def test_cursor_pages_cover_every_row_exactly_once(
        self,
        backend: Backend,
        advance_time: AdvanceTime,
        order: Literal["asc", "desc"],
        page_size: int,
    ) -> None:
        rows = await _spread_population(backend, advance_time)
        query = JobFilter(order=order, limit=page_size)
        seen: list[UUID] = []
        while page := await backend.list_jobs(query):
            assert len(page) <= page_size
            seen += [row.id for row in page]
            query = query.after(page[-1])
        assert seen == _ordered(rows, order)

    @covers("list_jobs")
    async def test_a_cursor_excludes_its_own_row(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        rows = await _spread_population(backend, advance_time)
        ordered = _ordered(rows, "asc")
        by_id = {row.id: row for row in rows}
        pivot = by_id[ordered[3]]
        after = await backend.list_jobs(JobFilter(cursor=(pivot.created_at, pivot.id)))
        assert [row.id for row in after] == ordered[4:]

    @covers("list_jobs")
    async def test_list_jobs_returns_at_most_limit_rows(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        rows = await _spread_population(backend, advance_time)
        listed = await backend.list_jobs(JobFilter(limit=3))
        assert [row.id for row in listed] == _ordered(rows, "asc")[:3]

    @covers("list_jobs")
    async def test_list_jobs_returns_the_stored_rows(self, backend: Backend) -> None:
        await _one_per_status(backend)
        for row in await backend.list_jobs(JobFilter()):
            assert row == await backend.get(row.id)

    # -- names taken bare ---------------------------------------------------------------

    @pytest.mark.parametrize("method", sorted(_BARE_NAMES))
    @covers(*_BARE_NAMES)
    async def test_a_name_no_store_holds_is_refused_where_it_is_taken_bare(
        self, backend: Backend, method: str
    ) -> None:
        # As JobFilter and the configs refuse one: Postgres raised its driver's error,
        # the in-memory backend stored the name or matched nothing.
        if not hasattr(backend, method):
            pytest.skip(f"{type(backend).__name__} has no {method} (an optional protocol)")
        job = await reach(backend, JobStatus.PENDING, queue="q")
        with pytest.raises(ValueError, match="NUL"):
            await _BARE_NAMES[method](backend)
        assert await backend.list_jobs(JobFilter()) == [job]

    # -- counts -----------------------------------------------------------------------

    @covers("count_pending_jobs")
    async def test_count_pending_jobs_counts_waiting_jobs_per_actor(self, backend: Backend) -> None:
        for status in STATUSES_WITHOUT_WAIT:
            await reach(backend, status, actor="counted")
        await reach(backend, JobStatus.SCHEDULED, actor="counted")
        await reach(backend, JobStatus.PENDING, actor="not-asked")
        counts = await backend.count_pending_jobs(["counted", "idle"])
        assert (counts["counted"], counts["idle"]) == (3, 0)

    @covers("count_pending_jobs")
    async def test_count_pending_jobs_stops_at_up_to(self, backend: Backend) -> None:
        for _ in range(4):
            await reach(backend, JobStatus.PENDING, actor="deep")
        await reach(backend, JobStatus.SCHEDULED, actor="shallow")
        await reach(backend, JobStatus.PENDING, actor="uncapped")
        await reach(backend, JobStatus.PENDING, actor="uncapped")
        counts = await backend.count_pending_jobs(
            ["deep", "shallow", "uncapped"], up_to={"deep": 2, "shallow": 3}
        )
        assert counts == {"deep": 2, "shallow": 1, "uncapped": 2}

    @covers("count_pending_jobs")
    async def test_count_pending_jobs_refuses_an_up_to_below_zero(self, backend: Backend) -> None:
        # No count is below zero: the in-memory backend returned one, Postgres raised its
        # driver's error (a negative LIMIT).
        await reach(backend, JobStatus.PENDING, actor="deep")
        with pytest.raises(ValueError, match="'deep': -1"):
            await backend.count_pending_jobs(["deep", "none"], up_to={"deep": -1, "none": 0})
        assert await backend.count_pending_jobs(["deep"], up_to={"deep": 0}) == {"deep": 0}

    @covers("count_active_jobs")
    async def test_count_active_jobs_counts_unfinished_jobs_in_the_queues(
        self, backend: Backend
    ) -> None:
        for status in STATUSES_WITHOUT_WAIT:
            await reach(backend, status, queue="counted")
        await reach(backend, JobStatus.PENDING, queue="also-counted")
        await reach(backend, JobStatus.RUNNING, queue="not-asked")
        assert await backend.count_active_jobs(["counted", "also-counted"]) == 4
        assert await backend.count_active_jobs(["empty"]) == 0
