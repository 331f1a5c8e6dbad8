"""The actors behind ``taskq demo``, and the mix of jobs it enqueues.

Read this module as an example of writing actors: a payload model as the
first parameter, ``ctx`` for the job's attempt, progress and sub-jobs, and
the two signals an actor raises to reschedule itself (:class:`~taskq.Snooze`,
:class:`~taskq.RetryAfter`). Everything runs on the ``taskq-demo`` queue, so
a demo worker never picks up another application's jobs.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final

from pydantic import BaseModel, Field

from taskq.actor import Actor, actor
from taskq.app import TaskQ
from taskq.context import Context
from taskq.models import EnqueueArgs, EnqueueItem
from taskq.retry import FixedBackoff
from taskq.signals import RetryAfter, Snooze

__all__ = [
    "ACTORS",
    "BATCH_CHILDREN",
    "DEMO_QUEUE",
    "EVERY_SECOND",
    "MIN_JOBS",
    "FanOut",
    "Flaky",
    "Steps",
    "Work",
    "batch_done",
    "batch_plan",
    "build_app",
    "call_rate_limited_api",
    "doomed",
    "fan_out",
    "flaky",
    "plan",
    "quick",
    "report_progress",
    "tick",
    "wait_for_upstream",
]

DEMO_QUEUE: Final = "taskq-demo"

# Short fixed delays keep the whole demo within seconds; real actors retry
# with the default exponential backoff.
_RETRY_DELAY: Final = timedelta(milliseconds=300)


class Work(BaseModel):
    """A job that "works" for ``ms`` milliseconds."""

    ms: int = Field(ge=0, le=10_000)


class Flaky(Work):
    """Work whose first ``failures`` attempts fail."""

    failures: int = Field(ge=0)


class Steps(BaseModel):
    """Work done in ``steps`` steps of ``ms`` milliseconds, reporting progress after each."""

    steps: int = Field(ge=1)
    ms: int = Field(ge=0, le=10_000)


class FanOut(BaseModel):
    """A job that splits into one sub-job per entry of ``children``."""

    children: list[Work]


@actor(name="demo.quick", queue=DEMO_QUEUE)
async def quick(payload: Work) -> dict[str, int]:
    """Most jobs: a short sleep, then a small JSON result."""
    await asyncio.sleep(payload.ms / 1000)
    return {"slept_ms": payload.ms}


@actor(
    name="demo.flaky", queue=DEMO_QUEUE, max_attempts=3, retry_backoff=FixedBackoff(_RETRY_DELAY)
)
async def flaky(payload: Flaky, ctx: Context) -> str:
    """Fails on its first attempts like a flaky upstream, then succeeds on a retry."""
    await asyncio.sleep(payload.ms / 1000)
    if ctx.attempt <= payload.failures:
        raise ConnectionError(f"upstream reset the connection (attempt {ctx.attempt})")
    return f"succeeded on attempt {ctx.attempt}"


@actor(
    name="demo.doomed", queue=DEMO_QUEUE, max_attempts=2, retry_backoff=FixedBackoff(_RETRY_DELAY)
)
async def doomed(payload: Work) -> None:
    """Always raises: retried until ``max_attempts`` is spent, then ``failed`` for good."""
    await asyncio.sleep(payload.ms / 1000)
    raise ValueError("the input names an account that does not exist")


@actor(name="demo.wait_for_upstream", queue=DEMO_QUEUE)
async def wait_for_upstream(payload: Work, ctx: Context) -> str:
    """Snoozes once (the data is not ready yet): back later, without spending an attempt."""
    if ctx.attempt == 1:
        raise Snooze(0.5)
    await asyncio.sleep(payload.ms / 1000)
    return "upstream was ready"


@actor(name="demo.call_rate_limited_api", queue=DEMO_QUEUE, max_attempts=3)
async def call_rate_limited_api(payload: Work, ctx: Context) -> str:
    """Told to come back later (an HTTP 429's Retry-After): spends an attempt, exact delay."""
    if ctx.attempt == 1:
        raise RetryAfter(0.5)
    await asyncio.sleep(payload.ms / 1000)
    return "accepted"


@actor(name="demo.fan_out", queue=DEMO_QUEUE)
async def fan_out(payload: FanOut, ctx: Context) -> int:
    """Enqueues its sub-jobs, which exist only if this job succeeds."""
    for child in payload.children:
        # Same tags as the parent, so whoever follows the parent finds the children.
        ctx.enqueue(quick, child, tags=ctx.job.tags)
    return len(payload.children)


@actor(name="demo.batch_done", queue=DEMO_QUEUE)
async def batch_done(payload: dict[str, Any], ctx: Context) -> str:
    """A batch's finalizer: runs once the batch ends (all its children finished, or too
    many failed in a row); its metadata names the batch."""
    return f"batch {ctx.job.metadata.get('batch_finalizer_for')} finished"


@actor(name="demo.tick", queue=DEMO_QUEUE)
async def tick(payload: dict[str, Any], ctx: Context) -> str:
    """Fired by the demo's cron schedule (:data:`EVERY_SECOND`) while the demo runs."""
    return f"tick at {ctx.job.scheduled_at:%H:%M:%S}"


EVERY_SECOND: Final = "* * * * * *"
"""The demo schedule's cron expression: every second (croniter's sixth field)."""


@actor(name="demo.report_progress", queue=DEMO_QUEUE)
async def report_progress(payload: Steps, ctx: Context) -> int:
    """Persists its progress after every step, for operators watching a long job."""
    for step in range(1, payload.steps + 1):
        await asyncio.sleep(payload.ms / 1000)
        await ctx.progress({"step": step, "of": payload.steps})
    return payload.steps


ACTORS: Final[Sequence[Actor[..., Any]]] = (
    quick,
    flaky,
    doomed,
    wait_for_upstream,
    call_rate_limited_api,
    fan_out,
    report_progress,
    batch_done,
    tick,
)

_FAN_OUT_CHILDREN: Final = 5
BATCH_CHILDREN: Final = 4
"""The children of the demo's tracked batch, which its finalizer (one more job) ends."""
# Share of the jobs of each kind; the rest are quick jobs.
_SHARES: Final = {"flaky": 0.08, "doomed": 0.04, "snooze": 0.05, "retry_after": 0.05}
_DELAYED_SHARE: Final = 0.03
_CANCELLED_SHARE: Final = 0.03

MIN_JOBS: Final = 20
"""The smallest mix that still holds one job of every kind."""


def build_app(url: str, *, schema: str = "taskq_demo") -> TaskQ:
    """A :class:`~taskq.TaskQ` with the demo's actors on ``url``."""
    return TaskQ(url, schema=schema, actors=ACTORS)


def plan(
    jobs: int, rng: random.Random, *, tags: Sequence[str] = ()
) -> tuple[list[EnqueueItem], list[int]]:
    """The demo's mix of ``jobs`` jobs, counting the sub-jobs the fan-out job will add
    and the batch of :func:`batch_plan`.

    Returns the items to enqueue (``jobs`` minus the sub-jobs and the batch) and the
    indexes of those to cancel while they are still pending. Every job carries ``tags``.
    """
    if jobs < MIN_JOBS:
        raise ValueError(f"the demo needs at least {MIN_JOBS} jobs for its mix, got {jobs}")

    def item(target: Actor[..., Any], payload: BaseModel, **options: Any) -> EnqueueItem:
        return EnqueueItem(
            actor=target.name, payload=payload.model_dump(), options={"tags": list(tags), **options}
        )

    def work() -> Work:
        return Work(ms=rng.randint(5, 60))

    def count(share: float) -> int:
        return max(1, round(jobs * share))

    items = [
        item(fan_out, FanOut(children=[work() for _ in range(_FAN_OUT_CHILDREN)])),
        item(report_progress, Steps(steps=5, ms=100)),
    ]
    items += [
        item(flaky, Flaky(ms=rng.randint(5, 30), failures=rng.choice((1, 2))))
        for _ in range(count(_SHARES["flaky"]))
    ]
    items += [item(doomed, work()) for _ in range(count(_SHARES["doomed"]))]
    items += [item(wait_for_upstream, work()) for _ in range(count(_SHARES["snooze"]))]
    items += [item(call_rate_limited_api, work()) for _ in range(count(_SHARES["retry_after"]))]
    items += [
        item(quick, work(), delay=round(rng.uniform(0.5, 1.5), 3))
        for _ in range(count(_DELAYED_SHARE))
    ]
    first_cancelled = len(items)
    items += [item(quick, work()) for _ in range(count(_CANCELLED_SHARE))]
    cancelled = list(range(first_cancelled, len(items)))
    batch_jobs = BATCH_CHILDREN + 1  # enqueued apart: see batch_plan
    items += [
        item(quick, work()) for _ in range(jobs - _FAN_OUT_CHILDREN - batch_jobs - len(items))
    ]
    # Shuffled, so the kinds interleave in the queue like real traffic; the
    # indexes to cancel follow their items.
    order = list(range(len(items)))
    rng.shuffle(order)
    position = {old: new for new, old in enumerate(order)}
    return [items[i] for i in order], sorted(position[i] for i in cancelled)


def batch_plan(
    app: TaskQ, rng: random.Random, *, tags: Sequence[str] = ()
) -> tuple[list[EnqueueArgs], EnqueueArgs]:
    """The demo's tracked batch: :data:`BATCH_CHILDREN` quick jobs and the finalizer
    (:func:`batch_done`) that runs once they have all finished, as
    ``Backend.enqueue_batch_atomic`` takes them."""
    children = [
        app.client.build_args(quick, Work(ms=rng.randint(5, 60)), tags=list(tags))
        for _ in range(BATCH_CHILDREN)
    ]
    return children, app.client.build_args(batch_done, {}, tags=list(tags))
