"""What the client makes of its caller's input, on every backend: enqueue options are
the caller's when given, checked as such (a value the database could not hold is
refused before anything is written, an explicit 0 or "" is not quietly replaced by the
actor's default), and a filter is never half used."""

from __future__ import annotations

import asyncio
import json
import traceback
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
import structlog
from pydantic import BaseModel, ConfigDict, Field, computed_field, field_serializer

from taskq import Context, EnqueueItem, JobStatus, TaskQ, actor
from taskq.backend import Backend, SupportsPrune
from taskq.client import JobsClient
from taskq.errors import ConfigurationError, EnqueueOptionsError, PayloadValidationError
from taskq.models import INT32_MAX, JobFilter, ScheduleCreateArgs


@actor(name="options.job", queue="jobs", max_attempts=2, timeout=30, result_ttl=60)
async def job(payload: dict[str, Any]) -> None:
    return None


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"priority": INT32_MAX + 1}, "priority"),
        ({"priority": -(2**31) - 1}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": INT32_MAX + 1}, "max_attempts"),
        ({"queue": ""}, "queue"),
        ({"queue": "jobs\x00"}, "queue.*NUL"),
        ({"idempotency_key": "k\x00"}, "idempotency_key.*NUL"),
        ({"identity_key": "k\x00"}, "identity_key.*NUL"),
        ({"fairness_key": "\x00"}, "fairness_key.*NUL"),
        ({"queue": "q" * 257}, "queue.*at most 256 bytes"),
        ({"idempotency_key": "k" * 1001}, "idempotency_key.*at most 1000 bytes"),
        ({"identity_key": "\u00e9" * 501}, "identity_key.*at most 1000 bytes.*got 1002"),
        ({"fairness_key": "f" * 1001}, "fairness_key.*at most 1000 bytes"),
        # Most often an unset variable: every job given it shared one key.
        ({"idempotency_key": ""}, "idempotency_key.*must not be empty"),
        ({"identity_key": ""}, "identity_key.*must not be empty"),
        ({"fairness_key": ""}, "fairness_key.*must not be empty"),
        ({"metadata": {"batch_id": "mine"}}, "batch_id.*must be a UUID"),
        ({"timeout": 0}, "timeout"),
        ({"schedule_to_close": 0}, "schedule_to_close"),
        ({"delay": timedelta(days=100_000_000)}, "delay"),
        ({"delay": 1e20}, "out of range"),
        ({"tags": "urgent"}, "tags must be a list"),
        ({"tags": None}, "tags must be a list"),
        ({"delay": float("nan")}, "delay takes a timedelta or a number of seconds"),
        ({"delay": "5"}, "delay takes .*there is no run-at option"),
        ({"timeout": "1s"}, "timeout takes a timedelta or a number of seconds"),
        ({"singleton": True}, "singleton=True needs an identity key"),
        # Coerced before: True for 1 (a second, an attempt), "3" and 3.0 for 3.
        ({"delay": True}, "delay takes a timedelta or a number of seconds, not True"),
        ({"timeout": False}, "timeout takes a timedelta or a number of seconds, not False"),
        ({"priority": "3"}, "priority must be a whole number, not '3'"),
        ({"priority": True}, "priority must be a whole number, not True"),
        ({"max_attempts": 2.0}, "max_attempts must be a whole number, not 2.0"),
        ({"singleton": "yes"}, "singleton must be True or False, not 'yes'"),
        # Its deadline would pass before it could start: failed unrun by the sweep.
        ({"delay": 5, "schedule_to_close": 1}, r"delay \(0:00:05\) must be shorter"),
        ({"delay": 5, "schedule_to_close": 5}, "deadline would pass before it could start"),
        ({"priorty": 1}, "unknown enqueue option.*priorty.*the options are"),
    ],
)
async def test_bad_options_are_refused_and_write_nothing(
    taskq_backend: Backend, options: dict[str, Any], error: str
) -> None:
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    with pytest.raises(EnqueueOptionsError, match=error):
        await tq.client.enqueue(job, {}, **options)
    assert await tq.client.list_jobs() == []


@pytest.mark.parametrize(
    "item",
    [{"actor": "options.job", "payload": {}}, ("options.job", {}, {}), "options.job"],
    ids=["dict", "triple", "str"],
)
async def test_a_batch_item_of_another_shape_is_refused_and_writes_nothing(
    taskq_backend: Backend, item: Any
) -> None:
    # A dict unpacked as a pair read its keys: "unknown actor 'actor'"; a triple or a
    # string, "too many values to unpack".
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    for enqueue in (tq.client.enqueue_batch, tq.client.enqueue_batch_fast):
        with pytest.raises(EnqueueOptionsError, match="EnqueueItem or an .actor, payload. pair"):
            await enqueue([("options.job", {}), item])
    assert await tq.client.list_jobs() == []
    # A pair as a list is still a pair.
    assert len(await tq.client.enqueue_batch([["options.job", {}]])) == 1  # type: ignore[list-item]


