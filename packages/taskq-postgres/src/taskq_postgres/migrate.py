"""The migration runner: applies the forward-only SQL files in ``migrations/``.

File naming, the ``{schema}`` token and the ``-- taskq:no-transaction``
directive are described in ``migrations/README.md``. In short: pending
``pre`` files run before pending ``post`` files, each ordered by
(version, seq); each file runs in its own transaction together with its
ledger row in ``{schema}.schema_migrations``; concurrent migrators of one
schema are serialized by an advisory lock, so all of them succeed and each
file is applied once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any, Final, Literal, TypeAlias

import asyncpg
import structlog
from asyncpg.pool import PoolConnectionProxy

from taskq.errors import TaskQError
from taskq.identifiers import check_identifier, validate_schema_name
from taskq_postgres._privileges import InsufficientPrivilegeError, diagnosed

__all__ = [
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
    "schema_fit",
]

_log = structlog.get_logger("taskq.migrate")

SCHEMA_PLACEHOLDER: Final = "{schema}"
"""The one token a migration may use; replaced by the validated schema name."""

NO_TRANSACTION_DIRECTIVE: Final = "-- taskq:no-transaction"
"""As a file's first line, runs that file outside a transaction."""

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

_SELECT_APPLIED_SQL: Final = "SELECT version, checksum, applied_at FROM {schema}.schema_migrations"

_RECORD_SQL: Final = "INSERT INTO {schema}.schema_migrations (version, checksum) VALUES ($1, $2)"


# $1 is the canonical (lower-case) schema name.
_LOCK_SQL: Final = "SELECT pg_advisory_lock(hashtext('taskq:migrate:' || $1))"
_UNLOCK_SQL: Final = "SELECT pg_advisory_unlock(hashtext('taskq:migrate:' || $1))"


@asynccontextmanager
async def _connected(target: str | Connection) -> AsyncIterator[Connection]:
    if not isinstance(target, str):
        yield target
        return
    conn = await asyncpg.connect(target)
    try:
        yield conn
    finally:
        await conn.close()


@asynccontextmanager
async def _migration_lock(conn: Connection, schema: str) -> AsyncIterator[None]:
    # Session-level, so it spans the per-file transactions. Waiting is the
    # point: a second migrator blocks here, then finds nothing pending.
    await conn.execute(_LOCK_SQL, schema)
    try:
        yield
    finally:
        if not conn.is_closed():
            await conn.execute(_UNLOCK_SQL, schema)


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
    except asyncpg.PostgresError as exc:
        raise MigrationError(f"cannot prepare schema {schema!r} for migrations: {exc}") from exc


async def _refused(
    conn: Connection, exc: asyncpg.InsufficientPrivilegeError, schema: str, doing: str
) -> MigrationPrivilegeError:
    """The error for a right refused while ``doing``: which role lacks which right."""
    refused = await diagnosed(conn, exc, schema=schema, migrating=True)
    return MigrationPrivilegeError(f"{doing} for migrations: {refused}")


async def _applied(conn: Connection, schema: str) -> dict[str, tuple[str, datetime]]:
    exists = await conn.fetchval(
        "SELECT to_regclass($1) IS NOT NULL", f"{check_identifier(schema)}.schema_migrations"
    )
    if not exists:
        return {}
    rows = await conn.fetch(_render(_SELECT_APPLIED_SQL, schema))
    return {row["version"]: (row["checksum"], row["applied_at"]) for row in rows}


async def _apply(conn: Connection, schema: str, migration: Migration) -> None:
    sql = migration.render(schema)
    record = _render(_RECORD_SQL, schema)
    try:
        if migration.transactional:
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(record, migration.name, migration.checksum(schema))
        else:
            # Simple-query protocol, one statement: nothing wraps it in a transaction.
            await conn.execute(sql)
            await conn.execute(record, migration.name, migration.checksum(schema))
    except asyncpg.InsufficientPrivilegeError as exc:
        raise await _refused(conn, exc, schema, f"cannot apply {migration.name}") from exc
    except asyncpg.PostgresError as exc:
        raise MigrationError(
            f"migration {migration.name} failed in schema {schema!r}: {exc}"
        ) from exc
    _log.info("taskq.migration-applied", migration=migration.name, schema=schema)


async def migrate(
    target: str | Connection,
    schema: str = "taskq",
    *,
    source: Traversable | None = None,
    post: bool = True,
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

    Running it again is a no-op. Applied files whose content has changed are
    reported with a ``taskq.migration-checksum-drift`` warning on the
    ``taskq.migrate`` logger and are not re-run. Raises ``ValueError`` for an
    invalid schema name before any SQL runs, and :class:`MigrationError`
    when a file fails (earlier files stay applied).
    """
    schema = validate_schema_name(schema)  # folded: one lock key for TaskQ and taskq
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
        for migration in pending:
            await _apply(conn, schema, migration)
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
    schema = validate_schema_name(schema)
    migrations = load_migrations(source)
    applied = await _applied(conn, schema)
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
