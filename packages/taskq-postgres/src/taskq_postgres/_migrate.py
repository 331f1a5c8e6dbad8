"""The migration runner: applies the forward-only SQL files in ``migrations/``.

File naming, the ``{schema}`` token and the ``-- taskq:no-transaction``
directive are described in ``migrations/README.md``. In short: pending
``pre`` files run before pending ``post`` files, each ordered by
(version, seq); each file runs in its own transaction together with its
ledger row in ``{schema}.schema_migrations``; concurrent migrators of one
schema are serialized by an advisory lock, so all of them succeed and each
file is applied once. Each file waits at most ``lock_timeout`` for a table lock and
is retried with growing pauses up to ``max_lock_wait``: a statement waiting for a
lock queues every later one on that table behind it (dispatch, enqueue, heartbeats).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any, Final, Literal, TypeAlias

import asyncpg
import structlog
from asyncpg.pool import PoolConnectionProxy

from taskq._dsn import redact
from taskq.errors import ConfigurationError, TaskQError
from taskq.identifiers import check_identifier, validate_schema_name
from taskq_postgres._connect import libpq_connect_timeout, unmigrated
from taskq_postgres._enqueue import Plan, Query, run
from taskq_postgres._privileges import InsufficientPrivilegeError, diagnosed, read_only_error

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_MAX_LOCK_WAIT",
    "MAX_LOCK_TIMEOUT",
    "NO_TRANSACTION_DIRECTIVE",
    "SCHEMA_PLACEHOLDER",
    "Connection",
    "Migration",
    "MigrationError",
    "MigrationPrivilegeError",
    "MigrationState",
    "MigrationStatus",
    "SchemaFit",
    "bundled_migrations",
    "load_migrations",
    "migrate",
    "migration_status",
    "plan_check_schema",
    "schema_fit",
]

_log = structlog.get_logger("taskq.migrate")

SCHEMA_PLACEHOLDER: Final = "{schema}"
"""The one token a migration may use; replaced by the validated schema name."""

NO_TRANSACTION_DIRECTIVE: Final = "-- taskq:no-transaction"
"""As a file's first line, runs that file outside a transaction."""

DEFAULT_LOCK_TIMEOUT: Final = timedelta(seconds=2)
"""How long one attempt at a migration file waits for a lock: as long as live queries
on the table may queue behind it."""

DEFAULT_MAX_LOCK_WAIT: Final = timedelta(minutes=1)
"""How long a file that cannot get its locks is retried before the migration fails."""

MAX_LOCK_TIMEOUT: Final = timedelta(milliseconds=2**31 - 1)
"""The longest ``lock_timeout`` Postgres takes (its setting is an int of milliseconds,
about 24.8 days): a longer one failed the first pending file, blamed on the file."""

_LIMIT_TEXT: Final = "2147483647ms (about 24.8 days)"

_MAX_PAUSE_FACTOR: Final = 5
"""Pauses between attempts double from ``lock_timeout`` up to this many times it."""

_NAME_RE: Final = re.compile(
    r"(?P<version>\d+\.\d+\.\d+)_(?P<seq>\d+)_(?P<phase>pre|post)_[a-z0-9_]+\.sql"
)

Connection: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
"""A plain asyncpg connection or one borrowed from a pool."""

MigrationState = Literal["applied", "pending", "drifted", "unknown"]


class MigrationError(TaskQError):
    """A migration could not be loaded or applied; the schema is unchanged past the last good file."""


class MigrationPrivilegeError(MigrationError, InsufficientPrivilegeError):
    """The role migrating lacks a right the migration needs (to create the schema, its
    tables, or to alter tables another role owns); the message names the role, the
    right and the fix. Both a :class:`MigrationError` and an
    :class:`~taskq_postgres.InsufficientPrivilegeError`."""


