"""The batch terminal-outcome hook: after a tracked batch's child's end is written, the
batch's failure streak follows it, and the batch aborts or completes.

The worker applies the ends it writes (:func:`apply_batch_terminal_outcome`); the
client and the maintenance leader apply those their cancels and sweeps write (the
backend reports them in ``batch_ends``: :func:`apply_batch_child_ends`), the leader's
sweeps and the worker's hand-backs through :func:`applied_batch_ends`, which applies
them also when the bounded call that wrote them is cut short.

A batch is tracked when it has a batch row (``enqueue_batch_atomic`` with a
``BatchRow``); a job tagged ``metadata.batch_id`` without one is left alone. A success
resets the streak (not one that reached the threshold); a failure adds to it and aborts
the batch at its ``failure_threshold`` (its waiting children are cancelled, its
finalizer released); any end completes the batch once no child is left to run. A hook
that could not be applied (the worker died, the database was away) is made up for by the
leader's ``complete_stale_batches`` sweep, which completes (or aborts) the batch. The
hook never raises: the end it follows was written, whatever becomes of its batch.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Final, Literal
from uuid import UUID

import structlog

from taskq.backend import Backend, SupportsBatchChildCheck, SupportsBatchFailureCount
from taskq.backend.statemachine import JobStatus
from taskq.models import BatchChildEnd, JobRow

__all__ = [
    "BatchOutcome",
    "applied_batch_ends",
    "apply_batch_child_ends",
    "apply_batch_terminal_outcome",
]

BatchOutcome = Literal["succeeded", "failed", "cancelled", "crashed", "abandoned"]
"""A child's terminal status, as it was written."""

_OUTCOMES: Final[dict[JobStatus, BatchOutcome]] = {
    JobStatus.SUCCEEDED: "succeeded",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
    JobStatus.CRASHED: "crashed",
    JobStatus.ABANDONED: "abandoned",
}

_log = structlog.get_logger("taskq.worker")


async def apply_batch_terminal_outcome(
    backend: Backend, row: JobRow, outcome: BatchOutcome
) -> None:
    """Apply a child's end (``outcome``, already written) to its batch; nothing for a
    job of no tracked batch. Never raises: a failure is logged and left to the sweep."""
    await _apply(backend, row.metadata.get("batch_id"), outcome)


async def apply_batch_child_ends(backend: Backend, ends: Iterable[BatchChildEnd]) -> None:
    """Apply the ends a cancel or a sweep wrote and reported (``batch_ends``) to their
    batches, as :func:`apply_batch_terminal_outcome` applies one, in one step per batch
    where the backend can (``SupportsBatchFailureCount``): a sweep that ended many
    children of one batch made a round trip per child. Each failure counts (one per
    child), all of a batch's at once; that step also says whether a child is left, and
    only a batch with no failure among its ends asks that. Never raises."""
    failures: Counter[str] = Counter()
    others: dict[str, BatchOutcome] = {}
    for tag, status in ends:
        outcome = _OUTCOMES.get(status)
        if outcome == "failed":
            failures[tag] += 1
        elif outcome is not None:
            others.setdefault(tag, outcome)
    for tag, count in failures.items():
        # Read after every end was written, its children left stand for the others too.
        await _apply(backend, tag, "failed", count)
    for tag, outcome in others.items():
        if tag not in failures:
            await _apply(backend, tag, outcome)


