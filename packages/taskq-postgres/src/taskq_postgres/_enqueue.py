"""Enqueue on Postgres: the insert's parameters, idempotent hits and singleton checks.

The insert (``ENQUEUE``) takes a whole list as parallel arrays, so one job
and a thousand cost one statement each; a lone job without an idempotency
key (the usual ``enqueue``) takes the leaner ``ENQUEUE_ONE``. Items whose
``(actor, idempotency_key)`` exists come back as the existing row. Singletons need a
check that no concurrent singleton enqueue can slip past: it runs under
transaction-scoped advisory locks on the identities, in the same transaction
as the insert. ``enqueue_batch_fast`` COPYs its jobs, making each row as asyncpg
sends it, and checks singletons after the COPY.

The multi-statement steps are written once, as plans (generators that yield each
:class:`Query` and get its answer back), so that the asyncpg backend (:func:`run`)
and the psycopg sync client run the same logic.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, NamedTuple, TypeVar

import asyncpg

from taskq.backend.statemachine import parse_status
from taskq.backend.storable import clean_text, dump_json, load_json
from taskq.errors import EnqueueError, SingletonCollisionError
from taskq.identifiers import check_identifier
from taskq.models import EnqueueArgs, JobRow, from_valid_values
from taskq_postgres._connect import BackendUnavailableError
from taskq_postgres._rows import job_row
from taskq_postgres._sql.enqueue import COPY_COLUMNS, DECIDED_COLUMNS
from taskq_postgres._statements import Statements

__all__ = [
    "ASYNC_PSYCOPG",
    "UNSET",
    "CopyFeed",
    "Plan",
    "Query",
    "TransactionAbortedError",
    "aborted",
    "check_singletons",
    "closed_connection",
    "copy_jobs",
    "duplicate_id",
    "insert_jobs",
    "insert_one",
    "one_job",
    "plan_check_singletons",
    "plan_insert_jobs",
    "refuse_keyless_singletons",
    "run",
]

Db = Any
"""A pool, a pooled connection or a caller's connection: anything with ``fetch``."""

_T = TypeVar("_T")


class Query(NamedTuple):
    """One statement a plan needs the answer of: ``kind`` names the asyncpg method
    (``fetch``: the records, ``fetchrow``: the first or None, ``fetchval``: its first
    value)."""

    kind: str
    sql: str
    args: tuple[Any, ...]


Plan = Generator[Query, Any, _T]
"""Yields each statement to run and takes its answer back; returns the result."""


async def run(db: Db, plan: Plan[_T]) -> _T:
    """Run ``plan``'s statements on ``db`` (asyncpg), one after the other."""
    try:
        query = next(plan)
        while True:
            try:
                answer = await getattr(db, query.kind)(query.sql, *query.args)
            except asyncpg.UniqueViolationError as exc:
                _raise_duplicate(exc)
                raise
            query = plan.send(answer)
    except StopIteration as done:
        result: _T = done.value
        return result


UNSET: Final = object()
"""What :data:`_FRESH_ROW` holds for a field ``fresh_row`` must set (no plain default)."""

_FRESH_ROW: Final[dict[str, Any]] = {
    name: UNSET if field.is_required() or field.default_factory is not None else field.default
    for name, field in JobRow.model_fields.items()
}
"""Every field of a new job: its plain default (``None``, zero) where the insert neither
set nor returned the column, else :data:`UNSET`. ``fresh_row`` copies it and sets the
values sent and returned: a copy of a dict of every key, then stores into it, cost a
quarter less than building one from the defaults and the values."""


class TransactionAbortedError(EnqueueError):
    """The connection given for an enqueue (a psycopg one to ``SyncJobsClient``, an
    asyncpg one to ``enqueue_with_conn`` or as ``connection=``) is in a transaction an
    earlier error aborted (PostgreSQL refuses every statement in it until it ends), so
    nothing was enqueued. Roll it back first (or let the transaction block the error
    left end), then enqueue again.
    """


