"""Enqueue: the inserted row, idempotency, singletons, the batch paths and wake-ups."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from uuid import uuid4

import pytest

from taskq.backend import Backend, CancelPhase, Connection, JobStatus, SupportsEnqueuePrecheck
from taskq.errors import SingletonCollisionError, UnstorableValueError
from taskq.models import ActorConfig, EnqueueArgs, JobFilter, JobRow
from taskq_testing.conformance._support import (
    ACTOR,
    FAR,
    LONG_LEASE,
    AdvanceTime,
    assert_close,
    assert_utc,
    covers,
    fetch,
    make_args,
    reach,
    require_conn,
    wait_for_wake,
)

_Insert = Callable[[Backend, Connection, EnqueueArgs], Awaitable[object]]

_MANY = 6_000
"""Jobs enough for a backend that writes as it pulls to have sent some before the end
(asyncpg sends a COPY's rows every 512 KiB: some 2,500 jobs)."""


class _InputFailed(Exception):
    """Raised by a test's input while a backend pulls it."""


async def _via_enqueue(backend: Backend, conn: Connection, args: EnqueueArgs) -> object:
    return await backend.enqueue(args)


async def _via_enqueue_with_conn(backend: Backend, conn: Connection, args: EnqueueArgs) -> object:
    return await backend.enqueue_with_conn(conn, args)


async def _via_enqueue_batch(backend: Backend, conn: Connection, args: EnqueueArgs) -> object:
    return await backend.enqueue_batch([args])


async def _via_enqueue_batch_fast(backend: Backend, conn: Connection, args: EnqueueArgs) -> object:
    return await backend.enqueue_batch_fast([args])


_INSERTS: dict[str, _Insert] = {
    "enqueue": _via_enqueue,
    "enqueue_with_conn": _via_enqueue_with_conn,
    "enqueue_batch": _via_enqueue_batch,
    "enqueue_batch_fast": _via_enqueue_batch_fast,
}
# enqueue_batch_fast has no idempotency handling by contract.
_IDEMPOTENT_INSERTS = ["enqueue", "enqueue_with_conn", "enqueue_batch"]


def _full_args(**overrides: object) -> EnqueueArgs:
    """Args with every optional field set, to check they are stored as given."""
    return make_args(
        payload={"n": 1, "nested": {"list": [1, "two", None]}},
        priority=7,
        max_attempts=5,
        idempotency_key=f"idem-{uuid4()}",
        identity_key="identity-1",
        fairness_key="tenant-a",
        timeout=timedelta(seconds=30),
        result_ttl=timedelta(hours=2),
        metadata={"source": "conformance", "nested": {"k": [1, 2]}},
        tags=["red", "blue"],
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id="b7ad6b7169203331",
        **overrides,
    )


def _plain_args(**overrides: object) -> EnqueueArgs:
    """Args with none of the optional fields (keys, deadline, timeout, TTL, metadata,
    tags, trace) set: a job as most enqueues make it."""
    return make_args(payload={"n": 2, "list": [1, None]}, priority=3, max_attempts=4, **overrides)


def _assert_stored_as_given(row: JobRow, args: EnqueueArgs) -> None:
    assert row.id == args.id
    assert (row.actor, row.queue, row.payload) == (args.actor, args.queue, args.payload)
    assert (row.priority, row.max_attempts) == (args.priority, args.max_attempts)
    assert (row.idempotency_key, row.identity_key, row.fairness_key) == (
        args.idempotency_key,
        args.identity_key,
        args.fairness_key,
    )
    assert (row.timeout, row.result_ttl) == (args.timeout, args.result_ttl)
    assert (row.metadata, row.tags) == (args.metadata, args.tags)
    assert (row.trace_id, row.span_id) == (args.trace_id, args.span_id)


def _assert_fresh(row: JobRow) -> None:
    """The run-state of a job nobody has touched since insert."""
    assert row.attempt == 0
    assert row.progress_seq == 0 and row.progress_state is None
    assert row.cancel_phase == CancelPhase.NONE
    assert row.cancel_requested_at is None and row.cancel_reason is None
    assert row.locked_by_worker is None and row.lock_expires_at is None
    assert row.started_at is None and row.execution_started_at is None
    assert row.finished_at is None
    assert row.result is None and row.error is None


class EnqueueTests:
    """``enqueue`` and its batch/connection variants; actor settings for backpressure."""

    @pytest.mark.parametrize("kind", ["idempotency-key", "no-key", "plain"])
    @covers("enqueue", "get")
    async def test_enqueue_stores_a_pending_job_as_given(self, backend: Backend, kind: str) -> None:
        # Without a key, Postgres takes a leaner statement, and a leaner one still
        # when no optional field is set: all must store the same.
        args = _full_args() if kind != "plain" else _plain_args()
        if kind == "no-key":
            args = args.model_copy(update={"idempotency_key": None})
        row = await backend.enqueue(args)
        _assert_stored_as_given(row, args)
        _assert_fresh(row)
        assert row.status is JobStatus.PENDING
        assert_utc(row.created_at, row.scheduled_at)
        assert_close(row.scheduled_at, row.created_at)
        assert row.deadline_at is None
        assert await backend.get(args.id) == row

    @pytest.mark.parametrize("plain", [False, True], ids=["with-deadline", "plain"])
    @covers("enqueue", "get")
    async def test_a_delayed_job_is_returned_as_stored(self, backend: Backend, plain: bool) -> None:
        # Postgres builds a keyless job's returned row from what it sent and what
        # the server decided (status, times): it must equal the stored one.
        if plain:
            args = _plain_args(delay=FAR)
        else:
            args = _full_args(delay=FAR, schedule_to_close=FAR * 2).model_copy(
                update={"idempotency_key": None}
            )
        row = await backend.enqueue(args)
        _assert_stored_as_given(row, args)
        _assert_fresh(row)
        assert row.status is JobStatus.SCHEDULED
        assert_close(row.scheduled_at, row.created_at + FAR)
        assert (row.deadline_at is None) is plain
        assert await backend.get(args.id) == row

    @pytest.mark.parametrize("delay", [None, timedelta(0)], ids=["no-delay", "zero-delay"])
    @covers("enqueue")
    async def test_enqueue_without_a_positive_delay_is_pending_now(
        self, backend: Backend, delay: timedelta | None
    ) -> None:
        row = await backend.enqueue(make_args(delay=delay))
        assert row.status is JobStatus.PENDING
        assert_close(row.scheduled_at, row.created_at)

    @covers("enqueue")
    async def test_enqueue_with_a_delay_is_scheduled_that_much_later(
        self, backend: Backend
    ) -> None:
        row = await backend.enqueue(make_args(delay=FAR))
        assert row.status is JobStatus.SCHEDULED
        assert_utc(row.scheduled_at)
        assert_close(row.scheduled_at, row.created_at + FAR)

    @covers("enqueue")
    async def test_schedule_to_close_sets_the_deadline_from_enqueue(self, backend: Backend) -> None:
        row = await backend.enqueue(make_args(schedule_to_close=timedelta(minutes=30)))
        assert_utc(row.deadline_at)
        assert_close(row.deadline_at, row.created_at + timedelta(minutes=30))

    @covers("enqueue", "get_events", "get_attempts")
    async def test_enqueue_writes_no_history(self, backend: Backend) -> None:
        # Creation is not a transition: no event, no attempt.
        row = await backend.enqueue(make_args())
        assert await backend.get_events(row.id) == []
        assert await backend.get_attempts(row.id) == []

    @pytest.mark.parametrize("method", sorted(_INSERTS))
    @covers("subscribe_wake", "enqueue", "enqueue_with_conn", "enqueue_batch", "enqueue_batch_fast")
    async def test_every_enqueue_path_wakes_every_subscriber(
        self, backend: Backend, transaction_conn: Connection, method: str
    ) -> None:
        if method == "enqueue_with_conn":
            require_conn(backend, transaction_conn)
        async with backend.subscribe_wake() as first, backend.subscribe_wake() as second:
            await _INSERTS[method](backend, transaction_conn, make_args())
            await wait_for_wake(first)
            await wait_for_wake(second)

    @covers("subscribe_wake", "enqueue", "dispatch_batch")
    async def test_enqueues_right_after_a_wake_still_wake(self, backend: Backend) -> None:
        # Postgres coalesces the NOTIFYs of enqueues that overlap: those of the
        # burst go out as one trailing wake, which must come all the same.
        queue, burst = f"burst-{uuid4().hex[:8]}", 10
        async with backend.subscribe_wake() as wake:
            await backend.enqueue(make_args(queue=queue))
            await wait_for_wake(wake)
            wake.clear()
            await asyncio.gather(*(backend.enqueue(make_args(queue=queue)) for _ in range(burst)))
            found = 0
            while found < burst + 1:
                await wait_for_wake(wake)
                wake.clear()
                found += len(await backend.dispatch_batch(uuid4(), [queue], 20, LONG_LEASE))

    # -- idempotency ------------------------------------------------------------

    @pytest.mark.parametrize(
        "existing_status",
        [
            JobStatus.PENDING,
            JobStatus.SCHEDULED,
            JobStatus.RUNNING,
            JobStatus.SUCCEEDED,
            JobStatus.CANCELLED,
        ],
    )
    @pytest.mark.parametrize("method", _IDEMPOTENT_INSERTS)
    @covers("enqueue", "enqueue_with_conn", "enqueue_batch", "list_jobs")
    async def test_a_known_idempotency_key_returns_the_existing_job_unchanged(
        self,
        backend: Backend,
        transaction_conn: Connection,
        method: str,
        existing_status: JobStatus,
    ) -> None:
        if method == "enqueue_with_conn":
            require_conn(backend, transaction_conn)
        existing = await reach(backend, existing_status, idempotency_key="k1", queue="q")
        duplicate = make_args(idempotency_key="k1", queue="q", payload={"other": True})
        returned = await _INSERTS[method](backend, transaction_conn, duplicate)
        if method == "enqueue_batch":
            assert isinstance(returned, list) and len(returned) == 1
            returned = returned[0]
        assert returned == existing
        assert await backend.get(duplicate.id) is None
        assert await backend.get(existing.id) == existing
        assert [row.id for row in await backend.list_jobs(JobFilter())] == [existing.id]

    @covers("enqueue")
    async def test_idempotency_keys_are_scoped_per_actor(self, backend: Backend) -> None:
        first = await backend.enqueue(make_args(idempotency_key="k1"))
        other = await backend.enqueue(make_args(actor="conformance.other", idempotency_key="k1"))
        assert other.id != first.id
        assert await backend.get(other.id) == other

    @covers("enqueue_batch")
    async def test_enqueue_batch_mixes_new_rows_and_idempotent_hits_in_input_order(
        self, backend: Backend
    ) -> None:
        existing = await backend.enqueue(make_args(idempotency_key="dup"))
        fresh_a, dup, fresh_b = make_args(), make_args(idempotency_key="dup"), make_args(delay=FAR)
        rows = await backend.enqueue_batch([fresh_a, dup, fresh_b])
        assert [row.id for row in rows] == [fresh_a.id, existing.id, fresh_b.id]
        assert rows[1] == existing
        assert [row.status for row in rows] == [
            JobStatus.PENDING,
            JobStatus.PENDING,
            JobStatus.SCHEDULED,
        ]
        assert len(await backend.list_jobs(JobFilter())) == 3

    @covers("enqueue_batch", "get")
    async def test_enqueue_batch_gives_a_key_repeated_in_the_call_its_first_items_row(
        self, backend: Backend
    ) -> None:
        first = _full_args()
        again = make_args(idempotency_key=first.idempotency_key, payload={"again": True})
        plain = make_args()
        rows = await backend.enqueue_batch([first, again, plain])
        assert [row.id for row in rows] == [first.id, first.id, plain.id]
        _assert_stored_as_given(rows[0], first)
        assert rows[1] == rows[0] == await backend.get(first.id)
        assert await backend.get(again.id) is None
        assert len(await backend.list_jobs(JobFilter())) == 2

    @pytest.mark.parametrize("duplicate_of", ["stored-job", "same-call"])
    @covers("enqueue_batch_fast")
    async def test_enqueue_batch_fast_fails_whole_on_a_duplicate_idempotency_key(
        self, backend: Backend, duplicate_of: str
    ) -> None:
        before = []
        if duplicate_of == "stored-job":
            before = [await backend.enqueue(make_args(idempotency_key="dup"))]
            batch = [make_args(), make_args(idempotency_key="dup")]
        else:
            batch = [
                make_args(),
                make_args(idempotency_key="dup"),
                make_args(idempotency_key="dup"),
            ]
        with pytest.raises(ValueError, match="idempotency key"):
            await backend.enqueue_batch_fast(batch)
        assert await backend.list_jobs(JobFilter()) == before

    @covers("enqueue", "enqueue_batch", "enqueue_batch_fast", "get")
    async def test_nul_characters_in_payload_metadata_and_tags_are_stored_as_replacements(
        self, backend: Backend
    ) -> None:
        def nul_args() -> EnqueueArgs:
            return make_args(payload={"p": "\x00"}, metadata={"\x00": 1}, tags=["t\x00"])

        stored = ({"p": "\ufffd"}, {"\ufffd": 1}, ["t\ufffd"])
        one = await backend.enqueue(nul_args())
        [batched] = await backend.enqueue_batch([nul_args()])
        copied = nul_args()
        assert await backend.enqueue_batch_fast([copied]) == 1
        for job in (one, batched, await fetch(backend, copied.id)):
            assert (job.payload, job.metadata, job.tags) == stored
            assert await fetch(backend, job.id) == job

    @covers("enqueue", "enqueue_batch", "enqueue_batch_fast", "get")
    async def test_numbers_read_back_as_postgres_jsonb_keeps_them(self, backend: Backend) -> None:
        # jsonb stores decimals written without an exponent: 1e16 reads back an int,
        # -0.0 as 0.0. The in-memory backend kept the floats, and Postgres's own
        # enqueue returned them while a later read did not.
        sent = {"big": 1e16, "bigger": -1.5e300, "zero": -0.0, "small": 1e-7, "plain": 2.5}
        stored = {"big": 10**16, "bigger": -15 * 10**299, "zero": 0.0, "small": 1e-7, "plain": 2.5}

        def args() -> EnqueueArgs:
            return make_args(payload=sent, metadata=sent)

        one = await backend.enqueue(args())
        [batched] = await backend.enqueue_batch([args()])
        copied = args()
        assert await backend.enqueue_batch_fast([copied]) == 1
        for job in (one, batched, await fetch(backend, copied.id)):
            for value in (job.payload, job.metadata):
                assert value == stored
                assert {k: type(v) for k, v in value.items()} == {
                    k: type(v) for k, v in stored.items()
                }
                assert math.copysign(1.0, value["zero"]) == 1.0
            assert await fetch(backend, job.id) == job

    @pytest.mark.parametrize("field", ["payload", "metadata"])
    @pytest.mark.parametrize(
        ("bad", "error"),
        [
            (float("nan"), "is not a JSON number"),
            # Storable, but never readable back: it used to wedge its queue on Postgres.
            (10**4300, "more than 4300 digits"),
            # What os.fsdecode makes of a file name's undecodable bytes: not UTF-8, and a
            # replacement would lose the name. It was a serializer's error.
            ("/data/\udcff.csv", "lone surrogate .* cannot be stored as JSON"),
            # No JSON form at all: the serializer's own error, no TaskQError.
            (object(), "cannot be stored as JSON .*<class 'object'>.*send JSON values"),
            (b"\xff", "cannot be stored as JSON .*invalid utf-8.*send JSON values"),
        ],
        ids=["nan", "long-int", "surrogate", "object", "bytes"],
    )
    @covers("enqueue", "enqueue_batch", "enqueue_batch_fast")
    async def test_a_number_json_cannot_hold_is_refused_and_writes_nothing(
        self, backend: Backend, field: str, bad: object, error: str
    ) -> None:
        args = make_args(**{field: {"x": bad, "fine": "1" * 5000}})
        # A TaskQError (as a producer catches them) and a ValueError.
        with pytest.raises(UnstorableValueError, match=error):
            await backend.enqueue(args)
        with pytest.raises(UnstorableValueError, match=error):
            await backend.enqueue_batch([make_args(), args])
        with pytest.raises(UnstorableValueError, match=error):
            await backend.enqueue_batch_fast([make_args(), args])
        assert await backend.list_jobs(JobFilter()) == []
        # Long digit runs in strings, and the longest integer that reads back, are fine.
        fine = await backend.enqueue(make_args(**{field: {"x": 10**4299, "s": "1" * 5000}}))
        assert getattr(await fetch(backend, fine.id), field)["x"] == 10**4299

    @pytest.mark.parametrize("field", ["payload", "metadata"])
    @covers("enqueue", "enqueue_batch")
    async def test_a_value_json_cannot_hold_is_refused_beside_a_known_idempotency_key(
        self, backend: Backend, field: str
    ) -> None:
        # Refused though the known key means nothing of it would be stored, as Postgres
        # refuses it when it serializes the rows it sends.
        known = await backend.enqueue(make_args(idempotency_key="once"))
        again = make_args(idempotency_key="once", **{field: {"x": float("nan")}})
        with pytest.raises(UnstorableValueError, match="is not a JSON number"):
            await backend.enqueue(again)
        with pytest.raises(UnstorableValueError, match="is not a JSON number"):
            await backend.enqueue_batch([again])
        assert await backend.list_jobs(JobFilter()) == [known]

    @covers("enqueue_batch_fast")
    async def test_enqueue_batch_fast_fails_whole_on_a_used_job_id(self, backend: Backend) -> None:
        taken = await backend.enqueue(make_args())
        with pytest.raises(ValueError, match="already exists"):
            await backend.enqueue_batch_fast([make_args(), make_args(id=taken.id)])
        assert await backend.list_jobs(JobFilter()) == [taken]

    # -- singleton ----------------------------------------------------------------

    @pytest.mark.parametrize(
        "active_status", [JobStatus.PENDING, JobStatus.SCHEDULED, JobStatus.RUNNING]
    )
    @covers("enqueue")
    async def test_singleton_collides_with_an_active_job_of_the_same_identity(
        self, backend: Backend, active_status: JobStatus
    ) -> None:
        active = await reach(backend, active_status, identity_key="user-1", queue="q")
        refused = make_args(identity_key="user-1", singleton=True, queue="q")
        with pytest.raises(SingletonCollisionError):
            await backend.enqueue(refused)
        assert await backend.get(refused.id) is None
        assert [row.id for row in await backend.list_jobs(JobFilter())] == [active.id]

    @pytest.mark.parametrize("fast", [False, True], ids=["enqueue_batch", "enqueue_batch_fast"])
    @covers("enqueue_batch", "enqueue_batch_fast")
    async def test_a_singleton_after_an_item_of_its_identity_in_one_call_names_the_call(
        self, backend: Backend, fast: bool
    ) -> None:
        # The error named the earlier item's job as the active holder to wait for: a job
        # that never existed (the whole call rolled back), so retrying never helped.
        first = make_args(identity_key="user-1", singleton=True)
        second = make_args(identity_key="user-1", singleton=True)
        call = backend.enqueue_batch_fast if fast else backend.enqueue_batch
        with pytest.raises(SingletonCollisionError, match="another item of this call") as refused:
            await call([first, second])
        assert str(first.id) not in str(refused.value)
        assert await backend.list_jobs(JobFilter()) == []

    @pytest.mark.parametrize(
        "finished_status", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED]
    )
    @covers("enqueue")
    async def test_singleton_ignores_finished_jobs_of_the_same_identity(
        self, backend: Backend, finished_status: JobStatus
    ) -> None:
        await reach(backend, finished_status, identity_key="user-1")
        row = await backend.enqueue(make_args(identity_key="user-1", singleton=True))
        assert row.status is JobStatus.PENDING

    @covers("enqueue")
    async def test_singleton_identity_is_scoped_per_actor(self, backend: Backend) -> None:
        await backend.enqueue(make_args(identity_key="user-1"))
        row = await backend.enqueue(
            make_args(actor="conformance.other", identity_key="user-1", singleton=True)
        )
        assert row.status is JobStatus.PENDING

    @covers("enqueue")
    async def test_identity_keys_without_singleton_never_block_enqueue(
        self, backend: Backend
    ) -> None:
        first = await backend.enqueue(make_args(identity_key="user-1"))
        second = await backend.enqueue(make_args(identity_key="user-1"))
        assert {first.status, second.status} == {JobStatus.PENDING}
        assert len(await backend.list_jobs(JobFilter(identity_key="user-1"))) == 2

    @covers("enqueue")
    async def test_singleton_without_identity_key_is_a_value_error(self, backend: Backend) -> None:
        args = make_args(singleton=True)
        with pytest.raises(ValueError):
            await backend.enqueue(args)
        assert await backend.get(args.id) is None

    @covers("precheck_enqueue")
    async def test_precheck_enqueue_raises_what_enqueue_batch_would_and_writes_nothing(
        self, backend: Backend
    ) -> None:
        if not isinstance(backend, SupportsEnqueuePrecheck):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsEnqueuePrecheck")
        held = await backend.enqueue(make_args(identity_key="user-1", idempotency_key="k"))
        free = make_args(identity_key="user-2", singleton=True)
        hit = make_args(idempotency_key="k", identity_key="user-1", singleton=True)
        await backend.precheck_enqueue([free, hit])  # a hit inserts nothing: no collision
        refused = make_args(identity_key="user-1", singleton=True)
        with pytest.raises(SingletonCollisionError):
            await backend.precheck_enqueue([free, refused])
        twice = make_args(identity_key="user-2", singleton=True)
        with pytest.raises(SingletonCollisionError):  # against the items before it too
            await backend.precheck_enqueue([free, twice])
        # The holder finishing first (a singleton enqueueing its own next run): free.
        await backend.precheck_enqueue([refused], finishing=held.id)
        assert [row.id for row in await backend.list_jobs(JobFilter())] == [held.id]

    # -- batch and connection paths ----------------------------------------------------

    @pytest.mark.parametrize("plain", [False, True], ids=["mixed", "plain"])
    @covers("enqueue_batch")
    async def test_enqueue_batch_returns_one_row_per_item_in_input_order(
        self, backend: Backend, plain: bool
    ) -> None:
        # Postgres sends an optional column no item sets as a NULL array: with every
        # item plain, all of them.
        first = _plain_args() if plain else _full_args()
        items = [first, _plain_args(delay=FAR), make_args(priority=-3)]
        rows = await backend.enqueue_batch(items)
        assert [row.id for row in rows] == [item.id for item in items]
        for row, item in zip(rows, items, strict=True):
            _assert_stored_as_given(row, item)
            _assert_fresh(row)
            assert await backend.get(item.id) == row
        assert [row.status for row in rows] == [
            JobStatus.PENDING,
            JobStatus.SCHEDULED,
            JobStatus.PENDING,
        ]

    @pytest.mark.parametrize("method", ["enqueue_batch", "enqueue_batch_fast"])
    @covers("enqueue_batch", "enqueue_batch_fast")
    async def test_enqueue_batch_of_nothing_inserts_nothing(
        self, backend: Backend, method: str
    ) -> None:
        if method == "enqueue_batch":
            assert await backend.enqueue_batch([]) == []
        else:
            assert await backend.enqueue_batch_fast([]) == 0
        assert await backend.list_jobs(JobFilter()) == []

    @covers("enqueue_batch")
    async def test_enqueue_batch_is_all_or_nothing(self, backend: Backend) -> None:
        # A second job cannot take an existing id, so the last item fails the batch.
        existing = await backend.enqueue(make_args())
        fresh = make_args()
        with pytest.raises(Exception):  # noqa: B017 - the contract fixes failure, not the type
            await backend.enqueue_batch([fresh, make_args(id=existing.id)])
        assert await backend.get(fresh.id) is None
        assert await backend.list_jobs(JobFilter()) == [existing]

    @covers("enqueue_batch_fast")
    async def test_enqueue_batch_fast_inserts_what_enqueue_would(self, backend: Backend) -> None:
        items = [_full_args(), make_args(delay=FAR), make_args()]
        assert await backend.enqueue_batch_fast(items) == 3
        rows = [await fetch(backend, item.id) for item in items]
        for row, item in zip(rows, items, strict=True):
            _assert_stored_as_given(row, item)
            _assert_fresh(row)
            assert_utc(row.created_at, row.scheduled_at)
        assert [row.status for row in rows] == [
            JobStatus.PENDING,
            JobStatus.SCHEDULED,
            JobStatus.PENDING,
        ]
        assert_close(rows[1].scheduled_at, rows[1].created_at + FAR)

    @covers("enqueue_batch_fast")
    async def test_enqueue_batch_fast_takes_a_lazy_input(self, backend: Backend) -> None:
        items = [make_args() for _ in range(_MANY)]
        assert await backend.enqueue_batch_fast(item for item in items) == _MANY
        for item in (items[0], items[-1]):
            _assert_stored_as_given(await fetch(backend, item.id), item)

    @covers("enqueue_batch_fast")
    async def test_enqueue_batch_fast_writes_nothing_when_its_input_fails_late(
        self, backend: Backend
    ) -> None:
        def failing() -> Iterator[EnqueueArgs]:
            for i in range(_MANY):
                if i == _MANY - 100:
                    raise _InputFailed(i)
                yield make_args()

        with pytest.raises(_InputFailed):
            await backend.enqueue_batch_fast(failing())
        assert await backend.list_jobs(JobFilter()) == []
        after = make_args()
        assert await backend.enqueue_batch_fast([after]) == 1
        assert [row.id for row in await backend.list_jobs(JobFilter())] == [after.id]

    @covers("enqueue_batch_fast")
    async def test_enqueue_batch_fast_admits_singletons_whose_identity_is_free(
        self, backend: Backend
    ) -> None:
        items = [
            make_args(identity_key="user-1", singleton=True),
            make_args(identity_key="user-2", singleton=True),
            make_args(identity_key="user-1"),
        ]
        assert await backend.enqueue_batch_fast(items) == 3
        assert len(await backend.list_jobs(JobFilter(identity_key="user-1"))) == 2

    @pytest.mark.parametrize("holder", ["stored", "earlier-in-batch"])
    @covers("enqueue_batch_fast")
    async def test_enqueue_batch_fast_refuses_a_singleton_whose_identity_is_held(
        self, backend: Backend, holder: str
    ) -> None:
        stored = []
        if holder == "stored":
            stored = [(await backend.enqueue(make_args(identity_key="user-1"))).id]
        batch = [make_args() for _ in range(3)]
        if holder == "earlier-in-batch":
            batch.insert(1, make_args(identity_key="user-1"))
        batch.append(make_args(identity_key="user-1", singleton=True))
        with pytest.raises(SingletonCollisionError):
            await backend.enqueue_batch_fast(batch)
        assert [row.id for row in await backend.list_jobs(JobFilter())] == stored

    @covers("enqueue_batch_fast")
    async def test_enqueue_batch_fast_refuses_a_singleton_without_identity_key(
        self, backend: Backend
    ) -> None:
        with pytest.raises(ValueError):
            await backend.enqueue_batch_fast([make_args(), make_args(singleton=True)])
        assert await backend.list_jobs(JobFilter()) == []

    @pytest.mark.parametrize("keyed", [True, False], ids=["idempotency-key", "no-key"])
    @covers("enqueue_with_conn")
    async def test_enqueue_with_conn_inserts_what_enqueue_would(
        self, backend: Backend, transaction_conn: Connection, keyed: bool
    ) -> None:
        require_conn(backend, transaction_conn)
        args = _full_args(delay=FAR, schedule_to_close=timedelta(hours=2))
        if not keyed:
            args = args.model_copy(update={"idempotency_key": None})
        row = await backend.enqueue_with_conn(transaction_conn, args)
        _assert_stored_as_given(row, args)
        _assert_fresh(row)
        assert row.status is JobStatus.SCHEDULED
        assert_close(row.scheduled_at, row.created_at + FAR)
        assert_close(row.deadline_at, row.created_at + timedelta(hours=2))
        assert await backend.get(args.id) == row

    # -- actor settings (the client enforces backpressure with them) -----------------

    @covers("register_actors", "get_actor_max_pending")
    async def test_register_actors_upserts_max_pending(self, backend: Backend) -> None:
        assert await backend.get_actor_max_pending() == {}
        await backend.register_actors(
            [ActorConfig(actor="a", max_pending=5), ActorConfig(actor="b", max_concurrent=2)]
        )
        assert await backend.get_actor_max_pending() == {"a": 5, "b": None}
        await backend.register_actors([ActorConfig(actor="a", max_pending=7)])
        assert await backend.get_actor_max_pending() == {"a": 7, "b": None}
        await backend.register_actors([ActorConfig(actor="a")])
        assert await backend.get_actor_max_pending() == {"a": None, "b": None}

    @covers("register_actors", "enqueue")
    async def test_max_pending_is_not_enforced_by_the_backend(self, backend: Backend) -> None:
        await backend.register_actors([ActorConfig(actor=ACTOR, max_pending=1)])
        for _ in range(3):
            await backend.enqueue(make_args())
        assert len(await backend.list_jobs(JobFilter(actor=ACTOR))) == 3

    @covers("enqueue")
    async def test_created_at_comes_from_the_backend_clock(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        first = await backend.enqueue(make_args())
        await advance_time(timedelta(seconds=0.05))
        second = await backend.enqueue(make_args())
        assert second.created_at - first.created_at >= timedelta(seconds=0.05)
