"""A role without the rights TaskQ needs gets one line naming the role, the right, the
object and the fix: from ``taskq-worker``, ``taskq migrate``, ``taskq enqueue``, an
application's enqueue and ``SyncJobsClient``; never a driver's traceback.

Each test makes a login role of its own (roles are cluster-wide: a random name, and
dropped after), and connects as it: the server trusts local logins, so the DSN only
names the user (and a password it ignores, to check that none is shown).
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from taskq import TaskQ
from taskq_postgres import InsufficientPrivilegeError, MigrationError, SyncJobsClient
from taskq_testing.postgres import PgSchema, unique_schema_name
from tests.apps.basic import Sleep, nap
from tests.cli.cli_helpers import APP, clean_env, run

pytestmark = pytest.mark.postgres

PASSWORD = "s3cret-pw"


@dataclass(frozen=True)
class Role:
    name: str
    dsn: str
    """The session database, as this role (with a password the server ignores)."""
    admin_dsn: str

    def grant(self, statement: str, *names: str) -> None:
        """Run ``statement`` as the admin, ``{}`` the identifiers ``names`` then the role."""
        idents = [sql.Identifier(n) for n in (*names, self.name)]
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL(statement).format(*idents))


@pytest.fixture
def role(pg_database_dsn: str) -> Iterator[Role]:
    name = f"taskq_test_role_{secrets.token_hex(6)}"
    with psycopg.connect(pg_database_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    parts = urlsplit(pg_database_dsn)
    host = parts.netloc.rpartition("@")[2]
    dsn = urlunsplit(parts._replace(netloc=f"{name}:{PASSWORD}@{host}"))
    try:
        yield Role(name, dsn, pg_database_dsn)
    finally:
        with psycopg.connect(pg_database_dsn, autocommit=True) as admin:
            # What it owns and was granted in the session database (the only one it
            # touched), then the role itself.
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _one_line(result: subprocess.CompletedProcess[str], prefix: str) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(prefix), lines[0]
    assert PASSWORD not in result.stderr
    return lines[0]


def _worker(role: Role, pg_schema: PgSchema) -> subprocess.CompletedProcess[str]:
    """``taskq-worker --until-idle`` as ``role`` on ``pg_schema``."""
    return run(
        "taskq-worker",
        APP,
        "--dsn",
        role.dsn,
        "--schema",
        pg_schema.name,
        "--until-idle",
        env=clean_env(TASKQ_STARTUP_WAIT="0"),
    )


def _worker_error(role: Role, pg_schema: PgSchema) -> str:
    """The one line ``taskq-worker --until-idle`` as ``role`` on ``pg_schema`` fails with."""
    return _one_line(_worker(role, pg_schema), "taskq-worker: error: ")


def test_a_worker_without_usage_on_the_schema_says_so_in_one_line(
    role: Role, pg_schema: PgSchema
) -> None:
    line = _worker_error(role, pg_schema)
    assert f"role '{role.name}' lacks USAGE on schema {pg_schema.name} " in line
    assert f"GRANT USAGE ON SCHEMA {pg_schema.name} TO {role.name}" in line


def test_a_worker_that_may_read_but_not_write_the_jobs_says_which_rights_lack(
    role: Role, pg_schema: PgSchema
) -> None:
    role.grant("GRANT USAGE ON SCHEMA {} TO {}", pg_schema.name)
    role.grant("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}", pg_schema.name)
    line = _worker_error(role, pg_schema)
    assert f"role '{role.name}' lacks INSERT, UPDATE and DELETE on table " in line
    assert f"GRANT INSERT, UPDATE, DELETE ON TABLE {pg_schema.name}." in line


def test_the_schema_wide_grants_a_refused_worker_is_given_are_all_it_needs(
    role: Role, pg_schema: PgSchema
) -> None:
    # Granted table by table as each refusal named it, a role took a run per table.
    role.grant("GRANT USAGE ON SCHEMA {} TO {}", pg_schema.name)
    line = _worker_error(role, pg_schema)
    marker = "every table and sequence at once, the migrations' ledger left read-only: "
    grants = line.partition(marker)[2].split("; ")
    tables, sequences = (f"ALL {k} IN SCHEMA {pg_schema.name}" for k in ("TABLES", "SEQUENCES"))
    ledger = f"{pg_schema.name}.schema_migrations"
    assert grants == [
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {role.name}",
        f"GRANT USAGE, SELECT, UPDATE ON {sequences} TO {role.name}",
        f"REVOKE INSERT, UPDATE, DELETE ON TABLE {ledger} FROM {role.name}",
    ]
    with psycopg.connect(role.admin_dsn, autocommit=True) as admin:
        for grant in grants:
            admin.execute(grant.encode())
    result = _worker(role, pg_schema)
    assert result.returncode == 0, result.stderr
    # ... and no more: a worker reads the migrations' ledger, only `taskq migrate`
    # writes it (the schema-wide grant alone let every worker rewrite it).
    with psycopg.connect(role.dsn, autocommit=True) as worker:
        ledger_sql = sql.Identifier(pg_schema.name, "schema_migrations")
        worker.execute(sql.SQL("SELECT version FROM {}").format(ledger_sql))
        for write in (
            "INSERT INTO {} (version, checksum) VALUES ('99.99.99_01_post_x', repeat('0', 64))",
            "UPDATE {} SET checksum = repeat('0', 64)",
            "DELETE FROM {}",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                worker.execute(sql.SQL(write).format(ledger_sql))


def test_migrate_without_create_on_the_database_says_so_in_one_line(role: Role) -> None:
    schema = unique_schema_name()
    database = urlsplit(role.dsn).path.lstrip("/")
    result = run("taskq", "migrate", "--dsn", role.dsn, "--schema", schema, env=clean_env())
    line = _one_line(result, "taskq migrate: error: ")
    assert f"role '{role.name}' lacks CREATE on database {database} " in line
    assert "run `taskq migrate` as the database's owner" in line
    assert f"GRANT CREATE ON DATABASE {database} TO {role.name}" in line


def test_migrate_of_a_schema_the_role_does_not_own_says_which_rights_lack(
    role: Role, pg_schema: PgSchema
) -> None:
    role.grant("GRANT USAGE ON SCHEMA {} TO {}", pg_schema.name)
    result = run("taskq", "migrate", "--dsn", role.dsn, "--schema", pg_schema.name, env=clean_env())
    line = _one_line(result, "taskq migrate: error: ")
    ledger = f"{pg_schema.name}.schema_migrations"
    assert f"role '{role.name}' lacks SELECT and INSERT on table {ledger} " in line
    assert "run `taskq migrate` as the schema's owner, or GRANT SELECT, INSERT ON TABLE" in line


def test_the_owner_of_a_schema_made_for_taskq_may_migrate_it_without_create_on_the_database(
    role: Role,
) -> None:
    # CREATE SCHEMA IF NOT EXISTS asks for CREATE on the database before it looks:
    # the owner a DBA made the schema for was refused.
    schema = unique_schema_name()
    role.grant("CREATE SCHEMA {} AUTHORIZATION {}", schema)
    result = run("taskq", "migrate", "--dsn", role.dsn, "--schema", schema, env=clean_env())
    assert result.returncode == 0, result.stderr
    assert "applied" in result.stdout


async def test_an_enqueue_without_insert_on_the_jobs_is_one_clear_error(
    role: Role, pg_schema: PgSchema
) -> None:
    role.grant("GRANT USAGE ON SCHEMA {} TO {}", pg_schema.name)
    role.grant("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}", pg_schema.name)
    async with TaskQ(role.dsn, schema=pg_schema.name, actors=[nap]) as tq:
        with pytest.raises(InsufficientPrivilegeError) as refused:
            await tq.client.enqueue(nap, Sleep())
    message = str(refused.value)
    assert "\n" not in message and PASSWORD not in message
    assert f"role '{role.name}' lacks INSERT, UPDATE and DELETE on table " in message
    assert f"{pg_schema.name}.jobs" in message


def test_taskq_enqueue_without_usage_on_the_schema_is_one_line(
    role: Role, pg_schema: PgSchema
) -> None:
    result = run(
        "taskq",
        "enqueue",
        APP,
        "nap",
        "{}",
        env=clean_env(TASKQ_DSN=role.dsn, TASKQ_SCHEMA=pg_schema.name),
    )
    line = _one_line(result, "taskq: error: ")
    assert f"role '{role.name}' lacks USAGE on schema {pg_schema.name} " in line


@pytest.mark.parametrize("target", ["dsn", "callers-transaction"])
def test_a_sync_client_enqueue_without_insert_is_one_clear_error(
    role: Role, pg_schema: PgSchema, target: str
) -> None:
    # In a caller's transaction, which the refusal aborted, the missing rights could not
    # be asked: "lacks SELECT/INSERT/UPDATE/DELETE", a right it has among them.
    role.grant("GRANT USAGE ON SCHEMA {} TO {}", pg_schema.name)
    role.grant("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}", pg_schema.name)
    with (
        psycopg.connect(role.dsn) as conn,
        SyncJobsClient(
            role.dsn if target == "dsn" else conn, schema=pg_schema.name, actors=[nap]
        ) as client,
        pytest.raises(InsufficientPrivilegeError) as refused,
    ):
        client.enqueue(nap, Sleep())
    message = str(refused.value)
    assert "\n" not in message and PASSWORD not in message
    assert f"role '{role.name}' lacks INSERT, UPDATE and DELETE on table " in message


def test_a_sync_client_of_a_role_that_cannot_read_the_limits_is_refused_after_another_read_them(
    role: Role, pg_schema: PgSchema
) -> None:
    # The limits (and the schema's check) were cached per host, port, database and
    # schema: once another role's client had read them, this role's enqueues went on
    # unchecked by its own right, and were refused again only once the cache ran out
    # (and behind a pooler that routes by user, as Supavisor does, one tenant's limits
    # were another's).
    role.grant("GRANT USAGE ON SCHEMA {} TO {}", pg_schema.name)
    role.grant("GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA {} TO {}", pg_schema.name)
    role.grant("REVOKE SELECT ON {}.{} FROM {}", pg_schema.name, "actor_config")
    with SyncJobsClient(pg_schema.dsn, schema=pg_schema.name, actors=[nap]) as owners:
        owners.enqueue(nap, Sleep())
    with (
        SyncJobsClient(role.dsn, schema=pg_schema.name, actors=[nap]) as client,
        pytest.raises(InsufficientPrivilegeError, match="actor_config"),
    ):
        client.enqueue(nap, Sleep())


def test_a_sync_client_without_usage_says_so_without_a_limits_warning_first(
    role: Role, pg_schema: PgSchema
) -> None:
    # The max_pending read failed open on the refusal first (a warning quoting the
    # driver), then the enqueue raised: no hiccup, a right to grant.
    import structlog.testing

    with (
        structlog.testing.capture_logs() as logs,
        SyncJobsClient(role.dsn, schema=pg_schema.name, actors=[nap]) as client,
        pytest.raises(InsufficientPrivilegeError, match="lacks USAGE on schema"),
    ):
        client.enqueue(nap, Sleep())
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == []


def test_a_migration_refused_a_right_is_still_a_migration_error() -> None:
    from taskq_postgres._migrate import MigrationPrivilegeError

    assert issubclass(MigrationPrivilegeError, MigrationError)
    assert issubclass(MigrationPrivilegeError, InsufficientPrivilegeError)


def test_a_role_that_may_delete_jobs_deletes_their_history_with_them(
    role: Role, pg_schema: PgSchema
) -> None:
    # As the foreign keys' cascade did, with the table owner's rights: the trigger that
    # replaced it needs no right of the deleting role's on the history tables.
    s = pg_schema.name
    with SyncJobsClient(pg_schema.dsn, schema=s, actors=[nap]) as owners:
        job = owners.enqueue(nap, Sleep())
    with psycopg.connect(pg_schema.dsn, autocommit=True) as owner:
        owner.execute(
            sql.SQL("INSERT INTO {}.job_events (job_id, kind) VALUES (%s, 'test')").format(
                sql.Identifier(s)
            ),
            (job.id,),
        )
    role.grant("GRANT USAGE ON SCHEMA {} TO {}", s)
    role.grant("GRANT SELECT, DELETE ON TABLE {}.jobs TO {}", s)
    with psycopg.connect(role.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DELETE FROM {}.jobs").format(sql.Identifier(s)))
    with psycopg.connect(pg_schema.dsn) as owner:
        left = owner.execute(
            sql.SQL("SELECT count(*) FROM {}.job_events").format(sql.Identifier(s))
        ).fetchone()
    assert left == (0,)