def aborted(rollback: str) -> TransactionAbortedError:
    """The error of an enqueue on a caller's aborted transaction, which ``rollback``
    (how the caller's driver rolls back) ends: the same words on either driver."""
    return TransactionAbortedError(
        f"the connection given is in a transaction an earlier error aborted (PostgreSQL "
        f"refuses every statement until it ends): nothing was enqueued; roll it back "
        f"({rollback}) first, then enqueue"
    )


ASYNC_PSYCOPG: Final = (
    "psycopg's AsyncConnection has no TaskQ client (enqueue_with_conn takes an asyncpg "
    "connection, SyncJobsClient a psycopg.Connection)"
)
"""What either client says of a psycopg ``AsyncConnection``: neither takes one."""


def closed_connection() -> BackendUnavailableError:
    """The error of an enqueue on a caller's connection that is closed: the same words on
    either driver."""
    return BackendUnavailableError(
        "the connection the enqueue was given is closed: nothing was enqueued; give it an open one"
    )


def refuse_keyless_singletons(args_list: Sequence[EnqueueArgs]) -> None:
    """``singleton=True`` without an ``identity_key`` is a ``ValueError`` (before any SQL)."""
    for args in args_list:
        if args.singleton and args.identity_key is None:
            raise ValueError(
                f"singleton=True needs an identity_key (actor {args.actor!r}): "
                f"a singleton is unique per (actor, identity_key)"
            )


_NO_DELAY: Final = timedelta(0)
_PAYLOADS: Final = 4
_METADATAS: Final = 13
"""Where ``_insert_params`` puts the payload and metadata texts (``ENQUEUE``'s $5, $14)."""


def _insert_params(args_list: Sequence[EnqueueArgs], parked: Sequence[bool]) -> list[Any]:
    return [
        [a.id for a in args_list],
        [a.actor for a in args_list],
        [a.queue for a in args_list],
        [a.priority for a in args_list],
        [dump_json(a.payload) for a in args_list],
        _sparse([a.delay for a in args_list]),
        [a.max_attempts for a in args_list],
        _sparse([a.idempotency_key for a in args_list]),
        _sparse([a.identity_key for a in args_list]),
        _sparse([a.fairness_key for a in args_list]),
        _sparse([a.schedule_to_close for a in args_list]),
        _sparse([a.timeout for a in args_list]),
        _sparse([a.result_ttl for a in args_list]),
        _sparse([dump_json(a.metadata) if a.metadata else None for a in args_list]),
        _sparse([dump_json(a.tags) if a.tags else None for a in args_list]),
        _sparse([a.trace_id for a in args_list]),
        _sparse([a.span_id for a in args_list]),
        list(parked) if any(parked) else None,
        [a.singleton for a in args_list] if any(a.singleton for a in args_list) else None,
    ]


def _sparse(column: list[Any]) -> list[Any] | None:
    """``column``, or None (a NULL array, which ``unnest`` pads with NULLs) when every
    value is None: asyncpg then encodes no element of it (a few type checks each)."""
    return column if any(value is not None for value in column) else None


def duplicate_id(constraint: str | None, detail: str | None) -> ValueError | None:
    """A unique violation on ``constraint`` as the caller's error when it is the jobs'
    primary key or idempotency key (only a COPY meets the latter: the inserts take a
    used key as a hit); None for any other (to be raised as it is)."""
    if constraint == "jobs_pkey":
        return ValueError(f"a job with that id already exists: {detail}")
    if constraint == "jobs_idempotency_key_uq":
        return ValueError(
            f"an idempotency key is already used: {detail}; enqueue_batch_fast does not "
            f"deduplicate, use enqueue_batch"
        )
    return None


