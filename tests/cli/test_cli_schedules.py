"""``taskq schedules list|create|update|delete`` against a real Postgres schema."""

from __future__ import annotations

import json
from uuid import uuid4

import pytest

from tests.cli.cli_helpers import APP, Cli, clean_env, error_line, run

pytestmark = pytest.mark.postgres


def _created_id(output: str) -> str:
    # "schedule NAME created: id UUID, next fire TIME"
    return output.split(" id ")[1].split(",")[0]


def _registered(cli: Cli, *actors: str) -> None:
    """``actors`` registered as a worker registers them at its start."""
    from taskq.models import ActorConfig

    configs = [ActorConfig(actor=name, queue="default") for name in actors]
    cli.on_backend(lambda backend: backend.register_actors(configs))


def test_create_list_update_delete(cli: Cli) -> None:
    _registered(cli, "nap", "nap_sync")
    out = cli.ok(
        "schedules", "create", "nightly", "nap", "0 3 * * *",
        "--payload", '{"seconds": 0.5}', "--queue", "batch", "--timezone", "Europe/Paris",
    )  # fmt: skip
    assert out.startswith("schedule nightly created: id ")
    assert "next fire " in out
    nightly = _created_id(out)
    paused = cli.ok("schedules", "create", "paused", "nap_sync", "*/5 * * * *", "--disabled")
    assert paused.endswith(", disabled\n")
    paused_id = _created_id(paused)

    listed = cli.json("schedules", "list")
    assert [s["name"] for s in listed] == ["nightly", "paused"]
    first = listed[0]
    assert first["id"] == nightly
    assert (first["actor"], first["cron"], first["queue"], first["timezone"]) == (
        "nap", "0 3 * * *", "batch", "Europe/Paris"
    )  # fmt: skip
    assert first["payload"] == {"seconds": 0.5}
    assert first["enabled"] is True and first["next_fire_at"] is not None
    assert listed[1]["enabled"] is False and listed[1]["next_fire_at"] is None
    assert [s["name"] for s in cli.json("schedules", "list", "--actor", "nap_sync")] == ["paused"]

    # text table, with --dsn/--schema instead of the environment
    text = run(
        "taskq", "schedules", "list", "--dsn", cli.pg.dsn, "--schema", cli.pg.name,
        env=clean_env(),
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    header, *lines = text.stdout.splitlines()
    assert header.split() == [
        "id", "name", "actor", "cron", "timezone", "queue", "enabled", "next_fire_at"
    ]  # fmt: skip
    assert [line.split()[:3] for line in lines] == [
        [nightly, "nightly", "nap"], [paused_id, "paused", "nap_sync"]
    ]  # fmt: skip

    assert cli.ok("schedules", "update", paused_id, "--enable", "--cron", "0 * * * *") == (
        "schedule paused updated\n"
    )
    assert cli.ok("schedules", "update", nightly, "--disable", "--payload", "{}") == (
        "schedule nightly updated\n"
    )
    by_name = {s["name"]: s for s in cli.json("schedules", "list")}
    assert by_name["paused"]["enabled"] is True and by_name["paused"]["cron"] == "0 * * * *"
    assert by_name["paused"]["next_fire_at"] is not None
    assert by_name["nightly"]["enabled"] is False and by_name["nightly"]["payload"] == {}
    assert by_name["nightly"]["queue"] == "batch"  # untouched options are kept

    assert cli.ok("schedules", "delete", nightly) == f"schedule {nightly} deleted\n"
    assert [s["name"] for s in cli.json("schedules", "list")] == ["paused"]
    cli.ok("schedules", "delete", paused_id)
    assert cli.ok("schedules", "list") == "no schedules\n"


def test_an_actor_no_worker_registered_is_created_with_a_warning(cli: Cli) -> None:
    # It was created silently, and its slots were enqueued every second for nobody.
    made = cli.taskq("schedules", "create", "typo", "npa", "* * * * *")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("schedule typo created: id ")
    assert made.stderr == (
        "taskq schedules: warning: no worker has registered actor 'npa'; its slots wait "
        "until one runs it (a typo? `taskq schedules delete` it)\n"
    )
    _registered(cli, "nap")
    assert cli.ok("schedules", "create", "fine", "nap", "* * * * *").startswith("schedule fine")


def test_refusals_are_one_line_errors(cli: Cli) -> None:
    _registered(cli, "nap")
    created = cli.ok("schedules", "create", "once", "nap", "* * * * *")
    schedule_id = _created_id(created)
    unknown = str(uuid4())

    cases = {
        ("create", "once", "nap", "* * * * *"): "a schedule named 'once' already exists",
        ("create", "bad", "nap", "not cron"): (
            "cron: invalid cron expression 'not cron': expected minute hour day-of-month "
            "month day-of-week, e.g. '*/5 * * * *'"
        ),
        ("create", "bad", "nap", "* * * * *", "--timezone", "Mars/Olympus"): (
            "timezone: unknown timezone 'Mars/Olympus': name an IANA zone (e.g. 'Europe/Paris') "
            "or 'UTC'"
        ),
        # Zone names are case-sensitive: it said "unknown timezone 'utc'", and no more.
        ("create", "bad", "nap", "* * * * *", "--timezone", "europe/paris"): (
            "timezone: unknown timezone 'europe/paris': did you mean 'Europe/Paris'?"
        ),
        ("update", schedule_id, "--timezone", "utc"): "did you mean 'UTC'?",
        # A region, looked up as a file, is a directory: an IsADirectoryError traceback.
        ("create", "bad", "nap", "* * * * *", "--timezone", "America"): (
            "timezone: unknown timezone 'America': 'America' is a region: name one of its "
            "zones, e.g. 'America/"
        ),
        ("create", "bad", "nap", "* * * * *", "--payload", "{oops"): "--payload is not valid JSON",
        # Past an index entry of the unique name: a ProgramLimitExceededError traceback.
        # (Random: Postgres compresses a repetitive one below the limit.)
        ("create", "".join(uuid4().hex for _ in range(100)), "nap", "* * * * *"): (
            "name: must be at most 256 bytes of UTF-8, got 3200"
        ),
        ("create", "bad", "nap", "* * * * *", "--payload", "[1]"): (
            "--payload must be a JSON object"
        ),
        # Read in the leader host's own zone, which changes with the leader.
        ("create", "bad", "nap", "* * * * *", "--timezone", "localtime"): (
            "timezone: timezone 'localtime' means whatever the host"
        ),
        ("update", schedule_id, "--timezone", "posixrules"): (
            "name an IANA zone (e.g. 'Europe/Paris') or 'UTC'"
        ),
        ("update", schedule_id): "nothing to change",
        ("update", unknown, "--disable"): f"no schedule {unknown}",
        ("update", schedule_id, "--cron", "61 * * * *"): "invalid cron expression",
        # A year long past: a traceback, where create said it in one line.
        ("update", schedule_id, "--cron", "0 0 1 1 * 0 2020"): "never fires after now",
        ("delete", unknown): f"no schedule {unknown}",
        ("delete", "not-a-uuid"): "'not-a-uuid' is not a schedule id",
    }
    for args, expected in cases.items():
        assert expected in error_line(cli.taskq("schedules", *args)), args
    assert [s["name"] for s in cli.json("schedules", "list")] == ["once"]


def test_enable_and_disable_are_exclusive(cli: Cli) -> None:
    result = cli.taskq("schedules", "update", str(uuid4()), "--enable", "--disable")
    assert result.returncode == 1  # a usage error; 2 is a watchdog trip
    assert "not allowed with argument" in result.stderr


def test_app_checks_the_actor_payload_and_queue_up_front(cli: Cli) -> None:
    # Without it, a payload the actor refuses was stored, and each slot's job failed.
    _registered(cli, "nap")
    app = ("--app", APP)
    refused = {
        ("create", "bad", "nap", "* * * * *", "--payload", '{"seconds": "soon"}'): "seconds",
        ("create", "bad", "npa", "* * * * *"): "npa",
    }
    for args, named in refused.items():
        assert named in error_line(cli.taskq("schedules", *args, *app)), args
    assert cli.json("schedules", "list") == []
    made = cli.ok("schedules", "create", "fine", "nap", "* * * * *", "--payload", "{}", *app)
    fine = _created_id(made)
    bad = cli.taskq("schedules", "update", fine, "--payload", '{"seconds": "soon"}', *app)
    assert "seconds" in error_line(bad)
    assert cli.json("schedules", "list")[0]["payload"] == {}
    # Without --app the payload is the worker's to check, as before.
    cli.ok("schedules", "update", fine, "--payload", '{"seconds": "soon"}')
    # An actor the application does not define is said, not passed unchecked.
    created = cli.taskq("schedules", "create", "other", "elsewhere", "* * * * *")
    assert created.returncode == 0, created.stderr  # with a warning: no worker runs it here
    other = _created_id(created.stdout)
    assert "not one of" in error_line(cli.taskq("schedules", "update", other, "--disable", *app))


def test_a_schedule_change_the_database_gave_up_on_points_at_schedules_list(cli: Cli) -> None:
    # It said "a change it was making may have been made: `taskq jobs list` shows",
    # which lists no schedule.
    import psycopg
    from psycopg import sql

    _registered(cli, "nap")
    separator = "&" if "?" in cli.pg.dsn else "?"
    bounded = f"{cli.pg.dsn}{separator}lock_timeout=100"
    with psycopg.connect(cli.pg.dsn) as holder:
        holder.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(cli.pg.name, "schedules")
            )
        )
        result = run(
            "taskq", "schedules", "create", "held", "nap", "* * * * *",
            env=clean_env(TASKQ_DSN=bounded, TASKQ_SCHEMA=cli.pg.name),
        )  # fmt: skip
        holder.rollback()
    line = error_line(result)
    assert "LockNotAvailableError" in line
    assert line.endswith(
        "(a change it was making may have been made: `taskq schedules list` shows)"
    )
    assert cli.json("schedules", "list") == []


