"""``SyncJobsClient``: TaskQ's enqueue calls for synchronous code (Django, Flask), on psycopg.

Given a DSN it keeps one connection of its own, in autocommit: each call commits
by itself. Given a ``psycopg.Connection`` it enqueues in that connection's
transaction: the jobs exist (and the workers are woken) only if the caller
commits. It runs the plans the asyncpg backend runs (``_enqueue``) and the payload
validation and ``max_pending`` check of ``JobsClient`` (``taskq.args_builder``).
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, Self, TypeVar, cast
from uuid import uuid4

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format, TransactionStatus
from psycopg.rows import DictRow, dict_row
from psycopg.types.datetime import TimestamptzBinaryLoader
from psycopg.types.string import TextBinaryLoader

from taskq._dsn import url_scheme
from taskq.actor import Actor, actors_by_name
from taskq.args_builder import (
    ActorRef,
    ArgsBuilder,
    BatchItem,
    MaxPendingLimits,
    check_capacity,
    one_per_key,
)
from taskq.errors import ConfigurationError, MaxPendingExceededError
from taskq.identifiers import check_identifier, validate_schema_name
from taskq.models import EnqueueArgs, JobRow
from taskq.settings import WorkerSettings
from taskq_postgres._connect import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_IDLE_IN_TRANSACTION,
    check_dsn,
    connection_settings,
    readable,
    same_address,
    translated_errors,
    unmigrated,
)
from taskq_postgres._enqueue import (
    ASYNC_PSYCOPG,
    CopyFeed,
    Plan,
    TransactionAbortedError,
    aborted,
    closed_connection,
    duplicate_id,
    plan_check_singletons,
    plan_insert_jobs,
    refuse_keyless_singletons,
)
from taskq_postgres._privileges import (
    DIAGNOSE_SQL,
    Denial,
    InsufficientPrivilegeError,
    ReadOnlyDatabaseError,
    read_only_error,
)
from taskq_postgres._rows import job_row
from taskq_postgres._service import service_settings
from taskq_postgres._sql.enqueue import COPY_COLUMNS
from taskq_postgres._sql.reads import SET_IDLE_LIMIT
from taskq_postgres._statements import statements_for
from taskq_postgres.channels import wake_channel

__all__ = ["SyncJobsClient", "TransactionAbortedError"]

_T = TypeVar("_T")

_Cursor = psycopg.RawCursor[DictRow]

_SYNC_ROLE: Final = "taskq-sync"
"""Its own connection's ``application_name`` prefix."""

_UNKNOWN_TYPE: Final = 0
"""The type oid psycopg looks a loader up under for a type it has none for."""

_ASK_TIMEOUT: Final = 2
"""Seconds a session opened only to ask which rights a role lacks may take to connect
(libpq's least)."""

_Where = tuple[str, int, str, str, str]
"""A schema's (host, port, database, schema), and the role that reaches it: the same
address may be another database for another role (a pooler that routes by user, as
Supavisor does), and a role's rights decide what it may read (``max_pending``'s limits
refused to one role were read for it by another's client). The role is the one that
logged in: a ``SET ROLE`` on a caller's connection is not seen, as the server tells
the client no current role, and asking it would cost a statement per enqueue. What is
kept holds either way: the schema's migrations and the limits are the same whoever
reads them, and the statements that need a right (counting, inserting) run as the
current role at each call."""

_FITTING: Final[set[_Where]] = set()
"""The schemas this process found fit to enqueue into (``plan_check_schema``): checked
once, not on every client a request makes."""

_LIMITS: Final[dict[tuple[_Where, float], MaxPendingLimits]] = {}
"""The ``max_pending`` limits this process's clients read, per schema (and role) and
cache period: shared, as an application's enqueues share JobsClient's, by the clients a
web app makes per request (each read them again, a savepoint and a query before its
enqueue). Threads may share one: a race reads the limits once more, or keeps the later read."""


