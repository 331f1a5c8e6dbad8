"""TaskQ: a Postgres-backed job queue that never loses a job.

The public API is re-exported here; everything else is private.
"""

from __future__ import annotations

from taskq._di.registry import ProviderRegistry as ProviderRegistry
from taskq._scope import Scope as Scope
from taskq.actor import Actor as Actor
from taskq.actor import actor as actor
from taskq.app import TaskQ as TaskQ
from taskq.backend import BACKEND_PROTOCOL_VERSION as BACKEND_PROTOCOL_VERSION
from taskq.backend import Backend as Backend
from taskq.backend import CancelPhase as CancelPhase
from taskq.backend import JobStatus as JobStatus
from taskq.client import JobsClient as JobsClient
from taskq.context import Context as Context
from taskq.errors import BatchAbortedError as BatchAbortedError
from taskq.errors import ConfigurationError as ConfigurationError
from taskq.errors import EmptyBatchError as EmptyBatchError
from taskq.errors import EnqueueOptionsError as EnqueueOptionsError
from taskq.errors import InvalidTransition as InvalidTransition
from taskq.errors import JobFailedError as JobFailedError
from taskq.errors import LeaseLost as LeaseLost
from taskq.errors import MaxPendingExceededError as MaxPendingExceededError
from taskq.errors import MissingProvider as MissingProvider
from taskq.errors import OutcomeNotRecorded as OutcomeNotRecorded
from taskq.errors import PayloadValidationError as PayloadValidationError
from taskq.errors import ProtocolVersionMismatch as ProtocolVersionMismatch
from taskq.errors import ResultExpiredError as ResultExpiredError
from taskq.errors import RetryRefusedError as RetryRefusedError
from taskq.errors import ScopeViolation as ScopeViolation
from taskq.errors import SingletonCollisionError as SingletonCollisionError
from taskq.errors import TaskQError as TaskQError
from taskq.errors import UnknownActorError as UnknownActorError
from taskq.errors import WorkerOwnershipMismatch as WorkerOwnershipMismatch
from taskq.models import ActorConfig as ActorConfig
from taskq.models import AttemptRow as AttemptRow
from taskq.models import BatchCounts as BatchCounts
from taskq.models import BatchFilter as BatchFilter
from taskq.models import BatchRow as BatchRow
from taskq.models import BulkCancelResult as BulkCancelResult
from taskq.models import CancelFlag as CancelFlag
from taskq.models import EnqueueArgs as EnqueueArgs
from taskq.models import EnqueueItem as EnqueueItem
from taskq.models import ErrorInfo as ErrorInfo
from taskq.models import EventRow as EventRow
from taskq.models import JobFilter as JobFilter
from taskq.models import JobRow as JobRow
from taskq.models import QueueConfig as QueueConfig
from taskq.models import ScheduleCreateArgs as ScheduleCreateArgs
from taskq.models import ScheduleRecord as ScheduleRecord
from taskq.models import ScheduleUpdateArgs as ScheduleUpdateArgs
from taskq.plugins import get_plugin_manager as get_plugin_manager
from taskq.plugins import open_backend as open_backend
from taskq.retry import ExponentialBackoff as ExponentialBackoff
from taskq.retry import FixedBackoff as FixedBackoff
from taskq.settings import WorkerSettings as WorkerSettings
from taskq.signals import RetryAfter as RetryAfter
from taskq.signals import Snooze as Snooze
from taskq.signals import TaskQSignal as TaskQSignal

__all__ = [
    "BACKEND_PROTOCOL_VERSION",
    "Actor",
    "ActorConfig",
    "AttemptRow",
    "Backend",
    "BatchAbortedError",
    "BatchCounts",
    "BatchFilter",
    "BatchRow",
    "BulkCancelResult",
    "CancelFlag",
    "CancelPhase",
    "ConfigurationError",
    "Context",
    "EmptyBatchError",
    "EnqueueArgs",
    "EnqueueItem",
    "EnqueueOptionsError",
    "ErrorInfo",
    "EventRow",
    "ExponentialBackoff",
    "FixedBackoff",
    "InvalidTransition",
    "JobFailedError",
    "JobFilter",
    "JobRow",
    "JobStatus",
    "JobsClient",
    "LeaseLost",
    "MaxPendingExceededError",
    "MissingProvider",
    "OutcomeNotRecorded",
    "PayloadValidationError",
    "ProtocolVersionMismatch",
    "ProviderRegistry",
    "QueueConfig",
    "ResultExpiredError",
    "RetryAfter",
    "RetryRefusedError",
    "ScheduleCreateArgs",
    "ScheduleRecord",
    "ScheduleUpdateArgs",
    "Scope",
    "ScopeViolation",
    "SingletonCollisionError",
    "Snooze",
    "TaskQ",
    "TaskQError",
    "TaskQSignal",
    "UnknownActorError",
    "WorkerOwnershipMismatch",
    "WorkerSettings",
    "__version__",
    "actor",
    "get_plugin_manager",
    "open_backend",
]


def __getattr__(name: str) -> str:
    # Read lazily: importlib.metadata is slow enough to notice in CLI start-up.
    if name == "__version__":
        from importlib.metadata import version

        return version("taskq-core")
    raise AttributeError(f"module 'taskq' has no attribute {name!r}")