def test_a_stored_schedule_name_is_escaped_where_a_change_names_it(cli: Cli) -> None:
    # `schedules list` escaped a name's control characters, but `update` printed the
    # stored name raw: '\x1b[2J' cleared the operator's terminal, '\x1b]0;...\x07'
    # retitled it.
    from taskq.models import ScheduleCreateArgs

    name = "nightly\x1b]0;PWNED\x07\x1b[2J"
    created = cli.on_backend(
        lambda b: b.create_schedule(
            ScheduleCreateArgs(name=name, actor="nap", cron="* * * * *", enabled=False)
        )
    )
    said = cli.ok("schedules", "update", str(created.id), "--cron", "0 * * * *")
    assert said == "schedule nightly\\x1b]0;PWNED\\x07\\x1b[2J updated\n"
    made = cli.taskq("schedules", "create", "tab\tbed\x1b[31m", "nap", "* * * * *", "--disabled")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("schedule tab bed\\x1b[31m created: id ")


def test_list_enabled_or_disabled_only(cli: Cli) -> None:
    _registered(cli, "nap", "nap_sync")
    cli.ok("schedules", "create", "on", "nap", "0 3 * * *")
    cli.ok("schedules", "create", "off", "nap", "0 3 * * *", "--disabled")
    cli.ok("schedules", "create", "off_too", "nap_sync", "*/5 * * * *", "--disabled")
    assert [s["name"] for s in cli.json("schedules", "list", "--enabled")] == ["on"]
    assert [s["name"] for s in cli.json("schedules", "list", "--disabled")] == ["off", "off_too"]
    both = cli.json("schedules", "list", "--disabled", "--actor", "nap_sync")
    assert [s["name"] for s in both] == ["off_too"]
    assert [s["name"] for s in cli.json("schedules", "list")] == ["off", "off_too", "on"]
    text = cli.ok("schedules", "list", "--enabled")
    assert [line.split()[1] for line in text.splitlines()[1:]] == ["on"]
    assert cli.ok("schedules", "list", "--enabled", "--actor", "nap_sync") == (
        "no enabled schedules\n"
    )

    result = cli.taskq("schedules", "list", "--enabled", "--disabled")
    assert result.returncode == 1  # a usage error; 2 is a watchdog trip
    assert "argument --disabled: not allowed with argument --enabled" in result.stderr


