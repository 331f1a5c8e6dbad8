"""``taskq enqueue`` and ``taskq jobs``: help, usage errors and the missing-DSN message.

Nothing here reaches a database.
"""

from __future__ import annotations

import pytest

from taskq.plugins import get_plugin_manager
from tests.cli.cli_helpers import APP, clean_env, error_line, run


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        (
            ["enqueue"],
            ["--dsn", "--schema", "--delay", "--priority", "--queue", "--idempotency-key"],
        ),
        (["jobs"], ["list", "show", "retry", "cancel"]),
        (["jobs", "list"], ["--status", "--active", "--finished", "--actor", "--queue", "--limit"]),
        (["jobs", "show"], ["JOB_ID", "--json"]),
        (["jobs", "retry"], ["JOB_ID", "--dsn"]),
        (["jobs", "cancel"], ["JOB_ID", "--reason"]),
    ],
    ids=" ".join,
)
def test_every_subcommand_has_help(command: list[str], flags: list[str]) -> None:
    result = run("taskq", *command, "--help", env=clean_env())
    assert result.returncode == 0, result.stderr
    assert f"usage: taskq {' '.join(command)}" in result.stdout
    for flag in flags:
        assert flag in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["enqueue", APP, "nap", "{}", "--delay", "soon"],
        ["jobs"],
        ["jobs", "list", "--active", "--finished"],
        ["jobs", "list", "--status", "done"],
        ["jobs", "list", "--limit", "0"],
    ],
    ids=" ".join,
)
def test_usage_errors_exit_1(args: list[str]) -> None:
    # API.md's exit codes: 1 an error, 2 a watchdog trip only (argparse's default is 2).
    result = run("taskq", *args, env=clean_env())
    assert result.returncode == 1
    assert f"usage: taskq {args[0]}" in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["enqueue", APP, "nap", "{}", "--delay", "-5s"],
            (
                "argument --delay: must not be negative, got '-5s'; to run the job now, "
                "leave --delay out or give 0"
            ),
        ),
        (
            ["migrate", "--lock-timeout", "-50ms"],
            "argument --lock-timeout: must be more than 0, got '-50ms'",
        ),
        (
            ["migrate", "--max-lock-wait", "-1m"],
            (
                "argument --max-lock-wait: must not be negative, got '-1m'; give 0 to try "
                "each migration once, without retrying"
            ),
        ),
    ],
    ids=["enqueue --delay", "migrate --lock-timeout", "migrate --max-lock-wait"],
)
def test_a_negative_duration_given_as_its_own_argument_reaches_the_duration_check(
    args: list[str], expected: str
) -> None:
    # argparse took "-5s" for an option: "--delay -5s" said "expected one argument",
    # where "--delay=-5s" said what was wrong.
    result = run("taskq", *args, env=clean_env())
    assert result.returncode == 1
    assert f"taskq {args[0]}: error: {expected}\n" in result.stderr


@pytest.mark.parametrize(
    "args", [["enqueue", APP, "nap", "{}"], ["jobs", "list"], ["jobs", "cancel", "0" * 32]]
)
def test_no_dsn_anywhere_says_how_to_give_one(args: list[str]) -> None:
    # The plugins offering a default DSN (an embedded server) are turned off, so
    # nothing is started; postgresql:// may go with them, which no DSN needs.
    defaults = get_plugin_manager().hook.taskq_default_dsn.get_hookimpls()
    offering = [impl.plugin_name for impl in defaults]
    assert "core" not in offering
    env = clean_env(TASKQ_DISABLE_PLUGINS=",".join(offering))
    line = error_line(run("taskq", *args, env=env))
    assert "--dsn" in line
    assert "TASKQ_DSN" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # A bare ValueError or OverflowError from URL parsing and asyncpg, as tracebacks.
        (["jobs", "list", "--dsn", "postgresql://[::1/x"], "invalid DSN"),
        (["enqueue", APP, "nap", "{}", "--dsn", "postgresql://[::1/x"], "invalid DSN"),
        (["migrate", "--dsn", "postgresql://u@127.0.0.1:99999/x"], "Port out of range"),
        # Bytes the locale cannot decode (a lone surrogate): asyncpg's traceback, from
        # inside its connect, in every command.
        (["jobs", "list", "--dsn", "postgresql://u@127.0.0.1:1/\udcff"], "not UTF-8 text"),
        (["migrate", "--dsn", "postgresql://u:p\udcff@127.0.0.1:1/x"], "not UTF-8 text"),
    ],
    ids=" ".join,
)
def test_a_dsn_that_cannot_be_parsed_is_one_line(args: list[str], expected: str) -> None:
    result = run("taskq", *args, env=clean_env())
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert expected in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "args",
    [["enqueue", APP, "nap", "{}"], ["jobs", "list"], ["schedules", "list"]],
)
def test_memory_is_refused_where_other_processes_jobs_are_meant(args: list[str]) -> None:
    # The job would be stored in this command's process and gone as it exits.
    result = run("taskq", *args, "--dsn", "memory://", env=clean_env())
    assert result.returncode == 1
    assert "memory:// lives inside one process" in error_line(result)


