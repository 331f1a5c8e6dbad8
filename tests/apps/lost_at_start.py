"""An application whose backend loses its connection while the worker starts."""

from __future__ import annotations

from taskq import TaskQ
from taskq.backend.memory import InMemoryBackend


class _LostAtStart(InMemoryBackend):
    async def open(self) -> None:
        await super().open()
        raise ConnectionResetError("connection reset by peer")


tq = TaskQ("memory://", backend=_LostAtStart())
