"""An application whose backend refuses its first opens (a database still starting)."""

from __future__ import annotations

from taskq import TaskQ
from taskq.backend.memory import InMemoryBackend


class LateBackend(InMemoryBackend):
    """Raises ``error`` from its first ``refusals`` opens; counts the opens until one
    succeeds (later ones are no-ops, as for every backend)."""

    def __init__(self) -> None:
        super().__init__()
        self.refusals = 0
        self.error: Exception = ConnectionRefusedError("connection refused")
        self.opens = 0
        self._open = False

    async def open(self) -> None:
        if self._open:
            return
        self.opens += 1
        if self.opens <= self.refusals:
            raise self.error
        await super().open()
        self._open = True


backend = LateBackend()
tq = TaskQ("memory://", backend=backend)