def test_the_exit_codes_are_public_where_api_md_names_them() -> None:
    import taskq.cli
    import taskq.worker

    assert (taskq.cli.EXIT_OK, taskq.cli.EXIT_ERROR, taskq.cli.EXIT_WATCHDOG) == (0, 1, 2)
    assert taskq.worker.EXIT_WATCHDOG == 2
    assert "EXIT_WATCHDOG" in taskq.worker.__all__ and "EXIT_WATCHDOG" in taskq.cli.__all__


@pytest.mark.parametrize("command", ["migrate", "embedded"])
def test_a_command_of_a_turned_off_plugin_says_so(command: str) -> None:
    # It said "not installed: pip install taskq-postgres" of an installed distribution.
    result = run("taskq", command, "--help", env=clean_env(TASKQ_DISABLE_PLUGINS="postgres"))
    assert result.returncode == 1
    assert (
        f"`taskq {command}` comes with taskq-postgres, which is installed but turned off by "
        f"TASKQ_DISABLE_PLUGINS (postgres)"
    ) in error_line(result)


def test_a_distribution_that_is_not_installed_is_named_with_its_install_command() -> None:
    from taskq.plugins._registry import why_absent

    assert why_absent("taskq-nowhere") == "which is not installed: pip install taskq-nowhere"


def test_a_command_of_a_missing_extra_names_the_extra() -> None:
    # taskq-postgres registers `taskq embedded` only with its [embedded] extra; without
    # it the message said the plugin "did not load", while `taskq plugins` showed it had.
    from taskq.cli import CommandRegistry, _missing_command

    without_extra = CommandRegistry()  # the postgres plugin loaded, no embedded command
    assert _missing_command(without_extra, ["embedded", "status"]) == (
        "`taskq embedded` comes with the [embedded] extra of taskq-postgres, which is not "
        "installed: pip install 'taskq-postgres[embedded]'"
    )


@pytest.mark.parametrize(
    "args", [["migrate"], ["jobs", "list"], ["schedules", "list"]], ids=" ".join
)
def test_an_empty_schema_is_refused_not_replaced_by_the_default(args: list[str]) -> None:
    # It silently meant "taskq" here, where taskq-worker refuses it.
    result = run(
        "taskq", *args, "--schema", "", "--dsn", "postgresql://u@127.0.0.1:1/x", env=clean_env()
    )
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert ": error: --schema: invalid SQL identifier ''" in line


@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "list", "--actor", "n\udcff"],
        ["jobs", "list", "--queue", "q\udcff"],
        ["schedules", "list", "--actor", "n\udcff"],
    ],
    ids=["jobs list --actor", "jobs list --queue", "schedules list --actor"],
)
def test_a_name_of_undecodable_bytes_is_a_usage_error_not_a_traceback(args: list[str]) -> None:
    # b"\xff" in argv reaches Python as a lone surrogate: JobFilter's validation error
    # (jobs list) and the driver's encoding error (schedules list) came out as tracebacks.
    result = run("taskq", *args, "--dsn", "postgresql://u@127.0.0.1:1/x", env=clean_env())
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"taskq {args[0]} list: error: argument {args[2]}: must be valid Unicode text" in (
        result.stderr
    )


def test_schedules_create_help_places_the_seconds_field_as_croniter_reads_it() -> None:
    # "(a 6th field: seconds)" read as Quartz's seconds-first layout: '*/10 * * * * *'
    # for "every 10 seconds" fired every second of every tenth minute.
    import re
    from datetime import UTC, datetime, timedelta

    from taskq.backend.cron import next_fire_at

    result = run("taskq", "schedules", "create", "--help", env=clean_env())
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "a 6th field, after the day of the week, gives seconds" in text
    found = re.search(r"'([^']+)' is every 10 seconds", text)
    assert found is not None, text
    start = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    first = next_fire_at(found.group(1), "UTC", start)
    assert first is not None
    assert next_fire_at(found.group(1), "UTC", first) == first + timedelta(seconds=10)


@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "list"],
        ["jobs", "cancel", "0" * 32],
        ["schedules", "list"],
        ["enqueue", APP, "nap", "{}"],
        ["migrate", "--status"],
    ],
    ids=" ".join,
)
def test_an_empty_dsn_is_refused_not_replaced_by_the_environments(args: list[str]) -> None:
    # `--dsn "$PROD_URL"` with the variable unset acted on TASKQ_DSN's database (or
    # started an embedded server) in silence, where an empty --schema is refused.
    elsewhere = "postgresql://u@127.0.0.1:1/elsewhere"
    env = clean_env(TASKQ_DSN=elsewhere, TASKQ_DIRECT_DSN=elsewhere)
    result = run("taskq", *args, "--dsn", "", env=env)
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert ": error: --dsn is empty: give a database URL" in line
    assert "elsewhere" not in line
