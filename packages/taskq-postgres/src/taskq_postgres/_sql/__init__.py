"""The Postgres backend's SQL, as named constants.

Each constant is a template that names the schema as ``{schema}``; it opens
with an ``-- arbiter:`` comment naming the clock its time predicates use
(always the server's ``clock_timestamp()``, or none). Constants that move a
job out of a status are :class:`TransitionSQL` values tagged with that move,
so a meta-test can check each carries its ``status = 'from'`` guard and that
the move is in ``VALID_TRANSITIONS``. Every value is bound as ``$n``; only
the validated schema name is ever interpolated.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from taskq.backend.statemachine import JobStatus
from taskq.identifiers import check_identifier

__all__ = [
    "FINALIZER_PARKED_AT",
    "JOB_COLUMNS",
    "JSON_JOB_COLUMNS",
    "SCHEMA_TOKEN",
    "TransitionSQL",
    "job_columns",
    "render",
]

SCHEMA_TOKEN: Final = "{schema}"

FINALIZER_PARKED_AT: Final = "timestamptz '9999-01-01 00:00:00+00'"
"""Where a batch finalizer waits (``scheduled``) until its batch ends: no sweep finds it
due (the in-memory backend's ``FINALIZER_PARKED_AT``)."""


def render(template: str, schema: str) -> str:
    """``template`` with ``{schema}`` replaced by the (re-validated) schema name.

    A plain replace, not ``str.format``: SQL is full of braces (``'{}'``).
    """
    return template.replace(SCHEMA_TOKEN, check_identifier(schema))


@dataclass(frozen=True)
class TransitionSQL:
    """A statement that moves jobs out of ``from_`` into one of ``to``.

    The SQL must select its rows with ``status = 'from_'``: that predicate is
    the serialization gate (only one writer's UPDATE can match a row).
    """

    from_: JobStatus
    to: frozenset[JobStatus]
    sql: str

    @classmethod
    def of(cls, from_: JobStatus, to: JobStatus | Iterable[JobStatus], sql: str) -> TransitionSQL:
        """Tag ``sql`` with its move; ``to`` is one status or the possible outcomes."""
        targets = frozenset([to]) if isinstance(to, JobStatus) else frozenset(to)
        return cls(from_, targets, sql)

    def render(self, schema: str) -> str:
        """The statement for ``schema``."""
        return render(self.sql, schema)


JOB_COLUMNS: Final = (
    "id",
    "actor",
    "queue",
    "status",
    "payload",
    "priority",
    "attempt",
    "max_attempts",
    "created_at",
    "scheduled_at",
    "started_at",
    "execution_started_at",
    "finished_at",
    "locked_by_worker",
    "lock_expires_at",
    "cancel_requested_at",
    "cancel_reason",
    "cancel_phase",
    "idempotency_key",
    "identity_key",
    "fairness_key",
    "schedule_to_close_deadline",
    "timeout",
    "result",
    "result_ttl",
    "result_expires_at",
    "progress_seq",
    "progress_state",
    "error_class",
    "error_message",
    "error_traceback",
    "metadata",
    "tags",
    "trace_id",
    "span_id",
)
"""The ``jobs`` columns a :class:`~taskq.models.JobRow` is read from."""

JSON_JOB_COLUMNS: Final = frozenset({"payload", "result", "progress_state", "metadata"})
"""Read as text and decoded in Python, so results do not depend on the json codecs
configured on a caller's connection."""


def job_columns(alias: str) -> str:
    """The select list of :data:`JOB_COLUMNS`, qualified by ``alias``."""
    return ", ".join(
        f"{alias}.{name}::text AS {name}" if name in JSON_JOB_COLUMNS else f"{alias}.{name}"
        for name in JOB_COLUMNS
    )
