"""The crash-reclaim outbox: ``poll_reclaim_events`` ordering, cursor, limit and delay."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID, uuid4

import pytest

from taskq.backend import Backend
from taskq.models import EventRow
from taskq_testing.conformance._support import (
    FAR,
    SHORT_LEASE,
    AdvanceTime,
    TimeLimits,
    backend_setting,
    covers,
    expire_short_leases,
    fetch,
    running_job,
    skip_unless_can_wait,
)

_ZERO = timedelta(0)


async def _reclaim(backend: Backend, advance_time: AdvanceTime, *max_attempts: int) -> list[UUID]:
    """Crash one job per entry (each with that many attempts); their ids."""
    worker = uuid4()
    jobs = [
        await running_job(backend, worker_id=worker, max_attempts=n, lease=SHORT_LEASE)
        for n in max_attempts
    ]
    await expire_short_leases(advance_time)
    assert await backend.reclaim_expired_locks(_ZERO, _ZERO) == len(jobs)
    return [job.id for job in jobs]


async def _poll_all(backend: Backend) -> list[EventRow]:
    return await backend.poll_reclaim_events(0, 1000, visibility_delay=_ZERO)


class ReclaimEventTests(TimeLimits):
    """``poll_reclaim_events``: a durable, ordered feed of ``reclaimed`` events."""

    @covers("poll_reclaim_events", "reclaim_expired_locks", "get_events")
    async def test_poll_returns_each_reclaim_in_event_id_order_once_visible(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        worker = uuid4()
        finished = await running_job(backend, worker_id=worker)
        assert await backend.mark_succeeded(finished.id, worker, None)
        job_ids = await _reclaim(backend, advance_time, 3, 1, 3)
        # Younger than the visibility delay asked for: held back.
        assert await backend.poll_reclaim_events(0, 100, visibility_delay=FAR) == []
        events = await _poll_all(backend)
        assert sorted(e.job_id for e in events) == sorted(job_ids)
        ids = [e.event_id for e in events]
        assert ids == sorted(set(ids))
        for event in events:
            assert event.kind == "reclaimed"
            # The outbox row is the job's own history row, not a copy.
            assert (await backend.get_events(event.job_id))[-1] == event
            assert event.detail["to_state"] == (await fetch(backend, event.job_id)).status
        # A consumer's edit of what it was handed changes nothing stored.
        events[0].detail["to_state"] = "edited"
        assert (await _poll_all(backend))[0].detail["to_state"] != "edited"

    @covers("poll_reclaim_events")
    async def test_poll_pages_through_the_feed_with_cursor_and_limit(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        await _reclaim(backend, advance_time, 3, 3, 1, 3, 1)
        everything = await _poll_all(backend)
        assert len(everything) == 5
        seen: list[EventRow] = []
        cursor = 0
        while page := await backend.poll_reclaim_events(cursor, 2, visibility_delay=_ZERO):
            assert len(page) <= 2
            seen.extend(page)
            cursor = page[-1].event_id
        assert seen == everything
        middle = everything[1].event_id
        assert (
            await backend.poll_reclaim_events(middle, 100, visibility_delay=_ZERO) == everything[2:]
        )

    @covers("poll_reclaim_events")
    async def test_poll_defaults_to_the_backend_visibility_delay(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        delay = backend_setting(backend, "reclaim_event_visibility_delay")
        if delay < timedelta(seconds=0.5):
            pytest.skip(
                f"reclaim_event_visibility_delay is {delay.total_seconds():g} s: too short to "
                f"observe an event being held back (needs at least 0.5 s)"
            )
        skip_unless_can_wait(delay, self.max_advance, "waiting out the reclaim visibility delay")
        [job_id] = await _reclaim(backend, advance_time, 3)
        assert await backend.poll_reclaim_events(0) == []
        await advance_time(delay)
        assert [e.job_id for e in await backend.poll_reclaim_events(0)] == [job_id]

    @covers("poll_reclaim_events")
    async def test_poll_ignores_every_other_kind_of_event(self, backend: Backend) -> None:
        worker = uuid4()
        job = await running_job(backend, worker_id=worker, cancel_phase=2)
        assert await backend.mark_abandoned(job.id, worker)
        assert len(await backend.get_events(job.id)) >= 3
        assert await _poll_all(backend) == []
