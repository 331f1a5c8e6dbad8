"""An application whose one provider never finishes its teardown (a client whose close
waits on a peer that is gone): the shutdown watchdog must still end the worker."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from taskq import ProviderRegistry, Scope, TaskQ, actor


class Client:
    """Stands for any resource with a close step."""


async def open_client() -> AsyncIterator[Client]:
    yield Client()
    await asyncio.sleep(3600)  # the close that never returns


@actor
async def uses_client(payload: dict[str, Any], client: Client) -> str:
    return "ok"


providers = ProviderRegistry()
providers.register(Client, open_client, scope=Scope.LOOP)

tq = TaskQ(
    os.environ.get("TASKQ_DSN", "memory://"),
    schema=os.environ.get("TASKQ_SCHEMA", "taskq"),
    actors=[uses_client],
    providers=providers,
)
