"""The errors ``wait_for_result`` raises carry the job's row wherever they go."""

from __future__ import annotations

import copy
import pickle
from datetime import UTC, datetime
from uuid import uuid4

import pytest

from taskq.backend.statemachine import JobStatus
from taskq.errors import JobFailedError, ResultExpiredError
from taskq.models import ErrorInfo, JobRow


def _row(status: JobStatus, **fields: object) -> JobRow:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    return JobRow.model_validate(
        {
            "id": uuid4(),
            "actor": "a",
            "queue": "q",
            "status": status,
            "payload": {},
            "priority": 0,
            "attempt": 1,
            "max_attempts": 1,
            "created_at": when,
            "scheduled_at": when,
            **fields,
        }
    )


@pytest.mark.parametrize(
    "error",
    [
        JobFailedError(_row(JobStatus.FAILED, error=ErrorInfo(error_class="E", message="m"))),
        ResultExpiredError(
            _row(JobStatus.SUCCEEDED, result_expires_at=datetime(2030, 1, 2, tzinfo=UTC))
        ),
    ],
    ids=["failed", "expired"],
)
def test_a_result_error_survives_pickling_and_copying(
    error: JobFailedError | ResultExpiredError,
) -> None:
    # Sent to another process (a process pool's future) or copied, it raised AttributeError:
    # rebuilt from its message, where its row goes.
    error.add_note("seen by the caller")
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(again) is type(error)
        assert (again.row, str(again), again.__notes__) == (
            error.row,
            str(error),
            ["seen by the caller"],
        )
