"""Model semantics that both backends rely on."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from pydantic import PrivateAttr, ValidationError

from taskq.backend.statemachine import ACTIVE_STATUSES, TERMINAL_STATUSES, JobStatus
from taskq.models import (
    ActorConfig,
    BatchFilter,
    BatchRow,
    BatchStatus,
    EnqueueArgs,
    ErrorInfo,
    JobFilter,
    QueueConfig,
    ScheduleCreateArgs,
    ScheduleUpdateArgs,
    from_valid_values,
)


def test_status_accepts_one_status_or_a_sequence() -> None:
    # frozenset, as statuses() returns: mypy holds a set and a frozenset never equal.
    assert JobFilter(status="pending").statuses() == frozenset({JobStatus.PENDING})
    assert JobFilter(status=["pending", JobStatus.RUNNING]).statuses() == frozenset(
        {JobStatus.PENDING, JobStatus.RUNNING}
    )


def test_status_accepts_a_set_of_statuses_such_as_terminal_statuses() -> None:
    # TERMINAL_STATUSES and ACTIVE_STATUSES are frozensets: list_jobs(status=...) of
    # either was refused as neither a status nor a sequence.
    assert JobFilter(status=TERMINAL_STATUSES).statuses() == TERMINAL_STATUSES
    assert JobFilter(status=ACTIVE_STATUSES).statuses() == ACTIVE_STATUSES
    assert JobFilter(status={"running", "pending"}).status == (
        JobStatus.PENDING,
        JobStatus.RUNNING,
    )


def test_empty_status_sequence_selects_nothing_not_everything() -> None:
    assert JobFilter(status=[]).statuses() == frozenset()
    assert JobFilter().statuses() is None


def test_unknown_status_is_a_value_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown job status.*pending, scheduled"):
        JobFilter(status=["pending", "finished"])


def test_status_and_active_are_mutually_exclusive() -> None:
    with pytest.raises(ValueError, match="either status or active"):
        JobFilter(status="pending", active=True)


def test_active_selects_by_terminality() -> None:
    assert JobFilter(active=True).statuses() == ACTIVE_STATUSES
    assert JobFilter(active=False).statuses() == TERMINAL_STATUSES


def test_filter_limit_is_bounded() -> None:
    with pytest.raises(ValidationError):
        JobFilter(limit=0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: JobFilter(limit=True),
        lambda: JobFilter(limit=False),
        lambda: BatchFilter(limit=True),
        lambda: QueueConfig(queue="q", max_concurrent=True),
    ],
)
def test_a_count_given_as_a_flag_is_refused(make: Callable[[], object]) -> None:
    # pydantic's lax int read True as 1: JobFilter(limit=True) listed one job.
    with pytest.raises(ValidationError, match="must be a whole number, not (True|False)"):
        make()


def test_a_count_given_as_a_number_or_none_still_validates() -> None:
    assert JobFilter(limit=1).limit == 1
    assert BatchFilter(limit=7).limit == 7
    assert QueueConfig(queue="q").max_concurrent is None
    assert QueueConfig(queue="q", max_concurrent=2).max_concurrent == 2


def test_enqueue_args_reject_negative_durations_and_empty_actor() -> None:
    with pytest.raises(ValidationError, match="delay"):
        EnqueueArgs(actor="a", delay=timedelta(seconds=-1))
    with pytest.raises(ValidationError, match="actor"):
        EnqueueArgs(actor="")
    with pytest.raises(ValidationError, match="max_attempts"):
        EnqueueArgs(actor="a", max_attempts=0)


@pytest.mark.parametrize(
    "field",
    ["actor", "queue", "idempotency_key", "identity_key", "fairness_key", "trace_id", "span_id"],
)
def test_enqueue_args_refuse_nul_in_names_and_keys(field: str) -> None:
    # Replaced, as in a payload, two keys could become one.
    values = {"actor": "a", field: "x\x00y"}
    with pytest.raises(ValidationError, match=f"{field}\n.*NUL"):
        EnqueueArgs(**values)


def test_enqueue_args_get_distinct_ids() -> None:
    assert EnqueueArgs(actor="a").id != EnqueueArgs(actor="a").id


def test_models_are_immutable() -> None:
    args = EnqueueArgs(actor="a")
    with pytest.raises(ValidationError):
        args.actor = "b"  # type: ignore[misc]


def test_from_valid_values_builds_what_validation_builds_and_stays_frozen() -> None:
    validated = EnqueueArgs(actor="a", payload={"n": 1}, delay=timedelta(seconds=5), tags=["t"])
    built = from_valid_values(EnqueueArgs, dict(validated))
    assert built == validated
    assert built.model_dump() == validated.model_dump()
    with pytest.raises(ValidationError):
        built.actor = "b"  # type: ignore[misc]
    # A copy with changes leaves the original (and its shared fields-set) alone.
    changed = built.model_copy(update={"priority": 7})
    assert (changed.priority, built.priority) == (7, 0)
    assert from_valid_values(EnqueueArgs, dict(validated)).model_fields_set == set(
        EnqueueArgs.model_fields
    )


def test_from_valid_values_refuses_values_that_miss_a_field() -> None:
    values = dict(EnqueueArgs(actor="a"))
    del values["queue"]
    with pytest.raises(
        TypeError, match=r"EnqueueArgs needs exactly its fields: missing \['queue'\]"
    ):
        from_valid_values(EnqueueArgs, values)


def test_from_valid_values_refuses_a_model_with_private_attributes() -> None:
    class WithPrivate(EnqueueArgs):
        _seen: int = PrivateAttr(default=0)

    with pytest.raises(TypeError, match="WithPrivate has private attributes"):
        from_valid_values(WithPrivate, dict(EnqueueArgs(actor="a")))


def test_error_info_from_exception_names_the_class() -> None:
    assert ErrorInfo.from_exception(KeyError("k")).error_class == "KeyError"
    info = ErrorInfo.from_exception(ValidationErrorLike("bad"))
    assert info.error_class.endswith("ValidationErrorLike")
    assert info.message == "bad"


class ValidationErrorLike(Exception):
    pass


def test_schedule_args_validate_cron_and_timezone() -> None:
    ScheduleCreateArgs(name="n", actor="a", cron="*/5 * * * * *", timezone="Europe/Paris")
    with pytest.raises(ValidationError, match="invalid cron"):
        ScheduleCreateArgs(name="n", actor="a", cron="every minute")
    with pytest.raises(ValidationError, match="unknown timezone"):
        ScheduleCreateArgs(name="n", actor="a", cron="* * * * *", timezone="Mars/Base")
    # Looked up as a file: a region (a directory of zones) and a name past the file
    # system's limit raised IsADirectoryError and OSError, not a validation error.
    with pytest.raises(ValidationError, match="'Europe' is a region: name one of its zones"):
        ScheduleCreateArgs(name="n", actor="a", cron="* * * * *", timezone="Europe")
    with pytest.raises(ValidationError, match="unknown timezone"):
        ScheduleUpdateArgs(timezone="a" * 300)
    with pytest.raises(ValidationError, match="invalid cron"):
        ScheduleUpdateArgs(cron="nope")
    # Parses, but names no date: would fail at every computation of its next slot.
    with pytest.raises(ValidationError, match="never fires"):
        ScheduleUpdateArgs(cron="0 0 30 2 *")
    ScheduleCreateArgs(name="n", actor="a", cron="0 0 29 2 *")  # leap days exist


def test_a_schedule_refuses_an_actor_or_queue_no_fired_job_could_have() -> None:
    # Stored as given, a name past 256 bytes failed every slot's fire at its enqueue.
    long = "q" * 257
    for bad in ({"actor": long}, {"queue": long}, {"queue": "a\x00b"}):
        with pytest.raises(ValidationError, match="at most 256 bytes|NUL"):
            ScheduleCreateArgs(**{"name": "n", "actor": "a", "cron": "* * * * *", **bad})
    with pytest.raises(ValidationError, match="at most 256 bytes"):
        ScheduleUpdateArgs(queue=long)
    assert ScheduleCreateArgs(name="n", actor="a" * 256, cron="* * * * *").queue is None
    # The name too: Postgres refused one past an index entry with a driver traceback.
    with pytest.raises(ValidationError, match="name\n.*at most 256 bytes of UTF-8, got 3000"):
        ScheduleCreateArgs(name="é" * 1500, actor="a", cron="* * * * *")
    assert ScheduleCreateArgs(name="n" * 256, actor="a", cron="* * * * *").name == "n" * 256


def test_schedule_update_args_unset_the_queue_with_actor_queue_only() -> None:
    # queue=None keeps the stored queue; actor_queue=True sets it back to None.
    assert ScheduleUpdateArgs(queue=None).changes() == {}
    assert ScheduleUpdateArgs(queue="q", enabled=False).changes() == {
        "queue": "q",
        "enabled": False,
    }
    assert ScheduleUpdateArgs(actor_queue=True).changes() == {"queue": None}
    with pytest.raises(ValidationError, match="either queue or actor_queue=True, not both"):
        ScheduleUpdateArgs(queue="q", actor_queue=True)


@pytest.mark.parametrize("zone", ["localtime", "posixrules", "Factory", "LocalTime"])
def test_a_schedule_timezone_the_host_decides_is_refused(zone: str) -> None:
    # ZoneInfo finds these in the host's zone files; what they mean is that host's (its
    # own zone, for localtime), and the leader that fires the schedule changes host.
    hint = rf"timezone '{zone}' .*name an IANA zone \(e.g. 'Europe/Paris'\) or 'UTC'"
    with pytest.raises(ValidationError, match=hint):
        ScheduleCreateArgs(name="n", actor="a", cron="* * * * *", timezone=zone)
    with pytest.raises(ValidationError, match=hint):
        ScheduleUpdateArgs(timezone=zone)
    ScheduleUpdateArgs(timezone="UTC")


def test_filter_after_builds_a_keyset_cursor() -> None:
    from taskq.models import JobRow

    when = datetime(2030, 1, 1, tzinfo=UTC)
    row = JobRow(
        id=uuid4(),
        actor="a",
        queue="q",
        status=JobStatus.PENDING,
        payload={},
        priority=0,
        attempt=0,
        max_attempts=3,
        created_at=when,
        scheduled_at=when,
    )
    assert JobFilter(limit=2).after(row).cursor == (when, row.id)


@pytest.mark.parametrize(
    "fields",
    [{"failure_threshold": 0}, {"failure_threshold": -3}, {"expected_size": -5}],
)
def test_a_batch_row_refuses_counts_out_of_range(fields: dict[str, int]) -> None:
    # The in-memory backend stored them; Postgres failed on a CHECK constraint.
    with pytest.raises(ValidationError):
        BatchRow(**{"id": uuid4(), "queue": "q", "expected_size": 1, **fields})


@pytest.mark.parametrize(
    ("status", "completed", "error"),
    [
        ("complete", False, "needs completed_at"),
        ("aborted", False, "needs completed_at"),
        ("active", True, "takes no completed_at"),
    ],
)
def test_a_batch_row_has_completed_at_exactly_when_finished(
    status: BatchStatus, completed: bool, error: str
) -> None:
    # The in-memory backend stored a complete row without the time; Postgres raised a
    # driver error (CheckViolationError: batches_completed_at_iff_done).
    when = datetime(2026, 1, 1, tzinfo=UTC) if completed else None
    with pytest.raises(ValidationError, match=error):
        BatchRow(id=uuid4(), queue="q", status=status, expected_size=1, completed_at=when)


@pytest.mark.parametrize("status", ["complete", "aborted"])
def test_a_finished_batch_row_with_its_time_is_valid(status: BatchStatus) -> None:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    row = BatchRow(id=uuid4(), queue="q", status=status, expected_size=1, completed_at=when)
    assert (row.status, row.completed_at) == (status, when)
    assert BatchRow(id=uuid4(), queue="q", expected_size=1).completed_at is None


@pytest.mark.parametrize(
    "make",
    [
        lambda: ActorConfig(actor="a\x00"),
        lambda: ActorConfig(actor="a", queue="q\x00"),
        lambda: QueueConfig(queue="q\x00"),
        lambda: BatchRow(id=uuid4(), queue="q\x00", expected_size=1),
        lambda: BatchRow(id=uuid4(), queue="q", expected_size=1, originating_actor="a\x00"),
        lambda: BatchFilter(queue="q\x00"),
    ],
)
def test_actor_and_queue_configs_refuse_names_no_store_holds(make: Callable[[], object]) -> None:
    # Refused by @actor already; given to a backend directly, Postgres raised a driver
    # error where the in-memory backend stored the name.
    with pytest.raises(ValidationError, match="must not contain NUL"):
        make()


def test_a_worker_refuses_an_empty_queue_name_as_enqueue_does() -> None:
    # check_name, the rule a job's queue meets at enqueue, let "" through (EnqueueArgs
    # refuses it by its own min_length): a worker given queues=[""] (a list built from
    # an unset variable) loaded and polled a queue no job can be on.
    from taskq.models import check_name
    from taskq.settings import SettingsError, WorkerSettings

    with pytest.raises(ValidationError):
        EnqueueArgs(actor="a", queue="")
    with pytest.raises(ValueError, match="empty"):
        check_name("")
    with pytest.raises(SettingsError, match="empty"):
        WorkerSettings.load({"queues": ["default", ""]}, env={})
