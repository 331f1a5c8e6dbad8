"""The lifetimes a dependency can have.

Lives outside :mod:`taskq._di` so that the public facade, the actor
decorator and the worker can name a scope without importing the DI engine.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Scope"]


class Scope(IntEnum):
    """How long a provided value lives, from widest to narrowest.

    A smaller number is a wider (longer-lived) scope. A provider may depend
    on providers of its own scope or a wider one; depending on a narrower
    one is a :class:`~taskq.errors.ScopeViolation`, because the longer-lived
    value would keep a reference to something torn down before it.

    Override the registered scope for one parameter with
    ``Annotated[T, Scope.TRANSIENT]``.

    A worker creates the shared values (PROCESS, LOOP, and THREAD for its event
    loop's thread) its actors need as it starts, before its first job
    (``eager_dependencies``); a sync actor's pool thread creates its THREAD values
    at first use, and TRANSIENT ones are made for each invocation.
    """

    #: One value per worker process, torn down when the worker stops.
    PROCESS = 0
    #: One value per OS thread; sync actors get their own thread's value.
    THREAD = 1
    #: One value per running event loop (connections, pools, clients).
    LOOP = 2
    #: One value per actor invocation, torn down when the invocation ends.
    TRANSIENT = 3
