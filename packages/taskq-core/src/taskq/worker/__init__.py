"""The worker runtime: producer, consumers, heartbeat and maintenance loops."""

from __future__ import annotations

from taskq.worker._runtime import Worker as Worker

__all__ = ["Worker"]
