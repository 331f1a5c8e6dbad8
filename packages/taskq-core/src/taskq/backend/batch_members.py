"""Who may join a batch: the rules every backend's ``enqueue_batch_atomic`` applies.

A tracked batch (one with a batch row) counts its children by their
``metadata.batch_id`` tag and releases its finalizer when none is left to run; a
finalizer without a batch row would never be released, and is refused. An
idempotency key can make an insert return a job already stored instead: one of
another batch's, or of none, would not be counted, and the batch could end before it
ran; a finalizer's would be released, and run, in place of the batch's own. Both are
refused, the whole call with them. An untracked batch (tags only) returns the stored
job, as any enqueue does. A key may name a job of this very batch (tagged before the
batch had a row) that has ended: when every child has, no child's end is left to
complete the batch, so the enqueue ends it (:func:`all_ended`), as its last child's end
would have. The same call again (a retry: its reply was lost after it committed)
returns the children the first one stored (:func:`replayed`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final
from uuid import UUID

from taskq.backend.statemachine import TERMINAL_STATUSES
from taskq.models import BatchRow, EnqueueArgs, JobRow

__all__ = [
    "BATCH_TAG",
    "FINALIZER_TAG",
    "all_ended",
    "check_children",
    "check_finalizer",
    "replayed",
]

BATCH_TAG: Final = "batch_id"
"""The ``metadata`` key naming a child's batch."""

FINALIZER_TAG: Final = "batch_finalizer_for"
"""The ``metadata`` key naming the batch a finalizer ends."""


def check_finalizer(finalizer: EnqueueArgs | None, batch_row: BatchRow | None) -> None:
    """A finalizer is the batch's own new job: it comes with the batch row, whose end
    releases it, and takes no idempotency key."""
    if finalizer is not None and batch_row is None:
        raise ValueError(
            "a batch's finalizer needs a batch row (batch_row=None was given): only the "
            "row's completion or abort releases the finalizer, which would stay parked "
            "(scheduled until 9999-01-01) for ever; pass a BatchRow with the batch's id, "
            "or no finalizer"
        )
    if finalizer is not None and finalizer.idempotency_key is not None:
        raise ValueError(
            f"a batch's finalizer takes no idempotency_key (got "
            f"{finalizer.idempotency_key!r}): a job stored under it would be released "
            f"in its place when the batch ends; drop the key: the finalizer is the "
            f"batch's own job"
        )


def check_children(rows: Iterable[JobRow], batch_tag: str) -> None:
    """Every row an insert of a tracked batch's children returned is a child of this
    batch (two of its children may share a key), not a job stored before."""
    for row in rows:
        if row.metadata.get(BATCH_TAG) != batch_tag:
            raise ValueError(
                f"idempotency key {row.idempotency_key!r} of actor {row.actor!r} already "
                f"names job {row.id}, which is not a child of batch {batch_tag}: the batch "
                f"would not wait for it; use a key of this batch's own"
            )


def all_ended(children: Sequence[JobRow]) -> bool:
    """Whether the rows an insert of a tracked batch's children returned have all ended
    (their keys named ended jobs of this batch): the batch is then ended at once, as
    ``complete_batch`` ends it, for no end of a child is left to come and end it (it
    stayed ``active``, its finalizer parked, until the stale-batch sweep, if any).
    A batch of no children is left to that sweep, as the spec has it."""
    return bool(children) and all(row.status in TERMINAL_STATUSES for row in children)


def replayed(
    children: Sequence[EnqueueArgs],
    batch_tag: str,
    batch_row: BatchRow | None,
    finalizer: EnqueueArgs | None,
    stored_row: BatchRow | None,
    by_id: Mapping[UUID, JobRow],
    by_key: Mapping[tuple[str, str], JobRow],
) -> list[JobRow] | None:
    """The stored children, in the order of ``children``, when this call is the one
    that stored batch ``batch_tag`` made again (a retry whose first reply was lost);
    else None, and the call's own error stands ("already exists").

    The same call: the batch row was stored as asked (its queue, size and threshold;
    none when none is asked), with this finalizer (by id), and every child names a
    stored child of this batch, by its id or else by its idempotency key (an item
    rebuilt for the retry has another id). ``by_id`` and ``by_key`` hold the stored jobs
    the children name."""
    if (batch_row is None) != (stored_row is None):
        return None
    if batch_row is not None and stored_row is not None:
        asked = (batch_row.queue, batch_row.expected_size, batch_row.failure_threshold)
        if asked != (stored_row.queue, stored_row.expected_size, stored_row.failure_threshold):
            return None
        finalizer_id = finalizer.id if finalizer is not None else batch_row.finalizer_job_id
        if stored_row.finalizer_job_id != finalizer_id:
            return None
    rows: list[JobRow] = []
    for args in children:
        row = by_id.get(args.id)
        if row is None and args.idempotency_key is not None:
            row = by_key.get((args.actor, args.idempotency_key))
        if row is None or row.metadata.get(BATCH_TAG) != batch_tag:
            return None
        rows.append(row)
    return rows