def test_create_update_and_delete_print_the_schedule_as_json(cli: Cli) -> None:
    # Only `list` had --json: a script had to parse "created: id UUID, next fire …".
    _registered(cli, "nap")
    made = cli.json(
        "schedules", "create", "nightly", "nap", "0 3 * * *", "--payload", '{"n": 1}',
        "--queue", "batch",
    )  # fmt: skip
    listed = cli.json("schedules", "list")
    assert made == listed[0]
    assert (made["name"], made["queue"], made["payload"]) == ("nightly", "batch", {"n": 1})
    assert made["enabled"] is True and made["next_fire_at"] is not None

    changed = cli.json("schedules", "update", made["id"], "--disable", "--payload", "{}")
    assert changed == cli.json("schedules", "list")[0]
    assert (changed["id"], changed["enabled"], changed["payload"]) == (made["id"], False, {})
    assert changed["next_fire_at"] is None

    assert cli.json("schedules", "delete", made["id"]) == changed
    assert cli.json("schedules", "list") == []
    gone = cli.taskq("schedules", "delete", made["id"], "--json")
    assert error_line(gone) == f"taskq: error: no schedule {made['id']}"
    assert gone.stdout == ""

    # The warning for an actor no worker runs stays on stderr: stdout is JSON alone.
    typo = cli.taskq("schedules", "create", "typo", "npa", "* * * * *", "--json")
    assert typo.returncode == 0, typo.stderr
    assert json.loads(typo.stdout)["actor"] == "npa"
    assert "no worker has registered actor 'npa'" in typo.stderr