@dataclass(frozen=True)
class Migration:
    """One migration file: its name, its place in the order and its SQL with ``{schema}``."""

    name: str
    phase: Literal["pre", "post"]
    version: tuple[int, int, int]
    seq: int
    template: str

    @classmethod
    def from_file(cls, name: str, template: str) -> Migration:
        """Parse ``name``; raise :class:`MigrationError` if it breaks the naming rule."""
        match = _NAME_RE.fullmatch(name)
        if match is None:
            raise MigrationError(
                f"migration file {name!r} does not follow <version>_<seq>_<pre|post>_<name>.sql "
                f"(e.g. 01.00.00_01_pre_initial.sql)"
            )
        major, minor, patch = (int(part) for part in match.group("version").split("."))
        phase: Literal["pre", "post"] = "pre" if match.group("phase") == "pre" else "post"
        return cls(name, phase, (major, minor, patch), int(match.group("seq")), template)

    @property
    def transactional(self) -> bool:
        """False when the first line is :data:`NO_TRANSACTION_DIRECTIVE`."""
        first_line = self.template.split("\n", 1)[0]
        return first_line.strip() != NO_TRANSACTION_DIRECTIVE

    def render(self, schema: str) -> str:
        """The SQL to run for ``schema``."""
        return _render(self.template, schema)

    def checksum(self, schema: str) -> str:
        """SHA-256 (hex) of the rendered SQL, as recorded in ``schema_migrations``."""
        return hashlib.sha256(self.render(schema).encode()).hexdigest()


@dataclass(frozen=True)
class MigrationStatus:
    """Where one migration stands in a schema.

    ``state`` is ``applied``; ``pending``; ``drifted`` (applied, but the file
    has changed since); or ``unknown`` (recorded in the schema but absent
    from this installation, e.g. applied by a newer TaskQ).
    """

    name: str
    state: MigrationState
    applied_at: datetime | None


def _apply_order(migration: Migration) -> tuple[int, tuple[int, int, int], int, str]:
    return (0 if migration.phase == "pre" else 1, migration.version, migration.seq, migration.name)


def _render(template: str, schema: str) -> str:
    # A plain replace, not str.format: SQL is full of braces ('{}' defaults).
    return template.replace(SCHEMA_PLACEHOLDER, check_identifier(schema))


def bundled_migrations() -> Traversable:
    """The migrations directory shipped inside the ``taskq_postgres`` package."""
    return files("taskq_postgres") / "migrations"


def load_migrations(source: Traversable | None = None) -> list[Migration]:
    """Every ``.sql`` file in ``source`` (default: the bundled ones), in apply order.

    Raises :class:`MigrationError` for a ``.sql`` file whose name breaks the
    naming rule, so a typo cannot silently skip a migration.
    """
    directory = bundled_migrations() if source is None else source
    migrations = [
        Migration.from_file(entry.name, entry.read_text(encoding="utf-8"))
        for entry in directory.iterdir()
        if entry.name.endswith(".sql") and entry.is_file()
    ]
    return sorted(migrations, key=_apply_order)


_CREATE_SCHEMA_SQL: Final = "CREATE SCHEMA IF NOT EXISTS {schema}"

_CREATE_LEDGER_SQL: Final = """
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version text PRIMARY KEY,
    checksum text NOT NULL CHECK (checksum ~ '^[0-9a-f]{64}$'),
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

# $1 the schema, $2 its ledger. Not $1::regnamespace: that raises for a missing schema.
_MISSING_SQL: Final = """
SELECT NOT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1) AS schema,
       to_regclass($2) IS NULL AS ledger
"""

# $1 the ledger's name: its columns, NULL when there is no such table.
_LEDGER_COLUMNS_SQL: Final = """
SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped
"""

_LEDGER_COLUMNS: Final = frozenset({"version", "checksum", "applied_at"})

_SELECT_APPLIED_SQL: Final = "SELECT version, checksum, applied_at FROM {schema}.schema_migrations"

_RECORD_SQL: Final = "INSERT INTO {schema}.schema_migrations (version, checksum) VALUES ($1, $2)"


# $1 is the canonical (lower-case) schema name.
_LOCK_SQL: Final = "SELECT pg_advisory_lock(hashtext('taskq:migrate:' || $1))"
_UNLOCK_SQL: Final = "SELECT pg_advisory_unlock(hashtext('taskq:migrate:' || $1))"
_TRY_LOCK_SQL: Final = "SELECT pg_try_advisory_lock(hashtext('taskq:migrate:' || $1))"

_TIMEOUTS_SQL: Final = (
    "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
)
# $1 lock_timeout, $2 statement_timeout; $3 true: for the transaction, false: the session.
_SET_TIMEOUTS_SQL: Final = (
    "SELECT set_config('lock_timeout', $1, $3), set_config('statement_timeout', $2, $3)"
)

# $1 as above. The sessions holding the migration lock: a bigint advisory key sits in
# pg_locks as classid (high 32 bits), objid (low 32 bits), objsubid 1.
_LOCK_HOLDER_SQL: Final = r"""
WITH k AS (SELECT hashtext('taskq:migrate:' || $1)::bigint AS key)
SELECT a.pid, a.state, a.application_name, a.backend_start,
       left(regexp_replace(a.query, '\s+', ' ', 'g'), 80) AS query
