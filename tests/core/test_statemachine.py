"""The state machine's tables and guards."""

from __future__ import annotations

import itertools

import pytest

from taskq.backend import PROTOCOL_MEMBERS, SupportsBatchedSuccess, SupportsUnstartedHandBack
from taskq.backend.statemachine import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    TRANSITION_DRIVERS,
    VALID_TRANSITIONS,
    CancelPhase,
    JobStatus,
    assert_valid_transition,
    is_valid_transition,
    parse_cancel_phase,
    parse_status,
)
from taskq.errors import InvalidTransition, TaskQError


def test_there_are_exactly_eight_statuses() -> None:
    assert {s.value for s in JobStatus} == {
        "pending",
        "scheduled",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "crashed",
        "abandoned",
    }


def test_active_and_terminal_partition_the_statuses() -> None:
    assert ACTIVE_STATUSES == {JobStatus.PENDING, JobStatus.SCHEDULED, JobStatus.RUNNING}
    assert ACTIVE_STATUSES | TERMINAL_STATUSES == set(JobStatus)
    assert not ACTIVE_STATUSES & TERMINAL_STATUSES


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(JobStatus, JobStatus)))
def test_assert_valid_transition_agrees_with_the_table(src: JobStatus, dst: JobStatus) -> None:
    if dst in VALID_TRANSITIONS[src]:
        assert_valid_transition(src, dst)
        assert is_valid_transition(src.value, dst.value)
    else:
        with pytest.raises(InvalidTransition) as info:
            assert_valid_transition(src, dst, job_id="j1")
        assert f"job j1: invalid transition {src.value} -> {dst.value}" in str(info.value)
        assert isinstance(info.value, TaskQError)


def test_terminal_statuses_have_no_way_out() -> None:
    for status in TERMINAL_STATUSES:
        assert VALID_TRANSITIONS[status] == frozenset()


def test_every_transition_has_a_driver_and_every_driver_is_a_backend_member() -> None:
    # A driver belongs to the Backend protocol or to an optional one a backend may add.
    optional = {
        name
        for protocol in (SupportsBatchedSuccess, SupportsUnstartedHandBack)
        for name in vars(protocol)
        if not name.startswith("_")
    }
    table = {(s, d) for s, targets in VALID_TRANSITIONS.items() for d in targets}
    assert set(TRANSITION_DRIVERS) == table
    for drivers in TRANSITION_DRIVERS.values():
        assert set(drivers) <= PROTOCOL_MEMBERS | optional


def test_stored_cancel_phases_parse_but_abandon_pending_is_refused() -> None:
    assert parse_cancel_phase(0) is CancelPhase.NONE
    assert parse_cancel_phase(1) is CancelPhase.COOPERATIVE
    assert parse_cancel_phase(2) is CancelPhase.FORCED
    with pytest.raises(ValueError, match="in-process only"):
        parse_cancel_phase(3)
    with pytest.raises(ValueError, match="unknown cancel phase 7.*upgrade taskq-core"):
        parse_cancel_phase(7)


def test_a_stored_status_is_read_as_its_member_and_an_unknown_one_says_to_upgrade() -> None:
    assert all(parse_status(status.value) is status for status in JobStatus)
    with pytest.raises(ValueError, match="unknown job status 'paused'.*upgrade taskq-core"):
        parse_status("paused")
