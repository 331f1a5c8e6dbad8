"""``taskq schedules list|create|update|delete``: manage the cron schedules the
maintenance leader fires.

Like ``taskq jobs``, these commands need no application: schedules are rows
in the backend, so an operator manages them with only a DSN. The payload is
then stored as given, and the actor need not be known here: both are checked
by the worker that runs a slot's job (one the actor refuses fails, with the
validation error, in ``taskq jobs list --status failed``). ``--app`` names the
application, whose actor, payload and queue are then checked up front, as each
slot's job will be built. An actor no worker has registered yet is
created with a warning (its slots wait until a worker runs it): a schedule
may come before the deploy of its actor, or be a typo.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from taskq.backend import SupportsCron
from taskq.cli._inputs import import_app, json_argument, name_argument
from taskq.cli._jobs_cmd import add_connection_options, connect_backend
from taskq.errors import TaskQError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from taskq.backend import Backend
    from taskq.cli._commands import CommandRegistry
    from taskq.models import ScheduleRecord

__all__ = ["ScheduleCommandError", "register"]


_M = TypeVar("_M", bound="BaseModel")


class ScheduleCommandError(TaskQError):
    """The schedule cannot be created, changed or deleted; the message says why."""


# -- arguments -------------------------------------------------------------------------


def _add_schedule_id(parser: argparse.ArgumentParser) -> None:
    # A plain string: a malformed id is reported like an unknown one (exit 1), not
    # as a usage error.
    parser.add_argument("schedule_id", metavar="ID", help="the schedule's id (a UUID)")


def _add_app(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--app",
        metavar="APP",
        help="module:attribute naming the TaskQ application: its actor, payload and queue "
        "are checked now, as each slot's job will be built (default: no check here; the "
        "worker that runs a slot's job checks it)",
    )


def _add_json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print {what} as a JSON object for scripts (the fields `list --json` gives "
        "each schedule) instead of a sentence",
    )


def _configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="schedules_action", metavar="ACTION", required=True)

    listing = actions.add_parser(
        "list",
        help="list schedules by name",
        description="List cron schedules by name; --enabled or --disabled keeps only those.",
    )
    add_connection_options(listing)
    listing.add_argument("--actor", type=name_argument, help="only this actor's schedules")
    state = listing.add_mutually_exclusive_group()
    state.add_argument(
        "--enabled",
        dest="enabled",
        action="store_const",
        const=True,
        help="only the schedules the leader fires",
    )
    state.add_argument(
        "--disabled",
        dest="enabled",
        action="store_const",
        const=False,
        help="only the disabled schedules (stored, not fired)",
    )
    listing.add_argument("--json", action="store_true", help="print a JSON array for scripts")
    listing.set_defaults(_schedules_run=_list)

    create = actions.add_parser(
        "create",
        help="add a cron schedule",
        description="Add a schedule: the maintenance leader enqueues a job of ACTOR at "
        "every slot of CRON.",
    )
    create.add_argument("name", metavar="NAME", help="a unique name for the schedule")
    create.add_argument("actor", metavar="ACTOR", help="the actor each slot enqueues")
    create.add_argument(
        "cron",
        metavar="CRON",
        help="cron expression, e.g. '*/5 * * * *'; a 6th field, after the day of the week, "
        "gives seconds: '* * * * * */10' is every 10 seconds",
    )
    create.add_argument("--payload", help="the jobs' payload as a JSON object (default: {})")
    create.add_argument("--queue", help="the jobs' queue (default: the actor's)")
    create.add_argument(
        "--timezone",
        default="UTC",
        help="IANA timezone CRON is read in, e.g. Europe/Paris (default: UTC)",
    )
    create.add_argument("--disabled", action="store_true", help="store it without firing it")
    _add_json(create, "the stored schedule")
    _add_app(create)
    add_connection_options(create)
    create.set_defaults(_schedules_run=_create)

    update = actions.add_parser(
        "update",
        help="change a schedule",
        description="Change a schedule; options not given are kept.",
    )
    _add_schedule_id(update)
    update.add_argument("--cron", help="a new cron expression")
    update.add_argument("--payload", help="a new payload, as a JSON object")
    queue = update.add_mutually_exclusive_group()
    queue.add_argument("--queue", help="a new queue for the jobs each slot enqueues")
    queue.add_argument(
        "--actor-queue",
        action="store_true",
        help="the jobs go to the actor's own queue again, whichever it is when each slot "
        "fires (as created without --queue)",
    )
    update.add_argument("--timezone", help="a new timezone")
    toggle = update.add_mutually_exclusive_group()
    toggle.add_argument(
        "--enable", dest="enabled", action="store_const", const=True, help="fire it again"
    )
    toggle.add_argument(
        "--disable", dest="enabled", action="store_const", const=False, help="stop firing it"
    )
    _add_json(update, "the changed schedule, as stored")
    _add_app(update)
    add_connection_options(update)
    update.set_defaults(_schedules_run=_update)

    delete = actions.add_parser(
        "delete", help="remove a schedule", description="Remove a schedule for good."
    )
    _add_schedule_id(delete)
    _add_json(delete, "the deleted schedule (as read just before deleting it)")
    add_connection_options(delete)
    delete.set_defaults(_schedules_run=_delete)


def _run(args: argparse.Namespace) -> int:
    code: int = asyncio.run(args._schedules_run(args))
    return code


def register(cli: CommandRegistry) -> None:
    """Add ``taskq schedules`` to the ``taskq`` command."""
    cli.add(
        "schedules",
        help="list, create, update or delete cron schedules",
        configure=_configure,
        run=_run,
    )


# -- parsing ---------------------------------------------------------------------------


def _schedule_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise ScheduleCommandError(
            f"{text!r} is not a schedule id; ids are UUIDs as `taskq schedules list` shows them"
        ) from None


def _payload(text: str) -> dict[str, Any]:
    try:
        value = json_argument(text)
    except ValueError as exc:
        raise ScheduleCommandError(
            f"--payload is not valid JSON ({exc}); quote it for the shell, "
            f"e.g. --payload '{{\"n\": 1}}'"
        ) from None
    if not isinstance(value, dict):
        raise ScheduleCommandError(f"--payload must be a JSON object, got {text!r}")
    return value


def _validated(model: type[_M], **fields: Any) -> _M:
    """``model(**fields)``, with a bad cron expression or timezone reported in one line."""
    from pydantic import ValidationError

    try:
        return model(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"])
        message = str(err["msg"]).removeprefix("Value error, ")
        raise ScheduleCommandError(f"{where}: {message}") from None


# -- the actions -------------------------------------------------------------------------


async def _list(args: argparse.Namespace) -> int:
    from taskq.cli._output import format_time, print_json, table

    async with connect_backend(args) as backend:
        schedules = await backend.list_schedules(actor=args.actor, enabled=args.enabled)
    if args.json:
        print_json(schedules)
        return 0
    if not schedules:
        which = {None: "", True: "enabled ", False: "disabled "}[args.enabled]
        print(f"no {which}schedules")
        return 0
    print(
        table(
            ["id", "name", "actor", "cron", "timezone", "queue", "enabled", "next_fire_at"],
            [
                [
                    str(s.id),
                    s.name,
                    s.actor,
                    s.cron,
                    s.timezone,
                    s.queue or "(the actor's)",
                    "yes" if s.enabled else "no",
                    format_time(s.next_fire_at),
                ]
                for s in schedules
            ],
        )
    )
    return 0


async def _create(args: argparse.Namespace) -> int:
    from taskq.cli._output import compact, format_time, print_json
    from taskq.models import ScheduleCreateArgs

    if args.queue == "":
        raise ScheduleCommandError(
            "--queue '' names no queue: leave --queue out for the actor's own queue"
        )
    create = _validated(
        ScheduleCreateArgs,
        name=args.name,
        actor=args.actor,
        cron=args.cron,
        payload=_payload(args.payload) if args.payload is not None else {},
        queue=args.queue,
        timezone=args.timezone,
        enabled=not args.disabled,
    )
    if args.app is not None:
        # Before connecting, which may start an embedded server: a typo says so at once.
        import_app(args.app).client.build_args(create.actor, create.payload, queue=create.queue)
    async with connect_backend(args) as backend:
        try:
            schedule = await backend.create_schedule(create)
        except ValueError as exc:  # the name is taken
            raise ScheduleCommandError(str(exc)) from None
        if isinstance(backend, SupportsCron) and create.actor not in (
            await backend.get_actor_queues()
        ):
            print(
                f"taskq schedules: warning: no worker has registered actor {create.actor!r}; "
                f"its slots wait until one runs it (a typo? `taskq schedules delete` it)",
                file=sys.stderr,
            )
    if args.json:
        print_json(schedule)
        return 0
    when = f"next fire {format_time(schedule.next_fire_at)}" if schedule.enabled else "disabled"
    print(f"schedule {compact(schedule.name)} created: id {schedule.id}, {when}")
    return 0


async def _update(args: argparse.Namespace) -> int:
    from taskq.cli._output import compact, print_json
    from taskq.models import ScheduleUpdateArgs

    schedule_id = _schedule_id(args.schedule_id)
    if args.queue == "":
        raise ScheduleCommandError(
            "--queue '' names no queue: give --actor-queue for the actor's own queue"
        )
    wanted = _validated(
        ScheduleUpdateArgs,
        cron=args.cron,
        payload=_payload(args.payload) if args.payload is not None else None,
        queue=args.queue,
        actor_queue=args.actor_queue,
        timezone=args.timezone,
        enabled=args.enabled,
    )
    if not wanted.changes():
        raise ScheduleCommandError(
            "nothing to change: give --cron, --payload, --queue, --actor-queue, --timezone, "
            "--enable or --disable"
        )
    checked = None
    if args.app is not None:
        checked = import_app(args.app)
    async with connect_backend(args) as backend:
        try:
            if checked is None:
                schedule = await backend.update_schedule(schedule_id, wanted)
            else:
                from taskq.client import JobsClient

                current = await _find(backend, schedule_id)
                if current is not None and current.actor not in checked.actors:
                    # Another application's actor: nothing here to check it against.
                    raise ScheduleCommandError(
                        f"schedule {compact(current.name)}'s actor {current.actor!r} is not one of "
                        f"{args.app}'s actors: name the application that defines it"
                    )
                # A new payload or queue is checked against the schedule's actor.
                client = JobsClient(backend, checked.actors)
                schedule = await client.update_schedule(schedule_id, wanted)
        except KeyError:
            raise ScheduleCommandError(f"no schedule {schedule_id}") from None
        except ValueError as exc:  # a cron that never fires again, as create says it
            raise ScheduleCommandError(str(exc)) from None
    if args.json:
        print_json(schedule)
        return 0
    # The stored name is anyone's text: escaped, as `schedules list` shows it.
    print(f"schedule {compact(schedule.name)} updated")
    return 0


async def _delete(args: argparse.Namespace) -> int:
    from taskq.cli._output import print_json

    schedule_id = _schedule_id(args.schedule_id)
    async with connect_backend(args) as backend:
        # The protocol's delete returns nothing: for --json the schedule is read first
        # (a change committed between the read and the delete is not in what is printed).
        deleted = await _find(backend, schedule_id) if args.json else None
        if args.json and deleted is None:
            raise ScheduleCommandError(f"no schedule {schedule_id}")
        try:
            await backend.delete_schedule(schedule_id)
        except KeyError:
            raise ScheduleCommandError(f"no schedule {schedule_id}") from None
    if deleted is not None:
        print_json(deleted)
        return 0
    print(f"schedule {schedule_id} deleted")
    return 0


async def _find(backend: Backend, schedule_id: UUID) -> ScheduleRecord | None:
    """The schedule ``schedule_id``, or None; the protocol reads schedules only as a list."""
    return next((s for s in await backend.list_schedules() if s.id == schedule_id), None)
