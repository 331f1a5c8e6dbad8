"""The Backend protocol, its version, the state machine and the clocks."""

from __future__ import annotations

from taskq.backend._protocol import BACKEND_PROTOCOL_VERSION as BACKEND_PROTOCOL_VERSION
from taskq.backend._protocol import OPTIONAL_PROTOCOLS as OPTIONAL_PROTOCOLS
from taskq.backend._protocol import PROTOCOL_MEMBERS as PROTOCOL_MEMBERS
from taskq.backend._protocol import Backend as Backend
from taskq.backend._protocol import Connection as Connection
from taskq.backend._protocol import LeaderElector as LeaderElector
from taskq.backend._protocol import ScheduleFire as ScheduleFire
from taskq.backend._protocol import SupportsActorDispatch as SupportsActorDispatch
from taskq.backend._protocol import SupportsBatchChildCheck as SupportsBatchChildCheck
from taskq.backend._protocol import SupportsBatchedSuccess as SupportsBatchedSuccess
from taskq.backend._protocol import SupportsBatchFailureCount as SupportsBatchFailureCount
from taskq.backend._protocol import SupportsCredentialReload as SupportsCredentialReload
from taskq.backend._protocol import SupportsCron as SupportsCron
from taskq.backend._protocol import SupportsEnqueuePrecheck as SupportsEnqueuePrecheck
from taskq.backend._protocol import SupportsFleetStats as SupportsFleetStats
from taskq.backend._protocol import SupportsHeldJobs as SupportsHeldJobs
from taskq.backend._protocol import SupportsLateOutcomes as SupportsLateOutcomes
from taskq.backend._protocol import SupportsLeaderElection as SupportsLeaderElection
from taskq.backend._protocol import SupportsLeaseRenewal as SupportsLeaseRenewal
from taskq.backend._protocol import SupportsMaintenanceRuns as SupportsMaintenanceRuns
from taskq.backend._protocol import SupportsMigrate as SupportsMigrate
from taskq.backend._protocol import SupportsPrune as SupportsPrune
from taskq.backend._protocol import SupportsResultExpiry as SupportsResultExpiry
from taskq.backend._protocol import SupportsStaleBatchSweep as SupportsStaleBatchSweep
from taskq.backend._protocol import (
    SupportsStatementCancellations as SupportsStatementCancellations,
)
from taskq.backend._protocol import SupportsTransactions as SupportsTransactions
from taskq.backend._protocol import SupportsUnstartedHandBack as SupportsUnstartedHandBack
from taskq.backend._protocol import SupportsWorkerCancelWake as SupportsWorkerCancelWake
from taskq.backend._protocol import SupportsWorkerRegistry as SupportsWorkerRegistry
from taskq.backend._protocol import check_batch_size as check_batch_size
from taskq.backend._protocol import check_failure_count as check_failure_count
from taskq.backend._protocol import check_protocol_keywords as check_protocol_keywords
from taskq.backend._protocol import check_protocol_version as check_protocol_version
from taskq.backend._protocol import check_retention as check_retention
from taskq.backend._protocol import check_up_to as check_up_to
from taskq.backend._protocol import missing_members as missing_members
from taskq.backend.clock import Clock as Clock
from taskq.backend.clock import FakeClock as FakeClock
from taskq.backend.clock import SystemClock as SystemClock
from taskq.backend.statemachine import ACTIVE_STATUSES as ACTIVE_STATUSES
from taskq.backend.statemachine import TERMINAL_STATUSES as TERMINAL_STATUSES
from taskq.backend.statemachine import VALID_TRANSITIONS as VALID_TRANSITIONS
from taskq.backend.statemachine import CancelPhase as CancelPhase
from taskq.backend.statemachine import JobStatus as JobStatus

__all__ = [
    "ACTIVE_STATUSES",
    "BACKEND_PROTOCOL_VERSION",
    "OPTIONAL_PROTOCOLS",
    "PROTOCOL_MEMBERS",
    "TERMINAL_STATUSES",
    "VALID_TRANSITIONS",
    "Backend",
    "CancelPhase",
    "Clock",
    "Connection",
    "FakeClock",
    "JobStatus",
    "LeaderElector",
    "ScheduleFire",
    "SupportsActorDispatch",
    "SupportsBatchChildCheck",
    "SupportsBatchFailureCount",
    "SupportsBatchedSuccess",
    "SupportsCredentialReload",
    "SupportsCron",
    "SupportsEnqueuePrecheck",
    "SupportsFleetStats",
    "SupportsHeldJobs",
    "SupportsLateOutcomes",
    "SupportsLeaderElection",
    "SupportsLeaseRenewal",
    "SupportsMaintenanceRuns",
    "SupportsMigrate",
    "SupportsPrune",
    "SupportsResultExpiry",
    "SupportsStaleBatchSweep",
    "SupportsStatementCancellations",
    "SupportsTransactions",
    "SupportsUnstartedHandBack",
    "SupportsWorkerCancelWake",
    "SupportsWorkerRegistry",
    "SystemClock",
    "check_batch_size",
    "check_failure_count",
    "check_protocol_keywords",
    "check_protocol_version",
    "check_retention",
    "check_up_to",
    "missing_members",
]
