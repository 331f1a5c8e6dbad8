"""``taskq jobs list|show|retry|cancel``: inspect and operate on stored jobs.

These commands need no application: reads, retries and cancels go straight to
the backend, so an operator can run them with only a DSN. The backend and
the client are imported inside the functions that use them, so that
``taskq --help`` does not pay for them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final
from uuid import UUID

from taskq._dsn import resolve_schema
from taskq.backend.statemachine import TERMINAL_STATUSES, JobStatus
from taskq.cli._inputs import name_argument
from taskq.errors import TaskQError

if TYPE_CHECKING:
    from taskq.backend import Backend
    from taskq.cli._commands import CommandRegistry
    from taskq.client import JobsClient
    from taskq.models import AttemptRow, EventRow, JobRow

__all__ = [
    "JobCommandError",
    "add_connection_options",
    "connect_backend",
    "open_client",
    "register",
]

DEFAULT_SCHEMA = "taskq"
_MAX_LIMIT = 10_000  # JobFilter's own bound


class JobCommandError(TaskQError):
    """The job cannot be shown, retried or cancelled; the message says why."""


# -- arguments -------------------------------------------------------------------------


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """``--dsn`` and ``--schema``, shared by the commands that talk to a backend directly."""
    parser.add_argument(
        "--dsn", help="database URL (default: $TASKQ_DSN, else an installed embedded server)"
    )
    parser.add_argument(
        "--schema", help=f"database schema (default: $TASKQ_SCHEMA, else {DEFAULT_SCHEMA})"
    )


def _add_job_id(parser: argparse.ArgumentParser) -> None:
    # A plain string: a malformed id is reported like an unknown one (exit 1), not
    # as a usage error.
    parser.add_argument("job_id", metavar="JOB_ID", help="the job's id (a UUID)")


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= _MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be between 1 and {_MAX_LIMIT}, got {value}")
    return value


def _configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="jobs_action", metavar="ACTION", required=True)

    listing = actions.add_parser(
        "list",
        help="list jobs, newest first",
        description="List jobs, newest first. Status filters: --status, --active or --finished.",
    )
    add_connection_options(listing)
    which = listing.add_mutually_exclusive_group()
    which.add_argument(
        "--status",
        action="extend",
        nargs="+",
        choices=[s.value for s in JobStatus],
        metavar="S",
        help=f"only jobs in these statuses ({', '.join(s.value for s in JobStatus)})",
    )
    which.add_argument(
        "--active", action="store_true", help="only jobs still pending, scheduled or running"
    )
    which.add_argument("--finished", action="store_true", help="only jobs in a terminal status")
    listing.add_argument("--actor", type=name_argument, help="only jobs of this actor")
    listing.add_argument("--queue", type=name_argument, help="only jobs on this queue")
    listing.add_argument(
        "--limit", type=_limit, default=100, help="show at most N jobs (default: 100)"
    )
    listing.add_argument(
        "--before",
        metavar="JOB_ID",
        help="only jobs created before this one: the next page, after the last id shown",
    )
    listing.add_argument("--json", action="store_true", help="print a JSON array for scripts")
    listing.set_defaults(_jobs_run=_list)

    show = actions.add_parser(
        "show",
        help="show a job with its attempts and events",
        description="Show a job's fields, its attempts and its audit events.",
    )
    _add_job_id(show)
    add_connection_options(show)
    show.add_argument(
        "--json", action="store_true", help="print a JSON object {job, attempts, events}"
    )
    show.set_defaults(_jobs_run=_show)

    retry = actions.add_parser(
        "retry",
        help="run a failed, crashed, cancelled or abandoned job again",
        description="Give a failed, crashed, cancelled or abandoned job a new life as pending; "
        "a job that used all its attempts gets one more (not a new max_attempts).",
    )
    _add_job_id(retry)
    add_connection_options(retry)
    retry.set_defaults(_jobs_run=_retry)

    cancel = actions.add_parser(
        "cancel",
        help="cancel a waiting job, or ask a running one to stop",
        description="Cancel a pending or scheduled job at once; a running job is asked to "
        "stop (its actor sees ctx.cancel_event).",
    )
    _add_job_id(cancel)
    add_connection_options(cancel)
    cancel.add_argument("--reason", help="why, recorded on the job and its cancel event")
    cancel.set_defaults(_jobs_run=_cancel)


def _run(args: argparse.Namespace) -> int:
    code: int = asyncio.run(args._jobs_run(args))
    return code


def register(cli: CommandRegistry) -> None:
    """Add ``taskq jobs`` to the ``taskq`` command."""
    cli.add(
        "jobs",
        help="list, show, retry or cancel jobs",
        configure=_configure,
        run=_run,
    )


# -- the backend -------------------------------------------------------------------------


@asynccontextmanager
async def connect_backend(args: argparse.Namespace) -> AsyncIterator[Backend]:
    """The open backend that ``--dsn`` / ``--schema`` (or their environment variables)
    name, with the backend settings of the ``TASKQ_*`` environment as an application
    built from a URL takes them (``TASKQ_DIRECT_DSN`` behind a pooler); closed on exit."""
    from taskq._dsn import resolve_shared_dsn
    from taskq.plugins import open_backend
    from taskq.settings import WorkerSettings

    schema = resolve_schema(args.schema, DEFAULT_SCHEMA)
    options = WorkerSettings.backend_options_from_env()
    backend = open_backend(resolve_shared_dsn(args.dsn), schema=schema, **options)
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


@asynccontextmanager
async def open_client(args: argparse.Namespace) -> AsyncIterator[JobsClient]:
    """A client on the backend the options name; no actors are needed to read, retry
    or cancel."""
    from taskq.client import JobsClient

    async with connect_backend(args) as backend:
        yield JobsClient(backend, {})


def _job_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise JobCommandError(
            f"{text!r} is not a job id; ids are UUIDs as `taskq jobs list` shows them"
        ) from None


async def _existing(client: JobsClient, job_id: UUID) -> JobRow:
    row = await client.get(job_id)
    if row is None:
        # The same words for an archived job as for a mistyped id: say where it may be.
        raise JobCommandError(
            f"no job {job_id} (a finished job moves to the archive once its status's "
            f"retention, TASKQ_PRUNE_RETENTION_<STATUS>, has passed)"
        )
    return row


# -- the actions -------------------------------------------------------------------------


async def _list(args: argparse.Namespace) -> int:
    from taskq.cli._output import format_time, print_json, table
    from taskq.models import JobFilter

    active = None
    if args.active or args.finished:
        active = bool(args.active)
    filters = JobFilter(
        status=args.status,
        active=active,
        actor=args.actor,
        queue=args.queue,
        order="desc",
        limit=args.limit,
    )
    # One more than shown, to say when the list is cut short: past JobFilter's bound
    # at --limit's maximum (capped there, it never said so), so set unvalidated.
    filters = filters.model_copy(update={"limit": args.limit + 1})
    # Read before connecting, as show/retry/cancel read theirs: a typo is said at once,
    # not after an embedded server's start or an unreachable server's timeout.
    before = None if args.before is None else _job_id(args.before)
    async with open_client(args) as client:
        if before is not None:
            # Keyset, from the job's own (created_at, id): a page is never shifted by
            # jobs enqueued between two calls, as an offset would be.
            anchor = await _existing(client, before)
            filters = filters.model_copy(update={"cursor": (anchor.created_at, anchor.id)})
        rows = await client.list_jobs(filters)
    more, rows = len(rows) > args.limit, rows[: args.limit]
    if more:
        # On stderr: stdout stays the list (a --json array for scripts).
        which = "the newest" if args.before is None else "the next"
        print(
            f"showing {which} {args.limit}; more jobs match: narrow the list with "
            f"--status, --actor or --queue, raise --limit (up to {_MAX_LIMIT}), or see "
            f"the next page with --before {rows[-1].id}",
            file=sys.stderr,
        )
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no jobs")
        return 0
    print(
        table(
            ["id", "actor", "queue", "status", "attempt", "created_at", "finished/scheduled"],
            [
                [
                    str(r.id),
                    r.actor,
                    r.queue,
                    r.status.value,
                    f"{r.attempt}/{r.max_attempts}",
                    format_time(r.created_at),
                    format_time(r.finished_at or r.scheduled_at),
                ]
                for r in rows
            ],
        )
    )
    return 0


async def _show(args: argparse.Namespace) -> int:
    from taskq.cli._output import print_json

    job_id = _job_id(args.job_id)
    async with open_client(args) as client:
        row = await _existing(client, job_id)
        attempts = await client.get_attempts(job_id)
        events = await client.get_events(job_id)
    if args.json:
        print_json({"job": row, "attempts": attempts, "events": events})
    else:
        print(_render_job(row, attempts, events))
    return 0


def _render_job(row: JobRow, attempts: list[AttemptRow], events: list[EventRow]) -> str:
    from datetime import datetime, timedelta

    from taskq.backend.statemachine import CancelPhase
    from taskq.cli._output import compact, format_duration, format_time, table
    from taskq.models import ErrorInfo

    def shown(value: object) -> str:
        if isinstance(value, datetime):
            return format_time(value, ms=True)
        if isinstance(value, timedelta):
            return format_duration(value)
        if isinstance(value, CancelPhase):
            return value.name.lower()
        if isinstance(value, ErrorInfo):
            return compact(f"{value.error_class}: {value.message}", 200)
        return compact(value, 200)

    fields: list[tuple[str, str]] = []
    for name, info in type(row).model_fields.items():
        value = getattr(row, name)
        # Required fields always; optional ones only when set, so a plain job
        # shows a short list.
        if info.is_required() or value != info.get_default(call_default_factory=True):
            fields.append((name, shown(value)))
    width = max(len(name) for name, _ in fields) + 1
    parts = ["\n".join(f"{name + ':':<{width}} {text}" for name, text in fields)]

    parts.append("\nattempts:")
    if attempts:
        parts.append(
            table(
                ["attempt", "outcome", "started", "duration", "error"],
                [
                    [
                        str(a.attempt),
                        a.outcome,
                        format_time(a.started_at, ms=True),
                        format_duration(a.duration),
                        f"{a.error.error_class}: {a.error.message}" if a.error else "",
                    ]
                    for a in attempts
                ],
                max_width=60,
            )
        )
    else:
        parts.append("none")

    parts.append("\nevents:")
    if events:
        parts.append(
            table(
                ["id", "time", "kind", "detail"],
                [
                    [
                        str(e.event_id),
                        format_time(e.occurred_at, ms=True),
                        e.kind,
                        _pairs(e.detail),
                    ]
                    for e in events
                ],
                max_width=120,
            )
        )
    else:
        parts.append("none")
    return "\n".join(parts)


_FIRST_KEYS: Final = ("from_state", "to_state", "from_phase", "to_phase")
"""Event detail keys shown first, in this order (Postgres keeps jsonb keys shortest
first, which put ``from_state`` last, where a long line cut it off)."""


def _pairs(detail: dict[str, Any]) -> str:
    """An event's detail as ``key=value`` pairs, the transition first; a value with
    blanks is quoted so the pairs stay apart."""
    from taskq.cli._output import compact

    def value(v: Any) -> str:
        text = compact(v)
        return json.dumps(text) if isinstance(v, str) and " " in text else text

    first = [k for k in _FIRST_KEYS if k in detail]
    keys = [*first, *(k for k in detail if k not in first)]
    return " ".join(f"{k}={value(detail[k])}" for k in keys)


async def _retry(args: argparse.Namespace) -> int:
    job_id = _job_id(args.job_id)
    async with open_client(args) as client:
        if not await client.retry(job_id):
            row = await _existing(client, job_id)
            raise JobCommandError(
                f"job {job_id} cannot be retried: it is {row.status.value}, and only failed, "
                f"crashed, cancelled or abandoned jobs can be"
            )
    print(f"job {job_id} is pending again")
    return 0


async def _cancel(args: argparse.Namespace) -> int:
    job_id = _job_id(args.job_id)
    async with open_client(args) as client:
        if not await client.cancel(job_id, reason=args.reason):
            row = await _existing(client, job_id)
            raise JobCommandError(
                f"job {job_id} cannot be cancelled: it already finished ({row.status.value})"
            )
        row = await _existing(client, job_id)
    if row.status is JobStatus.CANCELLED:
        print(f"job {job_id} cancelled")
    elif row.status in TERMINAL_STATUSES:
        # It ended between the request and this read: no actor will see the request.
        print(f"cancel requested for job {job_id}, but it ended {row.status.value} first")
    else:
        print(
            f"cancel requested for job {job_id} ({row.status.value}): "
            f"its actor sees ctx.cancel_event"
        )
    return 0