def _raise_duplicate(exc: asyncpg.UniqueViolationError) -> None:
    """Raise :func:`duplicate_id`'s error for ``exc`` when it has one (else return, for
    the caller to re-raise ``exc``)."""
    error = duplicate_id(exc.constraint_name, exc.detail)
    if error is not None:
        raise error from exc


def _plain(a: EnqueueArgs) -> bool:
    """Whether every optional column of ``a``'s row keeps its default."""
    return not (
        a.identity_key is not None
        or a.fairness_key is not None
        or a.schedule_to_close is not None
        or a.timeout is not None
        or a.result_ttl is not None
        or a.metadata
        or a.tags
        or a.trace_id is not None
        or a.span_id is not None
    )


def one_job(
    sql: Statements, a: EnqueueArgs, wake_channel: str | None
) -> tuple[str, tuple[Any, ...], str, str | None, bool]:
    """The statement inserting ``a``, notifying ``wake_channel`` (or None): its text
    and arguments (a ``fetchrow``), the payload and metadata texts it sends (for
    :func:`fresh_row`), and whether it is ``ENQUEUE_ONE_PLAIN``, for a job due now none
    of whose optional columns is set (its record holds only ``created_at``: see
    :func:`decided_now`); else ``ENQUEUE_ONE``."""
    payload = dump_json(a.payload)
    if _plain(a) and (a.delay is None or a.delay <= _NO_DELAY):
        plain = (a.id, a.actor, a.queue, a.priority, payload, a.max_attempts, wake_channel)
        return sql.enqueue_one_plain, plain, payload, None, True
    metadata = dump_json(a.metadata) if a.metadata else None
    args = (
        a.id,
        a.actor,
        a.queue,
        a.priority,
        payload,
        a.delay,
        a.max_attempts,
        a.identity_key,
        a.fairness_key,
        a.schedule_to_close,
        a.timeout,
        a.result_ttl,
        metadata or "{}",
        # text[] (no JSON round trip); NULs replaced as dump_json does for ENQUEUE
        [clean_text(tag) for tag in a.tags],
        a.trace_id,
        a.span_id,
        wake_channel,
    )
    return sql.enqueue_one, args, payload, metadata, False


def decided_now(created_at: datetime) -> tuple[Any, ...]:
    """What :func:`fresh_row` reads of a job ``ENQUEUE_ONE_PLAIN`` inserted: ``pending``,
    no attempt yet, due at its ``created_at``, no deadline."""
    return ("pending", 0, created_at, created_at, None)


async def insert_one(db: Db, sql: Statements, a: EnqueueArgs, wake_channel: str | None) -> JobRow:
    """Insert one job without an idempotency key (:func:`one_job`); the row is built
    from what was sent plus what the server decided. Singletons need
    :func:`check_singletons` first, in a transaction."""
    # Not a plan: a one-at-a-time producer pays for every layer around the statement.
    text, args, payload, metadata, plain = one_job(sql, a, wake_channel)
    try:
        record = await db.fetchrow(text, *args)
    except asyncpg.UniqueViolationError as exc:
        _raise_duplicate(exc)
        raise
    return fresh_row(a, payload, metadata, decided_now(record[0]) if plain else record)


