"""The batch terminal-outcome hook: after the worker writes a tracked batch's child's
end, the batch's failure streak follows it, and the batch aborts or completes.

A batch is tracked when it has a batch row (``enqueue_batch_atomic`` with a
``BatchRow``); a job tagged ``metadata.batch_id`` without one is left alone. A
success resets the streak; a failure adds to it and aborts the batch at its
``failure_threshold`` (its waiting children are cancelled, its finalizer released); any
end completes the batch once no child is left to run. A hook that could not be applied
(the worker died, the database was away) is made up for by the leader's
``complete_stale_batches`` sweep, which completes the batch.
"""

from __future__ import annotations

from typing import Literal
from uuid import UUID

import structlog

from taskq.backend import Backend, SupportsBatchChildCheck
from taskq.models import JobRow

__all__ = ["BatchOutcome", "apply_batch_terminal_outcome"]

BatchOutcome = Literal["succeeded", "failed", "cancelled", "abandoned"]
"""A child's terminal status, as the worker wrote it."""

_log = structlog.get_logger("taskq.worker")


async def apply_batch_terminal_outcome(
    backend: Backend, row: JobRow, outcome: BatchOutcome
) -> None:
    """Apply a child's end (``outcome``, already written) to its batch; nothing for a
    job of no tracked batch. Never raises: a failure is logged and left to the sweep."""
    raw = row.metadata.get("batch_id")
    if raw is None:
        return
    try:
        batch_id = UUID(str(raw))
    except ValueError:  # a tag the user set by hand, naming no batch
        return
    try:
        if outcome == "failed":
            failures, threshold, remaining = await backend.increment_batch_failures(batch_id)
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
                return  # no batch row (tags only), or the batch has ended
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


async def _left(backend: Backend, batch_id: UUID) -> int:
    """0 when no child of the batch is left to run, else a positive number: asked after
    every child's end, so at once where the backend can tell."""
    if isinstance(backend, SupportsBatchChildCheck):
        return int(await backend.batch_has_active_children(batch_id))
    return await backend.count_batch_non_terminal(batch_id)
