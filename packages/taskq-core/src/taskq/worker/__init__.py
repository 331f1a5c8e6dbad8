"""The worker runtime: producer, consumers, heartbeat and maintenance loops."""

from __future__ import annotations

from taskq.cli._exit_codes import EXIT_WATCHDOG as EXIT_WATCHDOG
from taskq.worker._runtime import Worker as Worker

__all__ = ["EXIT_WATCHDOG", "Worker"]
