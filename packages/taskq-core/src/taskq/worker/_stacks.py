"""``dump_task_stacks``: the one implementation behind every task-stack dump.

Used by SIGUSR2, the ``/tasks`` health route, watchdog trips and the
shutdown straggler log. Each live asyncio task becomes one structured record
(name, coroutine, await sites as file:line) plus a raw stderr line, so the
dump survives a broken logging pipeline. No locals or payload values are
included: only code structure and file paths.
"""

from __future__ import annotations

import asyncio
import sys

import structlog

__all__ = ["describe_tasks", "dump_task_stacks"]

_log = structlog.get_logger("taskq.worker")


_MAX_DEPTH = 16


def _await_sites(task: asyncio.Task[object]) -> list[str]:
    """Where ``task`` waits, innermost first: the chain of coroutines each awaits.

    ``Task.get_stack`` gives a suspended task's outermost frame only, which names the
    loop's wrapper, never the statement it is stuck in.
    """
    sites: list[str] = []
    link: object = task.get_coro()
    for _ in range(_MAX_DEPTH):
        frame = getattr(link, "cr_frame", None) or getattr(link, "gi_frame", None)
        if frame is None:
            break
        sites.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")
        link = getattr(link, "cr_await", None) or getattr(link, "gi_yieldfrom", None)
    if not sites:  # running, or not a coroutine: what the task itself reports
        sites = [f"{f.f_code.co_filename}:{f.f_lineno}" for f in task.get_stack(limit=8)]
    return sites[::-1]


def describe_tasks(tasks: set[asyncio.Task[object]] | None = None) -> list[dict[str, object]]:
    """Every live task (default: of the running loop): name, coroutine, await sites
    (innermost first)."""
    described = []
    for task in tasks if tasks is not None else asyncio.all_tasks():
        frames = _await_sites(task)
        coro = task.get_coro()
        described.append(
            {
                "name": task.get_name(),
                "coro": getattr(coro, "__qualname__", repr(coro)),
                "await_sites": frames,
            }
        )
    return sorted(described, key=lambda t: str(t["name"]))


def dump_task_stacks(reason: str, *, detector: str | None = None) -> int:
    """Log one record per live task and echo it raw to stderr; returns the task count."""
    tasks = describe_tasks()
    for task in tasks:
        # `task`, not `name`: structlog routed to the standard library with its fields
        # as `extra` refused `name` (a LogRecord attribute), and the dump died there.
        _log.warning(
            "taskq.task-stack",
            reason=reason,
            detector=detector,
            task=task["name"],
            coro=task["coro"],
            await_sites=task["await_sites"],
        )
        print(
            f"taskq task-stack [{reason}] {task['name']} {task['coro']} "
            f"at {' <- '.join(map(str, task['await_sites']))}",  # type: ignore[call-overload]
            file=sys.stderr,
        )
    sys.stderr.flush()
    return len(tasks)
