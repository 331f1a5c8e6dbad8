"""``watch_reclaims``: the crash-reclaim feed as an async iterator.

Polls ``Backend.poll_reclaim_events`` after a cursor. The backend's wake
subscription fires on every reclaim (Sweep 1 notifies the wake channel), so
a wake triggers an immediate poll; a poll that comes back empty after a wake
usually means the event has not cleared the visibility delay yet, so it is
retried on a short bounded cadence until that delay has passed, instead of
waiting for the full ``poll_interval``. On backends that offer
``check_reclaim_visibility_delay_risk`` (Postgres) a slow diagnostic runs
once a minute and warns about writers that could break the feed's ordering.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import structlog

from taskq.backend import Backend
from taskq.models import EventRow

__all__ = ["watch_reclaims"]

_log = structlog.get_logger("taskq.reclaims")

_CATCH_UP_STEP = 0.25
"""Seconds between the polls that follow a wake which found nothing yet."""

_FIRST_PAUSE = 0.1
"""Seconds before the first retry of a poll that failed transiently (doubling, up to
the poll interval)."""


def watch_reclaims(
    backend: Backend,
    after_id: int = 0,
    *,
    poll_interval: timedelta = timedelta(seconds=5),
    visibility_delay: timedelta | None = None,
    risk_check_interval: timedelta = timedelta(minutes=1),
    batch_size: int = 100,
) -> AsyncIterator[EventRow]:
    """Reclaim events with ``event_id > after_id``, in id order, forever.

    Delivery is at least once: persist the cursor (``event.event_id``) after
    processing, and dedupe on it. Bad arguments raise here, at the call, not at
    the first iteration (``ValueError``, ``TypeError``). A poll that fails
    transiently (the database restarting) is retried, logged
    ``taskq.watch-reclaims-retry``; any other error ends the iteration.

    An event lives as long as its job: pruning a finished job past its retention
    (``prune_retention_*``, 7 days for a success) takes its events along, whatever
    the readers' cursors, which only they keep. A reader away for longer resumes
    after a gap: reconcile from the jobs (``list_jobs``) when it does.
    """
    # A zero interval polled the database in a tight loop; a float failed only once
    # the feed went idle.
    if isinstance(after_id, bool) or not isinstance(after_id, int) or after_id < 0:
        raise ValueError(f"after_id must be an event id (an int >= 0), got {after_id!r}")
    for name, value in (
        ("poll_interval", poll_interval),
        ("risk_check_interval", risk_check_interval),
    ):
        if not isinstance(value, timedelta) or value <= timedelta(0):
            raise ValueError(f"{name} must be a positive timedelta, got {value!r}")
    if visibility_delay is not None and (
        not isinstance(visibility_delay, timedelta) or visibility_delay < timedelta(0)
    ):
        raise ValueError(
            f"visibility_delay must be a timedelta >= 0 (or None: the backend's), "
            f"got {visibility_delay!r}"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    return _watch(
        backend,
        after_id,
        poll_interval=poll_interval,
        visibility_delay=visibility_delay,
        risk_check_interval=risk_check_interval,
        batch_size=batch_size,
    )


async def _watch(
    backend: Backend,
    after_id: int,
    *,
    poll_interval: timedelta,
    visibility_delay: timedelta | None,
    risk_check_interval: timedelta,
    batch_size: int,
) -> AsyncIterator[EventRow]:
    delay = visibility_delay if visibility_delay is not None else _backend_delay(backend)
    cursor = after_id
    loop = asyncio.get_running_loop()
    next_risk_check = loop.time()
    catch_up_until = 0.0
    # Here, not at the top: `import taskq` (which imports this module) stays without
    # the worker runtime, which a producer never runs.
    from taskq.worker._transient import transient_errors

    transient = transient_errors()
    pause = _FIRST_PAUSE
    async with backend.subscribe_wake() as wake:
        while True:
            if loop.time() >= next_risk_check:
                next_risk_check = loop.time() + risk_check_interval.total_seconds()
                await _check_risk(backend, delay)
            wake.clear()
            try:
                events = await backend.poll_reclaim_events(
                    cursor, batch_size, visibility_delay=visibility_delay
                )
            except transient as exc:
                # A feed runs for ever: a database blip (a restart, a failover) must not
                # end the reader's loop. The cursor is unchanged, so nothing is skipped.
                _log.warning("taskq.watch-reclaims-retry", error=repr(exc), retry_in=pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, poll_interval.total_seconds())
                continue
            pause = _FIRST_PAUSE
            for event in events:
                cursor = max(cursor, event.event_id)
                yield event
            if len(events) == batch_size:
                continue
            now = loop.time()
            if now < catch_up_until:
                await asyncio.sleep(min(_CATCH_UP_STEP, catch_up_until - now))
                continue
            try:
                async with asyncio.timeout(poll_interval.total_seconds()):
                    await wake.wait()
            except TimeoutError:
                continue
            # Woken: the event may still be inside its visibility delay.
            catch_up_until = loop.time() + delay.total_seconds() + _CATCH_UP_STEP


def _backend_delay(backend: Backend) -> timedelta:
    found: Any = getattr(backend, "reclaim_event_visibility_delay", None)
    return found if isinstance(found, timedelta) else timedelta(seconds=2)


async def _check_risk(backend: Backend, delay: timedelta) -> None:
    """The once-a-minute diagnostic; a failing one (a role that may not read the server's
    activity, a blip) is said, and the feed goes on."""
    check = getattr(backend, "check_reclaim_visibility_delay_risk", None)
    if check is None:
        return
    try:
        writers = await check(delay)
    except Exception as exc:  # noqa: BLE001 - a diagnostic: it must not end the feed
        _log.warning("taskq.watch-reclaims-risk-check-failed", error=repr(exc))
        return
    for writer in writers:
        _log.warning("taskq.watch-reclaims-visibility-delay-at-risk", writer=repr(writer))