FROM pg_locks l
CROSS JOIN k
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = ((k.key >> 32) & 4294967295)::oid
  AND l.objid = (k.key & 4294967295)::oid
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


_ASYNCPG_CONNECT_TIMEOUT: Final = 60.0
"""asyncpg's own default, for a DSN without a connect_timeout."""


@asynccontextmanager
async def _connected(target: str | Connection) -> AsyncIterator[Connection]:
    if not isinstance(target, str):
        yield target
        return
    dsn, timeout = libpq_connect_timeout(target, _ASYNCPG_CONNECT_TIMEOUT)
    conn = await asyncpg.connect(dsn, timeout=timeout)
    try:
        yield conn
    finally:
        await conn.close()


@asynccontextmanager
async def _migration_lock(conn: Connection, schema: str) -> AsyncIterator[None]:
    # Session-level, so it spans the per-file transactions. Waiting is the
    # point: a second migrator blocks here, then finds nothing pending.
    if not await conn.fetchval(_TRY_LOCK_SQL, schema):
        await _say_who_holds_the_lock(conn, schema)
        await _wait_for_lock(conn, schema)
    try:
        yield
    finally:
        if not conn.is_closed() and not await conn.fetchval(_UNLOCK_SQL, schema):
            # Taken on one server session, released on another: a pooler between.
            raise MigrationError(
                "the migration lock was not held by this session when released: the "
                "connection goes through a transaction-mode pooler, which may keep the "
                "lock on a server connection; migrate through the server's own address"
            )


async def _wait_for_lock(conn: Connection, schema: str) -> None:
    """Wait for the migration lock with no bound: a role's ``lock_timeout`` or
    ``statement_timeout`` (a common guard) ended the wait with the driver's "canceling
    statement", and the second of two deploys failed instead of finding nothing to do."""
    local = conn.is_in_transaction()  # a caller's transaction keeps its settings after
    previous = await conn.fetchrow(_TIMEOUTS_SQL)
    assert previous is not None  # one row, always
    await conn.execute(_SET_TIMEOUTS_SQL, "0", "0", local)
    try:
        await conn.execute(_LOCK_SQL, schema)
    except BaseException:
        # A caller's transaction is aborted now, and its rollback puts its settings back:
        # a statement sent to it failed ("current transaction is aborted"), in place of
        # what ended the wait (a cancellation of the migrator).
        if not local and not conn.is_closed():
            await conn.execute(_SET_TIMEOUTS_SQL, *previous, local)
        raise
    await conn.execute(_SET_TIMEOUTS_SQL, *previous, local)


async def _say_who_holds_the_lock(conn: Connection, schema: str) -> None:
    """Log whom a migrator waits for: the wait is unbounded, and it was silent (a
    leftover session of a killed migrator, or one an operator holds for maintenance,
    looked like a hung command)."""
    try:
        holders = await conn.fetch(_LOCK_HOLDER_SQL, schema)
    except asyncpg.PostgresError:  # only a hint: the wait goes on without it
        holders = []
    # Info, not a warning: concurrent migrators (workers started with --migrate
    # together) wait for each other by design.
    _log.info(
        "taskq.migration-waiting-for-lock",
        schema=schema,
        held_by=[
            f"pid {h['pid']} ({h['state']}, application {h['application_name']!r}, "
            f"connected {_when(h['backend_start'])}: {h['query']!r})"
            for h in holders
        ],
        hint="another migrator of this schema runs, and this one goes on once it is "
        "done; a session left holding the lock (a killed migrator's, whose statement "
        "still runs, or one held for maintenance) ends with SELECT pg_terminate_backend(pid)",
    )