@asynccontextmanager
async def applied_batch_ends(
    backend: Backend, *, grace: float
) -> AsyncIterator[list[BatchChildEnd]]:
    """A ``batch_ends`` list for the calls in the block, applied to the batches however
    the block ends: it returns, raises (a sweep commits turn by turn, so one that fails
    in a later turn has ended the earlier turns' children), or is cancelled (its
    caller's bound ran out, the worker stops: the ends written still count). The apply
    runs in a task of its own, so a cancel that comes while it runs does not cut it
    short either; once cancelled, it gets ``grace`` seconds more, then is given up
    (logged; the stale-batch sweep completes the batches), so a hung database holds
    the caller no longer than that."""
    ends: list[BatchChildEnd] = []
    try:
        yield ends
    except asyncio.CancelledError:
        if ends:
            await _give_up_after(grace, asyncio.create_task(apply_batch_child_ends(backend, ends)))
        raise
    except Exception:
        await _apply_shielded(backend, ends, grace)
        raise  # the block's error stands: the apply never raises
    await _apply_shielded(backend, ends, grace)


async def _apply_shielded(backend: Backend, ends: list[BatchChildEnd], grace: float) -> None:
    """Apply ``ends`` in a task a cancel of the caller does not cut short at once."""
    if not ends:
        return
    applying = asyncio.create_task(apply_batch_child_ends(backend, ends))
    try:
        await asyncio.shield(applying)
    except asyncio.CancelledError:
        await _give_up_after(grace, applying)
        raise


async def _give_up_after(grace: float, applying: asyncio.Task[None]) -> None:
    """Wait up to ``grace`` for an apply whose caller was cancelled, then cancel it."""
    try:
        await asyncio.wait([applying], timeout=grace)
    finally:  # also when cancelled again meanwhile: no apply outlives its caller
        if not applying.done():
            applying.cancel()
            _log.warning(
                "taskq.batch-ends-not-applied",
                grace=grace,
                hint="the leader's stale-batch sweep completes their batches; their "
                "failures count toward failure_threshold only once no child is left",
            )


async def _apply(backend: Backend, raw: object, outcome: BatchOutcome, count: int = 1) -> None:
    """The hook for ``count`` ends (``outcome``) of children tagged ``raw``: only
    failures come several at once, each counted."""
    if raw is None:
        return
    try:
        batch_id = UUID(str(raw))
    except ValueError:  # a tag the user set by hand, naming no batch
        return
    try:
        if outcome == "failed":
            failures, threshold, remaining = await _add_failures(backend, batch_id, count)
            if threshold is not None and failures >= threshold:
                cancelled = await backend.abort_batch(batch_id)
                _log.info(
                    "taskq.batch-aborted",
                    batch_id=str(batch_id),
                    consecutive_failures=failures,
                    children_cancelled=cancelled,
                )
                return
        else:
            if outcome == "succeeded" and not await backend.reset_batch_failures(batch_id):
                return  # no batch row (tags only), the batch has ended or aborts
            remaining = await _left(backend, batch_id)
        if remaining == 0:
            await backend.complete_batch(batch_id)
    except KeyError:  # no batch row (tags only), or the batch has ended
        return
    except Exception as exc:  # noqa: BLE001 - the job's own outcome stands regardless
        _log.warning(
            "taskq.batch-outcome-not-applied",
            batch_id=str(batch_id),
            outcome=outcome,
            error=repr(exc),
            hint="the leader's stale-batch sweep completes the batch",
        )


async def _add_failures(
    backend: Backend, batch_id: UUID, count: int
) -> tuple[int, int | None, int]:
    """``count`` failures of the batch's children counted: in one call where the backend
    can, else one increment each up to the one that reaches the threshold."""
    if isinstance(backend, SupportsBatchFailureCount):
        return await backend.add_batch_failures(batch_id, count)
    for _ in range(count):
        failures, threshold, remaining = await backend.increment_batch_failures(batch_id)
        if threshold is not None and failures >= threshold:
            break
    return failures, threshold, remaining


async def _left(backend: Backend, batch_id: UUID) -> int:
    """0 when no child of the batch is left to run, else a positive number: asked after
    every child's end, so at once where the backend can tell."""
    if isinstance(backend, SupportsBatchChildCheck):
        return int(await backend.batch_has_active_children(batch_id))
    return await backend.count_batch_non_terminal(batch_id)
