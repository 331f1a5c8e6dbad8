"""``taskq migrate`` through the installed console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taskq_postgres._migrate import load_migrations
from taskq_testing.postgres import unique_schema_name

TASKQ = str(Path(sys.executable).with_name("taskq"))
BUNDLED = [m.name for m in load_migrations()]


def _taskq(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("TASKQ_DSN", "TASKQ_SCHEMA")}
    return subprocess.run(
        [TASKQ, *args],
        check=False,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _assert_one_clear_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("taskq migrate: error: ")
    return lines[0]


@pytest.mark.postgres
def test_migrate_then_status(pg_database_dsn: str) -> None:
    schema = unique_schema_name()
    first = _taskq("migrate", "--dsn", pg_database_dsn, "--schema", schema)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == [w for name in BUNDLED for w in ("applied", name)]

    again = _taskq("migrate", "--dsn", pg_database_dsn, "--schema", schema)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"schema {schema} is up to date"

    status = _taskq("migrate", "--dsn", pg_database_dsn, "--schema", schema, "--status", "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["schema"] == schema
    assert [(m["name"], m["state"]) for m in report["migrations"]] == [
        (name, "applied") for name in BUNDLED
    ]
    assert all(m["applied_at"] for m in report["migrations"])


@pytest.mark.postgres
def test_dsn_and_schema_come_from_the_environment(pg_database_dsn: str) -> None:
    schema = unique_schema_name()
    env = {"TASKQ_DSN": pg_database_dsn, "TASKQ_SCHEMA": schema}
    before = _taskq("migrate", "--status", **env)
    assert before.returncode == 1, before.stderr  # pending
    assert [line.split()[0] for line in before.stdout.splitlines()] == ["pending"] * len(BUNDLED)

    applied = _taskq("migrate", "--json", **env)
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout) == {"schema": schema, "applied": BUNDLED, "newer": []}


@pytest.mark.postgres
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_status_exits_1_while_a_migration_is_pending(pg_database_dsn: str, as_json: bool) -> None:
    # It exited 0 whatever it listed: a deploy script could not tell a schema that still
    # needs `taskq migrate` from one that is ready without parsing the listing.
    schema = unique_schema_name()
    target = ("--dsn", pg_database_dsn, "--schema", schema, *(("--json",) if as_json else ()))
    fresh = _taskq("migrate", "--status", *target)
    assert fresh.returncode == 1
    many = len(BUNDLED) > 1
    assert fresh.stderr == (
        f"taskq migrate: {len(BUNDLED)} migration{'s' if many else ''} pending in schema "
        f"{schema}: apply {'them' if many else 'it'} with `taskq migrate`\n"
    )
    if as_json:  # the listing is whole all the same
        states = [m["state"] for m in json.loads(fresh.stdout)["migrations"]]
    else:
        states = [line.split()[0] for line in fresh.stdout.splitlines()]
    assert states == ["pending"] * len(BUNDLED)

    assert _taskq("migrate", "--dsn", pg_database_dsn, "--schema", schema).returncode == 0
    ready = _taskq("migrate", "--status", *target)
    assert (ready.returncode, ready.stderr) == (0, "")


@pytest.mark.postgres
def test_the_report_names_the_schema_as_postgres_holds_it(pg_database_dsn: str) -> None:
    schema = unique_schema_name()
    applied = _taskq("migrate", "--dsn", pg_database_dsn, "--schema", schema.upper(), "--json")
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["schema"] == schema


def test_no_dsn_says_how_to_give_one(tmp_path: Path) -> None:
    # Without the [embedded] extra there is no default server: hide pgserver
    # (an installed one would start under ./.taskq/; tests/demo/ covers that).
    code = (
        "import sys; sys.modules['pgserver'] = None\n"
        "from taskq.cli import main\n"
        "sys.exit(main(['migrate']))\n"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("TASKQ_DSN", "TASKQ_SCHEMA")}
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=tmp_path,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = _assert_one_clear_line(result)
    assert "--dsn" in line
    assert "TASKQ_DSN" in line
    assert not (tmp_path / ".taskq").exists()


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://:::bad", "invalid DSN"),
        ("mysql://localhost/x", "invalid DSN"),
        ("postgresql://postgres@127.0.0.1:1/x", "cannot connect"),
    ],
)
def test_bad_dsns_fail_with_one_line(dsn: str, expected: str) -> None:
    assert expected in _assert_one_clear_line(_taskq("migrate", "--dsn", dsn))


def test_passwords_stay_out_of_errors() -> None:
    line = _assert_one_clear_line(_taskq("migrate", "--dsn", "postgresql://u:s3cret@127.0.0.1:1/x"))
    assert "s3cret" not in line


def test_an_invalid_schema_fails_before_connecting() -> None:
    result = _taskq("migrate", "--dsn", "postgresql://postgres@127.0.0.1:1/x", "--schema", "a;b")
    assert "error: --schema: invalid SQL identifier" in _assert_one_clear_line(result)
    from_env = _taskq(
        "migrate", "--dsn", "postgresql://postgres@127.0.0.1:1/x", TASKQ_SCHEMA="order"
    )
    assert "error: TASKQ_SCHEMA: invalid SQL identifier 'order'" in _assert_one_clear_line(from_env)


def test_the_taskq_command_does_not_import_the_driver() -> None:
    code = (
        "import sys\n"
        "from taskq.cli import build_parser\n"
        "from taskq.cli import _collect_commands\n"
        "names = [c.name for c in _collect_commands().commands()]\n"
        "assert 'migrate' in names, names\n"
        "print('asyncpg' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"


def test_a_server_that_never_answers_is_a_timeout_said_as_such() -> None:
    # A listener that accepts and says nothing: the line ended "cannot connect to ...:".
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        dsn = f"postgresql://postgres:pw@127.0.0.1:{port}/x"
        line = _assert_one_clear_line(_taskq("migrate", "--dsn", dsn))
    assert line.startswith("taskq migrate: error: cannot connect to PostgreSQL at")
    assert line.endswith(": TimeoutError") and "pw" not in line


@pytest.mark.postgres
def test_lock_bounds_are_flags(pg_database_dsn: str, tmp_path: Path) -> None:
    # The schema lacks the last bundled file; a transaction holds every table it might
    # change. The command gives up after one 50 ms try, not a minute of them.
    import asyncio

    import psycopg
    from psycopg import sql

    from taskq_postgres._migrate import bundled_migrations, migrate

    for name in BUNDLED[:-1]:
        (tmp_path / name).write_bytes((bundled_migrations() / name).read_bytes())
    schema = unique_schema_name()
    asyncio.run(migrate(pg_database_dsn, schema, source=tmp_path))
    with psycopg.connect(pg_database_dsn) as holder:
        tables = holder.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s"
            " AND tablename <> 'schema_migrations'",
            (schema,),
        ).fetchall()
        holder.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.SQL(", ").join(sql.Identifier(schema, t) for (t,) in tables)
            )
        )
        args = ("migrate", "--dsn", pg_database_dsn, "--schema", schema)
        result = _taskq(*args, "--lock-timeout", "50ms", "--max-lock-wait", "0")
        line = _assert_one_clear_line(result)
        assert f"migration {BUNDLED[-1]} could not lock the tables" in line
        assert "pg_stat_activity" in line
        holder.rollback()
    assert _taskq(*args, "--lock-timeout", "50ms").returncode == 0


@pytest.mark.parametrize(
    ("flag", "value", "error"),
    [
        ("--lock-timeout", "0", "must be more than 0"),
        ("--lock-timeout", "soon", "expected a duration"),
        ("--max-lock-wait", "-1", "must not be negative"),
        ("--lock-timeout", "30d", "must be at most 2147483647ms"),
    ],
)
def test_lock_bounds_out_of_range_are_usage_errors(flag: str, value: str, error: str) -> None:
    result = _taskq("migrate", "--dsn", "postgresql://postgres@127.0.0.1:1/x", f"{flag}={value}")
    assert result.returncode == 1
    assert f"argument {flag}: {error}" in result.stderr


@pytest.mark.postgres
async def test_the_longest_lock_timeout_postgres_takes_is_accepted(pg_database_dsn: str) -> None:
    from taskq_postgres._migrate import MAX_LOCK_TIMEOUT, migrate

    schema = unique_schema_name()
    assert await migrate(pg_database_dsn, schema, lock_timeout=MAX_LOCK_TIMEOUT) == BUNDLED


@pytest.mark.postgres
def test_a_schema_a_newer_taskq_migrated_is_not_called_up_to_date(pg_database_dsn: str) -> None:
    # After a rolled-back deploy, this version's `taskq migrate` said "up to date" of a
    # schema whose newer post migration makes this version's workers refuse it.
    import psycopg
    from psycopg import sql

    schema = unique_schema_name()
    args = ("migrate", "--dsn", pg_database_dsn, "--schema", schema)
    assert _taskq(*args).returncode == 0
    with psycopg.connect(pg_database_dsn) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {} (version, checksum) VALUES (%s, %s), (%s, %s)").format(
                sql.Identifier(schema, "schema_migrations")
            ),
            ("99.00.00_01_pre_future.sql", "a" * 64, "99.00.00_50_post_future.sql", "b" * 64),
        )

    result = _taskq(*args)
    assert result.returncode == 0, result.stderr
    assert "up to date" not in result.stdout
    assert result.stdout.strip() == (
        f"schema {schema} has every migration of this TaskQ, and 2 of a newer one it does "
        f"not know (`taskq migrate --status` lists them as unknown)"
    )
    assert result.stderr.strip() == (
        f"taskq migrate: warning: schema {schema} was migrated by a newer TaskQ "
        f"(99.00.00_50_post_future.sql), which may have removed what this version uses: "
        f"its workers refuse the schema; upgrade taskq-postgres to run on it"
    )
    report = json.loads(_taskq(*args, "--json").stdout)
    assert report == {
        "schema": schema,
        "applied": [],
        "newer": ["99.00.00_01_pre_future.sql", "99.00.00_50_post_future.sql"],
    }


@pytest.mark.postgres
def test_ctrl_c_while_waiting_for_another_migrator_exits_1_saying_so(
    pg_database_dsn: str,
) -> None:
    # Interrupted, it exited 1 in silence: nothing told what the run had done.
    import psycopg

    from tests.cli.cli_helpers import interrupt_once_blocked

    schema = unique_schema_name()
    with psycopg.connect(pg_database_dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtext('taskq:migrate:' || %s))", (schema,))
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
        migrator = subprocess.Popen(
            [TASKQ, "migrate", "--dsn", pg_database_dsn, "--schema", schema],
            env=clean,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = interrupt_once_blocked(migrator, pg_database_dsn, holder.info.backend_pid)
    assert migrator.returncode == 1
    assert out == ""
    assert "Traceback" not in err
    # After the line that said whom it waited for (taskq.migration-waiting-for-lock).
    assert err.strip().splitlines()[-1] == (
        "taskq migrate: interrupted: the files applied before stay applied, the one running "
        "was not recorded; `taskq migrate --status` shows where the schema stands, and "
        "`taskq migrate` goes on from there"
    )
    status = _taskq("migrate", "--dsn", pg_database_dsn, "--schema", schema, "--status")
    assert {line.split()[0] for line in status.stdout.splitlines()} == {"pending"}


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("message", "one_line"),
    [
        ("cannot perform operation: connection is closed", True),
        ("cannot perform operation: another operation is in progress", False),
    ],
    ids=["closed", "busy"],
)
def test_only_a_closed_connections_interface_error_is_one_line(
    pg_database_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    message: str,
    one_line: bool,
) -> None:
    # Every asyncpg InterfaceError was "database error on ...": a second statement on a
    # busy connection, a bug of ours, lost the traceback that showed where.
    import asyncpg

    from taskq.cli import main

    async def fails(*_: object) -> None:
        raise asyncpg.InterfaceError(message)

    monkeypatch.setattr("taskq_postgres._migrate.migration_status", fails)
    # In-process: leave the logging configuration of the tests that follow alone.
    monkeypatch.setattr("taskq.logs.configure_logging", lambda **_: None)
    monkeypatch.setattr("taskq_postgres._cli._log_to_stderr", lambda: None)
    argv = ["migrate", "--status", "--dsn", pg_database_dsn, "--schema", unique_schema_name()]
    if one_line:
        assert main(argv) == 1
        assert capsys.readouterr().err.startswith("taskq migrate: error: database error on ")
    else:
        with pytest.raises(asyncpg.InterfaceError, match="another operation is in progress"):
            main(argv)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "message",
    ["cannot switch to state 15; another operation (2) is in progress", "not connected"],
    ids=["switch", "not-connected"],
)
def test_a_connection_the_server_has_just_ended_is_one_line(
    pg_database_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    message: str,
) -> None:
    # What a statement meets on a connection a restart has just ended, before asyncpg
    # read the socket's end: the database's doing (client_fault says so), yet taskq
    # migrate let it out as a traceback, where taskq and taskq-worker say it in one line.
    import asyncpg

    from taskq.cli import main

    async def fails(*_: object) -> None:
        raise asyncpg.InternalClientError(message)

    monkeypatch.setattr("taskq_postgres._migrate.migration_status", fails)
    monkeypatch.setattr("taskq.logs.configure_logging", lambda **_: None)
    monkeypatch.setattr("taskq_postgres._cli._log_to_stderr", lambda: None)
    argv = ["migrate", "--status", "--dsn", pg_database_dsn, "--schema", unique_schema_name()]
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith("taskq migrate: error: database error on ")