async def _prepared(conn: Connection, schema: str) -> dict[str, tuple[str, datetime]]:
    """Create the schema and its ledger if missing; the migrations applied so far."""
    try:
        # A savepoint in a caller's transaction: a failure leaves it usable (and the
        # migration lock releasable) instead of aborted.
        async with conn.transaction():
            # Checked first: CREATE ... IF NOT EXISTS checks the right to create before
            # it looks, so the owner of a schema made for TaskQ (CREATE SCHEMA taskq
            # AUTHORIZATION app) was refused for want of CREATE on the database, and a
            # role that may only read a migrated schema could not find nothing to do.
            missing = await conn.fetchrow(_MISSING_SQL, schema, f"{schema}.schema_migrations")
            assert missing is not None  # one row, always
            if missing["schema"]:
                await conn.execute(_render(_CREATE_SCHEMA_SQL, schema))
            if missing["schema"] or missing["ledger"]:
                await conn.execute(_render(_CREATE_LEDGER_SQL, schema))
        return await _applied(conn, schema)
    except asyncpg.InsufficientPrivilegeError as exc:
        raise await _refused(conn, exc, schema, f"cannot prepare schema {schema!r}") from exc
    except asyncpg.ReadOnlySQLTransactionError as exc:
        # As for a file (_apply): the server's refusal, with what to do about it.
        raise read_only_error(exc, dsn=None) from exc
    except asyncpg.PostgresError as exc:
        raise MigrationError(f"cannot prepare schema {schema!r} for migrations: {exc}") from exc


async def _refused(
    conn: Connection, exc: asyncpg.InsufficientPrivilegeError, schema: str, doing: str
) -> MigrationPrivilegeError:
    """The error for a right refused while ``doing``: which role lacks which right."""
    refused = await diagnosed(conn, exc, schema=schema, migrating=True)
    return MigrationPrivilegeError(f"{doing} for migrations: {refused}")


async def _applied(conn: Connection, schema: str) -> dict[str, tuple[str, datetime]]:
    return await run(conn, _plan_applied(schema))


def _plan_applied(schema: str) -> Plan[dict[str, tuple[str, datetime]]]:
    """The ledger's rows (version: checksum, applied_at), as a plan (``_enqueue.run``,
    or the sync client's on psycopg)."""
    columns = yield Query(
        "fetchval", _LEDGER_COLUMNS_SQL, (f"{check_identifier(schema)}.schema_migrations",)
    )
    if columns is None:
        return {}
    if not _LEDGER_COLUMNS <= set(columns):
        # Another tool's (Rails, Ecto, golang-migrate, dbmate keep one by that name): its
        # rows are no TaskQ migrations, and reading them failed with the driver's
        # "column checksum does not exist".
        raise ConfigurationError(
            f"schema {schema!r} holds a schema_migrations that is not TaskQ's ledger (its "
            f"columns: {', '.join(columns)}), most likely another migration tool's: TaskQ "
            f"keeps its own ledger under that name, so give TaskQ a schema of its own "
            f"(--schema / TASKQ_SCHEMA, e.g. taskq)"
        )
    rows = yield Query("fetch", _render(_SELECT_APPLIED_SQL, schema), ())
    return {row["version"]: (row["checksum"], row["applied_at"]) for row in rows}


@dataclass(frozen=True)
class _LockBounds:
    """How long a file waits for its locks: per attempt, and in all."""

    lock_timeout: timedelta
    max_lock_wait: timedelta
    restore: str | None
    """The caller's ``lock_timeout`` to put back after each file run inside the caller's
    transaction (a ``SET LOCAL`` outlives the savepoint it is made in); else None."""

    @property
    def setting(self) -> str:
        # Whole milliseconds, rounded up: 0 would mean no limit.
        return f"{math.ceil(self.lock_timeout / timedelta(milliseconds=1))}ms"


