"""``taskq migrate``: apply the schema migrations, or show where they stand.

asyncpg and the runner are imported inside the functions that use them, so
that ``taskq --help`` does not pay for them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, cast

from taskq._dsn import resolve_dsn, resolve_schema
from taskq.errors import ConfigurationError, TaskQError

if TYPE_CHECKING:
    from taskq.cli import CommandRegistry
    from taskq_postgres._migrate import Connection

_CONNECT_TIMEOUT_SECONDS = 10.0


class _CommandError(Exception):
    """A failure reported to the user as one line on stderr."""


class _NegativeDuration(argparse.ArgumentTypeError):
    """A duration given below zero: each option says what to give instead."""


def _duration(text: str) -> timedelta:
    from taskq.settings import NegativeDurationError, parse_duration

    try:
        # typed `object` to serve as a pydantic validator; a string always comes back
        # as a timedelta
        return cast(timedelta, parse_duration(text))
    except NegativeDurationError as exc:
        raise _NegativeDuration(str(exc)) from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_duration(text: str) -> timedelta:
    try:
        duration = _duration(text)
    except _NegativeDuration:
        duration = timedelta(0)
    if duration <= timedelta(0):
        # Postgres reads a lock_timeout of 0 as "wait for ever".
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text.strip()!r}")
    from taskq_postgres._migrate import MAX_LOCK_TIMEOUT

    if duration > MAX_LOCK_TIMEOUT:
        # Past Postgres's limit the first pending file failed, the error blaming it.
        raise argparse.ArgumentTypeError(
            f"must be at most 2147483647ms, about 24.8 days (Postgres's limit), got "
            f"{text.strip()!r}; to keep retrying longer, raise --max-lock-wait"
        )
    return duration


def _max_lock_wait(text: str) -> timedelta:
    try:
        return _duration(text)
    except _NegativeDuration as exc:
        raise argparse.ArgumentTypeError(
            f"{exc}; give 0 to try each migration once, without retrying"
        ) from None


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        help="PostgreSQL URL (default: $TASKQ_DIRECT_DSN, the server's own address behind "
        "a pooler, else $TASKQ_DSN, else the embedded server under ./.taskq/ when "
        "taskq-postgres[embedded] is installed)",
    )
    parser.add_argument("--schema", help="schema to migrate (default: $TASKQ_SCHEMA, else taskq)")
    parser.add_argument(
        "--status",
        action="store_true",
        help="list applied and pending migrations; change nothing. Exits 1 while any "
        "migration is pending (saying so on stderr), 0 when none is: a deploy script's "
        "check",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument(
        "--lock-timeout",
        type=_positive_duration,
        metavar="DURATION",
        help="how long each migration waits for a table lock before it backs off and "
        "retries; live queries on that table wait behind it meanwhile (default: 2s)",
    )
    parser.add_argument(
        "--max-lock-wait",
        type=_max_lock_wait,
        metavar="DURATION",
        help="how long to keep retrying a migration that cannot get its locks (a long "
        "open transaction holds them) before failing (default: 1m)",
    )


@asynccontextmanager
async def _connection(dsn: str) -> AsyncIterator[Connection]:
    """Connect, and turn every expected failure into a one-line :class:`_CommandError`."""
    import asyncpg

    from taskq_postgres._connect import (
        check_dsn,
        libpq_connect_timeout,
        redact,
        translated_errors,
    )
    from taskq_postgres._transient import client_fault

    try:  # the check the other commands make: asyncpg leaks bare errors (a port's range)
        dsn = check_dsn(dsn)
        # The backend's translation: a timeout said nothing after "cannot connect ...:".
        with translated_errors(dsn):
            # A session setting no pooler passes: a transaction-mode pooler (PgBouncer)
            # refuses it at once, where the migration lock taken through one stayed on a
            # server connection it lends to others, and the next migration hung on it.
            target, timeout = libpq_connect_timeout(dsn, _CONNECT_TIMEOUT_SECONDS)
            conn = await asyncpg.connect(target, timeout=timeout, server_settings={"jit": "off"})
    except TaskQError as exc:
        raise _CommandError(str(exc)) from exc
    try:
        yield conn
    except TaskQError as exc:  # a MigrationError, a refused privilege: each says what to do
        raise _CommandError(str(exc)) from exc
    # InternalClientError: a statement on a connection a restart has just ended meets it.
    except (
        OSError,
        TimeoutError,
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        asyncpg.InternalClientError,
    ) as exc:
        if client_fault(exc):
            raise  # a bug of ours ("another operation is in progress"): its traceback shows it
        raise _CommandError(f"database error on {redact(dsn)}: {exc}") from exc
    finally:
        await conn.close()


async def _show_status(dsn: str, schema: str, as_json: bool) -> int:
    """List the migrations; the exit code: 1 while any is pending."""
    from taskq_postgres._migrate import migration_status

    async with _connection(dsn) as conn:
        statuses = await migration_status(conn, schema)
    if as_json:
        rows = [
            {
                "name": s.name,
                "state": s.state,
                "applied_at": s.applied_at.isoformat() if s.applied_at else None,
            }
            for s in statuses
        ]
        print(json.dumps({"schema": schema, "migrations": rows}, indent=2))
    else:
        for s in statuses:
            applied_at = s.applied_at.isoformat(timespec="seconds") if s.applied_at else ""
            print(f"{s.state:<8} {s.name}  {applied_at}".rstrip())
    pending = sum(s.state == "pending" for s in statuses)
    if not pending:
        return 0
    # Exit 0 said nothing to a deploy script checking whether the schema is ready.
    print(
        f"taskq migrate: {pending} migration{'s' if pending > 1 else ''} pending in schema "
        f"{schema}: apply {'them' if pending > 1 else 'it'} with `taskq migrate`",
        file=sys.stderr,
    )
    return 1


async def _apply(
    dsn: str,
    schema: str,
    as_json: bool,
    lock_timeout: timedelta | None,
    max_lock_wait: timedelta | None,
) -> None:
    from taskq_postgres._migrate import (
        DEFAULT_LOCK_TIMEOUT,
        DEFAULT_MAX_LOCK_WAIT,
        migrate,
        schema_fit,
    )

    async with _connection(dsn) as conn:
        applied = await migrate(
            conn,
            schema,
            lock_timeout=DEFAULT_LOCK_TIMEOUT if lock_timeout is None else lock_timeout,
            max_lock_wait=DEFAULT_MAX_LOCK_WAIT if max_lock_wait is None else max_lock_wait,
        )
        # A schema a newer TaskQ migrated (a rolled-back deploy): "up to date" was said
        # of it too, and this version's workers then refused it.
        fit = await schema_fit(conn, schema)
    newer = sorted([*fit.newer_pre, *fit.newer_post])
    if fit.newer_post:
        print(
            f"taskq migrate: warning: schema {schema} was migrated by a newer TaskQ "
            f"({', '.join(fit.newer_post)}), which may have removed what this version uses: "
            f"its workers refuse the schema; upgrade taskq-postgres to run on it",
            file=sys.stderr,
        )
    if as_json:
        print(json.dumps({"schema": schema, "applied": applied, "newer": newer}, indent=2))
        return
    for name in applied:
        print(f"applied  {name}")
    if newer:
        print(
            f"schema {schema} has every migration of this TaskQ, and {len(newer)} of a "
            f"newer one it does not know (`taskq migrate --status` lists them as unknown)"
        )
    elif not applied:
        print(f"schema {schema} is up to date")


def _log_to_stderr() -> None:
    # structlog prints to stdout unless configured; keep stdout for results
    # (and clean for --json). An application's own configuration wins.
    import structlog

    if not structlog.is_configured():
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))


def _run(args: argparse.Namespace) -> int:
    try:
        try:
            schema = resolve_schema(args.schema, "taskq")  # folded, as the schema it names is
        except ConfigurationError as exc:
            raise _CommandError(str(exc)) from exc
        # After the schema check, so a typo does not start an embedded server for nothing.
        try:
            # Migrations hold a session's advisory lock: the server itself, not a pooler.
            direct = os.environ.get("TASKQ_DIRECT_DSN") or None
            dsn = resolve_dsn(args.dsn if args.dsn is not None else direct)
        except TaskQError as exc:
            raise _CommandError(str(exc)) from exc
        _log_to_stderr()
        if args.status:
            return asyncio.run(_show_status(dsn, schema, args.json))
        asyncio.run(_apply(dsn, schema, args.json, args.lock_timeout, args.max_lock_wait))
    except _CommandError as exc:
        one_line = " ".join(str(exc).split())  # server messages may span lines
        print(f"taskq migrate: error: {one_line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Said, where it exited 1 in silence: the files applied so far are printed only
        # at the end, so an operator could not tell what the run had done.
        print(
            "taskq migrate: interrupted: the files applied before stay applied, the one "
            "running was not recorded; `taskq migrate --status` shows where the schema "
            "stands, and `taskq migrate` goes on from there",
            file=sys.stderr,
        )
        return 1
    return 0


def register(cli: CommandRegistry) -> None:
    """Add ``taskq migrate`` to the ``taskq`` command."""
    cli.add(
        "migrate",
        help="apply TaskQ's schema migrations to a PostgreSQL database (or --status to list them)",
        configure=_configure,
        run=_run,
    )
