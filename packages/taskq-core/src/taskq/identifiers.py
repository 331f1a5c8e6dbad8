"""The one home of SQL identifier validation (``_IDENT_RE``).

Drivers cannot bind identifiers as parameters, so the schema name is
interpolated into SQL. It is validated when a backend or migrator is built
*and* again at every interpolation site (defence in depth): call
:func:`check_identifier` immediately before the f-string that embeds it.
"""

from __future__ import annotations

import re
from typing import Final

from taskq.errors import InvalidIdentifierError

__all__ = [
    "MAX_IDENTIFIER_BYTES",
    "MAX_SCHEMA_NAME_BYTES",
    "check_identifier",
    "validate_schema_name",
]

_IDENT_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""Plain ASCII identifiers only. Always used with ``fullmatch``: ``match`` with
``^...$`` would accept a trailing newline (``$`` matches before it)."""

_RESERVED: Final = frozenset(
    {
        "all",
        "analyse",
        "analyze",
        "and",
        "any",
        "array",
        "as",
        "asc",
        "asymmetric",
        "both",
        "case",
        "cast",
        "check",
        "collate",
        "column",
        "constraint",
        "create",
        "current_catalog",
        "current_date",
        "current_role",
        "current_time",
        "current_timestamp",
        "current_user",
        "default",
        "deferrable",
        "desc",
        "distinct",
        "do",
        "else",
        "end",
        "except",
        "false",
        "fetch",
        "for",
        "foreign",
        "from",
        "grant",
        "group",
        "having",
        "in",
        "initially",
        "intersect",
        "into",
        "lateral",
        "leading",
        "limit",
        "localtime",
        "localtimestamp",
        "not",
        "null",
        "offset",
        "on",
        "only",
        "or",
        "order",
        "placing",
        "primary",
        "references",
        "returning",
        "select",
        "session_user",
        "some",
        "symmetric",
        "system_user",
        "table",
        "then",
        "to",
        "trailing",
        "true",
        "union",
        "unique",
        "user",
        "using",
        "variadic",
        "when",
        "where",
        "window",
        "with",
        # reserved, though allowed as a function or type name: not as a schema's
        "authorization",
        "binary",
        "collation",
        "concurrently",
        "cross",
        "current_schema",
        "freeze",
        "full",
        "ilike",
        "inner",
        "is",
        "isnull",
        "join",
        "left",
        "like",
        "natural",
        "notnull",
        "outer",
        "overlaps",
        "right",
        "similar",
        "tablesample",
        "verbose",
        # Category C, "non-reserved (cannot be function or type)": a type named through
        # the schema (`c int.job_status`, `x::int.job_status`) is a syntax error, some
        # tables too (`time.jobs`). PostgreSQL 15's list, from
        # SELECT word FROM pg_get_keywords() WHERE catcode = 'C'.
        "between",
        "bigint",
        "bit",
        "boolean",
        "char",
        "character",
        "coalesce",
        "dec",
        "decimal",
        "exists",
        "extract",
        "float",
        "greatest",
        "grouping",
        "inout",
        "int",
        "integer",
        "interval",
        "least",
        "national",
        "nchar",
        "none",
        "normalize",
        "nullif",
        "numeric",
        "out",
        "overlay",
        "position",
        "precision",
        "real",
        "row",
        "setof",
        "smallint",
        "substring",
        "time",
        "timestamp",
        "treat",
        "trim",
        "values",
        "varchar",
        "xmlattributes",
        "xmlconcat",
        "xmlelement",
        "xmlexists",
        "xmlforest",
        "xmlnamespaces",
        "xmlparse",
        "xmlpi",
        "xmlroot",
        "xmlserialize",
        "xmltable",
    }
)
"""Postgres's key words that cannot name a schema unquoted (``pg_get_keywords()``,
categories R, T and C, as of PostgreSQL 15, plus ``system_user`` from 16): a name
among them would pass the pattern and fail inside the first statement, leaving a
half-made schema. A test checks the list against the server's own."""

MAX_IDENTIFIER_BYTES: Final = 63
"""Postgres truncates longer identifiers silently (NAMEDATALEN - 1)."""

# Names derived from the schema must fit too: pg_notify() rejects a channel
# over 63 bytes while LISTEN silently truncates it, so the two sides would
# never meet. The longest fixed-format derived name is the events channel
# ``taskq_events_{schema}``; the per-worker channel, which would not fit with
# a full worker id, is shortened by a hash in the backend's channel helper.
_LONGEST_DERIVED_PREFIX: Final = len("taskq_events_")
MAX_SCHEMA_NAME_BYTES: Final = MAX_IDENTIFIER_BYTES - _LONGEST_DERIVED_PREFIX


def check_identifier(name: str) -> str:
    """Return ``name`` if it is a safe plain identifier, else raise
    :class:`~taskq.errors.InvalidIdentifierError` (a ``ValueError``)."""
    if not isinstance(name, str) or _IDENT_RE.fullmatch(name) is None:
        raise InvalidIdentifierError(
            f"invalid SQL identifier {name!r}: use ASCII letters, digits and underscores, "
            f"not starting with a digit"
        )
    if len(name.encode()) > MAX_IDENTIFIER_BYTES:
        raise InvalidIdentifierError(
            f"invalid SQL identifier {name!r}: longer than Postgres's "
            f"{MAX_IDENTIFIER_BYTES}-byte limit"
        )
    if name.lower() in _RESERVED:
        raise InvalidIdentifierError(
            f"invalid SQL identifier {name!r}: a reserved SQL key word; choose another name"
        )
    return name


def validate_schema_name(schema: str) -> str:
    """Validate a TaskQ schema name; return it as Postgres folds it (lowercase) or raise
    :class:`~taskq.errors.InvalidIdentifierError` (a ``ValueError``).

    Beyond :func:`check_identifier`, the name must not be one Postgres keeps for its
    catalogs (``pg_*``, ``information_schema``), and must leave room for the
    channel names derived from it (at most :data:`MAX_SCHEMA_NAME_BYTES`). Folded
    here, once: ``TaskQ`` and ``taskq`` name one schema, and every name derived from
    it (channels, lock keys) must be the same for both spellings.
    """
    check_identifier(schema)
    if schema.lower().startswith("pg_"):
        raise InvalidIdentifierError(
            f"schema name {schema!r} starts with pg_, which Postgres reserves for its own schemas"
        )
    if schema.lower() == "information_schema":
        raise InvalidIdentifierError(
            f"schema name {schema!r} is the SQL standard's catalog schema: pg_dump leaves "
            f"it out of every backup, so TaskQ's tables and jobs there would be lost "
            f"on a restore; choose another name"
        )
    if len(schema.encode()) > MAX_SCHEMA_NAME_BYTES:
        raise InvalidIdentifierError(
            f"schema name {schema!r} is too long: at most {MAX_SCHEMA_NAME_BYTES} bytes, so "
            f"that derived NOTIFY channel names fit Postgres's {MAX_IDENTIFIER_BYTES}-byte limit"
        )
    return schema.lower()
