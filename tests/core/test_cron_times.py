"""When a cron schedule fires across daylight-saving changes: at set hours once a day,
as cron does, even when clocks go back and a local time happens twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from taskq.backend.cron import cron_slots, next_fire_at
from taskq.models import ScheduleRecord

_NY = "America/New_York"  # clocks go back at 02:00 EDT on 1 November 2026


def _fires(cron: str, start: datetime, count: int) -> list[datetime]:
    fires, after = [], start
    for _ in range(count):
        fire = next_fire_at(cron, _NY, after)
        assert fire is not None
        fires.append(fire)
        after = fire
    return fires


def test_a_daily_time_that_happens_twice_fires_once() -> None:
    # 01:30 came twice (EDT, then EST) and so did the job.
    start = datetime(2026, 11, 1, 4, 0, tzinfo=UTC)  # 00:00 EDT
    assert _fires("30 1 * * *", start, 2) == [
        datetime(2026, 11, 1, 5, 30, tzinfo=UTC),  # 01:30 EDT
        datetime(2026, 11, 2, 6, 30, tzinfo=UTC),  # 01:30 EST, the next day
    ]


@pytest.mark.parametrize("cron", ["30 * * * *", "*/30 * * * *"])
def test_an_every_hour_schedule_runs_in_both_hours(cron: str) -> None:
    start = datetime(2026, 11, 1, 5, 0, tzinfo=UTC)  # 01:00 EDT
    fires = _fires(cron, start, 3)
    assert datetime(2026, 11, 1, 5, 30, tzinfo=UTC) in fires  # 01:30 EDT
    assert datetime(2026, 11, 1, 6, 30, tzinfo=UTC) in fires  # 01:30 EST


def test_set_hours_skip_every_slot_of_the_repeated_hour() -> None:
    start = datetime(2026, 11, 1, 5, 50, tzinfo=UTC)  # 01:50 EDT
    assert _fires("*/20 1 * * *", start, 2) == [
        datetime(2026, 11, 2, 6, 0, tzinfo=UTC),  # 01:00 EST on the 2nd: none at 01:xx EST
        datetime(2026, 11, 2, 6, 20, tzinfo=UTC),
    ]


def test_a_year_field_past_2050_is_a_cron_expression() -> None:
    # Checked from 2000 alone, croniter's 50-year search refused it as "no such date".
    from taskq.models import ScheduleCreateArgs

    args = ScheduleCreateArgs(name="once", actor="a", cron="0 9 1 1 * 0 2051")
    assert args.cron == "0 9 1 1 * 0 2051"
    with pytest.raises(ValueError, match="never fires"):
        ScheduleCreateArgs(name="never", actor="a", cron="0 0 30 2 *")


@pytest.mark.parametrize("cron", ["R 3 * * *", "* * * * * R", "r(0-29) * * * *", "R/15 * * * *"])
def test_a_random_field_is_refused_where_it_would_fire_at_random(cron: str) -> None:
    # croniter draws an R field again at each computation of the next slot: "R 3 * * *"
    # fired at two or three random minutes of 03:00 each night, "* * * * * R" (a random
    # second of each minute) 21 times in ten minutes on Postgres.
    from taskq.models import ScheduleCreateArgs, ScheduleUpdateArgs

    with pytest.raises(ValueError, match="random field"):
        ScheduleCreateArgs(name="random", actor="a", cron=cron)
    with pytest.raises(ValueError, match="random field"):
        ScheduleUpdateArgs(cron=cron)


@pytest.mark.parametrize(
    ("cron", "only"),
    [
        ("*/61 * * * *", "match only minute 0, not every 61 minutes"),
        ("0 */25 * * *", "match only hour 0, not every 25 hours"),
        ("0 0 */32 * *", "match only day-of-month 1, not every 32 days"),
        ("0 0 1 jan-dec/13 *", "match only month jan, not every 13 months"),
        ("0 0 * * 1-5/8", "match only day-of-week 1, not every 8 days"),
        ("0,30 * * * * 10/61", "match only second 10, not every 61 seconds"),
    ],
)
def test_a_step_longer_than_its_field_is_refused_where_it_would_match_only_its_start(
    cron: str, only: str
) -> None:
    # croniter took "*/61 * * * *" as minute 0 alone (hourly), "*/25" in the hour field
    # as midnight, "*/32" as the 1st of the month, and said nothing.
    from taskq.models import ScheduleCreateArgs, ScheduleUpdateArgs

    with pytest.raises(ValueError, match=only):
        ScheduleCreateArgs(name="step", actor="a", cron=cron)
    with pytest.raises(ValueError, match=only):
        ScheduleUpdateArgs(cron=cron)


@pytest.mark.parametrize(
    "cron", ["*/30 * * * *", "0-59/30 * * * *", "*/60 * * * *", "0 */24 * * *", "10-20/11 * * * *"]
)
def test_a_step_within_its_field_is_a_cron_expression(cron: str) -> None:
    # Up to the field's whole range a step says what it does: "*/60" is minute 0, every
    # 60 minutes; a step longer than a range of its own (10-20/11) is the range's start.
    from taskq.models import ScheduleCreateArgs

    assert ScheduleCreateArgs(name="step", actor="a", cron=cron).cron == cron


@pytest.mark.parametrize(
    ("cron", "window", "count"),
    [
        ("R 3 * * *", timedelta(days=3), 3),
        ("r(0-29) 3 * * *", timedelta(days=3), 3),
        ("R/15 3 * * *", timedelta(days=1), 4),
        ("* * * * * R", timedelta(minutes=10), 10),
    ],
)
def test_a_stored_random_field_fires_at_one_time_a_period(
    cron: str, window: timedelta, count: int
) -> None:
    # Refused at create/update since, but stored before: croniter drew the value again
    # at each computation of the next slot, so "R 3 * * *" fired two or three times a
    # night at random, and "* * * * * R" 21 times in ten minutes. It is drawn from the
    # expression: the same time at every computation, and on every leader.
    start = datetime(2026, 12, 1, tzinfo=UTC)
    assert len({next_fire_at(cron, "UTC", start) for _ in range(20)}) == 1
    schedule = ScheduleRecord(
        id=uuid4(), name="random", actor="a", cron=cron, payload={}, queue=None,
        timezone="UTC", enabled=True, next_fire_at=None, created_at=start, updated_at=start,
    )  # fmt: skip
    slots, _ = cron_slots(schedule, start + window, window)
    assert len(slots) == count