def _check_lock_bounds(lock_timeout: timedelta, max_lock_wait: timedelta) -> None:
    """Both bounds checked before any SQL runs."""
    for name, value in (("lock_timeout", lock_timeout), ("max_lock_wait", max_lock_wait)):
        if not isinstance(value, timedelta):
            raise TypeError(f"{name} must be a timedelta, got {type(value).__name__}")
    if lock_timeout <= timedelta(0):
        # Postgres reads lock_timeout = 0 as "wait for ever": the queueing this prevents.
        raise ValueError(f"lock_timeout must be positive, got {lock_timeout}")
    if lock_timeout > MAX_LOCK_TIMEOUT:
        raise ValueError(
            f"lock_timeout must be at most {_LIMIT_TEXT} (Postgres's limit), got "
            f"{lock_timeout}; to keep waiting past it, raise max_lock_wait instead"
        )
    if max_lock_wait < timedelta(0):
        raise ValueError(f"max_lock_wait must not be negative, got {max_lock_wait}")


# $1 lock_timeout; $2 true: for the transaction (SET LOCAL), false: for the session (SET).
_SET_LOCK_TIMEOUT_SQL: Final = "SELECT set_config('lock_timeout', $1, $2)"

# $1 the schema. The sessions holding locks on its tables, oldest transaction first:
# the long one a migration waited for is among them (pg_locks only names the lock
# waited for while the wait lasts, and the wait has been given up).
_LOCK_HOLDERS_SQL: Final = r"""
SELECT a.pid, a.state, a.xact_start,
       array_agg(DISTINCT quote_ident(n.nspname) || '.' || quote_ident(c.relname)) AS tables,
       left(regexp_replace(a.query, '\s+', ' ', 'g'), 80) AS query
FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation AND c.relkind IN ('r', 'p')
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $1
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.granted AND l.locktype = 'relation' AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY a.pid, a.state, a.xact_start, a.query
ORDER BY a.xact_start NULLS LAST
LIMIT 3
"""

# $1 the schema. Its invalid indexes but those another session is building now (CREATE
# INDEX CONCURRENTLY marks its index valid only at the end).
_INVALID_INDEXES_SQL: Final = """
SELECT coalesce(array_agg(quote_ident(n.nspname) || '.' || quote_ident(c.relname)
                          ORDER BY c.relname), '{}')
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $1
WHERE NOT i.indisvalid
  AND NOT EXISTS (
      SELECT FROM pg_stat_progress_create_index p
      WHERE p.index_relid = i.indexrelid AND p.pid <> pg_backend_pid()
  )
"""

_FIND_LONG_TRANSACTIONS: Final = (
    "SELECT pid, state, xact_start, query FROM pg_stat_activity "
    "WHERE xact_start < now() - interval '1 minute' ORDER BY xact_start"
)


async def _apply_once(
    conn: Connection, schema: str, migration: Migration, bounds: _LockBounds
) -> None:
    sql = migration.render(schema)
    record = _render(_RECORD_SQL, schema)
    if migration.transactional:
        async with conn.transaction():
            await conn.execute(_SET_LOCK_TIMEOUT_SQL, bounds.setting, True)
            await conn.execute(sql)
            await conn.execute(record, migration.name, migration.checksum(schema))
            if bounds.restore is not None:
                await conn.execute(_SET_LOCK_TIMEOUT_SQL, bounds.restore, True)
        return
    # Outside a transaction (checked by the caller): for the session, put back after.
    previous = await conn.fetchval("SELECT current_setting('lock_timeout')")
    await conn.execute(_SET_LOCK_TIMEOUT_SQL, bounds.setting, False)
    try:
        # Simple-query protocol, one statement: nothing wraps it in a transaction.
        await conn.execute(sql)
    finally:
        if not conn.is_closed():
            await conn.execute(_SET_LOCK_TIMEOUT_SQL, previous, False)
    invalid = await conn.fetchval(_INVALID_INDEXES_SQL, schema)
    if invalid:
        raise MigrationError(
            f"migration {migration.name} left invalid indexes in schema {schema!r}: "
            f"{', '.join(invalid)} (a CREATE INDEX CONCURRENTLY that failed or timed out, in "
            f"this run or an earlier one, leaves its index behind, unused and not enforced, "
            f"and IF NOT EXISTS then skips it); it was not recorded as applied: drop them "
            f"(DROP INDEX CONCURRENTLY <name>), fix the cause (duplicate rows, a long "
            f"transaction), then run the migration again (taskq migrate)"
        )
    await conn.execute(record, migration.name, migration.checksum(schema))


