"""taskq-testing: the pytest plugin, the backend conformance suite, and a worker run
until idle for tests of an application's actors.

Names are imported lazily (module ``__getattr__``): the pytest plugin loads in
every pytest run, and the worker is needed only by the tests that run one.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskq_testing.worker import TEST_SETTINGS as TEST_SETTINGS
    from taskq_testing.worker import run_until_idle as run_until_idle

__all__ = ["TEST_SETTINGS", "run_until_idle"]

_HOMES = {"TEST_SETTINGS": "taskq_testing.worker", "run_until_idle": "taskq_testing.worker"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'taskq_testing' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value
