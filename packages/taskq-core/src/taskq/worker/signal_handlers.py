"""The process signals a running worker answers (API.md section 6)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING

from taskq.cli._exit_codes import EXIT_ERROR
from taskq.worker._stacks import dump_task_stacks

if TYPE_CHECKING:
    from taskq.worker._runtime import Worker

__all__ = ["install_signal_handlers"]


def install_signal_handlers(worker: Worker, program: str) -> None:
    """On the running loop: SIGTERM/SIGINT escalate (drain, then force, then exit 1);
    SIGHUP reloads credentials; SIGUSR2 dumps task stacks. ``program`` names the
    process in the one line the third signal prints."""
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_stop_signal() -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            worker.stop()
        elif signals_seen == 2:
            worker.escalate()
        else:  # the third: stop now (the orchestrator's job is the supervisor's now)
            # Not with stderr gone (a log shipper's pipe): the error skipped the exit,
            # and no signal ended the worker.
            with contextlib.suppress(OSError):
                print(f"{program}: third signal, exiting at once", file=sys.stderr)
                sys.stderr.flush()
            os._exit(EXIT_ERROR)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop_signal)
    loop.add_signal_handler(signal.SIGUSR2, lambda: dump_task_stacks("sigusr2"))
    loop.add_signal_handler(signal.SIGHUP, worker.reload)