async def _drop_left_invalid(
    conn: Connection, schema: str, before: set[str], bounds: _LockBounds
) -> None:
    """Drop the invalid indexes a cut attempt left (invalid now, not before the file ran),
    each within the lock timeout, as the file's statement waited."""
    left = sorted(set(await conn.fetchval(_INVALID_INDEXES_SQL, schema)) - before)
    if not left:
        return
    previous = await conn.fetchval("SELECT current_setting('lock_timeout')")
    await conn.execute(_SET_LOCK_TIMEOUT_SQL, bounds.setting, False)
    try:
        for name in left:  # quoted by _INVALID_INDEXES_SQL
            await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    finally:
        if not conn.is_closed():
            await conn.execute(_SET_LOCK_TIMEOUT_SQL, previous, False)


async def _apply(conn: Connection, schema: str, migration: Migration, bounds: _LockBounds) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    pause = bounds.lock_timeout.total_seconds()
    # A no-transaction file's CREATE INDEX CONCURRENTLY cut by the lock timeout leaves its
    # index invalid, which IF NOT EXISTS skips on the retry: those it left are dropped
    # first (not those of an earlier run, which the invalid-index check names).
    invalid_before = (
        None if migration.transactional else set(await conn.fetchval(_INVALID_INDEXES_SQL, schema))
    )
    attempts = 0
    while True:
        attempts += 1
        try:
            if attempts > 1 and invalid_before is not None:
                await _drop_left_invalid(conn, schema, invalid_before, bounds)
            await _apply_once(conn, schema, migration, bounds)
            break
        except asyncpg.LockNotAvailableError as exc:
            # Rolled back (a transaction's file), or its invalid index dropped on the retry.
            waited = loop.time() - started
            left = bounds.max_lock_wait.total_seconds() - waited
            if left <= 0:
                raise await _lock_wait_exceeded(conn, schema, migration, attempts, waited) from exc
            pause = min(pause, left)
            _log.warning(
                "taskq.migration-lock-retry",
                migration=migration.name,
                schema=schema,
                attempt=attempts,
                lock_timeout=bounds.setting,
                retry_in=round(pause, 3),
                gives_up_in=round(left, 1),
            )
            await asyncio.sleep(pause)
            pause = min(pause * 2, bounds.lock_timeout.total_seconds() * _MAX_PAUSE_FACTOR)
        except asyncpg.InsufficientPrivilegeError as exc:
            raise await _refused(conn, exc, schema, f"cannot apply {migration.name}") from exc
        except asyncpg.ReadOnlySQLTransactionError as exc:
            # The server's, not the file's: "see the comments at the top of" it misled.
            raise read_only_error(exc, dsn=None) from exc
        except asyncpg.PostgresError as exc:
            # What to do next, as the lock-wait error says it: the server's words alone
            # (a duplicate key, a missing object) left the state of the schema a guess.
            raise MigrationError(
                f"migration {migration.name} failed in schema {schema!r}: "
                f"{str(exc).rstrip().rstrip('.')}; it was not "
                f"applied, nor any file after it (the files before it stay applied): see the "
                f"comments at the top of {migration.name} (in taskq_postgres/migrations), "
                f"fix the cause, then run the migration again (taskq migrate)"
            ) from exc
    _log.info("taskq.migration-applied", migration=migration.name, schema=schema)


async def _lock_wait_exceeded(
    conn: Connection, schema: str, migration: Migration, attempts: int, waited: float
) -> MigrationError:
    """The error for a file that never got its locks: who holds locks on the schema's
    tables now, and how to end the wait."""
    try:
        holders = await conn.fetch(_LOCK_HOLDERS_SQL, schema)
    except asyncpg.PostgresError:  # only a hint: the advice stands without it
        holders = []
    if holders:
        named = "; ".join(
            f"pid {h['pid']} on {', '.join(sorted(h['tables']))} "
            f"({h['state']}, transaction open since {_when(h['xact_start'])}: {h['query']!r})"
            for h in holders
        )
        who = f"Sessions holding locks on the schema's tables, oldest transaction first: {named}"
    else:
        who = "No session holds a lock on the schema's tables any more"
    return MigrationError(
        f"migration {migration.name} could not lock the tables it changes in schema "
        f"{schema!r} in time ({attempts} attempt{'s' if attempts > 1 else ''} over "
        f"{waited:.1f} s); it was not applied, "
        f"nor any file after it. {who}. A long open transaction blocks it: end it "
        f"(SELECT pg_terminate_backend(<pid>)) or let it finish, then run the migration "
        f"again (taskq migrate); find long transactions with: {_FIND_LONG_TRANSACTIONS}"
    )


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else "(none)"


