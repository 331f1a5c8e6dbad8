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


async def watch_reclaims(
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
    processing, and dedupe on it.
    """
    delay = visibility_delay if visibility_delay is not None else _backend_delay(backend)
    cursor = after_id
    loop = asyncio.get_running_loop()
    next_risk_check = loop.time()
    catch_up_until = 0.0
    async with backend.subscribe_wake() as wake:
        while True:
            if loop.time() >= next_risk_check:
                next_risk_check = loop.time() + risk_check_interval.total_seconds()
                await _check_risk(backend, delay)
            wake.clear()
            events = await backend.poll_reclaim_events(
                cursor, batch_size, visibility_delay=visibility_delay
            )
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
    check = getattr(backend, "check_reclaim_visibility_delay_risk", None)
    if check is None:
        return
    for writer in await check(delay):
        _log.warning("taskq.watch-reclaims-visibility-delay-at-risk", writer=repr(writer))
