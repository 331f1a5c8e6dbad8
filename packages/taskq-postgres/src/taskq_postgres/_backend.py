"""``PostgresBackend``: the Backend protocol on PostgreSQL through an asyncpg pool.

Behaves exactly as ``docs/backend-contract.md`` describes (and as the
in-memory reference backend does); the conformance suite checks both. What
is Postgres-specific:

* **Time.** Every time stored or compared comes from ``clock_timestamp()``
  in the statement that owns the predicate; relative inputs (delays, leases)
  are bound as intervals and added there.
* **One round trip per write.** Each terminal write, sweep, cancel and
  dispatch is a single statement whose data-modifying CTEs also write the
  attempt and event rows, and at most one ``pg_notify`` per statement.
* **Identifiers.** The schema name is validated at construction and again
  wherever it is interpolated (the statements are rendered once per schema);
  every value is bound as ``$n``.
* **Wake-ups** use LISTEN/NOTIFY on the schema's channels
  (:mod:`taskq_postgres.channels`) over one dedicated connection opened on
  the first subscription.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
    nullcontext,
    suppress,
)
from datetime import UTC, datetime, timedelta
from itertools import chain, count
from typing import Any, ClassVar, Final, Literal, TypeAlias, cast
from uuid import UUID, uuid4

import asyncpg
import structlog

from taskq.backend import (
    check_batch_size,
    check_failure_count,
    check_protocol_version,
    check_retention,
    check_up_to,
)
from taskq.backend._protocol import ScheduleFire
from taskq.backend.batch_members import (
    BATCH_TAG,
    FINALIZER_TAG,
    all_ended,
    check_children,
    check_finalizer,
    replayed,
)
from taskq.backend.cron import (
    cron_slots,
    first_fire_at,
    one_per_singleton,
    skipped_slots,
    updated_fire_at,
    within_max_pending,
)
from taskq.backend.fairness import STRICT, CohortTurns, cohort_of
from taskq.backend.late_outcome import late_outcome_detail
from taskq.backend.statemachine import JobStatus
from taskq.backend.storable import check_delay, clean_text, dump_json, load_json
from taskq.errors import (
    ConfigurationError,
    EnqueueError,
    RetryRefusedError,
    SingletonCollisionError,
    TaskQError,
)
from taskq.identifiers import validate_schema_name
from taskq.models import (
    ActorConfig,
    AttemptOutcome,
    AttemptRow,
    BatchChildEnd,
    BatchCounts,
    BatchFilter,
    BatchRow,
    BulkCancelResult,
    CancelFlag,
    EnqueueArgs,
    ErrorInfo,
    EventRow,
    JobFilter,
    JobId,
    JobRow,
    QueueConfig,
    ScheduleCreateArgs,
    ScheduleRecord,
    ScheduleUpdateArgs,
    SuccessWrite,
    check_names,
    registered_over,
)
from taskq_postgres._bounded import BoundedPool, PinnedConnection, ended_if_read_only
from taskq_postgres._connect import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_IDLE_IN_TRANSACTION,
    LEADER_ROLE,
    NOTIFY_ROLE,
    POSTGRES_SCHEMES,
    BackendUnavailableError,
    LentConnections,
    Password,
    check_dsn,
    check_instance_id,
    connect,
    connection_settings,
    create_pool,
    password_from_file,
    redact,
    same_address,
    through_pooler,
    translated_errors,
)
from taskq_postgres._enqueue import (
    ASYNC_PSYCOPG,
    aborted,
    check_singletons,
    closed_connection,
    copy_jobs,
    insert_jobs,
    insert_one,
    refuse_keyless_singletons,
    run,
    singleton_lock_key,
)
from taskq_postgres._leader import LeaderStatements, PostgresLeaderElector
from taskq_postgres._listener import NotifyListener
from taskq_postgres._privileges import (
    InsufficientPrivilegeError,
    diagnosed,
    dsn_user,
    privilege_error,
    read_only_error,
)
from taskq_postgres._rows import (
    LongRunningJobEventsWriter,
    attempt_row,
    batch_counts,
    batch_row,
    cancel_flag,
    event_row,
    job_row,
    schedule_record,
    writer_row,
)
from taskq_postgres._sql import prune as prune_sql
from taskq_postgres._sql import render
from taskq_postgres._sql.cancel import DIRECTION_TOKEN, FILTER_TOKEN
from taskq_postgres._sql.reads import (
    ORDER_TOKEN,
    POOLED_SESSION_SETTINGS,
    SERVER_IDENTITY,
    SET_IDLE_LIMIT,
    WHERE_TOKEN,
)
from taskq_postgres._statements import statements_for
from taskq_postgres._transient import STATEMENT_CANCELLATIONS, TRANSIENT_PG_ERRORS
from taskq_postgres._wake import EnqueueWake, WakeCoalescer
from taskq_postgres.channels import (
    events_channel,
    wake_channel,
    worker_channel,
    worker_channel_prefix,
)

__all__ = ["PostgresBackend"]

_log = structlog.get_logger("taskq.backend")

Connection = Any
"""A caller's asyncpg connection (plain or pooled): the protocol keeps it opaque."""

_POOL_ROLE: Final = "taskq-pool"
_NOTIFY_ROLE: Final = NOTIFY_ROLE
_MIGRATE_ROLE: Final = "taskq-migrate"
_RUNNING_IDENTITY_INDEX: Final = "jobs_running_identity_key"
_CANCEL_TRIES: Final = 3
"""How often a cancel statement is tried when Postgres breaks a deadlock with it."""
# The most jobs one sweep statement moves (a turn): ~0.3 s of a slow machine's time,
# far inside the leader's bound, where 100,000 due jobs in one statement took 6 s.
_SWEEP_TURN: Final = 5_000
_SWEEP_TURNS: Final = 4
"""Turns each of the leader's sweep loop's sweeps (promotion, deadlines, reclaim) takes
per call at most (20,000 jobs); that loop runs every ``maintenance_interval``."""
_IDENTITY_RACE_TRIES: Final = 3
_PAST_LOCKED_ROUNDS: Final = 3
"""Rounds a full plain head that other dispatchers' locks left short is read deeper
(each four times the last): at most 64 times the head's rows."""
_DispatchCall: TypeAlias = tuple[tuple[str, ...], tuple[str, ...] | None]
"""A dispatch's queues and actors (None: every actor)."""
# Prune and archive batches move thousands of rows: exempt from the worker's
# short per-statement command_timeout, yet still bounded.
_BULK_STATEMENT_TIMEOUT: Final = 600.0
_FIRST_KEY: Final = (datetime(1, 1, 1, tzinfo=UTC), UUID(int=0))
"""The (time, id) key the first turn over the batches starts after (every time is later)."""
_CLOSE_TIMEOUT: Final = 5.0
"""Seconds a close waits for the pool's connections to end cleanly before it cuts them."""
_NO_DELAY: Final = timedelta(0)
_DEFAULT_MAX_POOL_SIZE: Final = 10
_MIN_POOL_FOR_WORKER_PINS: Final = 5
"""Three pinned connections (enqueue, dispatch, success) leave two to the rest."""
_CRON_TICK_SECONDS: Final = 2.0
"""How long one cron tick goes on firing due schedules (one transaction each; half the
``command_timeout`` when that is shorter, as the leader bounds the tick by it); the rest
wait a tick. A count of 100 a tick held 2,000 schedules due each minute up to 28 s
late, and dropped slots of 5,000 past the catch-up window."""
_DIAGNOSE_TIMEOUT: Final = 0.5
"""Seconds the question of which right a refused role lacks may wait for a pooled
connection: short, as it runs within the caller's own bound (a worker loop's)."""


def _turns(ids: Sequence[object]) -> list[list[int]]:
    """The positions of ``ids`` in turns of distinct ids, each id's in order: the first
    item of every id, then the second of those that repeat, and so on (one turn when
    none repeats)."""
    turns: list[list[int]] = []
    seen: dict[object, int] = {}
    for position, key in enumerate(ids):
        turn = seen.get(key, 0)
        seen[key] = turn + 1
        if turn == len(turns):
            turns.append([])
        turns[turn].append(position)
    return turns


def _dispatched(records: list[Any]) -> list[JobRow]:
    """The jobs a strict-FIFO statement locked (a row with NULL job columns: none)."""
    return [job_row(record) for record in records if record["id"] is not None]


def _changed(status: str) -> int:
    """The row count of an ``UPDATE n`` / ``DELETE n`` command status."""
    return int(status.rsplit(" ", 1)[-1])


class _Params:
    """Numbered ``$n`` placeholders for a statement assembled from fixed fragments."""

    def __init__(self, first: int) -> None:
        self._first = first
        self.values: list[Any] = []

    def bind(self, value: Any) -> str:
        self.values.append(value)
        return f"${self._first + len(self.values) - 1}"


def _job_conditions(filters: JobFilter, params: _Params) -> list[str]:
    """``filters`` as predicates over alias ``j`` (the cursor included, the limit not)."""
    conditions: list[str] = []
    statuses = filters.statuses()
    if statuses is not None:
        names = sorted(status.value for status in statuses)
        conditions.append(f"j.status::text = ANY({params.bind(names)}::text[])")
    if filters.actor is not None:
        conditions.append(f"j.actor = {params.bind(filters.actor)}")
    if filters.queue is not None:
        conditions.append(f"j.queue = {params.bind(filters.queue)}")
    if filters.identity_key is not None:
        conditions.append(f"j.identity_key = {params.bind(filters.identity_key)}")
    if filters.idempotency_key is not None:
        conditions.append(f"j.idempotency_key = {params.bind(filters.idempotency_key)}")
    if filters.batch_id is not None:
        # Both predicates, so the partial index jobs_batch_id_idx applies.
        conditions.append(
            f"j.metadata ? 'batch_id' AND j.metadata ->> 'batch_id' = "
            f"{params.bind(str(filters.batch_id))}"
        )
    if filters.tags:
        conditions.append(f"j.tags @> {params.bind(list(filters.tags))}::text[]")
    if filters.cursor is not None:
        created_at, job_id = filters.cursor
        after = "<" if filters.order == "desc" else ">"
        conditions.append(
            f"(j.created_at, j.id) {after} "
            f"({params.bind(created_at)}::timestamptz, {params.bind(job_id)}::uuid)"
        )
    return conditions


