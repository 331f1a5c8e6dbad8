"""What a ``late_outcome`` event says, the same on every backend: an attempt's outcome
that its worker could write only after the attempt was no longer its own."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from taskq.backend.storable import clean_text
from taskq.models import ErrorInfo

__all__ = ["late_outcome_detail"]


def late_outcome_detail(
    attempt: int, worker_id: UUID, outcome: str, error: ErrorInfo | None
) -> dict[str, Any]:
    """The event's ``detail``: which attempt, which worker, what it came to and, for a
    failure, the error's class and message (text as a store holds it)."""
    detail: dict[str, Any] = {
        "attempt": attempt,
        "worker_id": str(worker_id),
        "outcome": clean_text(outcome),
    }
    if error is not None:
        detail["error_class"] = clean_text(error.error_class)
        detail["error_message"] = clean_text(error.message)
    return detail
