"""A failed attempt's backoff counts the attempts the job used, not the re-runs that
used none (snoozes, hand-backs), on every backend."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from taskq import Context, JobStatus, Snooze, TaskQ, actor
from taskq_testing import run_until_idle

pytestmark = pytest.mark.postgres

BACKOFF_CALLS: list[int] = []


def _recorded(attempt: int) -> timedelta:
    BACKOFF_CALLS.append(attempt)
    return timedelta(0)


@actor(name="backoff.poller", max_attempts=3, retry_backoff=_recorded)
async def poller(payload: dict[str, Any], ctx: Context) -> None:
    # Polls ("not ready yet") by snoozing, then fails for real: twice, then succeeds.
    runs = payload["snoozes"]
    if ctx.attempt <= runs:
        raise Snooze(0)
    if ctx.attempt <= runs + 2:
        raise RuntimeError(f"failure at attempt {ctx.attempt}")


async def test_snoozes_do_not_lengthen_the_backoff_of_later_failures(taskq_backend: Any) -> None:
    # Ten snoozes made the first real failure's backoff that of an eleventh attempt:
    # 17 minutes with the default exponential one, not a second.
    BACKOFF_CALLS.clear()
    tq = TaskQ("memory://", actors=[poller], backend=taskq_backend)
    async with tq:
        job = await tq.client.enqueue(poller, {"snoozes": 10})
        await run_until_idle(tq, timeout=20)
        row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.SUCCEEDED
    assert row.attempt == 13
    assert BACKOFF_CALLS == [1, 2]
