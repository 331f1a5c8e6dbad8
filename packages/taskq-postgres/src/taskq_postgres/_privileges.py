"""A refused privilege (SQLSTATE 42501) as one line: the role, the right it lacks, on
what, and the statement (or the role to run as) that fixes it.

PostgreSQL says only ``permission denied for table jobs``: not which role asked, nor
which right it lacks. The server is asked (``has_*_privilege``, on the connection
that was refused, so as that role); when it cannot say, the message names the
right TaskQ needs there. Nothing here retries: rights do not heal by themselves.
"""

from __future__ import annotations

import re
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from taskq._dsn import redact
from taskq.errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "DIAGNOSE_SQL",
    "Denial",
    "InsufficientPrivilegeError",
    "ReadOnlyDatabaseError",
    "diagnosed",
    "dsn_user",
    "privilege_error",
    "read_only_error",
]


class InsufficientPrivilegeError(ConfigurationError):
    """The database role TaskQ connects as lacks a privilege on TaskQ's database, schema
    or tables (PostgreSQL's ``insufficient_privilege``, SQLSTATE 42501).

    The message names the role, the right and the object, and the ``GRANT`` (or the
    role to run as) that fixes it. Retrying will not help: grant the right, or
    connect as a role that has it (``taskq migrate`` as the schema's owner).
    """


class ReadOnlyDatabaseError(ConfigurationError):
    """The server refused a write as read-only (SQLSTATE 25006): a standby (a read
    replica, or a primary a failover demoted) or ``default_transaction_read_only`` set
    for the role or database (as a managed database's provider does while its disk is
    full). Transient: a worker's loops retry it, on a new connection (a session keeps
    the setting it began with), until the server takes writes again; a command says it
    in one line."""


def read_only_error(exc: BaseException, *, dsn: str | None) -> ReadOnlyDatabaseError:
    """The error for ``exc`` (a driver's 25006), naming the server it came from."""
    where = f" at {redact(dsn)}" if dsn else ""
    return ReadOnlyDatabaseError(
        f"the database{where} refused a write: {exc}. It is a standby (a read replica, "
        f"or a primary a failover demoted), or default_transaction_read_only is set for "
        f"the role or database (as a provider does while its disk is full): point the "
        f"DSN (--dsn, TASKQ_DSN) at the primary, or have the setting reset"
    )


_DENIED_RE: Final = re.compile(
    r"permission denied for (?P<kind>schema|table|sequence|database|view|relation) "
    r"(?P<name>\S+)"
)
_NOT_OWNER_RE: Final = re.compile(r"must be owner of (?P<kind>[a-z ]+?) (?P<name>\S+)$")

# The rights TaskQ uses on each kind of object, asked in this order.
_RIGHTS: Final = {
    "schema": ("USAGE",),
    "database": ("CONNECT",),
    "table": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "sequence": ("USAGE", "SELECT", "UPDATE"),
}
# A migrator creates the schema (or in it), and reads and writes the ledger; tables it
# alters it must own, which the server says otherwise ("must be owner of").
_MIGRATING_RIGHTS: Final = {
    "schema": ("USAGE", "CREATE"),
    "database": ("CREATE",),
    "table": ("SELECT", "INSERT"),
}

DIAGNOSE_SQL: Final = """
-- arbiter: none
SELECT current_user::text AS role, ARRAY(
    SELECT p FROM unnest($3::text[]) AS p
    WHERE NOT CASE $1::text
        WHEN 'schema' THEN has_schema_privilege($2, p)
        WHEN 'database' THEN has_database_privilege($2, p)
        WHEN 'sequence' THEN has_sequence_privilege($2, p)
        ELSE has_table_privilege($2, p)
    END
) AS missing
"""
"""The role the connection acts as, and which of the rights ``$3`` it lacks on the
object ``$2`` of kind ``$1``; ``$1``-``$3`` from :meth:`Denial.question` (``$n``
parameters: asyncpg and psycopg's raw cursor alike)."""


def _and(words: Sequence[str]) -> str:
    return " and ".join(filter(None, [", ".join(words[:-1]), words[-1]]))