async def test_a_batch_item_names_its_actor_by_the_actor_or_its_name(
    taskq_backend: Backend,
) -> None:
    # As enqueue and a pair take it: an EnqueueItem refused the actor itself.
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    items = [
        EnqueueItem(actor=job, payload={"n": 1}, options={"priority": 5}),
        EnqueueItem(actor="options.job", payload={"n": 2}),
    ]
    rows = await tq.client.enqueue_batch(items)
    assert [(r.actor, r.payload, r.priority) for r in rows] == [
        ("options.job", {"n": 1}, 5),
        ("options.job", {"n": 2}, 0),
    ]
    assert await tq.client.enqueue_batch_fast(items) == 2


async def test_given_options_are_kept_and_others_come_from_the_actor(
    taskq_backend: Backend,
) -> None:
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    mine = await tq.client.enqueue(job, {}, result_ttl=0, priority=INT32_MAX, tags=["a"])
    assert (mine.result_ttl, mine.priority, mine.tags) == (timedelta(0), INT32_MAX, ["a"])
    assert (mine.queue, mine.max_attempts, mine.timeout) == ("jobs", 2, timedelta(seconds=30))


@actor(name="options.resultless", result_ttl=0)
async def resultless(payload: dict[str, Any]) -> None:
    return None


async def test_an_actor_result_ttl_of_zero_is_taken_as_enqueue_takes_it(
    taskq_backend: Backend,
) -> None:
    # enqueue(result_ttl=0) keeps no result past the job's end; @actor refused the same
    # value ("must be positive") at the decoration.
    tq = TaskQ("memory://", actors=[resultless], backend=taskq_backend)
    row = await tq.client.enqueue(resultless, {})
    assert row.result_ttl == timedelta(0)
    with pytest.raises(ConfigurationError, match="result_ttl must not be negative, got -1"):
        actor(name="options.negative_ttl", result_ttl=-1)(resultless.fn)


async def test_cancel_where_refuses_a_limit_it_would_not_apply(taskq_backend: Backend) -> None:
    # cancel_where(JobFilter(status="pending", limit=1)) cancelled every pending job.
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    kept = [await tq.client.enqueue(job, {}) for _ in range(2)]
    with pytest.raises(ValueError, match=r"its limit \(1\) would not apply"):
        await tq.client.cancel_where(JobFilter(actor="options.job", limit=1))
    with pytest.raises(ValueError, match="Leave the limit out"):
        await tq.client.cancel_where(actor="options.job", limit=1)
    for row in kept:  # nothing was cancelled
        found = await tq.client.get(row.id)
        assert found is not None and found.cancel_requested_at is None
    result = await tq.client.cancel_where(JobFilter(actor="options.job"))
    assert sorted(result.cancelled) == sorted(row.id for row in kept)


async def test_a_filter_and_filter_keywords_together_are_refused(taskq_backend: Backend) -> None:
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    kept = await tq.client.enqueue(job, {})
    with pytest.raises(TypeError, match="not both"):
        await tq.client.cancel_where(JobFilter(actor="options.job"), queue="elsewhere")
    with pytest.raises(TypeError, match="not both"):
        await tq.client.list_jobs(JobFilter(actor="options.job"), queue="elsewhere")
    row = await tq.client.get(kept.id)
    assert row is not None and row.cancel_requested_at is None  # nothing was cancelled


@pytest.mark.parametrize("given", [{"actor": "options.job"}, "options.job"], ids=["dict", "str"])
async def test_a_filter_that_is_no_job_filter_is_refused_saying_what_to_pass(
    taskq_backend: Backend, given: Any
) -> None:
    # It failed deep in the backend with AttributeError ('statuses').
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    kept = await tq.client.enqueue(job, {})
    for call in (tq.client.list_jobs, tq.client.cancel_where):
        with pytest.raises(TypeError, match="filters is a JobFilter, not .*as keywords"):
            await call(given)
    row = await tq.client.get(kept.id)
    assert row is not None and row.status is JobStatus.PENDING


async def test_wait_for_result_with_no_time_answers_from_one_read(taskq_backend: Backend) -> None:
    from taskq_testing import run_until_idle

    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    waiting = await tq.client.enqueue(job, {}, queue="nobody-works-this")
    with pytest.raises(TimeoutError, match=r"did not finish within 0 s \(it is pending\)"):
        await tq.client.wait_for_result(waiting.id, timeout=0)
    done = await tq.client.enqueue(job, {})
    await run_until_idle(tq, queues=["jobs"])
    assert await tq.client.wait_for_result(done.id, timeout=0) is None  # done: no wait
    # None: no limit (a raw TypeError before); a string is no number of seconds (it
    # was read as one).
    assert await tq.client.wait_for_result(done.id, timeout=None) is None
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(tq.client.wait_for_result(waiting.id, timeout=None), 0.2)
    with pytest.raises(TypeError, match="takes seconds .*not str"):
        await tq.client.wait_for_result(done.id, timeout="5")  # type: ignore[arg-type]


