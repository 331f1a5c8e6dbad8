"""The shape of a schema as text (columns, constraints, indexes, triggers, enums,
functions): what ``schema_snapshot.txt`` holds, and what a schema upgraded with data
in it must come to as well."""

from __future__ import annotations

from typing import Any

import asyncpg

_COLUMNS = """
SELECT c.relname AS table_name, a.attname, format_type(a.atttypid, a.atttypmod) AS type,
       a.attnotnull, pg_get_expr(d.adbin, d.adrelid) AS default_expr
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE n.nspname = $1 AND c.relkind = 'r'
ORDER BY c.relname, a.attnum
"""

_CONSTRAINTS = """
SELECT c.relname AS table_name, k.conname AS name, pg_get_constraintdef(k.oid) AS definition
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1
ORDER BY c.relname, k.conname
"""

_INDEXES = (
    "SELECT tablename, indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY tablename, indexname"
)

_TRIGGERS = """
SELECT c.relname AS table_name, pg_get_triggerdef(t.oid) AS definition
FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND NOT t.tgisinternal
ORDER BY c.relname, t.tgname
"""

_ENUMS = """
SELECT t.typname, array_agg(e.enumlabel ORDER BY e.enumsortorder)::text[] AS labels
FROM pg_type t
JOIN pg_namespace n ON n.oid = t.typnamespace
JOIN pg_enum e ON e.enumtypid = t.oid
WHERE n.nspname = $1
GROUP BY t.typname
ORDER BY t.typname
"""

_FUNCTIONS = """
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args,
       pg_get_function_result(p.oid) AS result
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = $1
ORDER BY p.proname
"""


async def describe_schema(conn: asyncpg.Connection[Any], schema: str) -> str:
    """Every object of ``schema``, one a line, its name replaced by ``{schema}``. Run it
    with ``search_path = pg_catalog``, so that every name is qualified the same way."""
    lines = [
        f"enum {row['typname']} ({', '.join(row['labels'])})"
        for row in await conn.fetch(_ENUMS, schema)
    ]
    lines.extend(
        f"function {row['proname']}({row['args']}) -> {row['result']}"
        for row in await conn.fetch(_FUNCTIONS, schema)
    )
    tables: dict[str, list[str]] = {}
    for row in await conn.fetch(_COLUMNS, schema):
        column = f"  {row['attname']} {row['type']}"
        if row["attnotnull"]:
            column += " NOT NULL"
        if row["default_expr"] is not None:
            column += f" DEFAULT {row['default_expr']}"
        tables.setdefault(row["table_name"], []).append(column)
    for row in await conn.fetch(_CONSTRAINTS, schema):
        tables[row["table_name"]].append(f"  constraint {row['name']} {row['definition']}")
    for row in await conn.fetch(_INDEXES, schema):
        tables[row["tablename"]].append(f"  {row['indexdef']}")
    for row in await conn.fetch(_TRIGGERS, schema):
        tables[row["table_name"]].append(f"  {row['definition']}")
    for name in sorted(tables):
        lines.append(f"table {name}")
        lines.extend(tables[name])
    return "\n".join(lines).replace(f"{schema}.", "{schema}.") + "\n"