def fresh_row(a: EnqueueArgs, payload: str, metadata: str | None, decided: Any) -> JobRow:
    """The row of a job just inserted: what was sent (``a``, validated as EnqueueArgs)
    plus what the server decided, ``decided``: its status, attempt, ``created_at``,
    ``scheduled_at`` and ``schedule_to_close_deadline``, in this order (as
    ``ENQUEUE_ONE``'s RETURNING starts: its asyncpg record as it is; :func:`_decided`
    for a record read by name, :func:`decided_now` for ``ENQUEUE_ONE_PLAIN``'s). Returning the whole row and decoding it cost about a
    tenth of a one-job enqueue; read by position, a few percent of its client CPU
    less. The JSON is parsed back from the text sent (``metadata`` None: ``{}``), so
    NUL replacements show."""
    status, attempt, created_at, scheduled_at, deadline_at = decided[:5]
    row = _FRESH_ROW.copy()
    row["id"] = a.id
    row["actor"] = a.actor
    row["queue"] = a.queue
    row["status"] = parse_status(status)
    row["payload"] = load_json(payload)
    row["priority"] = a.priority
    row["attempt"] = attempt
    row["max_attempts"] = a.max_attempts
    row["created_at"] = created_at
    row["scheduled_at"] = scheduled_at
    row["idempotency_key"] = a.idempotency_key
    row["identity_key"] = a.identity_key
    row["fairness_key"] = a.fairness_key
    row["deadline_at"] = deadline_at
    row["timeout"] = a.timeout
    row["result_ttl"] = a.result_ttl
    row["metadata"] = {} if metadata is None else load_json(metadata)
    row["tags"] = [clean_text(tag) for tag in a.tags] if a.tags else []
    row["trace_id"] = a.trace_id
    row["span_id"] = a.span_id
    return from_valid_values(JobRow, row)


def _decided(record: Any) -> tuple[Any, ...]:
    """What the server decided for an inserted job, as :func:`fresh_row` reads it, from a
    record read by name (``ENQUEUE``'s; a psycopg row, a dict)."""
    return tuple(record[name] for name in DECIDED_COLUMNS)


class CopyFeed:
    """The rows one COPY writes (``COPY_COLUMNS``), created at ``now``, each made as
    asyncpg asks for it: a lazy input is built (and validated) while the server
    takes the rows already sent, instead of before the COPY starts.

    Whatever pulling the input raises ends the rows there and waits in ``error``, for
    the caller to raise once the COPY has ended (the transaction then rolls back).
    Raised inside the COPY, it would make asyncpg abort it and cancel the query over
    a second connection. The jobs with an identity key are kept for the singleton
    check that follows.
    """

    __slots__ = ("_args", "_now", "count", "error", "identified")

    def __init__(self, args: Iterable[EnqueueArgs], now: datetime) -> None:
        self._args = args
        # In UTC: a caller's connection may read the clock in a zone of its own, where
        # adding days adds calendar days (23 or 25 hours across a DST change).
        self._now = now.astimezone(UTC)
        self.count = 0
        self.error: Exception | None = None
        self.identified: list[EnqueueArgs] = []

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        now, zero, identified = self._now, timedelta(0), self.identified
        try:
            for a in self._args:
                if a.identity_key is not None:
                    identified.append(a)
                elif a.singleton:
                    refuse_keyless_singletons([a])
                delay = a.delay
                delayed = delay is not None and delay > zero
                deadline = a.schedule_to_close
                row = (
                    a.id,
                    a.actor,
                    a.queue,
                    "scheduled" if delayed else "pending",
                    a.priority,
                    dump_json(a.payload),
                    now + delay if delay is not None and delayed else now,
                    now,
                    now,
                    a.max_attempts,
                    a.idempotency_key,
                    a.identity_key,
                    a.fairness_key,
                    None if deadline is None else now + deadline,
                    a.timeout,
                    a.result_ttl,
                    dump_json(a.metadata) if a.metadata else "{}",
                    [clean_text(tag) for tag in a.tags] if a.tags else a.tags,
                    a.trace_id,
                    a.span_id,
                    now,
                )
                self.count += 1
                yield row
        except Exception as exc:  # noqa: BLE001 - kept, and raised by copy_jobs after the COPY
            self.error = exc


