"""Meta-tests binding the conformance suite to the protocol and the state machine."""

from __future__ import annotations

import inspect

import pytest

from taskq.backend import (
    OPTIONAL_PROTOCOLS,
    Backend,
    SupportsBatchedSuccess,
    SupportsEnqueuePrecheck,
    SupportsHeldJobs,
    SupportsUnstartedHandBack,
    SupportsWorkerCancelWake,
)
from taskq.backend._protocol import SupportsPrune
from taskq.backend.memory import InMemoryBackend
from taskq_postgres import PostgresBackend
from taskq_testing.conformance import BackendConformance
from taskq_testing.conformance._support import COVERS_ATTRIBUTE
from taskq_testing.conformance._transitions import BACKEND_DRIVEN_EDGES, DRIVES


def _protocol_members() -> set[str]:
    return {
        name
        for protocol in (Backend, *OPTIONAL_PROTOCOLS)
        for name, value in vars(protocol).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }


def _covered() -> set[str]:
    return {
        member
        for name in dir(BackendConformance)
        if name.startswith("test")
        for member in getattr(getattr(BackendConformance, name), COVERS_ATTRIBUTE, ())
    }


def test_the_protocol_has_the_members_this_check_expects() -> None:
    # Guards the filter below: a change in how Protocol classes store members must
    # not silently shrink the set to check.
    members = _protocol_members()
    assert {"enqueue", "dispatch_batch", "subscribe_wake", "prune_old_batches"} <= members
    assert {"fire_due_schedules", "leader_elector", "mark_succeeded_many"} <= members
    assert "BACKEND_PROTOCOL_VERSION" not in members


def test_every_protocol_member_has_a_conformance_test() -> None:
    missing = _protocol_members() - _covered()
    assert not missing, f"Backend members no conformance test covers: {sorted(missing)}"


def test_every_backend_driven_transition_has_a_case() -> None:
    assert set(DRIVES) == BACKEND_DRIVEN_EDGES


@pytest.mark.parametrize("backend_type", [InMemoryBackend, PostgresBackend])
def test_the_builtin_backends_implement_the_optional_writes(
    backend_type: type[InMemoryBackend | PostgresBackend],
) -> None:
    # The suite skips an optional protocol's tests on a backend without it: the
    # built-in ones must not lose theirs unnoticed.
    assert issubclass(backend_type, SupportsBatchedSuccess)
    assert issubclass(backend_type, SupportsUnstartedHandBack)
    assert issubclass(backend_type, SupportsWorkerCancelWake)
    assert issubclass(backend_type, SupportsPrune)
    assert issubclass(backend_type, SupportsHeldJobs)
    for protocol in OPTIONAL_PROTOCOLS:
        if (
            protocol is SupportsEnqueuePrecheck
            and not backend_type.supports_transactional_simulation
        ):
            continue  # a real transaction's rollback does its work
        assert issubclass(backend_type, protocol), protocol.__name__