async def test_waiting_on_an_archived_job_says_where_it_went(taskq_backend: Backend) -> None:
    from taskq_testing import run_until_idle

    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    # No result to outlive: a job is kept until its result expires.
    done = await tq.client.enqueue(job, {}, result_ttl=0)
    await run_until_idle(tq, queues=["jobs"])
    assert isinstance(taskq_backend, SupportsPrune)
    retention = {"succeeded": timedelta(0)}
    assert await taskq_backend.prune_terminal_jobs(retention, archive_retention=timedelta(1)) == 1
    # It said "no job <id>", as of an id never enqueued.
    with pytest.raises(KeyError, match="moved to the archive .*TASKQ_PRUNE_RETENTION_"):
        await tq.client.wait_for_result(done.id)


class _StalledReads:
    """``backend`` whose job reads never answer: a black-holed network, a pool none of
    whose connections comes back."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.reading = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def get(self, job_id: UUID) -> None:
        self.reading.set()
        await asyncio.Event().wait()


async def test_wait_for_result_keeps_to_its_timeout_when_the_first_read_stalls(
    taskq_backend: Backend,
) -> None:
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    waiting = await tq.client.enqueue(job, {}, queue="nobody-works-this")
    stalled = _StalledReads(taskq_backend)
    client = JobsClient(stalled, {job.name: job})  # type: ignore[arg-type]
    # The first read was outside the limit: the call waited for it forever.
    with pytest.raises(TimeoutError, match=r"within 0.05 s \(its status could not be read"):
        async with asyncio.timeout(10):  # a bound on the test, were the limit not kept
            await client.wait_for_result(waiting.id, timeout=0.05)
    assert stalled.reading.is_set()


class _BlippingReads:
    """``backend`` whose next ``failures`` job reads fail with ``error``, as over a
    database restart."""

    def __init__(self, backend: Backend, failures: int, error: Exception) -> None:
        self._backend = backend
        self.failures = failures
        self._error = error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def get(self, job_id: UUID) -> Any:
        if self.failures:
            self.failures -= 1
            raise self._error
        return await self._backend.get(job_id)


async def test_wait_for_result_waits_out_a_database_blip_within_its_timeout(
    taskq_backend: Backend,
) -> None:
    from taskq_testing import run_until_idle

    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    done = await tq.client.enqueue(job, {})
    await run_until_idle(tq, queues=["jobs"])
    # The first failed read ended the wait, whatever its timeout (None: for good).
    blipping = _BlippingReads(taskq_backend, 3, ConnectionResetError("server restarting"))
    client = JobsClient(blipping, {job.name: job})  # type: ignore[arg-type]
    with structlog.testing.capture_logs() as logs:
        assert await client.wait_for_result(done.id, timeout=None) is None
    assert blipping.failures == 0
    retries = [e for e in logs if e["event"] == "taskq.wait-for-result-retry"]
    assert [e["retry_in"] for e in retries] == [0.1, 0.2, 0.4]  # slower each time
    assert "server restarting" in retries[0]["error"]
    # A blip outlasting the limit is said with the failure; other errors at once.
    blipping.failures = 1_000_000
    with pytest.raises(TimeoutError, match=r"within 0.05 s \(its last read failed: Connection"):
        await client.wait_for_result(done.id, timeout=0.05)
    broken = _BlippingReads(taskq_backend, 1, RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        await JobsClient(broken, {}).wait_for_result(done.id)  # type: ignore[arg-type]
    # timeout=0 asks once: its read's failure is the answer.
    blipping.failures = 1
    with pytest.raises(ConnectionResetError):
        await client.wait_for_result(done.id, timeout=0)


class _ClockReads:
    """``backend`` whose clock's next ``failures`` reads fail with ``error`` (None: never
    answer), as over a database restart or a black-holed network."""

    def __init__(self, backend: Backend, failures: int, error: Exception | None) -> None:
        self._backend = backend
        self.failures = failures
        self._error = error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def now(self) -> Any:
        if self._error is None:
            await asyncio.Event().wait()
        if self.failures:
            self.failures -= 1
            assert self._error is not None  # None waited above, for good
            raise self._error
        return await self._backend.now()  # type: ignore[attr-defined]


async def test_wait_for_result_reads_the_clock_within_its_timeout_and_retries(
    taskq_backend: Backend,
) -> None:
    from taskq_testing import run_until_idle

    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    done = await tq.client.enqueue(job, {})
    await run_until_idle(tq, queues=["jobs"])
    row = await tq.client.get(done.id)
    assert row is not None and row.result_expires_at is not None  # the clock is read
    # The clock's read came after the wait, outside its limit and its retries: a blip
    # there was raised, a stall held the finished job's answer for good.
    blipping = _ClockReads(taskq_backend, 2, ConnectionResetError("server restarting"))
    client = JobsClient(blipping, {job.name: job})  # type: ignore[arg-type]
    assert await client.wait_for_result(done.id, timeout=None) is None
    assert blipping.failures == 0
    stalled = JobsClient(_ClockReads(taskq_backend, 0, None), {job.name: job})  # type: ignore[arg-type]
    with pytest.raises(TimeoutError, match=r"did not finish within 0.05 s"):
        async with asyncio.timeout(10):  # a bound on the test, were the limit not kept
            await stalled.wait_for_result(done.id, timeout=0.05)


async def test_enqueue_with_conn_needs_a_connection_on_postgres(pg_backend: Backend) -> None:
    # The caller's transaction is the point: without one the job would commit at once.
    tq = TaskQ("memory://", actors=[job], backend=pg_backend)
    with pytest.raises(TypeError, match="needs the caller's connection"):
        await tq.client.enqueue_with_conn(None, job, {})
    assert await tq.client.list_jobs() == []


class _Aliased(BaseModel):
    user_id: int = Field(alias="userId")


class _Computed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def doubled(self) -> int:
        return 2 * self.x


@actor(name="payloads.aliased")
async def aliased(payload: _Aliased) -> int:
    return payload.user_id


@actor(name="payloads.computed")
async def computed(payload: _Computed) -> int:
    return payload.doubled


async def test_payloads_are_stored_in_the_form_they_validate_back_from(
    taskq_backend: Backend,
) -> None:
    # Stored as {"user_id": 7} and {"x": 1, "doubled": 2}, they failed validation at
    # the worker every time: the actor never ran.
    from taskq_testing import run_until_idle

    tq = TaskQ("memory://", actors=[aliased, computed], backend=taskq_backend)
    jobs = [
        await tq.client.enqueue(aliased, {"userId": 7}),
        await tq.client.enqueue(aliased, _Aliased(userId=8)),
        await tq.client.enqueue(computed, {"x": 1}),
    ]
    assert [j.payload for j in jobs] == [{"userId": 7}, {"userId": 8}, {"x": 1}]
    await run_until_idle(tq)
    done = [await tq.client.get(j.id) for j in jobs]
    assert [(r.status, r.result) for r in done if r] == [
        (JobStatus.SUCCEEDED, 7),
        (JobStatus.SUCCEEDED, 8),
        (JobStatus.SUCCEEDED, 2),
    ]


class _Lossy(BaseModel):
    when: int

    @field_serializer("when")
    def _as_words(self, value: int) -> str:
        return f"at {value}"


@actor(name="payloads.lossy")
async def lossy(payload: _Lossy) -> None:
    return None


@actor(name="payloads.plain")
async def plain(payload: dict[str, Any]) -> None:
    return None


@pytest.mark.parametrize(
    ("target", "payload", "error"),
    [
        (lossy, {"when": 3}, PayloadValidationError),  # "at 3" is no int
        (plain, {"x": b"\xff"}, PayloadValidationError),  # no text, no JSON
        (plain, {"x": object()}, PayloadValidationError),
        (plain, {"x": float("nan")}, ValueError),  # was stored as null
        (plain, {"x": [float("inf")]}, ValueError),
        # JSON's keys are text: read again as JSON these were stored as {"1": "b"}
        # (the first value lost) and {"None": 1}.
        (plain, {1: "a", "1": "b"}, PayloadValidationError),
        (plain, {None: 1}, PayloadValidationError),
    ],
    ids=["serializer", "bytes", "object", "nan", "inf", "int-key", "none-key"],
)
async def test_a_payload_that_cannot_be_stored_as_given_is_refused(
    taskq_backend: Backend, target: Any, payload: dict[str, Any], error: type[Exception]
) -> None:
    tq = TaskQ("memory://", actors=[lossy, plain], backend=taskq_backend)
    with pytest.raises(error):
        await tq.client.enqueue(target, payload)
    assert await tq.client.list_jobs() == []


def test_a_payload_key_that_is_no_text_is_refused_saying_what_to_give() -> None:
    with pytest.raises(PayloadValidationError, match=r"1\.\[key\].*give its keys as str"):
        plain.dump_payload({1: "a"})


async def test_inputs_one_backend_would_misread_are_refused_on_every_backend(
    taskq_backend: Backend,
) -> None:
    from datetime import datetime
    from uuid import uuid4

    from pydantic import ValidationError

    from taskq.models import JobFilter

    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    kept = await tq.client.enqueue(job, {})
    # Postgres took a naive cursor as UTC; memory could not compare it.
    with pytest.raises(ValidationError, match="timezone"):
        JobFilter(cursor=(datetime(2026, 1, 1), uuid4()))
    # Memory enqueued (and committed) with no caller's transaction to join.
    with pytest.raises(TypeError, match="needs the caller's connection"):
        await tq.client.enqueue_with_conn(None, job, {})
    # Postgres waited forever; memory gave up at once.
    with pytest.raises(ValueError, match="not nan"):
        await tq.client.wait_for_result(kept.id, timeout=float("nan"))
    # It said "did not finish within -1 s".
    with pytest.raises(ValueError, match="0 or more, not -1"):
        await tq.client.wait_for_result(kept.id, timeout=-1)
    assert [r.id for r in await tq.client.list_jobs()] == [kept.id]


@actor(name="options.echo")
async def echo(payload: dict[str, Any]) -> Any:
    return payload


async def test_a_value_past_the_jsonb_limit_is_refused_on_every_backend(
    taskq_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Over 256 MB: memory took it, Postgres raised its driver's error (or lost the
    # connection past 1 GB); a result that large succeeded in memory only. The limit,
    # made small here, is jsonb's on both.
    from taskq.backend import storable
    from taskq_testing import run_until_idle

    monkeypatch.setattr(storable, "MAX_JSON_BYTES", 1_000)
    tq = TaskQ("memory://", actors=[echo], backend=taskq_backend)
    with pytest.raises(
        ValueError, match="JSON value of 1,0.. bytes cannot be stored: at most 1,000"
    ):
        await tq.client.enqueue(echo, {"x": "y" * 1_000})
    assert await tq.client.list_jobs() == []
    small = await tq.client.enqueue(echo, {"x": "y" * 400})
    monkeypatch.setattr(storable, "MAX_JSON_BYTES", 300)  # its result now too large
    await run_until_idle(tq, queues=["default"])
    row = await tq.client.get(small.id)
    assert row is not None and row.status is JobStatus.FAILED
    assert row.error is not None and "cannot be stored" in row.error.message


def _nested(depth: int) -> Any:
    value: Any = 0
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@actor(name="options.deep_result")
async def deep_result(payload: dict[str, Any], ctx: Context) -> Any:
    await ctx.progress({"tree": _nested(230)})
    return _nested(230)


async def test_json_nested_past_the_fast_readers_200_levels_is_stored_and_read_back(
    taskq_backend: Backend,
) -> None:
    # pydantic-core writes 254 levels and reads 200: such a value was stored and never
    # read back. Its enqueue raised after the commit (a retry made a duplicate), every
    # dispatch that took it failed with its co-dispatched jobs until the worker exited,
    # and a schedule holding it stopped cron for the fleet.
    from taskq.models import ScheduleCreateArgs
    from taskq_testing import run_until_idle

    tq = TaskQ("memory://", actors=[echo, deep_result], backend=taskq_backend)
    deep = {"tree": _nested(230)}
    one = await tq.client.enqueue(echo, deep, metadata={"tree": _nested(230)})
    [batched] = await tq.client.enqueue_batch([(echo, deep)])
    assert await tq.client.enqueue_batch_fast([(echo, deep)]) == 1
    made = await tq.client.create_schedule(
        ScheduleCreateArgs(name="deep", actor=echo.name, cron="0 3 * * *", payload=deep)
    )
    assert one.payload == deep and batched.payload == deep and made.payload == deep
    assert [s.payload for s in await tq.client.list_schedules()] == [deep]
    result = await tq.client.enqueue(deep_result, {})
    await run_until_idle(tq)
    rows = await tq.client.list_jobs()
    assert [row.status for row in rows] == [JobStatus.SUCCEEDED] * 4
    assert all(row.result == deep for row in rows if row.actor == echo.name)
    done = await tq.client.get(result.id)
    assert done is not None and done.result == _nested(230)
    assert done.progress_state == {"tree": _nested(230)}
    # Past the writer's limit: refused before anything is stored, and said plainly.
    with pytest.raises(ValueError, match="nested too deep: flatten it"):
        await tq.client.enqueue(echo, {"tree": _nested(300)})
    with pytest.raises(ValueError, match="nested more than 254 levels deep .* flatten it"):
        await tq.client.enqueue(echo, {}, metadata={"tree": _nested(300)})
    assert len(await tq.client.list_jobs()) == 4


def test_stored_json_deeper_than_the_fast_reader_takes_is_still_read() -> None:
    from taskq.backend.storable import load_json

    deep: Any = 0
    for _ in range(240):
        deep = [deep]
    assert load_json(json.dumps(deep)) == deep


@actor(name="options.capped", max_pending=1)
async def capped(payload: dict[str, Any]) -> None:
    return None


async def test_an_idempotent_retry_at_max_pending_gets_its_job_back(
    taskq_backend: Backend,
) -> None:
    # A producer retrying after a timeout, under backpressure, was refused
    # (MaxPendingExceededError) though its job existed and nothing would be inserted.
    from taskq.errors import MaxPendingExceededError

    tq = TaskQ("memory://", actors=[capped], backend=taskq_backend)
    first = await tq.client.enqueue(capped, {}, idempotency_key="order-7")
    again = await tq.client.enqueue(capped, {}, idempotency_key="order-7")
    assert again.id == first.id
    with pytest.raises(MaxPendingExceededError):
        await tq.client.enqueue(capped, {}, idempotency_key="order-8")
    with pytest.raises(MaxPendingExceededError):
        await tq.client.enqueue(capped, {})
    # A batch too, when every item's key is stored: nothing is inserted.
    [batched] = await tq.client.enqueue_batch(
        [EnqueueItem(actor="options.capped", payload={}, options={"idempotency_key": "order-7"})]
    )
    assert batched.id == first.id
    with pytest.raises(MaxPendingExceededError):
        await tq.client.enqueue_batch(
            [
                EnqueueItem(actor="options.capped", payload={}, options={"idempotency_key": k})
                for k in ("order-7", "order-9")
            ]
        )
    assert [r.id for r in await tq.client.list_jobs()] == [first.id]


async def test_max_pending_counts_a_backlog_only_up_to_the_limit(taskq_backend: Backend) -> None:
    # Every refused enqueue counted the actor's whole backlog: a million waiting rows
    # read for each producer's retry, while the queue was already past its limit.
    from taskq.errors import MaxPendingExceededError

    tq = TaskQ("memory://", actors=[capped], backend=taskq_backend)
    async with tq:
        # Past the limit by other means (the limit lowered since): five waiting jobs.
        backlog = [tq.client.build_args(capped, {}) for _ in range(5)]
        await taskq_backend.enqueue_batch(backlog)
        with pytest.raises(MaxPendingExceededError) as refused:
            await tq.client.enqueue(capped, {})
    assert "already has 1 or more waiting jobs (max_pending=1)" in str(refused.value)


@actor(name="options.closed", max_pending=0)
async def closed(payload: dict[str, Any]) -> None:
    return None


async def test_max_pending_zero_refuses_every_job_saying_so(taskq_backend: Backend) -> None:
    # Counted up to 0, the refusal said "already has 0 or more waiting jobs".
    from taskq.errors import MaxPendingExceededError

    tq = TaskQ("memory://", actors=[closed], backend=taskq_backend)
    async with tq:
        with pytest.raises(
            MaxPendingExceededError, match=r"takes no waiting jobs \(max_pending=0\)"
        ):
            await tq.client.enqueue(closed, {})
        assert await tq.client.list_jobs() == []


@pytest.mark.parametrize("fast", [False, True], ids=["enqueue_batch", "enqueue_batch_fast"])
async def test_items_repeating_a_new_key_count_once_against_max_pending(
    taskq_backend: Backend, fast: bool
) -> None:
    # The batch makes one job, yet was refused for adding two (max_pending=1).
    tq = TaskQ("memory://", actors=[capped], backend=taskq_backend)
    twice = [
        EnqueueItem(actor="options.capped", payload={}, options={"idempotency_key": "order-1"})
    ] * 2
    if fast:
        # COPY does not deduplicate (the call fails on the repeated key), but not as
        # "past max_pending".
        with pytest.raises(ValueError, match="already used|duplicate|idempotency"):
            await tq.client.enqueue_batch_fast(twice)
    else:
        first, second = await tq.client.enqueue_batch(twice)
        assert first.id == second.id
        assert [r.id for r in await tq.client.list_jobs()] == [first.id]


async def test_a_job_id_as_text_finds_the_job_on_every_backend(taskq_backend: Backend) -> None:
    # From a URL or a command line: Postgres found the job, the in-memory backend not.
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    row = await tq.client.enqueue(job, {})
    text = str(row.id)
    found = await tq.client.get(text)
    assert found is not None and found.id == row.id
    assert [e.kind for e in await tq.client.get_events(text)] == [
        e.kind for e in await tq.client.get_events(row.id)
    ]
    assert await tq.client.cancel(text) is True
    with pytest.raises(ValueError, match="'nope' is not a job id"):
        await tq.client.get("nope")
    with pytest.raises(TypeError, match="a job id is a UUID"):
        await tq.client.get(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "error"),
    [("x\x00y", "must not contain NUL"), ("x\udcffy", "is a lone surrogate")],
    ids=["nul", "surrogate"],
)
@pytest.mark.parametrize("field", ["actor", "queue", "identity_key", "idempotency_key", "tags"])
async def test_a_filter_with_a_nul_is_a_clear_error_on_every_backend(
    taskq_backend: Backend, field: str, bad: str, error: str
) -> None:
    # Postgres raised a driver error, the in-memory backend matched nothing.
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    value: Any = [bad] if field == "tags" else bad
    with pytest.raises(ValueError, match=error):
        await tq.client.list_jobs(**{field: value})
    with pytest.raises(ValueError, match=error):
        await tq.client.cancel_where(**{field: value})


async def test_cancel_reasons_are_text_stored_as_every_backend_can_hold_it(
    taskq_backend: Backend,
) -> None:
    # A list was stored by memory (breaking JobRow's type), a driver error on Postgres.
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    row = await tq.client.enqueue(job, {})
    for reason in (["no"], {"why": 1}, 5, b"bytes"):
        with pytest.raises(TypeError, match="a cancel reason is a string or None"):
            await tq.client.cancel(row.id, reason=reason)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="a cancel reason is a string or None"):
            await tq.client.cancel_where(actor=job.name, reason=reason)  # type: ignore[arg-type]
    assert (await tq.client.get(row.id)).status is JobStatus.PENDING  # type: ignore[union-attr]
    assert await tq.client.cancel(row.id, reason="from /data/\udcff.csv\x00")
    cancelled = await tq.client.get(row.id)
    assert cancelled is not None and cancelled.cancel_reason == "from /data/\ufffd.csv\ufffd"


async def test_an_actor_of_another_type_is_a_clear_error(taskq_backend: Backend) -> None:
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    with pytest.raises(TypeError, match="an actor is given as an @actor function or its name"):
        await tq.client.enqueue(5, {})  # type: ignore[arg-type]
    assert await tq.client.list_jobs() == []


async def test_reads_take_an_actor_as_enqueue_does(taskq_backend: Backend) -> None:
    # The @actor function enqueue takes was refused by list_jobs and cancel_where
    # (pydantic's "Input should be a valid string") and list_schedules (a TypeError from
    # deep in its name check), and so was it by create_schedule.
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    row = await tq.client.enqueue(job, {})
    assert JobFilter(actor=job).actor == job.name
    assert [r.id for r in await tq.client.list_jobs(actor=job)] == [row.id]
    made = await tq.client.create_schedule(
        {"name": "nightly", "actor": job.name, "cron": "0 3 * * *"}
    )
    assert [s.id for s in await tq.client.list_schedules(actor=job)] == [made.id]
    by_function = await tq.client.create_schedule(
        {"name": "hourly", "actor": job, "cron": "0 * * * *"}
    )
    assert by_function.actor == job.name
    assert ScheduleCreateArgs(name="n", actor=job, cron="0 * * * *").actor == job.name
    assert (await tq.client.cancel_where(actor=job)).cancelled == [row.id]
    with pytest.raises(TypeError, match="actor is an @actor function or its name, not int"):
        await tq.client.list_schedules(actor=5)  # type: ignore[arg-type]


async def test_schedules_take_their_ids_as_text_and_their_args_as_dicts(
    taskq_backend: Backend,
) -> None:
    # By text: memory found no schedule (KeyError), Postgres found it, and an update
    # with a payload was a KeyError on both; a dict was an AttributeError.
    from taskq.models import ScheduleUpdateArgs

    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    made = await tq.client.create_schedule(
        {"name": "nightly", "actor": job.name, "cron": "0 3 * * *"}
    )
    text = str(made.id)
    updated = await tq.client.update_schedule(text, {"payload": {"n": 1}})
    assert updated.id == made.id and updated.payload == {"n": 1}
    updated = await tq.client.update_schedule(text, ScheduleUpdateArgs(enabled=False))
    assert updated.enabled is False
    moved = await tq.client.update_schedule(text, {"queue": "elsewhere"})
    assert moved.queue == "elsewhere"
    assert (await tq.client.update_schedule(text, {"actor_queue": True})).queue is None
    with pytest.raises(ValueError, match="'xyz' is not a schedule id"):
        await tq.client.update_schedule("xyz", {"enabled": True})
    with pytest.raises(TypeError, match="a schedule id is a UUID"):
        await tq.client.delete_schedule(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a ScheduleCreateArgs"):
        await tq.client.create_schedule(["nightly"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not contain NUL"):
        await tq.client.create_schedule({"name": "n\x00", "actor": job.name, "cron": "* * * * *"})
    with pytest.raises(ValueError, match="must not contain NUL"):
        await tq.client.list_schedules(actor="o\x00")
    with pytest.raises(TypeError, match="enabled is True, False or None"):
        await tq.client.list_schedules(enabled="no")  # type: ignore[arg-type]
    await tq.client.delete_schedule(text)
    assert await tq.client.list_schedules() == []
    with pytest.raises(KeyError, match="no schedule with id"):
        await tq.client.update_schedule(made.id, {"payload": {}})


async def test_a_batch_id_in_any_uuid_spelling_is_found_by_its_batch(
    taskq_backend: Backend,
) -> None:
    from uuid import uuid4

    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    batch = uuid4()
    for spelling in (str(batch), str(batch).upper(), batch.hex):
        await tq.client.enqueue(job, {}, metadata={"batch_id": spelling})
    assert len(await tq.client.list_jobs(batch_id=batch)) == 3


async def test_a_payload_that_does_not_validate_back_is_named_by_field_not_shown() -> None:
    # The message printed the whole stored form: every field's value, personal or not.
    tq = TaskQ("memory://", actors=[lossy])
    async with tq:
        with pytest.raises(PayloadValidationError, match="does not validate back") as info:
            await tq.client.enqueue(lossy, {"when": 3})
    told = "".join(traceback.format_exception(info.value))
    assert "when" in told and "at 3" not in told  # nor in the chain a traceback prints


async def test_an_invalid_payloads_error_prints_no_value() -> None:
    value = "s3" + "cr3t-not-an-int"  # split: the traceback quotes this source line
    tq = TaskQ("memory://", actors=[lossy])
    async with tq:
        with pytest.raises(PayloadValidationError, match="invalid payload") as info:
            await tq.client.enqueue(lossy, {"when": value})
    told = "".join(traceback.format_exception(info.value))
    assert "when" in told and "s3cr3t" not in told


async def test_cancel_where_without_a_filter_refuses_rather_than_cancel_every_job(
    taskq_backend: Backend,
) -> None:
    tq = TaskQ("memory://", actors=[job], backend=taskq_backend)
    row = await tq.client.enqueue(job, {})
    with pytest.raises(TypeError, match=r"needs a filter.*pass JobFilter\(\) to cancel every job"):
        await tq.client.cancel_where()
    with pytest.raises(TypeError, match="needs a filter"):
        await tq.client.cancel_where(reason="cleanup")
    # Keywords that select nothing are no filter: an unset variable's None, say.
    with pytest.raises(TypeError, match="needs a filter"):
        await tq.client.cancel_where(queue=None, actor=None, tags=[])
    assert (await tq.client.get(row.id)).status is JobStatus.PENDING  # type: ignore[union-attr]
    assert (await tq.client.cancel_where(JobFilter(), reason="all")).cancelled == [row.id]


class _Resize(BaseModel):
    image_id: int
    width: int = 100


class _Crop(BaseModel):
    image_id: int
    box: str = "0,0,10,10"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True)
    shape: _Resize
    label: str


@actor(name="payloads.resize")
async def resize(payload: _Resize) -> None:
    return None


@actor(name="payloads.strict")
async def strict(payload: _Strict) -> None:
    return None


async def test_a_payload_of_another_model_is_refused_not_enqueued_as_this_actors() -> None:
    # Refused by the model, the payload was read again as JSON (a fallback for strict
    # types' stored form), so a Crop passed to the resize actor went in as a resize job:
    # its box dropped, the width it never had set to the default.
    tq = TaskQ("memory://", actors=[resize, strict])
    async with tq:
        with pytest.raises(PayloadValidationError, match="instance of _Resize"):
            await tq.client.enqueue(resize, _Crop(image_id=1))
        with pytest.raises(PayloadValidationError, match="shape"):
            await tq.client.enqueue(strict, {"shape": _Crop(image_id=1), "label": "a"})
        with pytest.raises(PayloadValidationError, match="label"):
            await tq.client.enqueue(strict, {"shape": {"image_id": 1}, "label": uuid4()})
        # The stored form (what a worker reads back) still validates, strict or not.
        stored = {"shape": {"image_id": 1, "width": 5}, "label": "a"}
        assert (await tq.client.enqueue(strict, stored)).payload == stored
        assert (await tq.client.enqueue(resize, _Resize(image_id=2))).payload == {
            "image_id": 2,
            "width": 100,
        }
        assert await tq.client.list_jobs(actor="payloads.resize") != []
        assert len(await tq.client.list_jobs()) == 2


@actor(name="payloads.any_dict")
async def any_dict(payload: dict[str, Any]) -> None:
    return None


async def test_a_model_given_to_a_dict_actor_is_refused_with_what_to_pass_instead() -> None:
    # Once converted through JSON, a model passed to a dict-typed actor is now refused
    # (an object of another type is not read again as JSON): pydantic's bare "Input
    # should be a valid dictionary" named neither what was given nor what to do.
    tq = TaskQ("memory://", actors=[any_dict, resize])
    async with tq:
        with pytest.raises(PayloadValidationError) as refused:
            await tq.client.enqueue(any_dict, _Resize(image_id=1))
        said = str(refused.value)
        assert "given a _Resize, not a dict" in said
        assert "model_dump(mode='json')" in said
        with pytest.raises(PayloadValidationError, match="given a _Crop, not a _Resize"):
            await tq.client.enqueue(resize, _Crop(image_id=1))
        stored = _Resize(image_id=1).model_dump(mode="json")
        assert (await tq.client.enqueue(any_dict, stored)).payload == stored
