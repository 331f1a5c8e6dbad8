"""Running the ``taskq`` command as a user would, for the demo and embedded-server tests."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

TASKQ = str(Path(sys.executable).with_name("taskq"))

needs_pgserver = pytest.mark.skipif(
    importlib.util.find_spec("pgserver") is None,
    reason="needs the taskq-postgres[embedded] extra (pgserver)",
)


def user_env() -> dict[str, str]:
    """This environment without the variables that would name a database or schema."""
    return {k: v for k, v in os.environ.items() if k not in ("TASKQ_DSN", "TASKQ_SCHEMA")}


def taskq(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``taskq ARGS`` in ``cwd``, with no DSN in the environment."""
    return subprocess.run(
        [TASKQ, *args],
        check=False,
        cwd=cwd,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _taskq_after(
    prelude: str, args: tuple[str, ...], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``taskq ARGS`` in a fresh interpreter that runs ``prelude`` first."""
    code = f"{prelude}from taskq.cli import main\nimport sys\nsys.exit(main({list(args)!r}))\n"
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=cwd,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def taskq_without_pgserver(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``taskq ARGS`` as if the [embedded] extra were not installed."""
    return _taskq_after("import sys; sys.modules['pgserver'] = None\n", args, cwd, 60)


def expected_statuses(jobs: int) -> dict[str, int]:
    """How the demo's ``jobs`` jobs end: the mix fixes the counts, whatever the random draw."""
    import random

    from taskq.demo import doomed, plan

    items, cancelled = plan(jobs, random.Random(0))
    failed = sum(item.actor == doomed.name for item in items)
    return {
        "succeeded": jobs - failed - len(cancelled),
        "failed": failed,
        "cancelled": len(cancelled),
        "crashed": 0,
        "abandoned": 0,
    }


def taskq_interrupted_while_enqueueing(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``taskq ARGS`` (a demo) sent a real SIGINT as it plans its jobs: before its
    worker, and so the worker's signal handlers, exist."""
    prelude = (
        "import os, signal\n"
        "import taskq.demo\n"
        "plan = taskq.demo.plan\n"
        "def interrupted(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return plan(*args, **kwargs)\n"
        "taskq.demo.plan = interrupted\n"
    )
    return _taskq_after(prelude, args, cwd, 120)