def _ident(name: str) -> str:
    """``name`` as SQL writes it: bare when Postgres would keep it as it is."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Denial:
    """What a 42501 message says was refused, read from the server's (English) text."""

    message: str
    schema: str
    migrating: bool

    @property
    def _parts(self) -> tuple[str, str, bool] | None:
        """(kind, name, whether ownership is what lacks), or None for a text not read."""
        if (match := _DENIED_RE.search(self.message)) is not None:
            kind = "table" if match["kind"] in ("view", "relation") else match["kind"]
            return kind, match["name"], False
        if (match := _NOT_OWNER_RE.search(self.message)) is not None:
            return match["kind"], match["name"], True
        return None

    def _target(self, kind: str, name: str) -> str:
        # The server names a table unqualified: TaskQ's statements touch its schema's.
        return name if kind in ("schema", "database") else f"{_ident(self.schema)}.{name}"

    def _needed(self, kind: str, name: str) -> tuple[str, ...]:
        if name == "schema_migrations" and not self.migrating:
            return ("SELECT",)  # only migrators write the ledger; a backend reads it
        return (_MIGRATING_RIGHTS if self.migrating else _RIGHTS).get(kind, _RIGHTS[kind])

    def question(self) -> tuple[str, str, list[str]] | None:
        """:data:`DIAGNOSE_SQL`'s arguments, or None when there is nothing to ask."""
        parts = self._parts
        if parts is None or parts[2]:
            return None
        kind, name, _ = parts
        return kind, self._target(kind, name), list(self._needed(kind, name))

    def error(
        self,
        role: str | None,
        missing: Sequence[str] | None,
    ) -> InsufficientPrivilegeError:
        """The one-line error, ``missing`` the rights the server said lack (None or
        empty: it could not say)."""
        who = f"role {role!r}" if role else "the role TaskQ connects as"
        said = f"({' '.join(self.message.split())})"
        parts = self._parts
        if parts is None:
            return InsufficientPrivilegeError(
                f"{who} was refused a privilege in schema {self.schema!r} {said}: grant it, "
                f"or connect as a role that has it (the schema's owner)"
            )
        kind, name, not_owner = parts
        if not_owner:
            return InsufficientPrivilegeError(
                f"{who} does not own {kind} {name} in schema {self.schema!r} {said}: "
                f"run `taskq migrate` as its owner"
            )
        # Server-side a schema's or database's name is taken as it is; in SQL, quoted.
        target = _ident(name) if kind in ("schema", "database") else self._target(kind, name)
        rights = list(missing or self._needed(kind, name))
        # Unasked, it lacks one of them at least: "SELECT/INSERT".
        lacks = _and(rights) if missing or len(rights) == 1 else "/".join(rights)
        grantee = _ident(role) if role else "<role>"
        grant = f"GRANT {', '.join(rights)} ON {kind.upper()} {target} TO {grantee}"
        if self.migrating:
            whose = kind if kind in ("schema", "database") else "schema"
            fix = f"run `taskq migrate` as the {whose}'s owner, or {grant}"
        else:
            fix = f"{grant} (run by its owner), or connect as a role that has it"
            if kind in ("table", "sequence"):
                # Granted table by table, each run stopped at the next table refused.
                fix += (
                    "; every table and sequence at once, the migrations' ledger left "
                    f"read-only: {_schema_grants(self.schema, grantee)}"
                )
        return InsufficientPrivilegeError(f"{who} lacks {lacks} on {kind} {target} {said}: {fix}")


def _schema_grants(schema: str, grantee: str) -> str:
    """The statements that give ``grantee`` every right TaskQ's statements use in
    ``schema``, and no more: the schema-wide grant covers the migrations' ledger too,
    which a backend only reads (only ``taskq migrate`` writes it), so its writes are
    taken back. The ledger has no sequence: the sequences' grant gives nothing on it."""
    s = _ident(schema)
    ledger_writes = [r for r in _RIGHTS["table"] if r != "SELECT"]
    return (
        f"GRANT {', '.join(_RIGHTS['table'])} ON ALL TABLES IN SCHEMA {s} TO {grantee}; "
        f"GRANT {', '.join(_RIGHTS['sequence'])} ON ALL SEQUENCES IN SCHEMA {s} TO {grantee}; "
        f"REVOKE {', '.join(ledger_writes)} ON TABLE {s}.schema_migrations FROM {grantee}"
    )


def dsn_user(dsn: str | None) -> str | None:
    """The user a DSN names, if it names one (the user part alone: no password)."""
    if dsn:
        with suppress(ValueError):
            return urlsplit(dsn).username or None
    return None


def privilege_error(
    exc: BaseException,
    *,
    schema: str,
    role: str | None,
    missing: Sequence[str] | None = None,
    migrating: bool = False,
) -> InsufficientPrivilegeError:
    """The error for ``exc`` (a driver's 42501), without asking the server."""
    return Denial(str(exc), schema, migrating).error(role, missing)


async def diagnosed(
    conn: Any,
    exc: BaseException,
    *,
    schema: str,
    dsn: str | None = None,
    migrating: bool = False,
) -> InsufficientPrivilegeError:
    """:func:`privilege_error` for ``exc``, refused on ``conn`` (an asyncpg connection),
    with the role and the missing rights asked of the server; what it cannot tell
    (on a connection in an aborted transaction, say) the message goes without."""
    denial = Denial(str(exc), schema, migrating)
    role, missing = dsn_user(dsn), None
    question = denial.question()
    # A diagnosis: its own failure must not hide the refusal, nor (in a savepoint)
    # abort a caller's transaction the refusal left usable.
    with suppress(Exception):
        async with conn.transaction():
            row = await conn.fetchrow(DIAGNOSE_SQL, *(question or ("schema", schema, [])))
        role, missing = row["role"], (list(row["missing"]) if question else None)
    return denial.error(role, missing)
