"""A small application for tests that start real `taskq-worker` processes.

The backend URL comes from TASKQ_DSN (the worker's --dsn overrides it), so
the same module serves memory:// and Postgres runs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from taskq import Context, FixedBackoff, QueueConfig, RetryAfter, Snooze, TaskQ, actor


class Sleep(BaseModel):
    seconds: float = 0.0
    tag: str = ""


class Watched(Sleep):
    started: str = ""
    """A file the actor creates once its body runs: a test's signal that the job has
    started, where its row says only that it was dispatched."""

    def announce(self) -> None:
        if self.started:
            Path(self.started).touch()


@actor(queue="default")
async def nap(payload: Sleep, ctx: Context) -> dict[str, Any]:
    await asyncio.sleep(payload.seconds)
    return {"tag": payload.tag, "attempt": ctx.attempt}


@actor(queue="default")
async def nap_to_thread(payload: Watched) -> None:
    import time

    def in_its_thread() -> None:
        payload.announce()
        time.sleep(payload.seconds)

    await asyncio.to_thread(in_its_thread)


@actor(queue="other")
def nap_sync(payload: Watched) -> dict[str, Any]:
    import time

    payload.announce()
    time.sleep(payload.seconds)
    return {"tag": payload.tag, "thread": threading.current_thread().name}


# Start order within one worker process: finish times cannot tell it, since the
# completer writes successes that finish close together in one statement.
_starts = itertools.count()


@actor(queue="default")
async def ordered(payload: Sleep) -> dict[str, Any]:
    return {"tag": payload.tag, "started": next(_starts)}


@actor(queue="fair")
async def fair(payload: Sleep) -> dict[str, Any]:
    started = next(_starts)
    await asyncio.sleep(payload.seconds)
    return {"tag": payload.tag, "started": started}


@actor(max_attempts=3, retry_backoff=FixedBackoff(timedelta(seconds=0.2)))
async def always_fails(payload: dict[str, Any]) -> None:
    raise RuntimeError("boom")


@actor
async def snooze_twice(payload: dict[str, Any], ctx: Context) -> int:
    if ctx.attempt <= 2:
        raise Snooze(0.1)
    return ctx.attempt


@actor(max_attempts=2)
async def retry_after(payload: dict[str, Any]) -> None:
    raise RetryAfter(0.1)


@actor(timeout=0.2, max_attempts=1)
async def too_slow(payload: dict[str, Any]) -> None:
    await asyncio.sleep(10)


@actor(max_concurrent=2)
async def capped(payload: Sleep) -> str:
    await asyncio.sleep(payload.seconds)
    return payload.tag


@actor(identity_key=lambda p: p.tag)
async def serialized(payload: Sleep) -> str:
    await asyncio.sleep(payload.seconds)
    return payload.tag


@actor(max_pending=3)
async def bounded(payload: dict[str, Any]) -> None:
    return None


@actor
async def spawner(payload: dict[str, Any], ctx: Context) -> int:
    children: int = payload["children"]
    for i in range(children):
        ctx.enqueue(nap, {"tag": f"child{i}"})
    if payload.get("fail"):
        raise ValueError("parent failed after enqueueing")
    return children


@actor(max_attempts=1)
async def follows_up(payload: dict[str, Any]) -> str:
    """Enqueues through the application's own client, as the actors of an app do."""
    job = await tq.client.enqueue(nap, {"tag": payload["tag"]})
    return str(job.id)


@actor
async def reporter(payload: dict[str, Any], ctx: Context) -> None:
    await ctx.progress({"step": 1})
    await asyncio.sleep(payload.get("seconds", 0))
    await ctx.progress({"step": 2})


@actor(max_attempts=3)
async def cooperative(payload: Watched, ctx: Context) -> str:
    """Checks its cancel_event between units of work."""
    payload.announce()
    for _ in range(int(payload.seconds / 0.05)):
        if ctx.cancel_event.is_set():
            return "stopped early"
        await asyncio.sleep(0.05)
    return "done"


@actor(max_attempts=3)
async def stubborn(payload: Watched) -> str:
    """Ignores cancel_event; stops only when its task is cancelled."""
    payload.announce()
    await asyncio.sleep(payload.seconds)
    return "done"


@actor(max_attempts=3)
async def swallower(payload: Watched) -> str:
    """Swallows CancelledError: the worst citizen."""
    payload.announce()
    loop = asyncio.get_running_loop()
    end = loop.time() + payload.seconds
    while loop.time() < end:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            continue
    return "done"


@actor(max_attempts=1)
async def blocker(payload: Sleep) -> None:
    """Blocks the event loop (what the loop-lag watchdog exists for)."""
    import time

    time.sleep(payload.seconds)  # noqa: ASYNC251 - blocking the loop is this actor's purpose


tq = TaskQ(
    os.environ.get("TASKQ_DSN", "memory://"),
    schema=os.environ.get("TASKQ_SCHEMA", "taskq"),
    actors=[
        nap,
        nap_sync,
        nap_to_thread,
        fair,
        ordered,
        always_fails,
        snooze_twice,
        retry_after,
        too_slow,
        capped,
        serialized,
        bounded,
        spawner,
        follows_up,
        reporter,
        cooperative,
        stubborn,
        swallower,
        blocker,
    ],
    queues=[QueueConfig(queue="fair", mode="round_robin")],
)