def _explained(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def call(self: PostgresBackend, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except asyncpg.InsufficientPrivilegeError as exc:
            raise await self._refused(exc) from exc
        except asyncpg.ReadOnlySQLTransactionError as exc:
            raise read_only_error(exc, dsn=self.dsn) from exc

    return call


def _privileges_explained(cls: type[PostgresBackend]) -> type[PostgresBackend]:
    """Make each public coroutine method raise a refused privilege as
    :class:`~taskq_postgres.InsufficientPrivilegeError` (the role, the right, the
    fix), not as asyncpg's bare "permission denied for table jobs": the one place
    every call of the protocol (an enqueue, a worker's dispatch) passes."""
    for name, method in list(vars(cls).items()):
        if name in _EXPLAINED_INLINE:
            continue
        if not name.startswith("_") and inspect.iscoroutinefunction(method):
            setattr(cls, name, _explained(method))
    return cls


_EXPLAINED_INLINE: Final = frozenset({"enqueue"})
"""Methods that explain a refused privilege in their own body: a one-at-a-time
producer pays for every coroutine frame around its statement."""


def _callers(conn: Any) -> Any:
    """A caller's connection, checked: an asyncpg one (or one from an asyncpg pool). Any
    other failed deep in a statement with a driver's AttributeError."""
    if not isinstance(conn, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
        import psycopg  # only to say what to do: a caller of the asyncpg backend may lack it

        hint = (
            f"{ASYNC_PSYCOPG}; PostgresBackend.connection() lends an asyncpg one"
            if isinstance(conn, psycopg.AsyncConnection)
            else "for psycopg's, use taskq_postgres.SyncJobsClient(conn, actors=...)"
        )
        raise TypeError(
            f"connection must be an asyncpg connection (asyncpg.Connection, or one acquired "
            f"from an asyncpg pool), not {type(conn).__module__}.{type(conn).__qualname__}: "
            f"{hint}"
        )
    return conn


@contextmanager
def _not_aborted(conn: Connection) -> Iterator[None]:
    """Around an enqueue: on a caller's transaction an earlier error aborted, the
    :class:`~taskq_postgres.TransactionAbortedError` ``SyncJobsClient`` raises there; on
    a caller's closed connection, its :class:`~taskq_postgres.BackendUnavailableError`."""
    try:
        yield
    except asyncpg.InFailedSQLTransactionError as exc:
        if conn is None:
            raise
        raise aborted(
            "the transaction's rollback(), or let its async with conn.transaction() block end"
        ) from exc
    except asyncpg.InterfaceError as exc:
        if conn is None or not _closed(conn):
            raise
        raise closed_connection() from exc


def _closed(conn: Connection) -> bool:
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:  # a pool's connection used after its release: as asyncpg says
        return False


@asynccontextmanager
async def _unset_event() -> AsyncIterator[asyncio.Event]:
    """A subscription nothing notifies (poll-only): the subscriber's timeout polls."""
    yield asyncio.Event()


_MS: Final = timedelta(milliseconds=1)


@_privileges_explained
class PostgresBackend:
    """The Backend protocol on PostgreSQL (URLs ``postgresql://`` and ``postgres://``).

    ``dsn`` names the database; ``schema`` the TaskQ schema in it (migrated
    with ``taskq migrate``; validated here, before any SQL). Options:

    * ``min_pool_size`` / ``max_pool_size``: the asyncpg pool's bounds; the maximum
      defaults to 10, or to ``min_pool_size`` when that is larger. Once the
      first enqueue ran, one pooled connection stays checked out for one-job
      enqueues (not with ``max_pool_size=1``); in a worker, one each for
      dispatches and batched successes too (with ``max_pool_size`` of 5 or more).
    * ``dispatch_oversample``: how many candidates per free slot the dispatch
      reads per actor, to absorb those that caps and identities filter out.
    * ``reclaim_event_visibility_delay``: the default trailing watermark of
      :meth:`poll_reclaim_events`.
    * ``cancel_reclaim_headroom``: the extra time a job with a cancel in
      progress gets past both graces before a crash reclaim.
    * ``idle_in_transaction_session_timeout``: ends a transaction left idle on
      one of TaskQ's connections, so its row locks cannot hide jobs from the
      ``SKIP LOCKED`` sweeps forever (None disables it).
    * ``connect_timeout``: per connection attempt.
    * ``instance_id``: names this backend's connections in ``pg_stat_activity``
      (``application_name`` ``taskq-pool/<id>`` and ``taskq-notify/<id>``);
      default: random.
    * ``wake_coalesce_window`` (default 2 ms): after an enqueue that notifies the
      workers, the enqueues this backend starts within the window while another
      of its enqueues runs skip their NOTIFY, and one trailing NOTIFY follows at
      the window's end (one window later at most while one of them still runs,
      as the next window's first enqueue may cover them), sent once they have
      committed (every NOTIFY takes a cluster-wide lock at commit, on which
      concurrent commits queue). An enqueue that starts while none other runs
      (an isolated one, or each of a loop of one after another) notifies in its
      own statement; 0 notifies on every enqueue. Enqueues in a caller's
      transaction always notify in it.
    * ``poll_only`` (default False): send no NOTIFY at all (enqueues, retries,
      sweeps, released batch finalizers, cancel requests) and open no LISTEN
      connection; ``subscribe_wake`` / ``subscribe_cancel_wake`` events are
      never set, so workers dispatch every ``poll_interval`` and see cancels at
      their heartbeat. For poolers without LISTEN/NOTIFY (PgBouncer transaction
      mode) when no ``direct_dsn`` is given, or to keep NOTIFY's commit lock off a
      heavy insert load.
    * ``stale_batch_grace`` (default 10 s): how long the leader's stale-batch sweep
      leaves a batch alone after its last child ended (or its creation), so as not to
      finish it before the worker applies that child's end.
    * ``direct_dsn`` (default: ``dsn``): the server's own address, not a
      transaction-mode pooler's, for the connections that must each stay one
      server session: the leader's (its advisory lock is the election), the LISTEN
      connection, and migrations' (their advisory lock). Through PgBouncer in
      transaction mode the leader's lock stays on whichever server connection the
      pooler lent, so give ``dsn`` the pooler and ``direct_dsn`` the server; LISTEN
      then works as well, and ``poll_only`` is not needed. A ``direct_dsn`` other
      than ``dsn`` says ``dsn`` is a pooler's (``behind_pooler``): the pooled
      connections then send only the settings a pooler passes (``application_name``,
      ``TimeZone``; :meth:`open` warns of the others the role's defaults leave
      otherwise) and keep no statement prepared (PgBouncer before 1.21 runs each
      statement on any server session). ``password`` and ``password_file`` apply
      to both addresses.

    TaskQ's connections run with ``TimeZone`` UTC (whatever the server's or the DSN's),
    so that a duration is exact: elsewhere ``+ interval '1 day'`` is a calendar day of
    the session's zone, 23 or 25 hours across a DST change.

    Call :meth:`open` before use and :meth:`close` after (``TaskQ`` does both).
    Beyond the protocol: :meth:`connection` lends a pooled connection for the
    ``*_with_conn`` methods, and :meth:`check_reclaim_visibility_delay_risk`
    reports transactions that could break the reclaim feed's ordering.
    """

    BACKEND_PROTOCOL_VERSION: ClassVar[int] = 3
    # Real transactions give sub-job atomicity; nothing to simulate.
    supports_transactional_simulation: ClassVar[bool] = False
    statement_cancellations: ClassVar[tuple[type[BaseException], ...]] = STATEMENT_CANCELLATIONS

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "taskq",
        min_pool_size: int = 1,
        max_pool_size: int | None = None,
        dispatch_oversample: int = 2,
        reclaim_event_visibility_delay: timedelta = timedelta(seconds=2),
        cancel_reclaim_headroom: timedelta = timedelta(seconds=60),
        idle_in_transaction_session_timeout: timedelta | None = DEFAULT_IDLE_IN_TRANSACTION,
        connect_timeout: timedelta = DEFAULT_CONNECT_TIMEOUT,
        command_timeout: timedelta | None = None,
        instance_id: str | None = None,
        notify_health_check_interval: timedelta = timedelta(seconds=5),
        notify_conn_factory: Callable[[], Awaitable[asyncpg.Connection[Any]]] | None = None,
        password: Password = None,
        password_file: str | None = None,
        wake_coalesce_window: timedelta = timedelta(milliseconds=2),
        poll_only: bool = False,
        direct_dsn: str | None = None,
        stale_batch_grace: timedelta = timedelta(seconds=10),
    ) -> None:
        # The schema first: a hostile name is refused before anything else is looked at.
        self.schema: Final = validate_schema_name(schema)
        self.dsn: Final = check_dsn(dsn)
        self.direct_dsn: Final = self.dsn if direct_dsn is None else check_dsn(direct_dsn)
        self.behind_pooler: Final = not same_address(self.direct_dsn, self.dsn)
        """Whether ``dsn`` is a pooler's (a ``direct_dsn`` naming another address was
        given)."""
        for name, given in (
            ("min_pool_size", min_pool_size),
            ("max_pool_size", max_pool_size),
            ("dispatch_oversample", dispatch_oversample),
        ):
            # A bool is an int to Python: True was taken as 1 (a pool of one, unpinned).
            if given is not None and (isinstance(given, bool) or not isinstance(given, int)):
                raise TypeError(f"{name} takes a whole number, not {given!r}")
        if max_pool_size is None:
            # Asking for more connections kept open than the default maximum means a
            # bigger pool, not a contradiction to refuse.
            max_pool_size = max(_DEFAULT_MAX_POOL_SIZE, min_pool_size)
        if not 1 <= min_pool_size <= max_pool_size:
            raise ValueError(
                f"need 1 <= min_pool_size <= max_pool_size, got {min_pool_size} and {max_pool_size}"
            )
        if dispatch_oversample < 1:
            raise ValueError(f"dispatch_oversample must be at least 1, got {dispatch_oversample}")
        for name, value in (
            ("reclaim_event_visibility_delay", reclaim_event_visibility_delay),
            ("cancel_reclaim_headroom", cancel_reclaim_headroom),
            ("idle_in_transaction_session_timeout", idle_in_transaction_session_timeout),
            ("connect_timeout", connect_timeout),
            ("notify_health_check_interval", notify_health_check_interval),
            ("wake_coalesce_window", wake_coalesce_window),
            ("stale_batch_grace", stale_batch_grace),
        ):
            if value is not None and value < timedelta(0):
                raise ValueError(f"{name} must not be negative, got {value}")
        self.min_pool_size = min_pool_size
        self.max_pool_size = max_pool_size
        self.dispatch_oversample = dispatch_oversample
        self.reclaim_event_visibility_delay = reclaim_event_visibility_delay
        self.cancel_reclaim_headroom = cancel_reclaim_headroom
        self._sweep_turn = _SWEEP_TURN
        self._stale_batches_after: tuple[datetime, UUID] = _FIRST_KEY
        """Where the stale-batch sweep's next window starts (the last one's last key)."""
        self._leftovers_after = ""
        """Where the leftovers turn's next window of batch ids starts (every id sorts
        after the empty one)."""
        self.idle_in_transaction_session_timeout = idle_in_transaction_session_timeout
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.notify_health_check_interval = notify_health_check_interval
        self._notify_conn_factory = notify_conn_factory
        self.wake_coalesce_window = wake_coalesce_window
        self.poll_only = poll_only
        self.stale_batch_grace = stale_batch_grace
        if password is not None and password_file is not None:
            raise ValueError("give password or password_file, not both")
        # A callable is asked at every new connection: rotated secrets take
        # effect on the connections a credential reload replaces.
        self._password: Password = (
            password_from_file(password_file) if password_file is not None else password
        )
        self.instance_id: Final = check_instance_id(
            instance_id if instance_id is not None else uuid4().hex[:12]
        )
        self._sql = statements_for(self.schema)
        self._leader_sql = LeaderStatements(self.schema)
        self._prune_sql = render(prune_sql.PRUNE_TERMINAL_JOBS, self.schema)
        self._expire_archive_sql = render(prune_sql.EXPIRE_ARCHIVE, self.schema)
        self._wake_channel = wake_channel(self.schema)
        self._events_channel = events_channel(self.schema)
        # What the statements that move jobs notify: None (no NOTIFY) when poll-only.
        self._wake_to = None if poll_only else self._wake_channel
        self._events_to = None if poll_only else self._events_channel
        # Calls (queue list, actors or None) that held a round-robin queue at their last
        # dispatch: they look the settings up first instead of trying strict FIFO first.
        self._round_robin_calls: set[_DispatchCall] = set()
        self._turns = CohortTurns()
        """Round robin's turns of this dispatcher (``taskq.backend.fairness``)."""
        # Calls whose head last needed the cap, identity or actor checks: they run the
        # full strict-FIFO statement without trying the plain-head one first.
        self._gated_heads: set[_DispatchCall] = set()
        self._worker_prefix = worker_channel_prefix(self.schema)
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None
        self._lent = LentConnections(through_pooler=self.behind_pooler)
        idle_limit = self._settings(_POOL_ROLE)["idle_in_transaction_session_timeout"]
        self._pooled_idle_limit = idle_limit if self.behind_pooler and idle_limit != "0" else None
        """Behind a pooler, the idle-in-transaction limit TaskQ's transactions set."""
        self._bounded: BoundedPool | None = None
        self._pinned: PinnedConnection | None = None
        self._pinned_dispatch: PinnedConnection | None = None
        self._pinned_success: PinnedConnection | None = None
        self._listener: NotifyListener | None = None
        self._wakes = WakeCoalescer(self._send_wake, wake_coalesce_window.total_seconds())
        self._open_lock = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresBackend:
        """Build from a ``postgresql://`` or ``postgres://`` URL; ``options`` are the
        constructor's keyword arguments. Does no I/O."""
        # The scheme alone here; the constructor checks the rest (check_dsn), where
        # urlsplit raised a bare ValueError (an unclosed IPv6 bracket).
        if url.partition(":")[0].lower() not in POSTGRES_SCHEMES:
            raise ValueError(
                f"PostgresBackend serves postgresql:// and postgres:// URLs, not {redact(url)!r}"
            )
        return cls(url, **options)

    def __repr__(self) -> str:
        state = "open" if self._pool is not None else "closed"
        return f"<PostgresBackend {redact(self.dsn)} schema={self.schema} {state}>"

    # -- lifecycle -------------------------------------------------------------
    async def open(self) -> None:
        """Create the pool and check the schema is migrated. Idempotent.

        Raises :class:`~taskq_postgres.BackendUnavailableError` when the server
        cannot be reached, :class:`~taskq.errors.ConfigurationError` for a DSN
        that cannot work or a schema without TaskQ's tables.
        """
        async with self._open_lock:
            if self._pool is not None:
                return
            settings = self._settings(_POOL_ROLE)
            pool = await create_pool(
                self.dsn,
                min_size=self.min_pool_size,
                max_size=self.max_pool_size,
                settings=through_pooler(settings) if self.behind_pooler else settings,
                connect_timeout=self.connect_timeout,
                password=self._password,
                command_timeout=self.command_timeout,
                lent=self._lent,
                prepared_statements=not self.behind_pooler,
            )
            try:
                await self._check_schema(pool)
                if self.behind_pooler:
                    await self._check_direct(pool)
                await self._check_pooled_settings(pool)
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
            bounded = self._bounded = BoundedPool(
                pool,
                None if self.command_timeout is None else self.command_timeout.total_seconds(),
            )
            # A pool of one would be left to the pinned connection alone. A worker's
            # dispatches and batched successes (one statement each, back to back; a
            # concurrent call goes to the pool) get theirs where two connections stay
            # free: in drains by two workers, skipping acquire and release gave ~15 %
            # more jobs/s (bench/README.md).
            self._pinned = (
                PinnedConnection(bounded, prepared=not self.behind_pooler)
                if self.max_pool_size > 1
                else None
            )
            worker_pins = self.max_pool_size >= _MIN_POOL_FOR_WORKER_PINS
            self._pinned_dispatch = PinnedConnection(bounded) if worker_pins else None
            self._pinned_success = PinnedConnection(bounded) if worker_pins else None
            if not self.poll_only:
                self._listener = NotifyListener(
                    self._connect_listener,
                    self._wake_channel,
                    self._events_channel,
                    health_check_interval=self.notify_health_check_interval.total_seconds(),
                    transient=TRANSIENT_PG_ERRORS,
                )

    async def close(self) -> None:
        """Send the wake still owed to coalesced enqueues, then close the listener
        connection and the pool. Idempotent."""
        await self._wakes.close()
        async with self._open_lock:
            listener, self._listener = self._listener, None
            pool, self._pool = self._pool, None
            self._bounded = None
            pinned = self._pinned_connections()
            self._pinned = self._pinned_dispatch = self._pinned_success = None
        if listener is not None:
            await listener.close()
        # Bounded and quiet: a close over a stalled network waited out every statement
        # timeout (forever without one) and then raised, failing a stop that had ended.
        for conn in pinned:
            with suppress(*TRANSIENT_PG_ERRORS):
                await conn.release()
        if pool is not None:
            bound = _CLOSE_TIMEOUT
            if self.command_timeout is not None:
                bound = min(bound, self.command_timeout.total_seconds())
            try:
                async with asyncio.timeout(bound):
                    await pool.close()
            except TRANSIENT_PG_ERRORS as exc:  # TimeoutError among them
                _log.warning("taskq.pool-close-forced", error=repr(exc))
                pool.terminate()

    async def _check_direct(self, pool: asyncpg.Pool[asyncpg.Record]) -> None:
        """Refuse a ``direct_dsn`` that does not reach the database the pool does: a
        typo left every worker without a leader (the election failing at each try), and
        another database's address led that one's fleet instead."""
        direct = await self._connect_listener()
        try:
            there = await direct.fetchrow(SERVER_IDENTITY)
        finally:
            await direct.close()
        async with pool.acquire() as conn:
            here = await conn.fetchrow(SERVER_IDENTITY)
        if here is None or there is None or tuple(here) != tuple(there):
            raise ConfigurationError(
                f"direct_dsn {redact(self.direct_dsn)} reaches another database than the "
                f"DSN {redact(self.dsn)}: give direct_dsn (TASKQ_DIRECT_DSN) the address of "
                f"the server the DSN's pooler connects to, with the same database"
            )

    async def _check_pooled_settings(self, pool: asyncpg.Pool[asyncpg.Record]) -> None:
        """Behind a pooler, warn of the session settings it kept from TaskQ's connections
        that the role's defaults leave otherwise (a pooler passes none at connect).
        Otherwise, refuse a pool whose sessions do not carry the settings sent: a pooler
        told to ignore them (PgBouncer's ``ignore_startup_parameters``) answers there,
        and the leader's lock taken through it stays on a server connection it lends."""
        async with pool.acquire() as conn:
            found = await conn.fetchrow(POOLED_SESSION_SETTINGS)
        assert found is not None
        if not self.behind_pooler:
            if found["jit"] != "off":
                raise ConfigurationError(
                    f"the sessions of {redact(self.dsn)} do not carry the settings TaskQ "
                    f"sends at connect (jit = off): a connection pooler ignoring them answers "
                    f"there; give the backend the server's own address as direct_dsn "
                    f"(TASKQ_DIRECT_DSN), and the pooler's as the DSN"
                )
            return
        wanted = {"jit": "off"}
        idle = self.idle_in_transaction_session_timeout
        if idle is not None and found["idle_timeout_ms"] == 0:
            wanted["idle_in_transaction_session_timeout"] = f"'{max(idle // _MS, 1)}ms'"
        if found["jit"] != "on":
            del wanted["jit"]
        if wanted:
            alter = f"ALTER ROLE {found['role']} SET "
            _log.warning(
                "taskq.pooled-settings-missing",
                settings=sorted(wanted),
                hint="TaskQ's connections through the pooler carry no session settings; "
                "give its role the ones TaskQ sets elsewhere: "
                + "; ".join(f"{alter}{name} = {value}" for name, value in wanted.items()),
            )

    def _settings(self, role: str) -> dict[str, str]:
        return connection_settings(role, self.instance_id, self.idle_in_transaction_session_timeout)

    async def _check_schema(self, pool: asyncpg.Pool[asyncpg.Record]) -> None:
        """Refuse a schema this code cannot run on (``plan_check_schema``)."""
        from taskq_postgres._migrate import plan_check_schema

        async with pool.acquire() as conn:
            checking = plan_check_schema(self._sql.schema_is_migrated, self.schema, self.direct_dsn)
            try:
                await run(conn, checking)
            except asyncpg.InsufficientPrivilegeError as exc:  # no USAGE on the schema, say
                raise await diagnosed(conn, exc, schema=self.schema, dsn=self.dsn) from exc

    async def _refused(self, exc: BaseException) -> InsufficientPrivilegeError:
        """The error for ``exc`` (a 42501), the missing rights asked on a pooled
        connection when one comes within :data:`_DIAGNOSE_TIMEOUT`."""
        with suppress(Exception):
            async with self._require_bounded().acquire(timeout=_DIAGNOSE_TIMEOUT) as conn:
                return await diagnosed(conn, exc, schema=self.schema, dsn=self.dsn)
        return privilege_error(exc, schema=self.schema, role=dsn_user(self.dsn))

    async def migrate(self) -> list[str]:
        """Apply pending migrations to this backend's schema (needs no ``open()``);
        returns the names applied (``taskq.backend.SupportsMigrate``). What a worker
        runs at start-up (``--migrate``): destructive (``post``) files wait for
        ``taskq migrate``, since workers of the old version may still be running."""
        from taskq_postgres._migrate import migrate

        # As the pool connects: the backend's password (file or provider) and timeout.
        conn = await connect(
            self.direct_dsn,  # the migrations' advisory lock is a session's
            settings=self._settings(_MIGRATE_ROLE),
            connect_timeout=self.connect_timeout,
            password=self._password,
        )
        try:
            with translated_errors(self.direct_dsn):  # a server gone meanwhile: BackendUnavailable
                return await migrate(conn, self.schema, post=False)
        finally:
            await conn.close()

    async def reload_credentials(self) -> None:
        """Make every pooled connection reconnect (with fresh credentials from the
        password provider) once it is released, and the LISTEN connection at once
        (``taskq.backend.SupportsCredentialReload``; the worker's SIGHUP).

        One connection is made with the fresh credentials first: if it fails (the
        secret was written before the role's password changed, or is wrong), this
        raises and the connections in use are kept. Expiring them first left every
        loop unable to connect, and the worker ended within seconds."""
        pool = self._require_pool()
        probe = await self._connect_listener()
        await probe.close()
        if self.behind_pooler:  # the pool's address is another: probed as well
            probe = await connect(
                self.dsn,
                settings=through_pooler(self._settings(_POOL_ROLE)),
                connect_timeout=self.connect_timeout,
                password=self._password,
            )
            await probe.close()
        await pool.expire_connections()
        for pinned in self._pinned_connections():
            await pinned.release()  # released, it is closed and replaced
        if self._listener is not None:
            await self._listener.reconnect()

    @property
    def notify_reconnects(self) -> int:
        """How many times the LISTEN connection was re-established since open."""
        return self._listener.reconnects if self._listener is not None else 0

    async def _connect_listener(self) -> asyncpg.Connection[Any]:
        # A credential-provider deployment reconnects through its own factory,
        # never through a DSN that may hold stale credentials.
        if self._notify_conn_factory is not None:
            return await self._notify_conn_factory()
        return await connect(
            self.direct_dsn,
            settings=self._settings(_NOTIFY_ROLE),
            connect_timeout=self.connect_timeout,
            password=self._password,
        )

    def _require_pool(self) -> asyncpg.Pool[asyncpg.Record]:
        if self._pool is None:
            raise ConfigurationError(
                "PostgresBackend is not open: await backend.open() first "
                "(TaskQ opens and closes its backend for you)"
            )
        return self._pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy[asyncpg.Record]]:
        """A connection from the backend's pool, for the ``*_with_conn`` methods inside
        a transaction of your own::

            async with backend.connection() as conn, conn.transaction():
                await conn.execute("INSERT INTO orders ...")
                await backend.enqueue_with_conn(conn, args)  # exists iff the order does

        It carries the backend's ``idle_in_transaction_session_timeout``: a
        transaction left idle longer is ended by the server, releasing its locks
        (behind a pooler, which passes no such setting, only where the role's defaults
        or the pooler's own ``idle_transaction_timeout`` set one; TaskQ's own
        transactions there set it for themselves).
        """
        pool = self._require_pool()
        async with pool.acquire() as conn:
            self._lent.lend(conn)  # caller code may leave session state: reset on release
            # Replaced, should it meet a read-only session: it went back to the pool as
            # it was, and every write on it failed after the setting's reset.
            async with ended_if_read_only(pool, conn):
                yield conn

    def _require_bounded(self) -> BoundedPool:
        self._require_pool()
        assert self._bounded is not None  # set together with the pool
        return self._bounded

    def _db(self, conn: Connection = None) -> Any:
        """The caller's connection when given, else the pool (which acquires per call,
        each call bounded by ``command_timeout``)."""
        return _callers(conn) if conn is not None else self._require_bounded()

    @asynccontextmanager
    async def _transaction(self, conn: Connection = None) -> AsyncIterator[Any]:
        """A transaction on the caller's connection (a savepoint if it is in one), else
        on a pooled connection."""
        if conn is not None:
            async with _callers(conn).transaction():
                yield conn
            return
        # Stated, not the server's default: the singleton check needs a fresh snapshot
        # per statement.
        async with (
            self._require_bounded().acquire() as pooled,
            pooled.transaction(isolation="read_committed"),
        ):
            if self._pooled_idle_limit is not None:
                # A pooler passes no session setting: the transaction sets its own, so
                # one left idle (a frozen process) cannot hide its rows from the sweeps.
                await pooled.execute(SET_IDLE_LIMIT, self._pooled_idle_limit)
            yield pooled

    # -- configuration -------------------------------------------------------------
    async def register_actors(self, configs: list[ActorConfig]) -> None:
        """Upsert each actor's ``max_concurrent`` / ``max_pending`` / ``queue`` /
        ``job_defaults``."""
        # One row per actor (one upsert cannot touch a row twice): the configs of an
        # actor given twice folded in order, as upserts one after another would leave
        # it (a later one without a queue or job defaults keeps the earlier one's).
        folded: dict[str, ActorConfig] = {}
        for config in configs:
            folded[config.actor] = registered_over(config, folded.get(config.actor))
        latest = list(folded.values())
        if not latest:
            return
        await self._db().execute(
            self._sql.register_actors,
            [c.actor for c in latest],
            [c.max_concurrent for c in latest],
            [c.max_pending for c in latest],
            [c.queue for c in latest],
            [None if c.job_defaults is None else dump_json(c.job_defaults) for c in latest],
        )

    async def configure_queue(self, config: QueueConfig) -> None:
        """Upsert a queue's mode and ``max_concurrent``."""
        await self._db().execute(
            self._sql.configure_queue, config.queue, config.mode, config.max_concurrent
        )

    # -- enqueue -------------------------------------------------------------------
    def _wake_for(self, conn: Connection) -> AbstractContextManager[str | None]:
        """Around one enqueue (ending after its commit): the wake channel its statement
        notifies, or None (poll-only, or coalesced into a trailing NOTIFY)."""
        if self.poll_only:
            return nullcontext(None)
        if conn is not None:
            _callers(conn)
            return nullcontext(self._wake_channel)  # commits with the caller: notify in it
        return self._wakes.around(self._wake_channel)

    def _wake_if_pending(self, back_in_pending: bool) -> None:
        """After a worker's write put a job back in ``pending`` (no delay: a snooze, a
        retry, a hand-back), wake the workers as an enqueue does, with a trailing NOTIFY
        sent once the write committed. A delayed job waits ``scheduled``; Sweep 3
        notifies when it moves it."""
        if back_in_pending and not self.poll_only:
            self._wakes.owe()

    def _pinned_connections(self) -> list[PinnedConnection]:
        return [
            pinned
            for pinned in (self._pinned, self._pinned_dispatch, self._pinned_success)
            if pinned is not None
        ]

    def _autocommit_db(self) -> PinnedConnection | BoundedPool:
        pool = self._require_bounded()
        return self._pinned if self._pinned is not None else pool

    async def _send_wake(self) -> None:
        await self._require_bounded().execute(self._sql.notify, self._wake_channel)

    async def _enqueue(self, conn: Connection, args_list: Sequence[EnqueueArgs]) -> list[JobRow]:
        refuse_keyless_singletons(args_list)
        wake = self._wake_for(conn)
        with wake as channel, _not_aborted(conn):
            if not any(args.singleton for args in args_list):
                db = conn if conn is not None else self._autocommit_db()
                rows, new = await insert_jobs(db, self._sql, args_list, wake_channel=channel)
            else:
                async with self._transaction(conn) as tx:
                    await check_singletons(tx, self._sql, self.schema, args_list)
                    rows, new = await insert_jobs(tx, self._sql, args_list, wake_channel=channel)
            if not new and isinstance(wake, EnqueueWake):
                wake.notified_nothing()
            return rows

    async def enqueue(self, args: EnqueueArgs) -> JobRow:
        """Insert one job (``pending``, or ``scheduled`` after a positive ``delay``) and
        wake the workers. A known idempotency key returns the existing row."""
        try:
            if args.singleton or args.idempotency_key is not None:
                [row] = await self._enqueue(None, [args])
                return row
            # The usual enqueue, in as few frames as it can: a one-at-a-time producer
            # pays for every layer around the statement.
            with self._wake_for(None) as channel:
                return await insert_one(self._autocommit_db(), self._sql, args, channel)
        except asyncpg.InsufficientPrivilegeError as exc:  # as _explained does elsewhere
            raise await self._refused(exc) from exc
        except asyncpg.ReadOnlySQLTransactionError as exc:
            raise read_only_error(exc, dsn=self.dsn) from exc

    async def enqueue_batch(
        self, args_list: list[EnqueueArgs], *, connection: Connection = None
    ) -> list[JobRow]:
        """Insert all items or none (one statement); one row per item, in order."""
        if not args_list:
            return []
        return await self._enqueue(connection, args_list)

    async def enqueue_batch_fast(
        self, args_list: Iterable[EnqueueArgs], *, connection: Connection = None
    ) -> int:
        """COPY the jobs in, pulling them as the rows are sent; returns how many. No
        idempotency handling: a used key fails the whole call. A caller's
        ``connection`` must use asyncpg's default json codecs."""
        pulled = iter(args_list)
        first = next(pulled, None)
        if first is None:
            return 0
        with self._wake_for(connection) as channel, _not_aborted(connection):
            async with self._transaction(connection) as tx:
                # COPY cannot evaluate clock_timestamp(): read it once, in this transaction.
                now: datetime = await tx.fetchval(self._sql.copy_clock_now, channel)
                return await copy_jobs(tx, self._sql, self.schema, chain([first], pulled), now)

    async def enqueue_with_conn(self, conn: Connection, args: EnqueueArgs) -> JobRow:
        """``enqueue`` on the caller's connection: the job exists (and the workers are
        woken) only if the caller's transaction commits. A singleton needs that
        transaction to be READ COMMITTED (``EnqueueError`` otherwise)."""
        if conn is None:
            # None means "no caller's transaction" to _enqueue: the job would commit at once.
            raise TypeError("enqueue_with_conn needs the caller's connection; use enqueue")
        [row] = await self._enqueue(conn, [args])
        return row

    # -- dispatch and heartbeat ---------------------------------------------------------
    async def dispatch_batch(
        self, worker_id: UUID, queues: list[str], limit: int, lock_lease: timedelta
    ) -> list[JobRow]:
        """Lock up to ``limit`` due pending jobs of ``queues`` for ``worker_id``.

        A dispatch that would start a second running job of one identity (another
        dispatcher started one after this statement's snapshot) fails on the unique
        index ``jobs_running_identity_key`` and runs again; it then sees that job."""
        check_names(*queues)
        return await self._dispatch_retrying(worker_id, queues, limit, lock_lease, None)

    async def dispatch_actors_batch(
        self,
        worker_id: UUID,
        queues: list[str],
        limit: int,
        lock_lease: timedelta,
        actors: Sequence[str],
    ) -> list[JobRow]:
        """:meth:`dispatch_batch` over the jobs of ``actors`` only (``SupportsActorDispatch``):
        the others' jobs take no place in the samples, the ranks or the turns."""
        check_names(*queues, *actors)
        if not actors:
            return []
        return await self._dispatch_retrying(
            worker_id, queues, limit, lock_lease, sorted(set(actors))
        )

    async def _dispatch_retrying(
        self,
        worker_id: UUID,
        queues: list[str],
        limit: int,
        lock_lease: timedelta,
        actors: list[str] | None,
    ) -> list[JobRow]:
        for _ in range(_IDENTITY_RACE_TRIES):
            try:
                return await self._dispatch(worker_id, queues, limit, lock_lease, actors)
            except asyncpg.UniqueViolationError as exc:
                if exc.constraint_name != _RUNNING_IDENTITY_INDEX:
                    raise
        return []  # lost every time: the producer dispatches again on its next turn

    async def _dispatch(
        self,
        worker_id: UUID,
        queues: list[str],
        limit: int,
        lock_lease: timedelta,
        actors: list[str] | None,
    ) -> list[JobRow]:
        """One dispatch, as :meth:`dispatch_batch` describes (of ``actors``' jobs only,
        unless None).

        The strict-FIFO statements read the queues' modes and caps themselves, so
        a busy strict-FIFO dispatch is one round trip: the small plain-head
        statement when the head of the queues needs no cap or identity check (run
        over deeper heads when other dispatchers' locks left it short), else
        (and next time, until a head is plain again) the full one. They lock nothing
        when a queue asked for is round robin; only then (or when the full one found
        no job, or when these queues were round robin last time) are the settings
        looked up, and the round-robin statement runs with them.
        """
        if limit <= 0 or not queues:
            return []
        wanted = list(dict.fromkeys(queues))
        # Whether a head was plain depends on the actors asked for too.
        key: _DispatchCall = (tuple(wanted), None if actors is None else tuple(actors))
        db: Any = self._pinned_dispatch or self._require_bounded()  # as _db(): untyped records
        params = [wanted, limit, worker_id, lock_lease, self.dispatch_oversample, actors]
        fifo_first = key not in self._round_robin_calls
        if fifo_first and key not in self._gated_heads:
            records = await db.fetch(self._sql.dispatch_plain_head, *params)
            if records[0]["plain_head"]:
                jobs = _dispatched(records)
                if (
                    len(jobs) < limit
                    and records[0]["head_size"] == limit * self.dispatch_oversample
                ):
                    jobs += await self._dispatch_past_locked(db, params, limit - len(jobs))
                return jobs
            self._gated_heads.add(key)
        if fifo_first:
            records = await db.fetch(self._sql.dispatch_strict_fifo, *params)
            if records[0]["plain_head"] or records[0]["round_robin"]:
                # Plain again; or round robin, whose head says nothing of the checks.
                self._gated_heads.discard(key)
            if not records[0]["round_robin"]:
                # What it locked is the answer, nothing included: a head that stays
                # gated (another actor's backlog at it, say) costs one statement a poll.
                return _dispatched(records)
        settings = await db.fetch(self._sql.queue_settings, wanted)
        round_robin = [r["name"] for r in settings if r["mode"] == "round_robin"]
        if not round_robin:
            # Round robin no longer (or, just now, not yet): strict FIFO after all.
            self._round_robin_calls.discard(key)
            records = await db.fetch(self._sql.dispatch_strict_fifo, *params)
            if records[0]["plain_head"]:
                self._gated_heads.discard(key)
            else:
                self._gated_heads.add(key)
            return _dispatched(records)
        self._round_robin_calls.add(key)
        capped = [
            (r["name"], r["max_concurrent"]) for r in settings if r["max_concurrent"] is not None
        ]
        turns = self._turns.turns()
        keyed = [(cohort, turn) for cohort, turn in turns.items() if isinstance(cohort, str)]
        records = await db.fetch(
            self._sql.dispatch_round_robin,
            *params[:5],
            [name for name, _ in capped],
            [cap for _, cap in capped],
            round_robin,
            [cohort for cohort, _ in keyed],
            [turn for _, turn in keyed],
            turns.get(None, 0),
            turns.get(STRICT, 0),
            actors,
        )
        jobs = [job_row(record) for record in records]
        self._turns.served(cohort_of(job, round_robin) for job in jobs)
        return jobs

    async def _dispatch_past_locked(self, db: Any, params: list[Any], missing: int) -> list[JobRow]:
        """Again, for ``missing`` jobs, over heads four times as deep each round, until a
        round locks a job, reads past the due jobs, or ``_PAST_LOCKED_ROUNDS`` are done.

        A plain head that was full (so due jobs lie beyond it) yet gave fewer jobs
        than asked: other dispatchers held the rest of it (``SKIP LOCKED``), their
        dispatches still in flight. Short, the worker would wait for a wake with
        slots free and jobs due (a drain by two workers lost seconds so). Their
        batches are their size, not this one's: a worker asking for 2 behind another
        locking 100 reads past them only in the third round (16, 64, then 256 rows).
        Short but not empty, the producer dispatches again at once.
        """
        wanted, limit, worker_id, lock_lease, oversample, actors = params
        rows = limit * oversample
        for _ in range(_PAST_LOCKED_ROUNDS):
            rows *= 4
            per_job = -(-rows // missing)  # ceiling: the head's rows per job asked for
            deeper_params = [wanted, missing, worker_id, lock_lease, per_job, actors]
            records = await db.fetch(self._sql.dispatch_plain_head, *deeper_params)
            if not records[0]["plain_head"]:
                # The deeper rows need the checks (a capped actor, an identity, another
                # actor's job): the plain-head statement locks nothing for them.
                records = await db.fetch(self._sql.dispatch_strict_fifo, *deeper_params)
                return _dispatched(records)
            jobs = _dispatched(records)
            if jobs or records[0]["head_size"] < missing * per_job:
                return jobs
        return []

    async def heartbeat_jobs(self, worker_id: UUID, lock_lease: timedelta) -> int:
        """Extend the lease of every running job ``worker_id`` holds; returns how many."""
        return len(await self.renew_leases(worker_id, lock_lease))

    async def renew_leases(self, worker_id: UUID, lock_lease: timedelta) -> list[JobId]:
        """``heartbeat_jobs``, returning the ids renewed; a row another transaction holds
        is skipped, not waited for (``SupportsLeaseRenewal``)."""
        records = await self._db().fetch(self._sql.heartbeat_jobs, worker_id, lock_lease)
        return [record["id"] for record in records]

    async def held_jobs(self, worker_id: UUID) -> list[tuple[JobId, int]]:
        """``(id, attempt)`` of every running job ``worker_id`` holds (``SupportsHeldJobs``)."""
        records = await self._db().fetch(self._sql.held_jobs, worker_id)
        return [(record["id"], record["attempt"]) for record in records]

    async def record_late_outcome(
        self, job_id: JobId, attempt: int, worker_id: UUID, outcome: str, error: ErrorInfo | None
    ) -> bool:
        """A ``late_outcome`` event in the job's history (``SupportsLateOutcomes``)."""
        detail = dump_json(late_outcome_detail(attempt, worker_id, outcome, error))
        said = dump_json(late_outcome_detail(attempt, worker_id, outcome, None))
        return bool(await self._db().fetchval(self._sql.late_outcome, job_id, detail, said))

    async def record_progress(
        self,
        job_id: JobId,
        worker_id: UUID,
        progress_seq: int,
        progress_state: dict[str, Any] | None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """Store newer progress for the owner of a running job."""
        owned = await self._db().fetchval(
            self._sql.record_progress,
            job_id,
            worker_id,
            attempt,
            progress_seq,
            None if progress_state is None else dump_json(progress_state),
        )
        return bool(owned)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy[asyncpg.Record]]:
        """A pooled connection inside a transaction: commits on a clean exit, rolls back
        on an exception (``taskq.backend.SupportsTransactions``). READ COMMITTED, whatever
        the server's default: a singleton enqueue in it needs a fresh snapshot per
        statement (a worker writes a success and its sub-jobs in one)."""
        async with self.connection() as conn, conn.transaction(isolation="read_committed"):
            yield conn

    async def extend_reservation_leases(self, worker_id: UUID, lock_lease: timedelta) -> int:
        """Extend the leases of the reservation slots ``worker_id`` holds."""
        status = await self._db().execute(
            self._sql.extend_reservation_leases, worker_id, lock_lease
        )
        return _changed(status)

    # -- terminal writes -----------------------------------------------------------------
    async def _mark_succeeded(
        self,
        conn: Connection,
        job_id: JobId,
        worker_id: UUID,
        result: Any,
        progress_seq: int,
        progress_state: dict[str, Any] | None,
        fallback_result_ttl: timedelta | None,
        attempt: int | None,
    ) -> bool:
        changed = await self._db(conn).fetchval(
            self._sql.mark_succeeded,
            job_id,
            worker_id,
            attempt,
            None if result is None else dump_json(result),
            fallback_result_ttl,
            progress_seq,
            None if progress_state is None else dump_json(progress_state),
        )
        return bool(changed)

    async def mark_succeeded(
        self,
        job_id: JobId,
        worker_id: UUID,
        result: Any,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        fallback_result_ttl: timedelta | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """``running -> succeeded`` storing ``result`` (NUL characters in its strings are
        stored as U+FFFD); False on a no-op."""
        return await self._mark_succeeded(
            None,
            job_id,
            worker_id,
            result,
            progress_seq,
            progress_state,
            fallback_result_ttl,
            attempt,
        )

    async def mark_succeeded_many(
        self,
        worker_id: UUID,
        items: Sequence[SuccessWrite],
        fallback_result_ttl: timedelta | None = None,
    ) -> list[bool]:
        """``mark_succeeded`` for a list in one statement: each row keeps its own
        ownership guard, attempt row and event; one flag per item, in order. Items of
        one job (a stale attempt's beside the current one's) are written in turn, a
        statement each, so each is judged as if written after the one before."""
        flags = [False] * len(items)
        # Every item's values serialized before the first turn is written: one that
        # cannot be stored refuses the whole call, a repeat's turn included.
        results = [None if item.result is None else dump_json(item.result) for item in items]
        states = [
            None if item.progress_state is None else dump_json(item.progress_state)
            for item in items
        ]
        for turn in _turns([item.job_id for item in items]):
            written = [items[i] for i in turn]
            records = await (self._pinned_success or self._require_bounded()).fetch(
                self._sql.mark_succeeded_many,
                worker_id,
                fallback_result_ttl,
                [item.job_id for item in written],
                [item.attempt for item in written],
                [results[i] for i in turn],
                [item.progress_seq for item in written],
                [states[i] for i in turn],
            )
            for record in records:
                flags[turn[record["position"] - 1]] = True
        return flags

    async def mark_succeeded_with_conn(
        self,
        conn: Connection,
        job_id: JobId,
        worker_id: UUID,
        result: Any,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        fallback_result_ttl: timedelta | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """``mark_succeeded`` on the caller's connection, inside its transaction."""
        return await self._mark_succeeded(
            conn,
            job_id,
            worker_id,
            result,
            progress_seq,
            progress_state,
            fallback_result_ttl,
            attempt,
        )

    async def mark_failed_or_retry(
        self,
        job_id: JobId,
        worker_id: UUID,
        error_info: ErrorInfo,
        retry_delay: timedelta | None,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        *,
        attempt: int | None = None,
    ) -> JobRow:
        """Record a failed attempt, then retry (``scheduled``/``pending``) or fail; the
        server clock decides the deadline. Returns the row after the write, the
        unchanged row on a no-op; ``KeyError`` for an unknown job."""
        if retry_delay is not None:
            check_delay(retry_delay)
        db = self._db()
        record = await db.fetchrow(
            self._sql.mark_failed_or_retry,
            job_id,
            worker_id,
            attempt,
            clean_text(error_info.error_class),
            clean_text(error_info.message),
            clean_text(error_info.traceback),
            retry_delay,
            progress_seq,
            None if progress_state is None else dump_json(progress_state),
        )
        if record is None:
            record = await db.fetchrow(self._sql.get_job, job_id)
            if record is None:
                raise KeyError(f"no job with id {job_id}")
        else:
            self._wake_if_pending(record["status"] == "pending")
        return job_row(record)

    async def mark_cancelled(
        self,
        job_id: JobId,
        worker_id: UUID,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """``running -> cancelled`` (the actor honoured a cancel); False on a no-op."""
        changed = await self._db().fetchval(
            self._sql.mark_cancelled,
            job_id,
            worker_id,
            attempt,
            progress_seq,
            None if progress_state is None else dump_json(progress_state),
        )
        return bool(changed)

    async def write_cancel_escalation(
        self,
        job_id: JobId,
        worker_id: UUID,
        phase: Literal[2],
        *,
        attempt: int | None = None,
    ) -> bool:
        """Cancel phase 1 -> 2 for the owner, with a ``cancel_escalated`` event."""
        if phase != 2:
            raise ValueError(f"a cancel can only be escalated to phase 2, not {phase}")
        changed = await self._db().fetchval(
            self._sql.write_cancel_escalation, job_id, worker_id, attempt
        )
        return bool(changed)

    async def mark_abandoned(
        self,
        job_id: JobId,
        worker_id: UUID,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        *,
        attempt: int | None = None,
    ) -> bool:
        """``running -> abandoned`` while ``cancel_phase = 2``, for the owner only."""
        changed = await self._db().fetchval(
            self._sql.mark_abandoned,
            job_id,
            worker_id,
            attempt,
            progress_seq,
            None if progress_state is None else dump_json(progress_state),
        )
        return bool(changed)

    async def mark_snoozed(
        self,
        job_id: JobId,
        worker_id: UUID,
        delay: timedelta,
        *,
        metadata_update: dict[str, Any] | None = None,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        outcome: AttemptOutcome = "snoozed",
        attempt: int | None = None,
    ) -> Literal["scheduled", "failed", "cancelled", "noop"]:
        """Run again after ``delay`` without using an attempt (``max_attempts + 1``);
        ``failed`` when that would pass the deadline, ``cancelled`` when a cancel was
        requested."""
        check_delay(delay)
        to_status = await self._db().fetchval(
            self._sql.mark_snoozed,
            job_id,
            worker_id,
            attempt,
            delay,
            dump_json(metadata_update) if metadata_update else None,
            outcome,
            progress_seq,
            None if progress_state is None else dump_json(progress_state),
        )
        if to_status is None:
            return "noop"
        self._wake_if_pending(to_status == "pending")
        if to_status in ("failed", "cancelled"):
            return cast(Literal["failed", "cancelled"], to_status)
        return "scheduled"

    async def hand_back_unstarted(
        self,
        worker_id: UUID,
        jobs: Sequence[tuple[JobId, int | None]],
        *,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> int:
        """``mark_snoozed`` with no delay and outcome ``unstarted`` for every job, in one
        statement (jobs the worker locked and never started); how many moved.
        ``batch_ends``: each job of a batch it failed or cancelled is appended to it."""
        if not jobs:
            return 0
        moved = await self._db().fetch(
            self._sql.mark_snoozed_many,
            [job_id for job_id, _ in jobs],
            worker_id,
            [attempt for _, attempt in jobs],
            timedelta(0),
            None,
            "unstarted",
            0,
            None,
        )
        self._wake_if_pending(any(record["to_status"] == "pending" for record in moved))
        if batch_ends is not None:
            batch_ends.extend(
                BatchChildEnd(record["batch_tag"], JobStatus(record["to_status"]))
                for record in moved
                if record["batch_tag"] is not None
                and record["to_status"] in (JobStatus.FAILED, JobStatus.CANCELLED)
            )
        return len(moved)

    async def mark_retry_after(
        self,
        job_id: JobId,
        worker_id: UUID,
        delay: timedelta,
        *,
        consume_budget: bool = True,
        progress_seq: int = 0,
        progress_state: dict[str, Any] | None = None,
        attempt: int | None = None,
    ) -> Literal[
        "scheduled", "failed:DeadlineExceeded", "failed:MaxAttemptsExceeded", "cancelled", "noop"
    ]:
        """Run again after ``delay``. With ``consume_budget=False`` (a rate-limit denial)
        the attempt does not count: ``max_attempts`` grows by one. ``cancelled`` when a
        cancel was requested."""
        check_delay(delay)
        result = await self._db().fetchval(
            self._sql.mark_retry_after,
            job_id,
            worker_id,
            attempt,
            delay,
            consume_budget,
            progress_seq,
            None if progress_state is None else dump_json(progress_state),
        )
        if result is None:
            return "noop"
        # "scheduled" covers both: no delay puts the job back in pending.
        self._wake_if_pending(result == "scheduled" and delay <= _NO_DELAY)
        return cast(
            Literal[
                "scheduled", "failed:DeadlineExceeded", "failed:MaxAttemptsExceeded", "cancelled"
            ],
            result,
        )

    # -- history -------------------------------------------------------------------------
    async def write_attempt(self, attempt: AttemptRow) -> None:
        """Insert or replace the attempt row of ``(job_id, attempt)``; ``KeyError`` when
        the job does not exist."""
        error = attempt.error
        found = await self._db().fetchval(
            self._sql.write_attempt,
            attempt.job_id,
            attempt.attempt,
            attempt.worker_id,
            attempt.started_at,
            attempt.finished_at,
            attempt.outcome,
            clean_text(error.error_class) if error else None,
            clean_text(error.message) if error else None,
            clean_text(error.traceback) if error else None,
        )
        if not found:
            raise KeyError(f"no job with id {attempt.job_id}")

    async def get_attempts(self, job_id: JobId) -> list[AttemptRow]:
        """Attempts of a job by attempt number."""
        return [attempt_row(r) for r in await self._db().fetch(self._sql.get_attempts, job_id)]

    async def get_events(self, job_id: JobId) -> list[EventRow]:
        """Events of a job by event id."""
        return [event_row(r) for r in await self._db().fetch(self._sql.get_events, job_id)]

    async def poll_reclaim_events(
        self,
        after_id: int,
        limit: int = 100,
        *,
        visibility_delay: timedelta | None = None,
    ) -> list[EventRow]:
        """``reclaimed`` events after ``after_id`` older than the visibility delay (the
        argument, else the backend's), in id order."""
        delay = (
            visibility_delay
            if visibility_delay is not None
            else self.reclaim_event_visibility_delay
        )
        records = await self._db().fetch(
            self._sql.poll_reclaim_events, after_id, delay, max(limit, 0)
        )
        return [event_row(r) for r in records]

    async def check_reclaim_visibility_delay_risk(
        self, visibility_delay: timedelta | None = None
    ) -> list[LongRunningJobEventsWriter]:
        """Transactions holding a lock on ``job_events`` for longer than the visibility
        delay (default: the backend's), oldest first.

        Such a writer may commit an event below a cursor that already moved past
        it, breaking the gap-free promise of :meth:`poll_reclaim_events`. A proxy
        signal for monitoring: it cannot tell whether the writer will insert.
        """
        delay = (
            visibility_delay
            if visibility_delay is not None
            else self.reclaim_event_visibility_delay
        )
        records = await self._db().fetch(self._sql.reclaim_visibility_risk, delay)
        return [writer_row(r) for r in records]

    # -- cancellation -------------------------------------------------------------------
    async def _cancel(
        self,
        condition: str,
        params: Sequence[Any],
        reason: str | None,
        batch_ends: list[BatchChildEnd] | None,
        order: Literal["asc", "desc"] = "asc",
    ) -> BulkCancelResult:
        direction = "DESC" if order == "desc" else "ASC"
        sql = self._sql.cancel_jobs.replace(FILTER_TOKEN, condition).replace(
            DIRECTION_TOKEN, direction
        )
        tried = 0
        while True:
            tried += 1
            try:
                records = await self._db().fetch(
                    sql, clean_text(reason), self._events_to, self._worker_prefix, *params
                )
                break
            except asyncpg.DeadlockDetectedError:
                # Against a worker's writes, which lock the same rows in their own order
                # (dispatch: by priority): the statement rolled back whole, try again.
                if tried == _CANCEL_TRIES:
                    raise
        result = BulkCancelResult()
        for record in records:
            (result.cancelled if record["outcome"] == "cancelled" else result.requested).append(
                record["id"]
            )
            if batch_ends is not None and record["batch_tag"] is not None:
                batch_ends.append(BatchChildEnd(record["batch_tag"], JobStatus.CANCELLED))
        return result

    async def write_cancel_request(
        self,
        job_id: JobId,
        reason: str | None,
        *,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> bool:
        """Cancel a waiting job at once, or flag a running one and tell its worker; False
        when the job is finished or unknown. A batch child cancelled at once goes to
        ``batch_ends``."""
        result = await self._cancel("j.id = $4", [job_id], reason, batch_ends)
        return bool(result.cancelled or result.requested)

    async def cancel_where(
        self,
        filter: JobFilter,
        reason: str | None,
        *,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> BulkCancelResult:
        """``write_cancel_request`` on every job ``filter`` selects (its limit ignored), in
        one statement; events written and ids returned in the filter's order."""
        params = _Params(4)
        conditions = _job_conditions(filter, params)
        return await self._cancel(
            " AND ".join(conditions) or "true", params.values, reason, batch_ends, filter.order
        )

    async def poll_cancel_flags(self, worker_id: UUID) -> list[CancelFlag]:
        """Running jobs of ``worker_id`` with a cancel request, oldest request first."""
        records = await self._db().fetch(self._sql.poll_cancel_flags, worker_id)
        return [cancel_flag(r) for r in records]

    # -- admin -----------------------------------------------------------------------------
    async def retry_job(self, job_id: JobId) -> bool:
        """Give a failed/crashed/cancelled/abandoned job a new life as ``pending``;
        ``SingletonCollisionError`` for a singleton whose identity another active job
        holds (it would be a second one)."""
        async with self._transaction(None) as tx:
            target = await tx.fetchrow(self._sql.retry_target, job_id)
            if target is not None and target["singleton"]:
                key = singleton_lock_key(self.schema, target["actor"], target["identity_key"])
                await tx.fetchval(self._sql.singleton_locks, [key])
            record = await tx.fetchrow(self._sql.retry_job, job_id, self._wake_to)
        if record is not None and record["holder"] is not None:
            raise SingletonCollisionError.on_retry(
                job_id, target["actor"], target["identity_key"], record["holder"]
            )
        if record is not None and record["late"] is not None:
            raise RetryRefusedError.past_deadline(job_id, record["late"].isoformat())
        if record is not None and record["aborted"] is not None:
            raise RetryRefusedError.in_aborted_batch(job_id, record["aborted"])
        return bool(record is not None and record["changed"])

    # -- sweeps ----------------------------------------------------------------------------
    async def _in_turns(
        self,
        query: str,
        *args: Any,
        turns: int | None = _SWEEP_TURNS,
        each: Callable[[asyncpg.Record], None] | None = None,
    ) -> int:
        """Run a sweep statement (its last parameter the most rows it moves) until it
        moves fewer, or ``turns`` times (None: no limit), handing each turn's record to
        ``each`` (what it reports beside the count): each turn commits, so a
        backlog a bounded caller cannot move in one go still drains, a turn at a time.
        The sweeps the leader runs together take :data:`_SWEEP_TURNS`, so one sweep's
        backlog leaves the next ones their share of the iteration's bound (a promotion
        backlog kept the reclaim after it from running: crashed workers' jobs waited
        for it); what is left, the next call moves."""
        moved = 0
        for _ in count() if turns is None else range(turns):
            record = await self._db().fetchrow(query, *args, self._sweep_turn)
            changed = int(record["changed"]) if record is not None else 0
            moved += changed
            if each is not None and record is not None:
                each(record)
            if changed < self._sweep_turn:
                break
        return moved

    async def scheduled_to_pending(self) -> int:
        """Promote due scheduled jobs; one wake per turn that moved any."""
        return await self._in_turns(self._sql.scheduled_to_pending, self._wake_to)

    async def deadline_sweep(self, *, batch_ends: list[BatchChildEnd] | None = None) -> int:
        """Fail pending/scheduled jobs whose ``schedule_to_close`` deadline passed; the
        batch children failed go to ``batch_ends``."""

        def report(record: asyncpg.Record) -> None:
            if batch_ends is not None:
                batch_ends.extend(
                    BatchChildEnd(tag, JobStatus.FAILED) for tag in record["batch_tags"] or ()
                )

        return await self._in_turns(self._sql.deadline_sweep, each=report)

    async def reclaim_expired_locks(
        self,
        cancel_grace: timedelta,
        cleanup_grace: timedelta,
        *,
        worker_silence: timedelta | None = None,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> int:
        """Reclaim running jobs whose lease expired (cancelled / pending / crashed); a job
        with a cancel in progress waits ``cancel_grace + cleanup_grace +
        cancel_reclaim_headroom`` past its lease; with ``worker_silence``, a job whose
        worker was seen within it is left. One wake per turn that reclaimed any. The
        batch children ended go to ``batch_ends``."""
        cancel_wait = cancel_grace + cleanup_grace + self.cancel_reclaim_headroom

        def report(record: asyncpg.Record) -> None:
            if batch_ends is not None:
                batch_ends.extend(
                    BatchChildEnd(tag, JobStatus(status))
                    for tag, status in record["batch_ends"] or ()
                )

        return await self._in_turns(
            self._sql.reclaim_expired_locks,
            cancel_wait,
            self._wake_to,
            worker_silence,
            each=report,
        )

    # -- reads -----------------------------------------------------------------------------
    async def get(self, job_id: JobId) -> JobRow | None:
        """One job, or None."""
        record = await self._db().fetchrow(self._sql.get_job, job_id)
        return job_row(record) if record is not None else None

    async def list_jobs(self, filters: JobFilter) -> list[JobRow]:
        """One page of the jobs ``filters`` selects, in ``(created_at, id)`` order."""
        params = _Params(1)
        conditions = _job_conditions(filters, params)
        direction = "DESC" if filters.order == "desc" else "ASC"
        clause = (
            (f"WHERE {' AND '.join(conditions)}\n" if conditions else "")
            + f"ORDER BY j.created_at {direction}, j.id {direction}\n"
            + f"LIMIT {params.bind(filters.limit)}"
        )
        order = f"ORDER BY page.created_at {direction}, page.id {direction}"
        sql = self._sql.list_jobs.replace(WHERE_TOKEN, clause).replace(ORDER_TOKEN, order)
        return [job_row(r) for r in await self._db().fetch(sql, *params.values)]

    async def count_pending_jobs(
        self, actors: list[str], *, up_to: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """Waiting (pending + scheduled) jobs of each actor asked for, each stopped at
        its ``up_to`` if it has one."""
        check_names(*actors)
        check_up_to(up_to)
        asked = list(dict.fromkeys(actors))
        limits = [None if up_to is None else up_to.get(actor) for actor in asked]
        records = await self._db().fetch(self._sql.count_pending_jobs, asked, limits)
        counts = {r["actor"]: int(r["waiting"]) for r in records}
        return {actor: counts.get(actor, 0) for actor in actors}

    async def get_actor_max_pending(self) -> dict[str, int | None]:
        """``max_pending`` of every registered actor."""
        records = await self._db().fetch(self._sql.get_actor_max_pending)
        return {r["actor"]: r["max_pending"] for r in records}

    async def get_actor_queues(self) -> dict[str, str]:
        """The queue of every actor registered with one (``SupportsCron``)."""
        records = await self._db().fetch(self._sql.get_actor_queues)
        return {r["actor"]: r["queue"] for r in records}

    async def get_actor_job_defaults(self) -> dict[str, dict[str, Any]]:
        """The job defaults of every actor registered with them (``SupportsCron``)."""
        records = await self._db().fetch(self._sql.get_actor_job_defaults)
        return {r["actor"]: load_json(r["job_defaults"]) for r in records}

    async def count_active_jobs(self, queues: list[str]) -> int:
        """Non-terminal jobs in ``queues``."""
        check_names(*queues)
        return int(await self._db().fetchval(self._sql.count_active_jobs, list(queues)))

    # -- wake-ups ---------------------------------------------------------------------------
    def _require_listener(self) -> NotifyListener | None:
        self._require_pool()
        assert self._listener is not None or self.poll_only  # set together with the pool
        return self._listener

    def subscribe_wake(self) -> AbstractAsyncContextManager[asyncio.Event]:
        """An event set whenever new work may be dispatchable (enqueue, promotion, retry,
        reclaim, finalizer release) in this schema. The consumer clears it. The first
        subscription opens the LISTEN connection. Never set when ``poll_only``."""
        listener = self._require_listener()
        return _unset_event() if listener is None else listener.subscribe_wake()

    def subscribe_cancel_wake(self) -> AbstractAsyncContextManager[asyncio.Event]:
        """An event set whenever a running job of this schema receives a cancel request.
        Never set when ``poll_only``."""
        listener = self._require_listener()
        return _unset_event() if listener is None else listener.subscribe_cancel()

    def subscribe_worker_cancel_wake(
        self, worker_id: UUID
    ) -> AbstractAsyncContextManager[asyncio.Event]:
        """An event set when a running job ``worker_id`` holds receives a cancel request:
        its own channel (``channels.worker_channel``) is listened to meanwhile. Never set
        when ``poll_only``."""
        listener = self._require_listener()
        if listener is None:
            return _unset_event()
        return listener.subscribe_worker_cancel(worker_channel(self.schema, worker_id))

    # -- schedules ---------------------------------------------------------------------------
    async def create_schedule(self, args: ScheduleCreateArgs) -> ScheduleRecord:
        """Store a schedule; its first ``next_fire_at`` follows the server clock.
        ``ValueError`` when the name is taken."""
        db = self._db()
        now: datetime = await db.fetchval(self._sql.schedule_clock_now)
        try:
            record = await db.fetchrow(
                self._sql.insert_schedule,
                uuid4(),
                args.name,
                args.actor,
                args.cron,
                dump_json(args.payload),
                args.queue,
                args.timezone,
                args.enabled,
                now,
                dump_json(args.options),
                first_fire_at(args.cron, args.timezone, args.enabled, now),
            )
        except asyncpg.UniqueViolationError:
            raise ValueError(
                f"a schedule named {args.name!r} already exists; update it or pick another name"
            ) from None
        return schedule_record(record)

    async def list_schedules(
        self, *, actor: str | None = None, enabled: bool | None = None
    ) -> list[ScheduleRecord]:
        """Schedules by name."""
        if actor is not None:
            check_names(actor)
        records = await self._db().fetch(self._sql.list_schedules, actor, enabled)
        return [schedule_record(r) for r in records]

    async def update_schedule(self, schedule_id: UUID, args: ScheduleUpdateArgs) -> ScheduleRecord:
        """Apply ``args.changes()`` (the fields set, the queue NULL for ``actor_queue``);
        ``next_fire_at`` is computed again from the server clock when the timing (cron,
        time zone, enabled) changed, else kept; ``KeyError`` if unknown."""
        async with self._transaction() as tx:
            current = await tx.fetchrow(self._sql.lock_schedule, schedule_id)
            if current is None:
                raise KeyError(f"no schedule with id {schedule_id}")
            stored = schedule_record(current)
            merged = stored.model_copy(update=args.changes())
            record = await tx.fetchrow(
                self._sql.update_schedule,
                schedule_id,
                merged.cron,
                dump_json(merged.payload),
                merged.queue,
                merged.timezone,
                merged.enabled,
                dump_json(merged.options),
                updated_fire_at(stored, merged, current["now"]),
            )
        return schedule_record(record)

    async def delete_schedule(self, schedule_id: UUID) -> None:
        """Remove a schedule; ``KeyError`` if unknown."""
        if await self._db().fetchval(self._sql.delete_schedule, schedule_id) is None:
            raise KeyError(f"no schedule with id {schedule_id}")

    # -- maintenance leader (taskq.backend._protocol's optional protocols) -----------------
    def leader_elector(self, worker_id: UUID, *, lease: timedelta) -> PostgresLeaderElector:
        """An elector over a dedicated ``taskq-leader`` session whose
        ``idle_session_timeout`` is ``lease`` (``SupportsLeaderElection``). Each
        confirmation ends within half the lease, and within half the
        ``command_timeout`` when one is set."""
        lease_ms = max(int(lease / timedelta(milliseconds=1)), 1)
        settings = {**self._settings(LEADER_ROLE), "idle_session_timeout": str(lease_ms)}

        async def connect_leader() -> asyncpg.Connection[Any]:
            try:
                return await connect(
                    self.direct_dsn,
                    settings=settings,
                    connect_timeout=self.connect_timeout,
                    password=self._password,
                )
            except BackendUnavailableError as exc:
                # An unreachable server is an outage the election rides out; a
                # refused login is not, and stays loud.
                if isinstance(exc.__cause__, TRANSIENT_PG_ERRORS):
                    raise exc.__cause__ from None
                raise

        # Within the lease; and two confirmations (the election loop may wait for one in
        # flight before its own) within the command_timeout a worker loop's iteration
        # is checked against.
        timeout = lease / 2
        if self.command_timeout is not None:
            timeout = min(timeout, self.command_timeout / 2)
        return PostgresLeaderElector(
            connect_leader, self._leader_sql, worker_id, command_timeout=timeout
        )

    async def fire_due_schedules(self, build: ScheduleFire, *, catch_up: timedelta) -> int:
        """Enqueue each due slot of each due schedule and advance its ``next_fire_at``,
        one schedule per transaction holding its row lock (``SupportsCron``). Slots and
        the catch-up cutoff come from the server clock read under the lock.

        A schedule's commit is its own: a tick cut short (the leader bounds it) keeps
        the schedules it fired, so a backlog larger than one tick drains over several
        instead of rolling back every time. The lock outlives a frozen leader by
        ``command_timeout`` at most (the session's idle-in-transaction limit), not
        by the pool's minute, in which a new leader skipped the schedule and its slot
        fell out of the catch-up window."""
        fired = 0
        clock = asyncio.get_running_loop()
        budget = _CRON_TICK_SECONDS
        if self.command_timeout is not None:
            budget = min(budget, self.command_timeout.total_seconds() / 2)
        ends = clock.time() + budget
        lock_bound = None
        if self.command_timeout is not None:
            lock_bound = f"{max(int(self.command_timeout.total_seconds() * 1000), 1)}ms"
        while clock.time() < ends:
            async with self._transaction() as tx:
                record = await tx.fetchrow(self._leader_sql.cron_due, 1, lock_bound)
                if record is None:
                    break
                fired += await self._fire(tx, record, build, catch_up)
        return fired

    async def _fire(self, tx: Any, record: Any, build: ScheduleFire, catch_up: timedelta) -> int:
        """Enqueue the due slots of the schedule ``record`` (locked by ``tx``), up to its
        actor's ``max_pending`` counted in ``tx``, and advance it; returns the jobs
        enqueued."""
        schedule = schedule_record(record)
        slots, following = cron_slots(schedule, record["now"], catch_up)
        jobs = [args for slot in slots if (args := build(schedule, slot)) is not None]
        jobs = one_per_singleton(schedule, slots, jobs)
        if jobs:
            capped = await tx.fetchrow(self._leader_sql.cron_max_pending, schedule.actor)
            if capped is not None:
                jobs = within_max_pending(
                    schedule, slots, jobs, capped["max_pending"], capped["waiting"]
                )
        if jobs:
            try:
                async with tx.transaction():  # a savepoint: the slots' enqueue alone
                    await self._enqueue(tx, jobs)
            except (
                TaskQError,
                ValueError,
                # The database refusing these rows (a constraint, a value): raised, the
                # tick failed each time, and the loop guard ended each leader in turn.
                asyncpg.DataError,
                asyncpg.IntegrityConstraintViolationError,
            ) as exc:
                skipped_slots(schedule, slots, exc)
                jobs = []
        await tx.execute(
            self._leader_sql.cron_advance,
            schedule.id,
            following,
            slots[-1] if slots else None,
            record["next_fire_at"],
        )
        return len(jobs)

    async def prune_terminal_jobs(
        self,
        retention: Mapping[str, timedelta],
        *,
        archive_retention: timedelta,
        batch_size: int = 10_000,
    ) -> int:
        """Move terminal jobs past their status's retention, and past their result's
        expiry, (with their attempts) into the archive, one atomic statement per batch,
        each from where the batch before left off (``SupportsPrune``)."""
        check_batch_size(batch_size)
        check_retention(retention)
        moved = 0
        for status, keep in retention.items():
            after = _FIRST_KEY[0]
            while True:
                record = await self._db().fetchrow(
                    self._prune_sql,
                    status,
                    keep,
                    batch_size,
                    archive_retention,
                    after,
                    timeout=_BULK_STATEMENT_TIMEOUT,
                )
                count = int(record["moved"]) if record is not None else 0
                moved += count
                if count < batch_size or record is None:
                    break
                after = record["last_finished"]
        return moved

    async def expire_archive(self, *, batch_size: int = 10_000) -> int:
        """Delete archived jobs past ``expire_at`` (attempts by cascade), in batches."""
        check_batch_size(batch_size)
        deleted = 0
        while True:
            count = int(
                await self._db().fetchval(
                    self._expire_archive_sql, batch_size, timeout=_BULK_STATEMENT_TIMEOUT
                )
            )
            deleted += count
            if count < batch_size:
                return deleted

    async def sweep_expired_results(self) -> int:
        """Clear the result of every job whose ``result_expires_at`` has passed on the
        server clock (``SupportsResultExpiry``); the expiry time itself is kept. A loop
        of its own, every ``result_expiry_interval``: as many turns as the backlog
        takes, within that loop's bound."""
        return await self._in_turns(self._sql.expire_results, turns=None)

    async def complete_stale_batches(self) -> int:
        """Complete every active batch with no active child, none ended within
        ``stale_batch_grace``, and release its finalizer (``SupportsStaleBatchSweep``);
        returns the batches completed. Then cancel, in turns, the waiting children of
        aborted batches (an abort cut short, a child retried after it).

        The active batches are read in windows of :data:`_SWEEP_TURN`, one statement
        each (all of them in one, a million outlasted the leader's bound and rolled back
        at every call), from where the last window left off: a call its bound cuts
        short is taken up there by the next, which would otherwise start over and
        never reach the batches at the end."""
        completed = 0
        while True:
            after_at, after_id = self._stale_batches_after
            record = await self._db().fetchrow(
                self._sql.complete_stale_batches,
                self._wake_to,
                self.stale_batch_grace,
                after_at,
                after_id,
                self._sweep_turn,
            )
            if record is None:
                break
            completed += int(record["completed"])
            if int(record["scanned"]) < self._sweep_turn:
                self._stale_batches_after = _FIRST_KEY
                break
            self._stale_batches_after = (record["last_at"], record["last_id"])
        await self._cancel_aborted_leftovers()
        return completed

    async def _cancel_aborted_leftovers(self) -> None:
        """Cancel the waiting children of aborted batches, in at most
        :data:`_SWEEP_TURNS` turns: each reads one window of the batch ids that have a
        child pending, scheduled or running, from where the turn before left off (the
        next call goes on from there, and starts over past the last)."""
        for _ in range(_SWEEP_TURNS):
            record = await self._db().fetchrow(
                self._sql.cancel_aborted_leftovers,
                self._leftovers_after,
                self._sweep_turn,
                self._sweep_turn,
            )
            if record is None:
                return
            if int(record["changed"]) < self._sweep_turn:
                # A full turn may have left more in its window: the next reads it again.
                if int(record["scanned"]) < self._sweep_turn:
                    self._leftovers_after = ""
                    return
                self._leftovers_after = record["last_tag"]

    # -- fleet statistics and the worker registry -------------------------------------------
    async def queue_depths(self) -> dict[str, dict[str, int]]:
        """Pending, scheduled and running jobs per queue (``SupportsFleetStats``)."""
        return {
            r["queue"]: {
                "pending": int(r["pending"]),
                "scheduled": int(r["scheduled"]),
                "running": int(r["running"]),
            }
            for r in await self._db().fetch(self._sql.queue_depths)
        }

    async def stranded_jobs(self) -> dict[str, dict[str, int]]:
        """Pending and scheduled jobs per actor and queue, of an actor with no
        ``actor_config`` row or, while workers are registered, that no worker row both
        runs and works the queue of (``SupportsFleetStats``)."""
        stranded: dict[str, dict[str, int]] = {}
        for r in await self._db().fetch(self._sql.stranded_jobs):
            stranded.setdefault(r["actor"], {})[r["queue"]] = int(r["jobs"])
        return stranded

    async def register_worker(
        self,
        worker_id: UUID,
        hostname: str,
        pid: int,
        queues: list[str],
        *,
        actors: Sequence[str] | None = None,
    ) -> None:
        """Upsert the worker's row on the server clock (``SupportsWorkerRegistry``)."""
        check_names(hostname, *queues, *(actors or ()))
        await self._db().execute(
            self._sql.register_worker,
            worker_id,
            hostname,
            pid,
            queues,
            None if actors is None else list(actors),
        )

    async def touch_worker(self, worker_id: UUID) -> bool:
        """Set the worker's ``last_seen_at`` to the server clock; False when the row is gone."""
        return _changed(await self._db().execute(self._sql.touch_worker, worker_id)) == 1

    async def deregister_worker(self, worker_id: UUID) -> None:
        """Delete the worker's row (no-op when it is gone)."""
        await self._db().execute(self._sql.deregister_worker, worker_id)

    async def cleanup_stale_workers(self, older_than: timedelta) -> int:
        """Delete workers unseen for more than ``older_than`` on the server clock."""
        return _changed(await self._db().execute(self._sql.cleanup_stale_workers, older_than))

    # -- batches -----------------------------------------------------------------------------
    async def enqueue_batch_atomic(
        self,
        items: Iterable[EnqueueArgs],
        *,
        batch_id: UUID,
        queue: str,
        batch_row: BatchRow | None,
        finalizer_args: EnqueueArgs | None,
        chunk_size: int = 1000,
    ) -> list[JobRow]:
        """Children (tagged ``metadata.batch_id``), the batch row and the parked finalizer
        in one transaction, the children inserted ``chunk_size`` per statement; one
        wake at commit. Returns the children's rows."""
        if batch_row is not None and batch_row.id != batch_id:
            raise ValueError(f"batch_row.id {batch_row.id} differs from batch_id {batch_id}")
        tag = str(batch_id)
        children = [
            args.model_copy(update={"metadata": {**args.metadata, BATCH_TAG: tag}})
            for args in items
        ]
        finalizer = (
            finalizer_args.model_copy(
                update={"metadata": {**finalizer_args.metadata, FINALIZER_TAG: tag}}
            )
            if finalizer_args is not None
            else None
        )
        check_finalizer(finalizer_args, batch_row)
        everything = [*children, *([finalizer] if finalizer is not None else [])]
        refuse_keyless_singletons(everything)
        step = max(chunk_size, 1)
        try:
            return await self._store_batch_atomic(children, batch_id, batch_row, finalizer, step)
        except (ValueError, EnqueueError):  # "already exists", a singleton's collision
            # Rolled back; the same call again (its first reply lost) is answered.
            rows = await self._replayed_batch(children, batch_id, batch_row, finalizer, step)
            if rows is None:
                raise
            return rows

    async def _store_batch_atomic(
        self,
        children: list[EnqueueArgs],
        batch_id: UUID,
        batch_row: BatchRow | None,
        finalizer: EnqueueArgs | None,
        step: int,
    ) -> list[JobRow]:
        tag = str(batch_id)
        everything = [*children, *([finalizer] if finalizer is not None else [])]
        rows: list[JobRow] = []
        inserted = 0
        async with self._transaction() as tx:
            await check_singletons(tx, self._sql, self.schema, everything)
            for start in range(0, len(children), step):
                chunk_rows, new = await insert_jobs(
                    tx, self._sql, children[start : start + step], wake_channel=None
                )
                if batch_row is not None or finalizer is not None:
                    check_children(chunk_rows, tag)  # raised: the transaction rolls back
                rows += chunk_rows
                inserted += new
            finalizer_id = batch_row.finalizer_job_id if batch_row is not None else None
            if finalizer is not None:
                [final_row], new = await insert_jobs(
                    tx, self._sql, [finalizer], wake_channel=None, parked=[True]
                )
                finalizer_id, inserted = final_row.id, inserted + new
            if batch_row is not None:
                await self._insert_batch_row(tx, batch_row, finalizer_id)
                if all_ended(rows):  # no child's end is left to come and end it
                    await tx.fetchrow(self._sql.complete_batch, batch_id, self._wake_to)
            if inserted and not self.poll_only:
                await tx.execute(self._sql.notify, self._wake_channel)
        return rows

    async def _replayed_batch(
        self,
        children: list[EnqueueArgs],
        batch_id: UUID,
        batch_row: BatchRow | None,
        finalizer: EnqueueArgs | None,
        step: int,
    ) -> list[JobRow] | None:
        """The children a call that is the stored batch's own made again stored
        (``replayed``), read ``step`` children per statement; else None."""
        db, stored_row = self._db(), await self.get_batch(batch_id)
        by_id: dict[UUID, JobRow] = {}
        by_key: dict[tuple[str, str], JobRow] = {}
        for start in range(0, len(children), step):
            chunk = children[start : start + step]
            keyed = [args for args in chunk if args.idempotency_key is not None]
            records = await db.fetch(
                self._sql.batch_replay_jobs,
                [args.id for args in chunk],
                [args.actor for args in keyed],
                [args.idempotency_key for args in keyed],
            )
            for found in map(job_row, records):
                by_id[found.id] = found
                if found.idempotency_key is not None:
                    by_key[(found.actor, found.idempotency_key)] = found
        return replayed(children, str(batch_id), batch_row, finalizer, stored_row, by_id, by_key)

    async def _insert_batch_row(self, tx: Any, row: BatchRow, finalizer_id: UUID | None) -> None:
        try:
            await tx.execute(
                self._sql.insert_batch_row,
                row.id,
                row.queue,
                row.status,
                row.expected_size,
                row.consecutive_failures,
                row.failure_threshold,
                finalizer_id,
                row.originating_actor,
                row.created_at,
                row.completed_at,
                dump_json(row.metadata),
            )
        except asyncpg.UniqueViolationError:
            raise ValueError(f"a batch with id {row.id} already exists") from None

    async def create_batch(
        self,
        batch_id: UUID,
        queue: str,
        expected_size: int,
        failure_threshold: int | None,
        finalizer_job_id: UUID | None,
        originating_actor: str | None,
        *,
        connection: Connection = None,
    ) -> None:
        """Insert an ``active`` batch row; ``ValueError`` if the id exists."""
        # The model's bounds, as the other backends apply them (a ValidationError is a
        # ValueError), not the table's CHECK constraint failing.
        BatchRow(
            id=batch_id,
            queue=queue,
            expected_size=expected_size,
            failure_threshold=failure_threshold,
            originating_actor=originating_actor,
        )
        try:
            await self._db(connection).execute(
                self._sql.create_batch,
                batch_id,
                queue,
                expected_size,
                failure_threshold,
                finalizer_job_id,
                originating_actor,
            )
        except asyncpg.UniqueViolationError:
            raise ValueError(f"a batch with id {batch_id} already exists") from None

    async def increment_batch_failures(
        self, batch_id: UUID, *, connection: Connection = None
    ) -> tuple[int, int | None, int]:
        """``(consecutive_failures, failure_threshold, children_left)`` after the
        increment (1 when a child is left to run, else 0); ``KeyError`` for an unknown
        or finished batch."""
        return await self._add_batch_failures(batch_id, 1, connection)

    async def add_batch_failures(self, batch_id: UUID, count: int) -> tuple[int, int | None, int]:
        """``count`` increments in one statement, stopping at the threshold
        (``SupportsBatchFailureCount``); ``KeyError`` for an unknown or finished batch."""
        check_failure_count(count)
        return await self._add_batch_failures(batch_id, count, None)

    async def _add_batch_failures(
        self, batch_id: UUID, count: int, connection: Connection
    ) -> tuple[int, int | None, int]:
        record = await self._db(connection).fetchrow(self._sql.add_batch_failures, batch_id, count)
        if record is None:
            raise KeyError(f"no active batch with id {batch_id}")
        return (
            record["consecutive_failures"],
            record["failure_threshold"],
            int(record["non_terminal"]),
        )

    async def reset_batch_failures(self, batch_id: UUID, *, connection: Connection = None) -> int:
        """Reset an active batch's failure streak short of its threshold; 1 when it
        did, else 0."""
        status = await self._db(connection).execute(self._sql.reset_batch_failures, batch_id)
        return _changed(status)

    async def abort_batch(self, batch_id: UUID, *, connection: Connection = None) -> int:
        """Abort an active batch: cancel its waiting children, release its finalizer;
        returns the children cancelled (0 for a finished batch). The children go in
        turns, one statement each (about 35 µs a child; all in one, 200,000 outlasted the
        worker's command timeout, and the batch was never aborted), the first of which
        aborts the batch; what an interrupted abort leaves, the stale-batch sweep
        cancels."""
        db, turn = self._db(connection), self._sweep_turn
        record = await db.fetchrow(self._sql.abort_batch, batch_id, self._wake_to, turn)
        cancelled = moved = int(record["cancelled"]) if record is not None else 0
        while moved == turn:
            moved = int(await db.fetchval(self._sql.cancel_aborted_children, batch_id, turn))
            cancelled += moved
        return cancelled

    async def complete_batch(self, batch_id: UUID, *, connection: Connection = None) -> None:
        """Complete an active batch (aborted, when its last children's failures reached
        its threshold) and release its finalizer; a no-op otherwise, and for one whose
        failure streak reached its threshold (abort_batch ends that one)."""
        await self._db(connection).fetchrow(self._sql.complete_batch, batch_id, self._wake_to)

    async def get_batch(self, batch_id: UUID) -> BatchRow | None:
        """One batch row, or None."""
        record = await self._db().fetchrow(self._sql.get_batch, batch_id)
        return batch_row(record) if record is not None else None

    async def list_batches(self, filter: BatchFilter) -> list[tuple[BatchRow, BatchCounts]]:
        """Batches with their children's counts (finalizer excluded), newest first."""
        params = _Params(1)
        params.bind(filter.limit)
        conditions: list[str] = []
        if filter.queue is not None:
            conditions.append(f"b.queue = {params.bind(filter.queue)}")
        if filter.batch_id is not None:
            conditions.append(f"b.id = {params.bind(filter.batch_id)}")
        if filter.active is not None:
            conditions.append("b.status = 'active'" if filter.active else "b.status <> 'active'")
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        sql = self._sql.list_batches.replace(WHERE_TOKEN, where)
        records = await self._db().fetch(sql, *params.values)
        return [(batch_row(r), batch_counts(r)) for r in records]

    async def count_batch_non_terminal(
        self, batch_id: UUID, *, connection: Connection = None
    ) -> int:
        """Children of the batch (finalizer excluded) not yet terminal."""
        count = await self._db(connection).fetchval(self._sql.count_batch_non_terminal, batch_id)
        return int(count)

    async def batch_has_active_children(self, batch_id: UUID) -> bool:
        """Whether a child of the batch (finalizer excluded) is still to run, from the
        partial index of waiting and running children (``SupportsBatchChildCheck``)."""
        found: bool = await self._db().fetchval(self._sql.batch_has_active_children, batch_id)
        return found

    async def now(self) -> datetime:
        """The database's clock (``SupportsPrune``)."""
        now: datetime = await self._db().fetchval("SELECT clock_timestamp()")
        return now

    async def last_maintenance_run(self, loop: str) -> datetime | None:
        """The latest slot recorded for the leader loop ``loop``
        (``SupportsMaintenanceRuns``)."""
        check_names(loop)
        slot: datetime | None = await self._db().fetchval(
            self._leader_sql.maintenance_run_last, loop
        )
        return slot

    async def record_maintenance_run(self, loop: str, slot: datetime) -> bool:
        """Record ``slot`` as run for ``loop``, unless that slot or a later one is
        (``SupportsMaintenanceRuns``): one guarded upsert."""
        check_names(loop)
        status = await self._db().execute(self._leader_sql.maintenance_run_record, loop, slot)
        return _changed(status) == 1

    async def prune_old_batches(self, cutoff: datetime) -> int:
        """Delete batches completed before ``cutoff`` whose children are gone, in windows
        of at most :data:`_SWEEP_TURN` finished batches, each its own statement (one over
        a million batches outlasted the command timeout, rolled back, and no batch was
        ever pruned), until a window reads fewer."""
        deleted, (after_at, after_id) = 0, _FIRST_KEY
        while True:
            record = await self._db().fetchrow(
                self._sql.prune_old_batches, cutoff, after_at, after_id, self._sweep_turn
            )
            if record is None:
                return deleted
            deleted += int(record["changed"])
            if int(record["scanned"]) < self._sweep_turn:
                return deleted
            after_at, after_id = record["last_at"], record["last_id"]


# Fail at import, not at the first misbehaving call, if this module and core's
# protocol disagree about the contract (see the history in _protocol.py).
check_protocol_version(PostgresBackend)
