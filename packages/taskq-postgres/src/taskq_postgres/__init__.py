"""taskq-postgres: TaskQ's PostgreSQL backend, its migrations and its channel names.

Names are imported lazily (module ``__getattr__``), so ``import taskq_postgres``
(e.g. by ``taskq --help`` loading the plugin) does not import asyncpg.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskq_postgres._backend import PostgresBackend as PostgresBackend
    from taskq_postgres._connect import BackendUnavailableError as BackendUnavailableError
    from taskq_postgres._enqueue import TransactionAbortedError as TransactionAbortedError
    from taskq_postgres._migrate import MigrationError as MigrationError
    from taskq_postgres._migrate import MigrationPrivilegeError as MigrationPrivilegeError
    from taskq_postgres._migrate import MigrationStatus as MigrationStatus
    from taskq_postgres._migrate import migrate as migrate
    from taskq_postgres._migrate import migration_status as migration_status
    from taskq_postgres._privileges import InsufficientPrivilegeError as InsufficientPrivilegeError
    from taskq_postgres._privileges import ReadOnlyDatabaseError as ReadOnlyDatabaseError
    from taskq_postgres._rows import LongRunningJobEventsWriter as LongRunningJobEventsWriter
    from taskq_postgres._sync_client import SyncJobsClient as SyncJobsClient
    from taskq_postgres.channels import events_channel as events_channel
    from taskq_postgres.channels import wake_channel as wake_channel
    from taskq_postgres.channels import worker_channel as worker_channel

__all__ = [
    "BackendUnavailableError",
    "InsufficientPrivilegeError",
    "LongRunningJobEventsWriter",
    "MigrationError",
    "MigrationPrivilegeError",
    "MigrationStatus",
    "PostgresBackend",
    "ReadOnlyDatabaseError",
    "SyncJobsClient",
    "TransactionAbortedError",
    "events_channel",
    "migrate",
    "migration_status",
    "wake_channel",
    "worker_channel",
]

_HOMES = {
    "PostgresBackend": "taskq_postgres._backend",
    "BackendUnavailableError": "taskq_postgres._connect",
    "InsufficientPrivilegeError": "taskq_postgres._privileges",
    "ReadOnlyDatabaseError": "taskq_postgres._privileges",
    "LongRunningJobEventsWriter": "taskq_postgres._rows",
    "SyncJobsClient": "taskq_postgres._sync_client",
    "TransactionAbortedError": "taskq_postgres._enqueue",
    "events_channel": "taskq_postgres.channels",
    "wake_channel": "taskq_postgres.channels",
    "worker_channel": "taskq_postgres.channels",
    "MigrationError": "taskq_postgres._migrate",
    "MigrationPrivilegeError": "taskq_postgres._migrate",
    "MigrationStatus": "taskq_postgres._migrate",
    "migrate": "taskq_postgres._migrate",
    "migration_status": "taskq_postgres._migrate",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'taskq_postgres' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
