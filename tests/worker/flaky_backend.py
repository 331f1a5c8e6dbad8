"""In-memory backends that fail while the "database" is away."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from taskq.backend.memory import InMemoryBackend


class WritesFailWhileAway(InMemoryBackend):
    """Success and abandon writes raise a transient error while ``away`` is set;
    ``failed_writes`` counts them and ``failed`` is set at the first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.away = False
        self.failed_writes = 0
        self.failed = asyncio.Event()

    def _check(self) -> None:
        if self.away:
            self.failed_writes += 1
            self.failed.set()
            raise ConnectionRefusedError("database away")

    async def mark_succeeded(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return await super().mark_succeeded(*args, **kwargs)

    async def mark_succeeded_many(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return await super().mark_succeeded_many(*args, **kwargs)

    async def mark_abandoned(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return await super().mark_abandoned(*args, **kwargs)


class CutOff(InMemoryBackend):
    """Every call the worker makes fails while ``away`` is set, as across a partition
    (the subscriptions stay: they only wake)."""

    away = False

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name.startswith("_") or not inspect.iscoroutinefunction(attr):
            return attr
        if not super().__getattribute__("away"):
            return attr

        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionRefusedError("database unreachable")

        return refused


class FailuresFailWhileAway(InMemoryBackend):
    """``mark_failed_or_retry`` (a failure's write, a write-off past a limit) raises a
    transient error while ``away``, which it starts as; ``tried`` is set at the first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.away = True
        self.tried = asyncio.Event()

    async def mark_failed_or_retry(self, *args: Any, **kwargs: Any) -> Any:
        if self.away:
            self.tried.set()
            raise ConnectionRefusedError("database away")
        return await super().mark_failed_or_retry(*args, **kwargs)