def test_update_actor_queue_puts_the_jobs_back_on_the_actors_own_queue(cli: Cli) -> None:
    # `update --queue Q` set a queue, and nothing unset it: the schedule's jobs stayed on
    # Q even after the actor moved to another queue.
    _registered(cli, "nap")
    made = cli.json("schedules", "create", "nightly", "nap", "0 3 * * *", "--queue", "batch")
    assert made["queue"] == "batch"
    back = cli.json("schedules", "update", made["id"], "--actor-queue")
    assert back["queue"] is None
    assert (back["cron"], back["next_fire_at"]) == (made["cron"], made["next_fire_at"])
    text = cli.ok("schedules", "list")
    assert "(the actor's)" in text.splitlines()[1]
    # with --app too: the actor's own queue is checked as each slot's job will be built
    again = cli.json("schedules", "update", made["id"], "--queue", "batch", "--app", APP)
    assert again["queue"] == "batch"
    assert (
        cli.json("schedules", "update", made["id"], "--actor-queue", "--app", APP)["queue"] is None
    )

    both = cli.taskq("schedules", "update", made["id"], "--queue", "q", "--actor-queue")
    assert both.returncode == 1  # a usage error; 2 is a watchdog trip
    assert "argument --actor-queue: not allowed with argument --queue" in both.stderr
    assert error_line(cli.taskq("schedules", "update", made["id"], "--queue", "")) == (
        "taskq: error: --queue '' names no queue: give --actor-queue for the actor's own queue"
    )
    empty = cli.taskq("schedules", "create", "other", "nap", "* * * * *", "--queue", "")
    assert "leave --queue out for the actor's own queue" in error_line(empty)
    assert cli.json("schedules", "list")[0]["queue"] is None
