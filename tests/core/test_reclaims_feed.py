"""``watch_reclaims``: its arguments checked at the call, and a feed that outlives a
database blip."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest
import structlog.testing

from taskq import TaskQ
from taskq.backend.memory import InMemoryBackend
from taskq.models import EnqueueArgs, EventRow
from taskq.reclaims import watch_reclaims


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"poll_interval": timedelta(0)}, "poll_interval must be a positive timedelta"),
        ({"poll_interval": timedelta(seconds=-1)}, "poll_interval must be a positive"),
        ({"poll_interval": 1.0}, "poll_interval must be a positive timedelta, got 1.0"),
        ({"visibility_delay": timedelta(seconds=-1)}, "visibility_delay must be a timedelta >= 0"),
        ({"after_id": -1}, "after_id must be an event id"),
        ({"after_id": "0"}, "after_id must be an event id"),
    ],
)
def test_bad_arguments_are_refused_at_the_call_not_at_the_first_iteration(
    kwargs: dict[str, Any], message: str
) -> None:
    # A zero interval polled the database in a tight loop (9,000 queries a second on
    # Postgres); a float failed with an AttributeError once the feed went idle.
    tq = TaskQ("memory://")
    after_id = kwargs.pop("after_id", 0)
    with pytest.raises(ValueError, match=message):
        tq.watch_reclaims(after_id, **kwargs)


class _Blipping(InMemoryBackend):
    """Its first polls fail as a database restarting fails them."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def poll_reclaim_events(self, *args: Any, **kwargs: Any) -> list[EventRow]:
        if self.failures:
            self.failures -= 1
            raise ConnectionResetError("the server closed the connection")
        return await super().poll_reclaim_events(*args, **kwargs)

    async def check_reclaim_visibility_delay_risk(self, delay: timedelta) -> list[Any]:
        raise PermissionError("permission denied for pg_stat_activity")


async def test_a_transient_poll_failure_is_retried_and_the_feed_goes_on() -> None:
    # The error ended the reader's `async for`, for good, at the first blip.
    backend = _Blipping(failures=3)
    await backend.open()
    job = await backend.enqueue(EnqueueArgs(actor="a"))
    assert await backend.dispatch_batch(uuid4(), ["default"], 1, timedelta(milliseconds=1))
    await asyncio.sleep(0.01)
    assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 1
    feed = watch_reclaims(
        backend, visibility_delay=timedelta(0), poll_interval=timedelta(seconds=1)
    )
    assert isinstance(feed, AsyncGenerator)  # typed an AsyncIterator; closed below
    with structlog.testing.capture_logs() as logs:
        event = await asyncio.wait_for(anext(feed), 5)
    await feed.aclose()
    assert event.job_id == job.id and backend.failures == 0
    retries = [e for e in logs if e["event"] == "taskq.watch-reclaims-retry"]
    assert [e["retry_in"] for e in retries] == [0.1, 0.2, 0.4]
    assert [e["event"] for e in logs].count("taskq.watch-reclaims-risk-check-failed") == 1


def test_importing_taskq_leaves_the_worker_runtime_out() -> None:
    # A producer (a web app) never runs a worker: the feed's retry imported the whole
    # runtime into every `import taskq`.
    import subprocess
    import sys

    code = "import sys, taskq; print('taskq.worker._runtime' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"
