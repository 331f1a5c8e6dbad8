"""``taskq enqueue`` against a real Postgres schema, with a real worker to run the jobs."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from uuid import UUID

import pytest

from tests.cli.cli_helpers import APP, Cli, clean_env, error_line, run

pytestmark = pytest.mark.postgres


def test_enqueued_jobs_run_and_show_their_history(cli: Cli) -> None:
    # flags, with no TASKQ_* in the environment
    by_flags = run(
        "taskq",
        *("enqueue", APP, "nap", '{"tag": "flags"}', "--dsn", cli.pg.dsn, "--schema", cli.pg.name),
        env=clean_env(),
    )
    assert by_flags.returncode == 0, by_flags.stderr
    flags_id = UUID(by_flags.stdout.strip())
    # the environment
    env_id = UUID(cli.ok("enqueue", APP, "nap", '{"tag": "env"}').strip())

    cli.work_until_idle()

    shown = cli.json("jobs", "show", str(flags_id))
    assert shown["job"]["status"] == "succeeded"
    assert shown["job"]["result"] == {"tag": "flags", "attempt": 1}
    assert [a["outcome"] for a in shown["attempts"]] == ["succeeded"]
    assert [e["detail"]["to_state"] for e in shown["events"]] == ["running", "succeeded"]

    text = cli.ok("jobs", "show", str(env_id))
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines())
    assert fields["status"].strip() == "succeeded"
    assert fields["result"].strip() == '{"tag": "env", "attempt": 1}'
    attempts = text.split("attempts:\n")[1].split("\n\n")[0].splitlines()
    assert attempts[0].split() == ["attempt", "outcome", "started", "duration", "error"]
    assert attempts[1].split()[:2] == ["1", "succeeded"]
    events = text.split("events:\n")[1].splitlines()
    assert events[0].split() == ["id", "time", "kind", "detail"]
    assert "to_state=succeeded" in events[-1]


def test_options_reach_the_job(cli: Cli) -> None:
    args = ("enqueue", APP, "nap", '{"seconds": 0.5}', "--delay", "1h", "--priority", "7")
    row = cli.json(*args, "--queue", "other", "--idempotency-key", "k1")
    assert row["status"] == "scheduled"
    assert (row["actor"], row["queue"], row["priority"]) == ("nap", "other", 7)
    assert row["payload"] == {"seconds": 0.5, "tag": ""}
    assert row["idempotency_key"] == "k1"
    delay = datetime.fromisoformat(row["scheduled_at"]) - datetime.fromisoformat(row["created_at"])
    assert timedelta(minutes=59) < delay <= timedelta(hours=1, seconds=1)

    # The same key again: the stored job's id, and on stderr that nothing new was
    # enqueued (the id alone read as a new job, its payload dropped in silence).
    again = cli.taskq(*args[:3], '{"seconds": 9}', "--idempotency-key", "k1")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == row["id"]
    assert again.stderr == (
        f"taskq enqueue: job {row['id']} (scheduled) already had idempotency key 'k1': "
        f"nothing new was enqueued, and that job keeps its own payload and options\n"
    )
    assert cli.json("jobs", "show", row["id"])["job"]["payload"] == {"seconds": 0.5, "tag": ""}
    # A new key is a new job, with nothing said.
    assert cli.ok(*args, "--idempotency-key", "k2").strip() != row["id"]


def test_bad_input_is_one_line_and_enqueues_nothing(cli: Cli) -> None:
    cases = [
        ("nap", '{"tag": ', "not valid JSON"),
        ("no_such_actor", "{}", "unknown actor 'no_such_actor'"),
        ("nap", '{"seconds": "soon"}', "invalid payload for actor 'nap': seconds"),
        # Each of these printed a traceback: Python's parser takes them, a job cannot.
        ("nap", '{"seconds": NaN}', "NaN is not a JSON number"),
        ("nap", '{"tag": -Infinity}', "-Infinity is not a JSON number"),
        ("nap", '{"seconds": ' + "9" * 5000 + "}", "not valid JSON (Exceeds the limit"),
        ("nap", "[" * 20_000 + "]" * 20_000, "not valid JSON (it is nested too deeply)"),
        ("nap", '{"seconds": 1e400}', "Infinity is not a JSON number"),
        ("nap", '{"tag": "\\ud800"}', "lone surrogate"),
    ]
    for actor, payload, expected in cases:
        assert expected in error_line(cli.taskq("enqueue", APP, actor, payload))
    assert "cannot import 'tests.apps.nope'" in error_line(
        cli.taskq("enqueue", "tests.apps.nope:tq", "nap", "{}")
    )
    # A bad schema is blamed on where it came from, here the environment, not --schema.
    bad_schema = run("taskq", "jobs", "list", env={**cli.env(), "TASKQ_SCHEMA": "bad-x"})
    assert "error: TASKQ_SCHEMA: invalid SQL identifier 'bad-x'" in error_line(bad_schema)
    assert cli.ok("jobs", "list") == "no jobs\n"


def test_the_applications_backend_options_reach_the_enqueue(cli: Cli, tmp_path: Path) -> None:
    # The command rebuilt the application on its URL without the options its code gave
    # the backend (a password, password_file or direct_dsn): against a server that asks
    # for the password, `taskq enqueue` was refused where the worker was not. Here the
    # password is a callable, which the driver calls when it connects.
    marker = tmp_path / "asked"
    (tmp_path / "app_with_password.py").write_text(
        "import os\n"
        "from pathlib import Path\n"
        "from taskq import TaskQ\n"
        "from tests.apps.basic import nap\n"
        "def password() -> str:\n"
        "    Path(os.environ['PASSWORD_ASKED']).write_text('yes')\n"
        "    return 'unused'\n"
        "tq = TaskQ(os.environ['APP_DSN'], schema=os.environ['APP_SCHEMA'], actors=[nap],\n"
        "           password=password)\n"
    )
    env = clean_env(
        PYTHONPATH=str(tmp_path),
        APP_DSN=cli.pg.dsn,
        APP_SCHEMA=cli.pg.name,
        PASSWORD_ASKED=str(marker),
    )
    result = run("taskq", "enqueue", "app_with_password:tq", "nap", "{}", env=env)
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "yes"
    assert cli.json("jobs", "list")[0]["id"] == result.stdout.strip()


@pytest.mark.parametrize(
    "command",
    [("enqueue", "app_logging:tq", "nap", "{}"), ("schedules", "create", "s", "nap", "* * * * *")],
    ids=["enqueue", "schedules-create"],
)
def test_an_applications_logging_set_up_at_import_is_kept(
    cli: Cli, tmp_path: Path, command: tuple[str, ...]
) -> None:
    # `taskq` routed the standard library's records before importing the application,
    # whose logging.basicConfig then did nothing: its lines came out as TaskQ's JSON, and
    # its info lines not at all (taskq-worker routes after the import).
    (tmp_path / "app_logging.py").write_text(
        "import logging\n"
        'logging.basicConfig(level=logging.INFO, format="APP %(levelname)s %(message)s")\n'
        "from tests.apps.basic import tq\n"
        'logging.getLogger("app").info("imported")\n'
    )
    app = ("--app", "app_logging:tq") if command[0] == "schedules" else ()
    result = run("taskq", *command, *app, env=cli.env(PYTHONPATH=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert "APP INFO imported" in result.stderr.splitlines()
    assert "imported" not in result.stderr.replace("APP INFO imported", "")
