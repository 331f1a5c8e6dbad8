"""The worker's start record: what it names, and how much of it."""

from __future__ import annotations

import structlog

from taskq import TaskQ, WorkerSettings, actor
from taskq.worker import Worker
from taskq_testing import TEST_SETTINGS


async def test_the_start_record_names_at_most_fifty_actors_and_queues() -> None:
    # 2,000 actors made a 42 KB line, which log shippers split (Docker at 16 KB).
    async def work(payload: dict[str, int]) -> None:
        return None

    many = [actor(name=f"many.a{i:02}", queue=f"q{i:02}")(work) for i in range(60)]
    tq = TaskQ("memory://", actors=many)
    async with tq:
        queues = ",".join(f"q{i:02}" for i in range(60))
        flags = {**TEST_SETTINGS, "queues": queues, "until_idle": "true"}
        with structlog.testing.capture_logs() as logs:
            await Worker(tq, WorkerSettings.load(flags, env={})).run()
    [started] = [e for e in logs if e["event"] == "taskq.worker-started"]
    assert started["actors"] == [f"many.a{i:02}" for i in range(50)]
    assert started["actors_not_shown"] == 10
    assert len(started["queues"]) == 50 and started["queues_not_shown"] == 10
