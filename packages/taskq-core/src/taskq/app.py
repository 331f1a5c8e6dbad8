"""``TaskQ``: the application object tying a backend, actors and providers together."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from types import TracebackType
from typing import Any, Final, Self

import structlog

from taskq._di import ProviderRegistry
from taskq._dsn import redact, same_login
from taskq.actor import Actor, actors_by_name
from taskq.backend import Backend
from taskq.client import JobsClient
from taskq.models import EventRow, QueueConfig
from taskq.plugins import open_backend
from taskq.reclaims import watch_reclaims
from taskq.settings import WorkerSettings

__all__ = ["TaskQ"]

_log = structlog.get_logger("taskq.app")

_SECRET_OPTIONS: Final = ("password", "password_file")
"""Backend options that hold (or lead to) a password: meant for the server the code's URL
names, not for whichever one a command is pointed at."""


class TaskQ:
    """An application: ``TaskQ("postgresql://…/app", schema="taskq", actors=[...])``.

    ``async with tq:`` opens the backend and nothing else; ``tq.client``
    enqueues and inspects jobs; ``taskq-worker module:tq`` runs the actors.
    ``providers`` supplies the actors' injected dependencies; ``queues``
    configures queue modes (round-robin fairness) and fleet-wide caps.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = "taskq",
        actors: Iterable[Actor[..., Any]] = (),
        providers: ProviderRegistry | None = None,
        queues: Iterable[QueueConfig] = (),
        backend: Backend | None = None,
        **backend_options: Any,
    ) -> None:
        self.url = url
        self.schema = schema
        self.actors: dict[str, Actor[..., Any]] = actors_by_name(actors)
        self.providers = providers if providers is not None else ProviderRegistry()
        self.queues = list(queues)
        self.backend_options = dict(backend_options)
        """Options given for the backend (kept so a worker can rebuild it)."""
        self.backend: Backend = (
            backend
            if backend is not None
            else self._backend_from(url, schema, self.backend_options)
        )
        self.backend_from_url = backend is None
        """Whether the backend was built from ``url`` (a worker may build it anew with its
        settings), not given as an instance (which a worker uses as it is)."""
        self.client = JobsClient(self.backend, self.actors)
        # What the code gave, which a worker's settings override (see _retarget).
        self._code_url, self._code_schema = url, schema
        self._code_options = dict(backend_options)

    @staticmethod
    def _backend_from(url: str, schema: str, options: dict[str, Any]) -> Backend:
        # The fleet's TASKQ_* backend tunables apply here as in its workers (a reclaim
        # feed's visibility delay, poll-only), and win there as here.
        return open_backend(
            url, schema=schema, **{**options, **WorkerSettings.backend_options_from_env()}
        )

    def _retarget(self, url: str | None, schema: str | None, options: dict[str, Any]) -> None:
        """Build the backend anew, before it is opened, on ``url`` and ``schema`` (None:
        the ones the code gave) with ``options`` over the code's (a worker's settings),
        and the client with it. In place: the actors' code reaches the app through its
        module (``tq.client`` in a job), and a copy left that one unopened, so every such
        call failed in the worker alone. From the code's values each time, so that a
        second worker started in the same process (a test's) starts from them too."""
        self.url, self.schema = url or self._code_url, schema or self._code_schema
        self.backend_options = {**self._code_options_for(self.url), **options}
        self.backend = self._backend_from(self.url, self.schema, self.backend_options)
        self.client = JobsClient(self.backend, self.actors)

    def _code_options_for(self, url: str) -> dict[str, Any]:
        """The code's backend options for a backend on ``url``: its password or
        password_file only if every server ``url`` names is one the code's URL names, and
        ``url`` logs in as the same user (as .pgpass matches per host, port and user).
        Sent wherever ``--dsn`` or ``TASKQ_DSN`` pointed, they gave that server a
        password it was never meant to read."""
        dropped = [name for name in _SECRET_OPTIONS if self._code_options.get(name) is not None]
        if not dropped or same_login(url, self._code_url):
            return dict(self._code_options)
        _log.warning(
            "taskq.code-password-dropped",
            dropped=dropped,
            dsn=redact(url),
            code_dsn=redact(self._code_url),
            hint="the application's code gives the password for the server and user of its "
            "own URL, not this one: give this login's in the DSN, PGPASSWORD or ~/.pgpass",
        )
        return {name: value for name, value in self._code_options.items() if name not in dropped}

    def watch_reclaims(
        self,
        after_id: int = 0,
        *,
        poll_interval: timedelta = timedelta(seconds=5),
        visibility_delay: timedelta | None = None,
    ) -> AsyncIterator[EventRow]:
        """Crash-reclaim events after ``after_id``, in id order, as they happen (woken
        by the backend's wake channel, ``poll_interval`` as the fallback). At least
        once: persist ``event.event_id`` as your cursor after processing each. A
        transient database error is retried; an event goes when its job is pruned (see
        :func:`taskq.reclaims.watch_reclaims`)."""
        return watch_reclaims(
            self.backend,
            after_id,
            poll_interval=poll_interval,
            visibility_delay=visibility_delay,
        )

    async def __aenter__(self) -> Self:
        await self.backend.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.backend.close()