async def migrate(
    target: str | Connection,
    schema: str = "taskq",
    *,
    source: Traversable | None = None,
    post: bool = True,
    lock_timeout: timedelta = DEFAULT_LOCK_TIMEOUT,
    max_lock_wait: timedelta = DEFAULT_MAX_LOCK_WAIT,
) -> list[str]:
    """Apply every pending migration to ``schema``; return the names applied, in order.

    ``post=False`` (a worker migrating at start-up, in a rolling deploy) holds the
    pending ``post`` files back, logging ``taskq.migration-post-held-back``: they may remove
    what workers still on the old version use, so they wait for ``taskq migrate``,
    run once every worker is on the new version. A schema with nothing applied yet
    has no such workers and gets them all.

    ``target`` is a DSN (a connection is opened and closed here) or an open
    asyncpg connection, which must not be inside a transaction if a pending
    file is ``-- taskq:no-transaction``. ``source`` replaces the bundled
    migrations directory (for tests). ``schema`` is folded to lower case, as
    Postgres folds the unquoted name in SQL.

    Each file waits at most ``lock_timeout`` (default 2 s) for a lock on what it
    changes: a statement waiting for a table lock makes every later query on that
    table (dispatch, enqueue, heartbeats) wait behind it, for as long as the
    transaction it waits for stays open. A file that times out is rolled back and
    tried again after a pause (doubling from ``lock_timeout`` up to five times it),
    each retry logged as ``taskq.migration-lock-retry``, until ``max_lock_wait``
    (default 1 minute; the last attempt may end up to one ``lock_timeout`` later) has
    passed since its first attempt: then :class:`MigrationError` names the file and
    the sessions holding locks on the schema's tables. ``max_lock_wait=timedelta(0)``
    tries each file once. Waiting for another migrator (the advisory lock) is not
    bounded. The lock timeout is set for the file's transaction only (``SET LOCAL``);
    around a ``-- taskq:no-transaction`` file, for the session, and put back after.

    Running it again is a no-op. Applied files whose content has changed are
    reported with a ``taskq.migration-checksum-drift`` warning on the
    ``taskq.migrate`` logger and are not re-run. Raises ``ValueError`` for an
    invalid schema name or lock bound (a ``lock_timeout`` past
    :data:`MAX_LOCK_TIMEOUT`, Postgres's limit, too) before any SQL runs, and
    :class:`MigrationError` when a file fails (earlier files stay applied).
    """
    schema = validate_schema_name(schema)  # folded: one lock key for TaskQ and taskq
    _check_lock_bounds(lock_timeout, max_lock_wait)
    migrations = load_migrations(source)
    async with _connected(target) as conn, _migration_lock(conn, schema):
        applied = await _prepared(conn, schema)
        for migration in migrations:
            if migration.name not in applied:
                continue
            recorded, current = applied[migration.name][0], migration.checksum(schema)
            if recorded != current:
                _log.warning(
                    "taskq.migration-checksum-drift",
                    migration=migration.name,
                    schema=schema,
                    recorded_checksum=recorded,
                    current_checksum=current,
                )
        pending = [m for m in migrations if m.name not in applied]
        if not post and applied:
            held = [m.name for m in pending if m.phase == "post"]
            if held:
                _log.warning("taskq.migration-post-held-back", schema=schema, migrations=held)
                pending = [m for m in pending if m.phase == "pre"]
        if conn.is_in_transaction() and not all(m.transactional for m in pending):
            raise MigrationError(
                "a pending migration must run outside a transaction "
                "(-- taskq:no-transaction), but the connection given is inside one"
            )
        restore = None
        if pending and conn.is_in_transaction():
            restore = await conn.fetchval("SELECT current_setting('lock_timeout')")
        bounds = _LockBounds(lock_timeout, max_lock_wait, restore)
        for migration in pending:
            await _apply(conn, schema, migration, bounds)
        return [m.name for m in pending]


