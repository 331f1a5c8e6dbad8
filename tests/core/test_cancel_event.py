"""``ctx.cancel_event`` remembers whether the actor saw a stop request."""

from __future__ import annotations

import asyncio

from taskq.context import CancelEvent


async def test_looking_before_a_request_is_not_seeing_it() -> None:
    event = CancelEvent()
    assert not event.is_set() and not event.seen
    event.set()
    assert event.requested() and not event.seen  # the worker's own look
    assert event.is_set() and event.seen


async def test_waiting_for_the_request_sees_it() -> None:
    event = CancelEvent()
    waiter = asyncio.create_task(event.wait())
    await asyncio.sleep(0)
    assert not event.seen
    event.set()
    assert await waiter is True
    assert event.seen


async def test_a_sync_actors_look_from_its_thread_sees_it() -> None:
    event = CancelEvent()
    event.set()
    looked = await asyncio.to_thread(event.is_set)
    assert looked and event.seen
