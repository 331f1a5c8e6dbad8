"""The retry policy's delays: a backoff stays within its bounds at any attempt number, and
no delay can put a job off by more than a century (its times must stay readable)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from taskq import ExponentialBackoff, RetryAfter, Snooze, actor
from taskq.errors import ConfigurationError
from taskq.models import MAX_DURATION
from taskq.retry import FixedBackoff, RetryPolicy


@pytest.mark.parametrize("attempt", [1, 2, 12, 1025, 10**6])
def test_an_exponential_backoff_stays_within_its_cap_at_any_attempt(attempt: int) -> None:
    # From attempt 1025 the power overflowed a float (snoozes and rate-limit denials
    # advance the attempt too), and the job failed as an unrecordable outcome.
    backoff = ExponentialBackoff(base=timedelta(seconds=1), maximum=timedelta(minutes=5))
    for _ in range(50):  # jitter: never past the cap
        assert timedelta(0) <= backoff(attempt) <= timedelta(minutes=5)
    if attempt >= 12:
        assert backoff(attempt) >= timedelta(minutes=5) * 0.9


@pytest.mark.parametrize(
    "options",
    [
        {"factor": float("nan")},
        {"factor": float("inf")},
        {"factor": 0.5},
        {"maximum": timedelta(seconds=-1)},
        {"base": timedelta(seconds=10), "maximum": timedelta(seconds=5)},
        {"jitter": float("nan")},
    ],
)
def test_an_exponential_backoff_refuses_settings_without_a_sane_delay(
    options: dict[str, object],
) -> None:
    with pytest.raises(ValueError, match="ExponentialBackoff needs"):
        ExponentialBackoff(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("returned", "kept"),
    [
        (timedelta(seconds=-30), timedelta(0)),  # Postgres put the retry in the past
        (timedelta(days=3_000_000), MAX_DURATION),  # a year past 9999: an unreadable row
        (timedelta(seconds=7), timedelta(seconds=7)),
    ],
)
def test_a_custom_backoffs_delay_is_kept_within_zero_and_a_century(
    returned: timedelta, kept: timedelta
) -> None:
    assert RetryPolicy(lambda attempt: returned).delay(1) == kept


@pytest.mark.parametrize(
    ("backoff", "first", "third"),
    [
        (lambda attempt: 0, timedelta(0), timedelta(0)),
        (lambda attempt: 2**attempt, timedelta(seconds=2), timedelta(seconds=8)),
        (lambda attempt: 0.5, timedelta(seconds=0.5), timedelta(seconds=0.5)),
        (FixedBackoff(5), timedelta(seconds=5), timedelta(seconds=5)),  # type: ignore[arg-type]
        (
            RetryPolicy(FixedBackoff(timedelta(seconds=3))),
            timedelta(seconds=3),
            timedelta(seconds=3),
        ),
    ],
    ids=["zero", "seconds", "fraction", "fixed-seconds", "a-policy"],
)
def test_a_backoff_may_give_seconds_and_a_policy_is_a_backoff(
    backoff: Any, first: timedelta, third: timedelta
) -> None:
    # Each was accepted by @actor, then failed the job at its first error with a
    # TypeError (OutcomeNotRecorded), the actor's own error lost; a RetryPolicy was
    # refused though the message asked for "a taskq.retry policy".
    @actor(name="backoff.in_seconds", retry_backoff=backoff)
    async def job(payload: dict[str, Any]) -> None: ...

    assert (job.retry.delay(1), job.retry.delay(3)) == (first, third)
    assert ExponentialBackoff(base=2, maximum=60).base == timedelta(seconds=2)  # type: ignore[arg-type]


@pytest.mark.parametrize("returned", ["soon", None, float("nan"), True])
def test_a_backoff_giving_no_delay_is_refused_where_the_actor_is_defined(returned: Any) -> None:
    with pytest.raises(ConfigurationError, match="must be a timedelta or a number of seconds"):

        @actor(name="backoff.garbage", retry_backoff=lambda attempt: returned)
        async def job(payload: dict[str, Any]) -> None: ...


@pytest.mark.parametrize("signal", [Snooze, RetryAfter])
@pytest.mark.parametrize("delay", [timedelta(days=36_501), 1e12, float("nan"), -1])
def test_a_signal_with_a_delay_no_job_can_hold_is_refused(
    signal: type[Snooze | RetryAfter], delay: timedelta | float
) -> None:
    with pytest.raises(ValueError, match="delay must be"):
        signal(delay)
    assert signal(MAX_DURATION).delay == MAX_DURATION


@pytest.mark.parametrize("signal", [Snooze, RetryAfter])
@pytest.mark.parametrize("delay", [None, "5", True])
def test_a_signal_with_no_duration_says_what_a_delay_is(
    signal: type[Snooze | RetryAfter], delay: Any
) -> None:
    # None and "5" raised timedelta's own TypeError; True was taken as one second.
    with pytest.raises(TypeError, match="delay must be a timedelta or a number of seconds"):
        signal(delay)


def test_a_negative_signal_delay_is_told_in_seconds() -> None:
    # It read "got -1 day, 23:59:59".
    with pytest.raises(ValueError, match="got -1 s"):
        RetryAfter(-1)


@pytest.mark.parametrize("attempt", [60, 10**6])
def test_an_exponential_backoff_without_a_cap_stops_at_a_century(
    attempt: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # timedelta.max as the cap (no cap) was kept: once the power passed it, a delay
    # jittered up to the cap was a float past timedelta's range (OverflowError), and
    # the job failed as an unrecordable outcome where it should have been retried.
    monkeypatch.setattr("taskq.retry.random.uniform", lambda low, high: high)
    policy = RetryPolicy(ExponentialBackoff(maximum=timedelta.max))
    assert policy.delay(attempt) == MAX_DURATION


def test_a_custom_backoff_of_whole_seconds_past_a_floats_range_stops_at_a_century() -> None:
    # 2 ** attempt past attempt 1023 is an int no float holds: math.isfinite raised
    # OverflowError, and the job failed as an unrecordable outcome, not retried.
    policy = RetryPolicy(lambda attempt: 2**attempt)
    assert policy.delay(1100) == MAX_DURATION
    assert policy.delay(3) == timedelta(seconds=8)
