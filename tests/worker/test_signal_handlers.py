"""The stop signals' escalation, as ``install_signal_handlers`` sets it up."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import TYPE_CHECKING, cast

import pytest

from taskq.worker import signal_handlers

if TYPE_CHECKING:
    from taskq.worker import Worker


class _Worker:
    """Records the calls the signals make."""

    def __init__(self) -> None:
        self.stopped = asyncio.Event()
        self.escalated = asyncio.Event()

    def stop(self) -> None:
        self.stopped.set()

    def escalate(self) -> None:
        self.escalated.set()

    def reload(self) -> None:
        pass


class _GoneStderr:
    """stderr piped to a log shipper that is gone."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


async def test_the_third_stop_signal_exits_1_with_stderr_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its line's BrokenPipeError came before os._exit: the loop logged the callback's
    # error, and no number of signals ended the worker.
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[int] = loop.create_future()
    monkeypatch.setattr(os, "_exit", exited.set_result)  # the os signal_handlers calls
    monkeypatch.setattr(sys, "stderr", _GoneStderr())
    worker = _Worker()
    signal_handlers.install_signal_handlers(cast("Worker", worker), "taskq-worker")
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(worker.stopped.wait(), 5)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(worker.escalated.wait(), 5)
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(exited, 5) == 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
            loop.remove_signal_handler(sig)
