"""An application whose actor needs a model with a slow synchronous provider: it loads
for SLOW_PROVIDER_SECONDS, blocking the event loop (as loading an ML model does), or
refuses to load when SLOW_PROVIDER_FAILS is set (credentials the store refuses)."""

from __future__ import annotations

import os
import time
from typing import Any

from taskq import ProviderRegistry, Scope, TaskQ, actor

loads = 0


class Model:
    """Stands for a model that takes long to load."""

    def __init__(self) -> None:
        global loads
        loads += 1
        self.load = loads


def load_model() -> Model:
    if os.environ.get("SLOW_PROVIDER_FAILS"):
        raise PermissionError("the model store refused the credentials")
    time.sleep(float(os.environ.get("SLOW_PROVIDER_SECONDS", "0")))
    return Model()


@actor(max_attempts=1)
async def infer(payload: dict[str, Any], model: Model) -> dict[str, int]:
    return {"load": model.load, "loads": loads}


providers = ProviderRegistry()
providers.register(Model, load_model, scope=Scope.LOOP)

tq = TaskQ(
    os.environ.get("TASKQ_DSN", "memory://"),
    schema=os.environ.get("TASKQ_SCHEMA", "taskq"),
    actors=[infer],
    providers=providers,
)