async def copy_jobs(
    tx: Db, sql: Statements, schema: str, args: Iterable[EnqueueArgs], now: datetime
) -> int:
    """COPY ``args`` into ``jobs`` in ``tx`` (the caller's transaction), created at
    ``now``, pulling them as the rows are sent; returns how many.

    Singletons are checked after the COPY, under their identities' locks, against
    the active jobs other than these: a competing enqueue either committed before
    the check (and is seen) or waits on the lock until this transaction ends.
    """
    feed = CopyFeed(args, now)
    try:
        await tx.copy_records_to_table(
            "jobs", schema_name=check_identifier(schema), columns=list(COPY_COLUMNS), records=feed
        )
    except asyncpg.UniqueViolationError as exc:
        _raise_duplicate(exc)
        raise
    if feed.error is not None:
        raise feed.error
    if any(a.singleton for a in feed.identified):
        await check_singletons(tx, sql, schema, feed.identified, copied=True)
    return feed.count


async def insert_jobs(
    db: Db,
    sql: Statements,
    args_list: Sequence[EnqueueArgs],
    *,
    wake_channel: str | None,
    parked: Sequence[bool] | None = None,
) -> tuple[list[JobRow], int]:
    """:func:`plan_insert_jobs`, run on ``db``."""
    return await run(db, plan_insert_jobs(sql, args_list, wake_channel, parked))


def plan_insert_jobs(
    sql: Statements,
    args_list: Sequence[EnqueueArgs],
    wake_channel: str | None,
    parked: Sequence[bool] | None = None,
) -> Plan[tuple[list[JobRow], int]]:
    """Insert ``args_list``; one row per item in input order, and how many were new.

    ``wake_channel`` (or None) is notified once if anything was inserted.
    ``parked`` marks items (batch finalizers) that wait ``scheduled`` in the far
    future instead of following their delay.
    """
    flags = parked if parked is not None else [False] * len(args_list)
    only = args_list[0] if len(args_list) == 1 else None
    # A singleton's row says so (ENQUEUE's column): an operator's retry checks it.
    if only is not None and only.idempotency_key is None and not only.singleton and not flags[0]:
        text, one_args, payload, metadata, plain = one_job(sql, only, wake_channel)
        record = yield Query("fetchrow", text, one_args)
        decided = decided_now(record["created_at"]) if plain else _decided(record)
        return [fresh_row(only, payload, metadata, decided)], 1
    params = _insert_params(args_list, flags)
    records = yield Query("fetch", sql.enqueue, (*params, wake_channel))
    payloads, metadatas = params[_PAYLOADS], params[_METADATAS]
    fresh = {record["id"]: record for record in records if record["inserted"]}
    inserted: dict[Any, JobRow] = {}
    by_key: dict[tuple[str, str], JobRow] = {}
    for k, args in enumerate(args_list):
        record = fresh.get(args.id)
        if record is None:
            continue
        row = inserted[args.id] = fresh_row(
            args, payloads[k], metadatas[k] if metadatas is not None else None, _decided(record)
        )
        if args.idempotency_key is not None:
            by_key.setdefault((args.actor, args.idempotency_key), row)
    for record in records:
        if not record["inserted"]:
            row = job_row(record)
            by_key.setdefault((row.actor, row.idempotency_key or ""), row)
    unresolved = [
        (a.actor, a.idempotency_key)
        for a in args_list
        if a.id not in inserted
        and a.idempotency_key is not None
        and (a.actor, a.idempotency_key) not in by_key
    ]
    if unresolved:
        # Inserted by another transaction after our snapshot: ON CONFLICT waited
        # for it to commit, so a fresh statement sees it.
        found_by_key = yield Query(
            "fetch", sql.existing_by_key, ([k[0] for k in unresolved], [k[1] for k in unresolved])
        )
        for record in found_by_key:
            row = job_row(record)
            by_key.setdefault((row.actor, row.idempotency_key or ""), row)
    rows: list[JobRow] = []
    for args in args_list:
        found = inserted.get(args.id)
        if found is None and args.idempotency_key is not None:
            found = by_key.get((args.actor, args.idempotency_key))
        if found is None:
            raise RuntimeError(
                f"job {args.id} was neither inserted nor found by its idempotency key; "
                f"its existing row was deleted while this enqueue ran"
            )
        rows.append(found)
    return rows, len(inserted)


