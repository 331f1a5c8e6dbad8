"""``Context``: what a running actor knows about its job (``ctx`` parameter)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal
from uuid import UUID

import structlog

from taskq.args_builder import AscendingIds
from taskq.backend.storable import stored_json
from taskq.models import EnqueueArgs, JobRow

if TYPE_CHECKING:
    from taskq.client import ActorRef, JobsClient

__all__ = ["CancelEvent", "Context"]


class CancelEvent(asyncio.Event):
    """``ctx.cancel_event``: an :class:`asyncio.Event` that also remembers whether the
    actor saw it set (``is_set()`` returned True, or ``wait()`` returned).

    An actor that returns after seeing it stopped on request: its job ends
    ``cancelled`` (a user's cancel) or goes back for another attempt (a shutdown).
    One that returns without having looked finished its work, and its result
    stands: handed back, it would run again in full.
    """

    def __init__(self) -> None:
        super().__init__()
        self._seen = False

    def is_set(self) -> bool:
        """Whether a stop was requested (and, if so, the actor has now seen it)."""
        requested = super().is_set()
        if requested:
            self._seen = True
        return requested

    async def wait(self) -> Literal[True]:
        """Wait until a stop is requested (the actor has then seen it)."""
        await super().wait()
        self._seen = True
        return True

    def requested(self) -> bool:
        """Whether a stop was requested, without counting as the actor seeing it."""
        return super().is_set()

    @property
    def seen(self) -> bool:
        """Whether the actor saw the request."""
        return self._seen


class Context:
    """The job being executed, its cancellation signal, progress, logger and sub-jobs.

    ``cancel_event`` is set when someone asks to cancel the job (or a shutdown asks
    it to stop): check it between units of work and return early to end the job
    ``cancelled`` (handed back for another attempt, in a shutdown). An actor that
    never looks at it and returns has finished: its result stands.
    """

    def __init__(
        self,
        job: JobRow,
        log: structlog.typing.FilteringBoundLogger,
        client: JobsClient,
        record_progress: Any,
    ) -> None:
        self.job = job
        self.cancel_event = CancelEvent()
        self.log = log
        self.progress_seq = job.progress_seq
        self.progress_state: dict[str, Any] | None = job.progress_state
        self.subjobs: list[EnqueueArgs] = []
        self._subjob_ids = AscendingIds()
        self._client = client
        self._record_progress = record_progress

    @property
    def job_id(self) -> UUID:
        """The job's id."""
        return self.job.id

    @property
    def attempt(self) -> int:
        """This attempt's number (1 for the first run)."""
        return self.job.attempt

    async def progress(self, state: dict[str, Any]) -> None:
        """Persist progress now; each call gets a higher ``progress_seq`` (readers keep the
        newest, so a late write can never roll progress back). ``ValueError`` for a
        value no backend can store (a NaN), ``TypeError`` for one that is no mapping: the
        progress stays as it was."""
        # A job's progress is a JSON object (JobRow.progress_state): a string or a list,
        # stored, made rows that failed their own model on the way back.
        if not isinstance(state, Mapping):
            raise TypeError(
                f"progress must be a dict (a JSON object), got {type(state).__name__}: "
                f'wrap the value, e.g. ctx.progress({{"done": 5}})'
            )
        # Checked before it becomes this attempt's progress, which every outcome write
        # stores too: kept, it failed the job for good, even when the actor carried on.
        # A copy as stored: what the actor changes later is not its progress.
        stored = stored_json(dict(state))
        self.progress_seq += 1
        self.progress_state = stored
        await self._record_progress(self.progress_seq, self.progress_state)

    def enqueue(self, actor: ActorRef, payload: Any, **options: Any) -> EnqueueArgs:
        """Enqueue a sub-job that exists only if this job succeeds.

        The payload is validated now; the job is written together with this
        job's success (one transaction on Postgres) and dropped on failure. Of one
        priority on a strict FIFO queue, the sub-jobs run in the order enqueued.
        """
        if options.get("job_id") is None:
            options["job_id"] = self._subjob_ids()
        args = self._client.build_args(actor, payload, **options)
        self.subjobs.append(args)
        return args
