"""Real `taskq-worker` processes for the leader tests, with their logs in files."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taskq_testing.postgres import PgSchema

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FAST_ENV = {
    "TASKQ_POLL_INTERVAL": "100ms",
    "TASKQ_HEARTBEAT_INTERVAL": "100ms",
    "TASKQ_LOCK_LEASE": "2s",
    "TASKQ_LEADER_LEASE": "1s",
    "TASKQ_MAINTENANCE_INTERVAL": "50ms",
    "TASKQ_CRON_INTERVAL": "100ms",
    "TASKQ_TERMINATION_GRACE_PERIOD": "5s",
}


class WorkerProc:
    """One worker process; ``events()`` parses its JSON log lines so far."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and (name is None or record.get("event") == name):
                found.append(record)
        return found

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)


Spawn = Callable[..., WorkerProc]


@pytest.fixture
def spawn(pg_schema: PgSchema, tmp_path: Path) -> Iterator[Spawn]:
    """Start `taskq-worker tests.apps.basic:tq ARGS` with the fast settings (plus
    ``env``); every process is killed (and continued, if stopped) at the end."""
    procs: list[WorkerProc] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProc:
        base = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
        full = {
            **base,
            **FAST_ENV,
            "TASKQ_DSN": pg_schema.dsn,
            "TASKQ_SCHEMA": pg_schema.name,
            **(env or {}),
        }
        log = tmp_path / f"worker{len(procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(BIN / "taskq-worker"), "tests.apps.basic:tq", *args],
                cwd=REPO,
                env=full,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        worker = WorkerProc(proc, log)
        procs.append(worker)
        return worker

    yield start
    for worker in procs:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGCONT)
            worker.proc.kill()
        worker.proc.wait(timeout=10)


async def wait_until(
    check: Callable[[], Awaitable[Any]], seconds: float = 15, step: float = 0.02
) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(step)
    raise AssertionError(f"condition not met within {seconds}s")
