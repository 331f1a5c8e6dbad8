"""``taskq enqueue APP ACTOR JSON``: enqueue one job from the shell.

The application is loaded for its actors, so the payload is validated against
the actor's model before anything is written; the job goes to the database the
options name (``--dsn``, ``TASKQ_DSN``, an embedded default), not necessarily
the URL the application was written with.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from taskq._dsn import resolve_schema
from taskq.cli._inputs import import_app, json_argument
from taskq.errors import PayloadValidationError

if TYPE_CHECKING:
    from taskq.app import TaskQ
    from taskq.cli._commands import CommandRegistry
    from taskq.models import JobRow

__all__ = ["register"]


def _delay(text: str) -> timedelta:
    from taskq.settings import NegativeDurationError, parse_duration

    try:
        # typed `object` to serve as a pydantic validator; a string always
        # comes back as a timedelta
        return cast(timedelta, parse_duration(text))
    except NegativeDurationError as exc:
        # The client's rule too (EnqueueArgs refuses a negative delay): no "in the
        # past" that would mean "now".
        raise argparse.ArgumentTypeError(
            f"{exc}; to run the job now, leave --delay out or give 0"
        ) from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("app", metavar="APP", help="module:attribute naming a TaskQ object")
    parser.add_argument("actor", metavar="ACTOR", help="the actor's name")
    parser.add_argument("payload", metavar="JSON", help="the payload, as JSON: '{\"seconds\": 1}'")
    parser.add_argument(
        "--dsn",
        help="database URL (default: $TASKQ_DSN, else the application's own URL unless "
        "memory://, else an installed embedded server)",
    )
    parser.add_argument(
        "--schema", help="database schema (default: $TASKQ_SCHEMA, else the application's)"
    )
    parser.add_argument(
        "--delay", type=_delay, help="run no earlier than this from now: 30, 500ms, 30s, 5m, 1h"
    )
    parser.add_argument("--priority", type=int, help="higher runs first (default: the actor's)")
    parser.add_argument("--queue", help="the queue to put it on (default: the actor's)")
    parser.add_argument(
        "--idempotency-key",
        help="enqueueing the same actor and key again returns the existing job",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the stored job as JSON, not just its id"
    )


def _payload(text: str) -> Any:
    try:
        return json_argument(text)
    except ValueError as exc:
        raise PayloadValidationError(
            f"the payload is not valid JSON ({exc}); quote it for the shell, "
            f"e.g. '{{\"seconds\": 1}}'"
        ) from None


def _target(app: TaskQ, schema_flag: str | None, dsn_flag: str | None) -> TaskQ:
    """``app`` rebuilt on the database the options name, as taskq-worker rebuilds it
    (the code's backend options kept; its password only for the code's own server)."""
    from urllib.parse import urlsplit

    from taskq._dsn import resolve_shared_dsn

    schema = resolve_schema(schema_flag, app.schema)
    # Like taskq-worker: flag, env, then the URL the application names -- unless
    # that is memory://, which would vanish with this process.
    app_url = None if urlsplit(app.url).scheme == "memory" else app.url
    app._retarget(
        resolve_shared_dsn(
            dsn_flag if dsn_flag is not None else (os.environ.get("TASKQ_DSN") or app_url)
        ),
        schema,
        {},
    )
    return app


async def _enqueue(
    target: TaskQ, actor: str, payload: Any, options: dict[str, Any]
) -> tuple[JobRow, bool]:
    """The stored job, and whether it was stored before (its idempotency key's)."""
    from taskq.models import JobFilter

    key = options["idempotency_key"]
    async with target:
        earlier = []
        if key is not None:
            earlier = await target.client.list_jobs(
                JobFilter(actor=actor, idempotency_key=key, limit=1)
            )
        row = await target.client.enqueue(actor, payload, **options)
    return row, any(job.id == row.id for job in earlier)


def _run(args: argparse.Namespace) -> int:
    from taskq.cli._output import print_json

    payload = _payload(args.payload)
    app = import_app(args.app)
    options: dict[str, Any] = {
        "delay": args.delay,
        "priority": args.priority,
        "queue": args.queue,
        "idempotency_key": args.idempotency_key,
    }
    # Validate before resolving the DSN: that may start an embedded server, and a
    # typo in the actor or payload should not wait for it.
    app.client.build_args(args.actor, payload, **options)
    row, existed = asyncio.run(
        _enqueue(_target(app, args.schema, args.dsn), args.actor, payload, options)
    )
    if existed:
        # On stderr: stdout stays the job's id (or JSON) for scripts. Said, where the
        # id printed alone read as a new job, and this payload was dropped in silence.
        print(
            f"taskq enqueue: job {row.id} ({row.status.value}) already had idempotency key "
            f"{args.idempotency_key!r}: nothing new was enqueued, and that job keeps its "
            f"own payload and options",
            file=sys.stderr,
        )
    if args.json:
        print_json(row)
    else:
        print(row.id)
    return 0


def register(cli: CommandRegistry) -> None:
    """Add ``taskq enqueue`` to the ``taskq`` command."""
    cli.add(
        "enqueue",
        help="enqueue one job of an application's actor, its payload given as JSON",
        configure=_configure,
        run=_run,
    )