def _collision(args: EnqueueArgs, holder: object, retry_after: float | None) -> Exception:
    # retry_after is an advisory hint for the caller (architecture: Clock
    # Domains), never a predicate.
    return SingletonCollisionError(
        f"actor {args.actor!r} already has an active job ({holder}) with "
        f"identity_key {args.identity_key!r}; retry once it finishes",
        retry_after=retry_after,
    )


async def check_singletons(
    db: Db, sql: Statements, schema: str, args_list: Sequence[EnqueueArgs], *, copied: bool = False
) -> None:
    """:func:`plan_check_singletons`, run on ``db``."""
    await run(db, plan_check_singletons(sql, schema, args_list, copied=copied))


def singleton_lock_key(schema: str, actor: str, identity_key: str | None) -> str:
    """The advisory lock (``SINGLETON_LOCKS``) serializing the singletons of one identity."""
    return f"taskq:singleton:{schema}:{actor}:{identity_key}"


def plan_check_singletons(
    sql: Statements, schema: str, args_list: Sequence[EnqueueArgs], *, copied: bool = False
) -> Plan[None]:
    """Raise ``SingletonCollisionError`` for a singleton whose identity an active job
    (stored, or earlier in ``args_list``) holds. Must run in the inserting transaction:
    before the insert, or after it when ``copied`` (``args_list`` then being stored, its
    own rows are not holders, and marked singletons here: COPY writes no such column)."""
    singles = [a for a in args_list if a.singleton]
    if not singles:
        return
    lock_keys = sorted({singleton_lock_key(schema, a.actor, a.identity_key) for a in singles})
    isolation = yield Query("fetchval", sql.singleton_locks, (lock_keys,))
    if isolation not in ("read committed", "read uncommitted"):  # the latter runs as the former
        # Its snapshot predates the lock: a competing enqueue that committed while this
        # one waited would go unseen, and the identity would have two active jobs.
        raise EnqueueError(
            f"a singleton enqueue needs a READ COMMITTED transaction, not {isolation.upper()}: "
            f"it could not see a competing enqueue; enqueue it in a READ COMMITTED "
            f"transaction (or on its own)"
        )
    # Copied jobs had no idempotent hits: a used key failed the COPY.
    keyed = (
        []
        if copied
        else [(a.actor, a.idempotency_key) for a in args_list if a.idempotency_key is not None]
    )
    records = yield Query(
        "fetch",
        sql.enqueue_conflicts,
        (
            [k[0] for k in keyed],
            [k[1] for k in keyed],
            [a.actor for a in singles],
            [a.identity_key for a in singles],
        ),
    )
    used_keys = {(r["actor"], r["key"]) for r in records if r["kind"] == "idempotency"}
    ours = {a.id for a in args_list} if copied else set()
    active = {
        (r["actor"], r["key"]): r
        for r in records
        if r["kind"] == "identity" and r["id"] not in ours
    }
    staged_keys: set[tuple[str, str]] = set()
    staged: dict[tuple[str, str], EnqueueArgs] = {}
    for args in args_list:
        if args.idempotency_key is not None:
            key = (args.actor, args.idempotency_key)
            if key in used_keys or key in staged_keys:
                continue  # an idempotent hit: returns the existing job, inserts nothing
            staged_keys.add(key)
        if args.singleton and args.identity_key is not None:
            identity = (args.actor, args.identity_key)
            if identity in active:
                holder = active[identity]
                raise _collision(args, holder["id"], holder["retry_after"])
            if identity in staged:
                raise SingletonCollisionError.in_one_call(args.actor, args.identity_key)
        if args.identity_key is not None:
            staged.setdefault((args.actor, args.identity_key), args)
    if copied:
        yield Query("fetch", sql.mark_singletons, ([a.id for a in singles],))