async def migration_status(
    target: str | Connection,
    schema: str = "taskq",
    *,
    source: Traversable | None = None,
) -> list[MigrationStatus]:
    """Every migration and its state in ``schema``, in apply order; read-only.

    Migrations recorded in the schema but unknown to this installation come
    last, by name.
    """
    schema = validate_schema_name(schema)  # folded: one lock key for TaskQ and taskq
    migrations = load_migrations(source)
    async with _connected(target) as conn:
        try:
            applied = await _applied(conn, schema)
        except asyncpg.InsufficientPrivilegeError as exc:
            raise await diagnosed(conn, exc, schema=schema) from exc
    statuses: list[MigrationStatus] = []
    for migration in migrations:
        if migration.name not in applied:
            statuses.append(MigrationStatus(migration.name, "pending", None))
            continue
        recorded, applied_at = applied[migration.name]
        state: MigrationState = "applied" if recorded == migration.checksum(schema) else "drifted"
        statuses.append(MigrationStatus(migration.name, state, applied_at))
    known = {m.name for m in migrations}
    statuses.extend(
        MigrationStatus(name, "unknown", applied[name][1])
        for name in sorted(applied.keys() - known)
    )
    return statuses


@dataclass(frozen=True)
class SchemaFit:
    """How a schema's migrations fit the code of this installation."""

    missing: list[str]
    """``pre`` migrations not applied yet: this code's statements need them."""
    newer_pre: list[str]
    """Applied migrations of a newer TaskQ that only add (``pre``): this code still fits."""
    newer_post: list[str]
    """Applied ``post`` migrations of a newer TaskQ: they may have removed what this
    code uses (a ``post`` file runs once every worker is on its version)."""


async def schema_fit(
    conn: Connection, schema: str, *, source: Traversable | None = None
) -> SchemaFit:
    """Compare the migrations applied to ``schema`` with this installation's; read-only.
    Pending ``post`` files are not missing: the code before them still runs."""
    return await run(conn, _plan_schema_fit(schema, source))


def _plan_schema_fit(schema: str, source: Traversable | None) -> Plan[SchemaFit]:
    schema = validate_schema_name(schema)
    migrations = load_migrations(source)
    applied = yield from _plan_applied(schema)
    known = {m.name for m in migrations}
    newer = sorted(applied.keys() - known)
    newer_post = [
        name for name in newer if (m := _NAME_RE.fullmatch(name)) and m["phase"] == "post"
    ]
    return SchemaFit(
        missing=[m.name for m in migrations if m.phase == "pre" and m.name not in applied],
        newer_pre=[name for name in newer if name not in newer_post],
        newer_post=newer_post,
    )


def plan_check_schema(is_migrated: str, schema: str, dsn: str | None) -> Plan[None]:
    """Refuse a schema this code cannot run on: one without TaskQ's tables, one lacking a
    ``pre`` migration (the statements failed later, with a driver's "column does not
    exist"), or one a newer TaskQ's ``post`` migration changed; warn of a newer
    ``pre`` one. ``is_migrated`` is the schema's ``SCHEMA_IS_MIGRATED``; ``dsn`` the
    database the migrations run on (None: a caller's connection). A plan, run by the
    backend at ``open()`` and by ``SyncJobsClient`` before its first enqueue."""
    if not (yield Query("fetchval", is_migrated, ())):
        raise unmigrated(schema, dsn)
    fit = yield from _plan_schema_fit(schema, None)
    if fit.missing:
        raise unmigrated(schema, dsn, fit.missing)
    if fit.newer_post:
        where = "" if dsn is None else f" in {redact(dsn)}"
        raise ConfigurationError(
            f"schema {schema!r}{where} was migrated by a newer TaskQ "
            f"({', '.join(fit.newer_post)}), which may have removed what this version "
            f"uses: upgrade taskq-postgres to run on it"
        )
    if fit.newer_pre:
        _log.warning("taskq.schema-newer-than-code", schema=schema, migrations=fit.newer_pre)
