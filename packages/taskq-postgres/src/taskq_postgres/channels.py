"""The LISTEN/NOTIFY channel names of a TaskQ schema.

Each schema has its own channels, so TaskQ instances in different schemas of
one database never wake each other:

=================================  =======================================================
``wake_channel(schema)``           ``taskq_wake_{schema}``: new work may be dispatchable
                                   (empty payload)
``events_channel(schema)``         ``taskq_events_{schema}``: cancel requests, JSON
                                   ``{"type": "cancel", "worker_id": ..., "job_id": ...}``
``worker_channel(schema, id)``     ``taskq_worker_{schema}_{worker id hex}``: the same
                                   payload, for that worker only
=================================  =======================================================

Names use the schema as Postgres folds it (lower case). Postgres limits a
channel name to 63 bytes, and the two ends disagree past it: ``pg_notify``
raises "channel name too long" while ``LISTEN`` silently truncates. The
schema-name limit (``taskq.identifiers.MAX_SCHEMA_NAME_BYTES``) keeps the
first two within it; a worker channel that would not fit keeps its first 46
characters and ends in ``_`` plus 16 hex digits of the MD5 of the full name
(the SQL that notifies workers derives the same name, see
``taskq_postgres._sql.cancel.WORKER_CHANNEL_SQL``).
"""

from __future__ import annotations

import hashlib
from typing import Final
from uuid import UUID

from taskq.identifiers import MAX_IDENTIFIER_BYTES, validate_schema_name

__all__ = ["events_channel", "wake_channel", "worker_channel", "worker_channel_prefix"]

_HASH_DIGITS: Final = 16
_KEPT_HEAD: Final = MAX_IDENTIFIER_BYTES - _HASH_DIGITS - 1


def wake_channel(schema: str) -> str:
    """The channel that wakes every dispatcher of ``schema``."""
    return f"taskq_wake_{validate_schema_name(schema)}"


def events_channel(schema: str) -> str:
    """The fleet-wide event channel of ``schema`` (cancel requests)."""
    return f"taskq_events_{validate_schema_name(schema)}"


def worker_channel_prefix(schema: str) -> str:
    """``taskq_worker_{schema}_``: a worker channel before its (possible) shortening."""
    return f"taskq_worker_{validate_schema_name(schema)}_"


def worker_channel(schema: str, worker_id: UUID) -> str:
    """The channel of one worker of ``schema``, at most 63 bytes long."""
    full = worker_channel_prefix(schema) + worker_id.hex
    if len(full) <= MAX_IDENTIFIER_BYTES:
        return full
    digest = hashlib.md5(full.encode(), usedforsecurity=False).hexdigest()
    return f"{full[:_KEPT_HEAD]}_{digest[:_HASH_DIGITS]}"