def _connect_timeout(given: Mapping[str, object]) -> dict[str, Any]:
    """The ``connect_timeout`` for the client's own connection, as keyword arguments:
    none when the DSN gives one (``given``, its settings) or ``PGCONNECT_TIMEOUT`` does
    (psycopg reads both); the service's own when the service the connection names sets
    one, as libpq ranks it over the environment (psycopg, timing the attempt itself,
    reads no service file); else the backend's default, not psycopg's 130 s."""
    if given.get("connect_timeout") is not None:
        return {}
    from_service = service_settings(given).get("connect_timeout")
    if from_service is not None:
        return {"connect_timeout": from_service}
    if os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    return {"connect_timeout": math.ceil(DEFAULT_CONNECT_TIMEOUT.total_seconds())}


def _checked_url(dsn: str) -> str:
    """``dsn`` checked as ``PostgresBackend`` checks it, its scheme in lower case: libpq
    takes a URL only by ``postgresql://`` or ``postgres://`` as written, and read
    ``POSTGRESQL://...`` (which the backend takes) as a broken ``key=value`` string."""
    scheme, _, rest = check_dsn(dsn).partition(":")
    return f"{scheme.lower()}:{rest}"


def _sslmode(dsn: str) -> str | None:
    """The ``sslmode`` libpq connects with by ``dsn``: its own (a key=value DSN's too), else
    its service's, else ``PGSSLMODE``; None when ``dsn`` cannot be read (connecting says
    why)."""
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return None
    mode = given.get("sslmode") or service_settings(given).get("sslmode")
    return str(mode or os.environ.get("PGSSLMODE", ""))


_REFUSED_AT_ONCE: Final = "connection is bad: "
"""How psycopg says libpq refused a connection before it was under way: a server it
could not reach at once (a unix socket missing, libpq's words then naming it), or else
a connection option's value (a port that is no number, an unknown sslmode). Told by
words because nothing else tells them: no server was asked, so there is no SQLSTATE
(the error's sqlstate, diag and pgresult are None), and the PGconn psycopg attaches is
the same BAD connection either way (psycopg 3.3). psycopg's own libpq has no message
translations; a system libpq with them would make a missing socket a bad DSN."""


def _open(dsn: str, **settings: Any) -> psycopg.Connection[Any]:
    """``psycopg.connect``, an option's value libpq refuses raised as a bad DSN
    (``ProgrammingError``, which ``translated_errors`` makes a ``ConfigurationError``)."""
    try:
        return psycopg.connect(dsn, **settings)
    except psycopg.OperationalError as exc:
        said = str(exc)
        refused = said.removeprefix(_REFUSED_AT_ONCE)
        if refused == said or refused.startswith("connection to server"):
            raise
        # Not an outage to wait out; and libpq quotes the value, which in a key=value
        # DSN missing a space holds what follows it ("5432password=..."): a bad DSN's
        # message shows no quoted piece of it.
        raise psycopg.ProgrammingError(refused) from None


def _dropped(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server ended an idle connection (a restart, ``idle_session_timeout``,
    a proxy's idle cut): with nothing asked of it, its socket has something to read
    (the server's goodbye, then the end of the stream). Told before a statement is
    sent, the connection can be replaced with nothing lost."""
    return conn.info.transaction_status == TransactionStatus.IDLE and readable(conn.fileno())


class SyncJobsClient:
    """Enqueue from synchronous code: ``enqueue``, ``enqueue_batch`` and
    ``enqueue_batch_fast``, as :class:`~taskq.client.JobsClient` has them.

    ``target`` is a DSN (``postgresql://…``; the client opens one connection of its
    own, closed by :meth:`close` or ``with``) or a caller's ``psycopg.Connection``,
    whose transaction the jobs join (a savepoint where one is open; left open for
    the caller to commit; a singleton needs it READ COMMITTED). ``actors`` are the
    application's, which payloads are
    validated against (``TaskQ.actors``, or its values); ``schema`` the TaskQ schema.
    ``poll_only`` sends no NOTIFY (as ``PostgresBackend(poll_only=True)``: for workers
    that poll, or to keep NOTIFY's commit lock off a heavy insert load); the fleet's
    ``TASKQ_POLL_ONLY``, when set, decides instead, as for an application's backend.
    ``behind_pooler``: the DSN is a transaction-mode pooler's (PgBouncer), so the client's
    own connection sends no session settings and keeps no statement prepared; by
    default, whether the fleet's ``TASKQ_DIRECT_DSN`` is set (as a backend given a
    ``direct_dsn`` takes its DSN for a pooler's).
    On a caller's connection ``max_pending`` counts what its transaction sees, its own
    jobs not committed yet among them (``JobsClient``, counting on its pool, sees the
    committed ones only): one transaction enqueueing past the limit is refused here.
    A schema this code cannot run on (unmigrated, lacking a migration this version
    needs, changed by a newer TaskQ) is refused at the first enqueue as
    ``PostgresBackend.open()`` refuses it (a ``ConfigurationError``); checked once per
    process and database.
    One client may be shared by threads: its calls take turns. One made before the
    process forks (gunicorn's ``--preload``) opens a connection of its own in each child.
    """

    def __init__(
        self,
        target: str | psycopg.Connection[Any],
        *,
        actors: Iterable[Actor[..., Any]] | Mapping[str, Actor[..., Any]],
        schema: str = "taskq",
        max_pending_cache_ttl: float = 5.0,
        poll_only: bool = False,
        behind_pooler: bool | None = None,
    ) -> None:
        if not isinstance(target, str | psycopg.Connection):
            if target is None:
                hint = (
                    "no connection yet: Django's connection.connection is None until it "
                    "connects, call connection.ensure_connection() first"
                )
            elif isinstance(target, psycopg.AsyncConnection):
                hint = f"{ASYNC_PSYCOPG}: from async code, use TaskQ's JobsClient"
            else:
                hint = "for asyncpg or async code, use TaskQ's JobsClient"
            raise TypeError(
                f"SyncJobsClient takes a DSN string or a psycopg.Connection, not "
                f"{type(target).__qualname__} ({hint})"
            )
        self.schema = validate_schema_name(schema)
        # A mapping (TaskQ.actors, what JobsClient takes) by its actors, not its names.
        listed = actors.values() if isinstance(actors, Mapping) else actors
        self._build = ArgsBuilder(actors_by_name(listed))
        self._sql = statements_for(self.schema)
        fleet = WorkerSettings.backend_options_from_env()
        quiet = fleet.get("poll_only", poll_only)
        self._channel = None if quiet else wake_channel(self.schema)
        self._limits_ttl = max_pending_cache_ttl
        self._lock = threading.Lock()
        if isinstance(target, str):
            # Without the whitespace around it, as the backend reads a URL: a secret's
            # trailing newline went into the database name ('database "app " does not
            # exist'), and a leading space made the URL a broken key=value string.
            target = target.strip()
        # A URL is checked as PostgresBackend checks it; libpq's key=value form as libpq does.
        url = isinstance(target, str) and url_scheme(target) is not None
        self._dsn = (_checked_url(target) if url else target) if isinstance(target, str) else None
        if self._dsn == "":
            # libpq reads an empty string as every default: an unset DATABASE_URL
            # enqueued into whatever database PGHOST or the local socket led to.
            raise ConfigurationError(
                "SyncJobsClient was given an empty DSN: give one (postgresql://USER@HOST/DB), "
                "or 'postgresql://' to mean libpq's defaults (PGHOST, PGDATABASE, ...)"
            )
        if behind_pooler is None:  # as a backend given the fleet's direct_dsn judges
            direct = fleet.get("direct_dsn")
            behind_pooler = direct is not None and not (
                url and same_address(check_dsn(direct), cast(str, target))
            )
        self._behind_pooler = behind_pooler
        # Its own connection's session settings, as the backend's pooled connections'.
        self._settings = connection_settings(
            _SYNC_ROLE, uuid4().hex[:12], DEFAULT_IDLE_IN_TRANSACTION
        )
        self._conn = target if isinstance(target, psycopg.Connection) else self._connect()
        self._closed = False
        self._inherited = False
        _CLIENTS.add(self)

    # -- enqueue ---------------------------------------------------------------
    def enqueue(self, actor: ActorRef, payload: Any, **options: Any) -> JobRow:
        """Enqueue one job; options as ``JobsClient.enqueue``. Returns the stored row (the
        existing one for a repeated ``idempotency_key``)."""
        args = self._build.args(actor, payload, options)
        return self._once_more_if_read_only(lambda: self._enqueue(args))

    def _enqueue(self, args: EnqueueArgs) -> JobRow:
        with self._turn() as cur:
            try:
                self._check_capacity(cur, {args.actor: 1})
            except MaxPendingExceededError:
                # A producer retrying under backpressure gets its job back: nothing is
                # inserted.
                existing = self._existing(cur, args)
                if existing is None:
                    raise
                return existing
            [row] = self._insert(cur, [args])
        return row

    def _existing(self, cur: _Cursor, args: EnqueueArgs) -> JobRow | None:
        """The stored job of ``args``'s idempotency key, if it has one and it exists."""
        if args.idempotency_key is None:
            return None
        cur.execute(self._sql.existing_by_key, ([args.actor], [args.idempotency_key]))
        record = cur.fetchone()
        return None if record is None else job_row(_in_utc(record))

    def enqueue_batch(self, items: Iterable[BatchItem]) -> list[JobRow]:
        """Enqueue many jobs atomically (all or none); one row per item, in order.
        Every payload is validated before anything is written."""
        listed = list(items)
        counts = self._build.counts(listed)
        if not listed:
            # Nothing to write, as JobsClient and enqueue_batch_fast answer it: a
            # caller's aborted transaction (or a statement opening it) is no concern.
            return []
        return self._once_more_if_read_only(lambda: self._enqueue_batch(listed, counts))

    def _enqueue_batch(self, listed: list[BatchItem], counts: dict[str, int]) -> list[JobRow]:
        with self._turn() as cur:
            try:
                self._check_capacity(cur, counts)
            except MaxPendingExceededError as refused:
                # Past max_pending, the items whose keys are stored insert nothing (a
                # producer retrying its batch under backpressure): only the others count,
                # an item repeating a key of the call once.
                args_list = list(self._build.each(listed))
                new = Counter(
                    a.actor for a in one_per_key(args_list) if self._existing(cur, a) is None
                )
                try:
                    self._check_capacity(cur, new)
                except MaxPendingExceededError:
                    raise refused from None
            else:
                args_list = list(self._build.each(listed))
            return self._insert(cur, args_list)

    def enqueue_batch_fast(self, items: Iterable[BatchItem]) -> int:
        """Bulk enqueue by COPY, without idempotency handling or returned rows; returns
        how many. Payloads are validated as the rows are written; an invalid one fails
        the call and nothing is written."""
        listed = list(items)
        counts = self._build.counts(listed)
        if not listed:
            return 0
        return self._once_more_if_read_only(lambda: self._enqueue_batch_fast(listed, counts))

    def _enqueue_batch_fast(self, listed: list[BatchItem], counts: dict[str, int]) -> int:
        with self._turn() as cur, self._atomic(cur):
            self._check_capacity(cur, counts)
            cur.execute(self._sql.copy_clock_now, (self._channel,))
            clock = cur.fetchone()
            assert clock is not None
            feed = CopyFeed(self._build.each(listed), clock["now"])
            table = f"{check_identifier(self.schema)}.jobs ({', '.join(COPY_COLUMNS)})"
            try:
                with cur.copy(f"COPY {table} FROM STDIN") as copy:
                    for row in feed:
                        copy.write_row(row)
            except psycopg.errors.UniqueViolation as exc:
                _raise_duplicate(exc)
                raise
            if feed.error is not None:
                raise feed.error
            if any(a.singleton for a in feed.identified):
                checking = plan_check_singletons(
                    self._sql, self.schema, feed.identified, copied=True
                )
                _run(cur, checking)
            return feed.count

    def _insert(self, cur: _Cursor, args_list: list[EnqueueArgs]) -> list[JobRow]:
        """Insert as ``PostgresBackend.enqueue_batch`` does, notifying the workers."""
        refuse_keyless_singletons(args_list)
        inserting = plan_insert_jobs(self._sql, args_list, self._channel)
        if not any(a.singleton for a in args_list):
            rows, _ = _run(cur, inserting)
            return rows
        # The singleton check holds its identities' locks until the insert commits.
        with self._atomic(cur):
            _run(cur, plan_check_singletons(self._sql, self.schema, args_list))
            rows, _ = _run(cur, inserting)
        return rows

    def _check_capacity(self, cur: _Cursor, counts: Mapping[str, int]) -> None:
        bounded = self._build.bounded(counts, self._max_pending(cur))
        if not bounded:
            return
        asked = sorted(bounded)
        # Counted up to each limit: check_capacity needs no more to refuse.
        cur.execute(self._sql.count_pending_jobs, (asked, [bounded[name] for name in asked]))
        waiting = {r["actor"]: int(r["waiting"]) for r in cur.fetchall()}
        check_capacity(counts, bounded, waiting)

    def _max_pending(self, cur: _Cursor) -> Mapping[str, int | None]:
        """The fleet-wide ``max_pending`` limits (``MaxPendingLimits``: a failed read fails open)."""
        key = (self._where(), self._limits_ttl)
        known = _LIMITS.get(key) or _LIMITS.setdefault(key, MaxPendingLimits(self._limits_ttl))
        limits = known.cached()
        if limits is not None:
            return limits
        try:
            # In a savepoint on a caller's transaction: a failed read leaves it usable.
            with self._atomic(cur):
                cur.execute(self._sql.get_actor_max_pending)
                read: Mapping[str, int | None] | Exception = {
                    r["actor"]: r["max_pending"] for r in cur.fetchall()
                }
        except (
            psycopg.errors.UndefinedTable,
            psycopg.errors.InvalidSchemaName,
            psycopg.errors.InsufficientPrivilege,
        ):
            # No hiccup: an unmigrated schema or a missing right, which the cursor says
            # how to fix (failed open, the limits went unchecked for good).
            raise
        except psycopg.Error as exc:
            if self._conn.closed or self._conn.broken:
                raise  # no enqueue can follow on it: the loss, not a limits read, is news
            read = exc
        return known.update(read)

    @contextmanager
    def _atomic(self, cur: _Cursor) -> Iterator[None]:
        """All or nothing: a savepoint in the caller's transaction (left open for the caller
        to commit), or on an autocommit connection a transaction of its own."""
        conn = self._conn
        if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
            # No transaction yet: on an idle connection psycopg's transaction() would BEGIN
            # and COMMIT one of its own. A first statement opens the caller's, as any does.
            cur.execute("SELECT 1")
        with conn.transaction():
            if self._behind_pooler and self._dsn is not None:
                # A transaction of its own: the idle limit no pooler passes, as the
                # backend's own transactions set it there.
                limit = self._settings["idle_in_transaction_session_timeout"]
                cur.execute(SET_IDLE_LIMIT, (limit,))
            yield

    def _connect(self) -> psycopg.Connection[Any]:
        assert self._dsn is not None
        with translated_errors(
            self._dsn,
            invalid=(psycopg.ProgrammingError,),
            unavailable=(psycopg.OperationalError,),
            behind_pooler="pass SyncJobsClient(..., behind_pooler=True), or set "
            "TASKQ_DIRECT_DSN for the fleet",
            sslmode=_sslmode(self._dsn),
        ):
            settings = dict(self._settings)
            name = settings.pop("application_name")
            given = conninfo_to_dict(self._dsn)
            timeout = _connect_timeout(given)
            if self._behind_pooler:
                # A pooler passes no options and runs each statement on any server
                # session. The enqueue statements need no TimeZone: they add seconds;
                # its transactions set their idle limit (_atomic).
                conn = _open(
                    self._dsn,
                    autocommit=True,
                    application_name=name,
                    prepare_threshold=None,
                    **timeout,
                )
            else:
                # Durations added on TaskQ's own connections are exact (see
                # PostgresBackend). Added to the DSN's own options (else its service's,
                # else PGOPTIONS', as libpq ranks them): libpq takes one string, and a
                # keyword argument would replace them (a statement_timeout, a role's
                # search_path).
                options = str(
                    given.get("options")
                    or service_settings(given).get("options")
                    or os.environ.get("PGOPTIONS", "")
                )
                ours = " ".join(f"-c {k}={v}" for k, v in settings.items())
                conn = _open(
                    self._dsn,
                    autocommit=True,
                    application_name=name,
                    options=f"{options} {ours}".strip(),
                    **timeout,
                )
        # Its own transactions: stated, not the server's default (the singleton check
        # needs a fresh snapshot per statement).
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        return conn

    def _once_more_if_read_only(self, call: Callable[[], _T]) -> _T:
        """``call``, made once more when a session of the client's own refused its write
        as read-only: ``_turn`` closed that session, which may have begun read-only
        before the setting's reset, and the refusal ran nothing (an autocommit
        statement, or a transaction rolled back). A database still read-only refuses the
        second call too. On a caller's connection the refusal is the caller's."""
        try:
            return call()
        except ReadOnlyDatabaseError:
            if self._dsn is None:
                raise
            return call()

    @contextmanager
    def _turn(self) -> Iterator[_Cursor]:
        """This thread's turn on the connection, with a cursor taking ``$n`` parameters.

        A connection of its own that was lost (the server restarted, a proxy dropped
        it) is replaced: before the call when the loss shows while it idles, else after
        the call that saw it fail raised, since whether its statement committed cannot
        be known.
        """
        with self._lock:
            # Checked holding the lock: a call that waited on a close must not reopen.
            if self._closed:
                raise RuntimeError("this SyncJobsClient is closed; make a new one")
            if self._dsn is None:
                if self._conn.closed:
                    raise closed_connection()
                if self._conn.info.transaction_status == TransactionStatus.INERROR:
                    # Told before any statement: the limits read failed (a warning about
                    # a limits read), its savepoint's rollback failed (psycopg's noise),
                    # and a raw InFailedSqlTransaction said nothing of what to do.
                    raise aborted("conn.rollback()")
            elif self._inherited or self._conn.closed or _dropped(self._conn):
                self._conn.close()
                self._inherited = False
                self._conn = self._connect()
            with psycopg.RawCursor(self._conn, row_factory=dict_row) as cur:
                # Results in binary: psycopg reads text times and durations only in the
                # default DateStyle and IntervalStyle, and the session's may be any (the
                # statement had run by then: a retry would enqueue twice). psycopg's own
                # loader on this cursor alone: a caller's connection may load times its
                # own way (Django without USE_TZ: naive, in its zone).
                cur.format = Format.BINARY
                cur.adapters.register_loader("timestamptz", TimestamptzBinaryLoader)
                # Types psycopg does not know (TaskQ's enums: a job's status) as their
                # label, as text results give them, not as bytes.
                cur.adapters.register_loader(_UNKNOWN_TYPE, TextBinaryLoader)
                try:
                    self._check_schema(cur)
                    yield cur
                except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as exc:
                    raise unmigrated(self.schema, self._dsn) from exc
                except psycopg.errors.InsufficientPrivilege as exc:
                    raise self._refused(exc) from exc
                except psycopg.errors.ReadOnlySqlTransaction as exc:
                    # As PostgresBackend says it: a standby, or default_transaction_read_only.
                    if self._dsn is not None:
                        # Replaced at the next call, as the backend's pool replaces one: a
                        # session keeps the read-only default it began with, and every
                        # enqueue failed after the setting's reset (a provider's, once its
                        # disk has space) until the process restarted.
                        self._conn.close()
                    raise read_only_error(exc, dsn=self._dsn) from exc

    def _where(self) -> _Where:
        info = self._conn.info
        return (info.host, info.port, info.dbname, self.schema, info.user)

    def _check_schema(self, cur: _Cursor) -> None:
        """Refuse a schema this code cannot run on, as ``PostgresBackend.open()`` does (one
        lacking a migration this version needs, one a newer TaskQ changed); in a
        savepoint on a caller's transaction, which a refusal leaves usable."""
        where = self._where()
        if where in _FITTING:
            return
        from taskq_postgres._migrate import plan_check_schema

        with self._atomic(cur):
            _run(cur, plan_check_schema(self._sql.schema_is_migrated, self.schema, self._dsn))
        _FITTING.add(where)

    def _refused(self, exc: psycopg.errors.InsufficientPrivilege) -> InsufficientPrivilegeError:
        """``exc`` as :class:`~taskq_postgres.InsufficientPrivilegeError`, the missing rights
        asked of the server (as ``_privileges.diagnosed`` does on asyncpg)."""
        denial = Denial(exc.diag.message_primary or str(exc), self.schema, migrating=False)
        role, missing = self._conn.info.user, None
        question = denial.question()
        if question is not None:
            with (
                suppress(psycopg.Error),
                self._asking() as conn,
                psycopg.RawCursor(conn) as cur,
            ):
                cur.execute(DIAGNOSE_SQL, question)
                row = cur.fetchone()
                if row is not None:
                    role, missing = row[0], list(row[1])
        return denial.error(role, missing)

    @contextmanager
    def _asking(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection to ask the server a question on: the client's, in a savepoint (a
        failed question must not abort a caller's transaction); where the refusal
        aborted a caller's transaction, a short session of its own, with the caller's
        connection parameters (as the backend asks on its pool, not on the caller's)."""
        conn = self._conn
        if conn.info.transaction_status != TransactionStatus.INERROR:
            with conn.transaction():
                yield conn
            return
        params: dict[str, Any] = {
            **conn.info.get_parameters(),
            "password": conn.info.password,
            "connect_timeout": _ASK_TIMEOUT,
        }
        with psycopg.connect(**params, autocommit=True) as own:
            yield own

    # -- lifetime -------------------------------------------------------------------
    def _forked(self) -> None:
        """In a process just forked (``os.fork``: gunicorn's ``--preload``, a prefork
        pool): the connection of its own is the parent's session, which two processes
        using it at once garbled (one's answer read by the other, an enqueue that had
        committed failing); it is cut off from that session (its goodbye, when closed,
        goes nowhere) and replaced at the next call. The lock a parent's thread held
        at the fork would be held for good."""
        self._lock = threading.Lock()
        if self._dsn is None or self._conn.closed:
            return  # a caller's connection is the caller's to keep to one process
        self._inherited = True
        # Raised in a fork hook, an error is only printed: the connection is replaced
        # all the same (its goodbye then ending the parent's session, which it replaces).
        with suppress(OSError, psycopg.Error):
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, self._conn.fileno())
            finally:
                os.close(null)

    def close(self) -> None:
        """Close the connection the client opened (a caller's stays open)."""
        with self._lock:
            self._closed = True
            if self._dsn is not None:
                self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_CLIENTS: Final[weakref.WeakSet[SyncJobsClient]] = weakref.WeakSet()
"""This process's clients, each told when the process forks."""


def _after_fork() -> None:
    for client in list(_CLIENTS):
        client._forked()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_after_fork)


def _run(cur: _Cursor, plan: Plan[_T]) -> _T:
    """Run ``plan``'s statements on ``cur``, one after the other (``_enqueue.run`` on psycopg)."""
    try:
        query = next(plan)
        while True:
            try:
                cur.execute(query.sql, query.args)
            except psycopg.errors.UniqueViolation as exc:
                _raise_duplicate(exc)
                raise
            query = plan.send(_answer(cur, query.kind))
    except StopIteration as done:
        result: _T = done.value
        return result


def _raise_duplicate(exc: psycopg.errors.UniqueViolation) -> None:
    """Raise :func:`duplicate_id`'s error for ``exc`` when it has one (else return, for
    the caller to re-raise ``exc``), as ``_enqueue`` does for asyncpg."""
    error = duplicate_id(exc.diag.constraint_name, exc.diag.message_detail)
    if error is not None:
        raise error from exc


def _answer(cur: _Cursor, kind: str) -> Any:
    """What asyncpg's ``fetch``, ``fetchrow`` or ``fetchval`` would have returned, times in
    UTC (psycopg gives them in the session's zone)."""
    if kind == "fetch":
        return [_in_utc(row) for row in cur.fetchall()]
    row = cur.fetchone()
    if row is None:
        return None
    return _in_utc(row) if kind == "fetchrow" else next(iter(row.values()))


def _in_utc(row: DictRow) -> dict[str, Any]:
    return {k: v.astimezone(UTC) if isinstance(v, datetime) else v for k, v in row.items()}
