"""Building and opening PostgresBackend: validation, clear errors, registration."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

import taskq
from taskq.errors import ConfigurationError
from taskq.identifiers import MAX_SCHEMA_NAME_BYTES
from taskq.models import EnqueueArgs
from taskq_postgres import BackendUnavailableError, PostgresBackend
from taskq_testing.postgres import PgSchema, unique_schema_name

pytestmark = pytest.mark.postgres

# Port 1 refuses connections: reaching it raises, so a ValueError proves nothing connected.
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/taskq"

HOSTILE_SCHEMAS = [
    "x; drop table jobs",
    "taskq; DROP SCHEMA public CASCADE; --",
    'taskq"; DROP SCHEMA public; --',
    "ta'skq",
    "taskq\n",
    "\ntaskq",
    "taskq ",
    "t\u0430skq",  # Cyrillic a
    "\uff54askq",  # fullwidth t
    "taskq\x00",
    "public.jobs",
    "",
    "a" * (MAX_SCHEMA_NAME_BYTES + 1),
]


def _with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


@pytest.mark.parametrize("schema", HOSTILE_SCHEMAS)
def test_hostile_schema_names_are_refused_at_construction(schema: str) -> None:
    with pytest.raises(ValueError, match="identifier|schema name"):
        PostgresBackend(UNREACHABLE, schema=schema)


def test_the_schema_is_checked_before_the_dsn() -> None:
    with pytest.raises(ValueError, match="identifier"):
        PostgresBackend("not a dsn", schema="x; drop table jobs")


def test_schema_names_fold_to_lower_case() -> None:
    assert PostgresBackend(UNREACHABLE, schema="TaskQ").schema == "taskq"


@pytest.mark.parametrize(
    ("dsn", "problem"),
    [
        ("", "needs a DSN"),
        ("localhost/app", "scheme-less"),
        ("mysql://root@localhost/app", "not mysql"),
        ("postgresql://postgres@localhost:notaport/app", "invalid DSN"),
        ("postgresql://postgres:secret@[::1/app", "invalid DSN"),
    ],
)
def test_malformed_dsns_are_one_line_configuration_errors(dsn: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem) as info:
        PostgresBackend(dsn)
    assert "\n" not in str(info.value)
    assert "secret" not in str(info.value)


async def test_a_dsn_asyncpg_rejects_is_a_configuration_error_at_open() -> None:
    backend = PostgresBackend("postgresql://postgres:secret@127.0.0.1:1/x?sslmode=sometimes")
    with pytest.raises(ConfigurationError, match="invalid DSN") as info:
        await backend.open()
    message = str(info.value)
    assert "\n" not in message and "secret" not in message and "***" in message


@pytest.mark.parametrize("query", ["hostaddr=127.0.0.1", "keepalives_idel=1"])
async def test_a_libpq_parameter_asyncpg_sends_as_a_setting_is_a_configuration_error(
    pg_schema: PgSchema, query: str
) -> None:
    # asyncpg sends a query parameter it does not read as a server setting, refused
    # (42704) at every try: it was an outage's BackendUnavailableError.
    from taskq.worker.cli import _unreachable

    backend = PostgresBackend(f"{pg_schema.dsn}?{query}", schema=pg_schema.name)
    name = query.partition("=")[0]
    with pytest.raises(ConfigurationError, match=f"{name}.*asyncpg sends") as info:
        await backend.open()
    assert not isinstance(info.value, BackendUnavailableError)
    assert _unreachable(info.value) is None


async def test_a_server_wide_setting_in_the_dsn_is_a_configuration_error(
    pg_schema: PgSchema,
) -> None:
    # 55P02, of the transient 55000 family: a worker's start retried it for its whole
    # startup wait, the readiness probe saying the database was unreachable.
    backend = PostgresBackend(f"{pg_schema.dsn}?shared_buffers=64MB", schema=pg_schema.name)
    with pytest.raises(ConfigurationError, match="shared_buffers.*remove it from the DSN"):
        await backend.open()


@pytest.mark.parametrize("around", [("", " "), ("", " \n"), ("\t", " \r\n")])
async def test_whitespace_around_a_dsn_is_left_out_of_the_backends(
    pg_schema: PgSchema, around: tuple[str, str]
) -> None:
    # A secret's trailing space went into the database name ('database "... " does not
    # exist', an outage a worker's start waited out), where SyncJobsClient leaves it out.
    before, after = around
    dsn = f"{before}{pg_schema.dsn}{after}"
    backend = PostgresBackend(dsn, schema=pg_schema.name, direct_dsn=dsn)
    await backend.open()
    try:
        assert backend.dsn == backend.direct_dsn == pg_schema.dsn
        assert not backend.behind_pooler
        await backend.enqueue(EnqueueArgs(actor="a", payload={}))
    finally:
        await backend.close()


async def test_an_unreachable_server_is_a_one_line_backend_unavailable_error() -> None:
    backend = PostgresBackend(
        "postgresql://postgres:secret@127.0.0.1:1/taskq", connect_timeout=timedelta(seconds=2)
    )
    with pytest.raises(BackendUnavailableError, match=r"cannot connect to PostgreSQL at") as info:
        await backend.open()
    message = str(info.value)
    assert "\n" not in message
    assert "127.0.0.1:1" in message and "secret" not in message
    assert isinstance(info.value, taskq.TaskQError)


async def _skip_if_the_server_offers_ssl(dsn: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        if await conn.fetchval("SHOW ssl") == "on":
            pytest.skip("this server offers SSL")
    finally:
        await conn.close()


async def test_a_dsn_requiring_ssl_of_a_server_without_it_fails_as_a_configuration_error(
    pg_database_dsn: str,
) -> None:
    # A ConnectionError asyncpg raises: a worker's start waited it out for its whole
    # startup wait, as if the server were still coming up.

    from taskq.worker.cli import _unreachable
    from taskq_postgres import SyncJobsClient

    await _skip_if_the_server_offers_ssl(pg_database_dsn)
    dsn = f"{pg_database_dsn}?sslmode=require"
    with pytest.raises(ConfigurationError, match="requires SSL") as info:
        await PostgresBackend(dsn).open()
    assert not isinstance(info.value, BackendUnavailableError)
    assert _unreachable(info.value) is None  # not retried at a worker's start
    with pytest.raises(ConfigurationError, match="requires SSL"):  # libpq's words
        SyncJobsClient(dsn, actors=[]).enqueue("nothing", {})


@pytest.mark.parametrize("given", ["key=value", "service"])
def test_the_sync_clients_sslmode_is_read_as_libpq_reads_it(
    pg_database_dsn: str, given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read from a URL's query alone: a key=value DSN's sslmode=require (or a service's)
    # met by a server without SSL said "does not answer as PostgreSQL (wrong port?)", an
    # outage's BackendUnavailableError.
    import psycopg
    from psycopg.conninfo import make_conninfo

    from taskq_postgres import SyncJobsClient

    with psycopg.connect(pg_database_dsn) as conn:
        if conn.execute("SHOW ssl").fetchone() == ("on",):
            pytest.skip("this server offers SSL")
    monkeypatch.setenv("PGSSLMODE", "disable")  # ranked below the DSN's and the service's
    if given == "key=value":
        dsn = make_conninfo(pg_database_dsn, sslmode="require")
    else:
        services = tmp_path / "pg_service.conf"
        services.write_text("[tq]\nsslmode=require\n")
        monkeypatch.setenv("PGSERVICEFILE", str(services))
        dsn = make_conninfo(pg_database_dsn, service="tq")
    with pytest.raises(ConfigurationError, match="requires SSL") as info:
        SyncJobsClient(dsn, actors=[])
    assert not isinstance(info.value, BackendUnavailableError)


async def test_the_backends_sslmode_is_read_from_the_service_its_dsn_names(
    pg_database_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # asyncpg connects with the sslmode of the service a URL's query names: read from the
    # query alone, a service's sslmode=require met by a server without SSL said "does not
    # answer as PostgreSQL (wrong port?)", and a worker's start waited it out as an outage.

    from taskq.worker.cli import _unreachable

    await _skip_if_the_server_offers_ssl(pg_database_dsn)
    monkeypatch.setenv("PGSSLMODE", "disable")  # ranked below the service's
    services = tmp_path / "pg_service.conf"
    services.write_text("[tq]\nsslmode=require\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    with pytest.raises(ConfigurationError, match="requires SSL") as info:
        await PostgresBackend(f"{pg_database_dsn}?service=tq").open()
    assert not isinstance(info.value, BackendUnavailableError)
    assert _unreachable(info.value) is None  # not retried at a worker's start


@pytest.fixture
def not_postgres() -> Iterator[int]:
    """The port of a TCP server on 127.0.0.1 that is no PostgreSQL: it answers whatever
    it is sent with ``HTTP/1.1 400 Bad Request`` and hangs up."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                peer, _ = server.accept()
            except TimeoutError:
                continue
            with peer:
                peer.settimeout(1)
                try:
                    peer.recv(64)
                    peer.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


async def test_a_port_where_no_postgresql_answers_is_unavailable_and_retried(
    not_postgres: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reported as a DSN requiring SSL (which it did not), and as a ConfigurationError
    # a worker's start gave up on at once.
    from taskq.worker.cli import _unreachable
    from taskq_postgres import SyncJobsClient

    monkeypatch.delenv("PGSSLMODE", raising=False)
    where = f"127.0.0.1:{not_postgres}"
    for dsn in (
        f"postgresql://postgres@{where}/x",
        f"postgresql://postgres@{where}/x?sslmode=prefer",
    ):
        with pytest.raises(BackendUnavailableError) as info:
            await PostgresBackend(dsn, connect_timeout=timedelta(seconds=5)).open()
        message = str(info.value)
        assert f"the server at {where} does not answer as PostgreSQL (wrong port?)" in message
        assert "sslmode" not in message.replace(dsn, "") and "SSL (" not in message
        assert _unreachable(info.value) is not None  # retried within the startup wait
        with pytest.raises(BackendUnavailableError, match=r"does not answer as PostgreSQL"):
            SyncJobsClient(dsn, actors=[])


@pytest.mark.parametrize("given", ["dsn", "env"])
async def test_a_dsn_requiring_ssl_of_a_port_refusing_it_still_names_sslmode(
    not_postgres: int, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    # asyncpg cannot tell a PostgreSQL without SSL from another program there.
    dsn = f"postgresql://postgres@127.0.0.1:{not_postgres}/x"
    if given == "dsn":
        monkeypatch.setenv("PGSSLMODE", "disable")  # the DSN's own sslmode wins
        dsn += "?sslmode=require"
    else:
        monkeypatch.setenv("PGSSLMODE", "require")
    with pytest.raises(ConfigurationError, match="requires SSL") as info:
        await PostgresBackend(dsn).open()
    assert f"if the server at 127.0.0.1:{not_postgres} is no PostgreSQL" in str(info.value)
    monkeypatch.setenv("PGSSLMODE", "require")
    with pytest.raises(BackendUnavailableError, match="does not answer as PostgreSQL"):
        await PostgresBackend(
            f"postgresql://postgres@127.0.0.1:{not_postgres}/x?sslmode=allow"
        ).open()


def test_a_worker_waits_out_a_port_where_no_postgresql_answers_yet(
    not_postgres: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gc

    from structlog.testing import capture_logs

    from taskq.worker.cli import main

    for name in [k for k in os.environ if k.startswith("TASKQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("PGSSLMODE", raising=False)
    monkeypatch.setattr("taskq.logs.configure_logging", lambda **_: None)
    monkeypatch.setenv("TASKQ_STARTUP_WAIT", "1s")
    dsn = f"postgresql://postgres@127.0.0.1:{not_postgres}/x"
    try:
        with capture_logs() as logs:
            code = main(["tests.apps.basic:tq", "--dsn", dsn, "--until-idle"])
    finally:
        gc.unfreeze()  # main() froze what it had loaded
    assert code == 1
    retried = [e for e in logs if e["event"] == "taskq.backend-unreachable-at-start"]
    assert retried and "does not answer as PostgreSQL" in retried[0]["error"]
    err = capsys.readouterr().err
    assert "does not answer as PostgreSQL (wrong port?)" in err and "sslmode" not in err


async def test_a_missing_database_is_a_backend_unavailable_error(pg_database_dsn: str) -> None:
    backend = PostgresBackend(_with_database(pg_database_dsn, "taskq_no_such_database"))
    with pytest.raises(BackendUnavailableError, match="does not exist"):
        await backend.open()


async def test_an_unmigrated_schema_is_a_configuration_error(pg_database_dsn: str) -> None:
    schema = unique_schema_name()
    backend = PostgresBackend(pg_database_dsn, schema=schema)
    # The DSN in the hint: without it the command migrated its own default database.
    hint = re.escape(f"taskq migrate --dsn '{pg_database_dsn}' --schema {schema}")
    with pytest.raises(ConfigurationError, match=hint):
        await backend.open()


async def test_the_migrate_hint_of_a_dsn_with_a_password_is_no_masked_command(
    pg_database_dsn: str,
) -> None:
    # Copied as shown, `--dsn 'postgresql://postgres:***@...'` sent *** as the password.
    parts = urlsplit(pg_database_dsn)
    dsn = urlunsplit(
        parts._replace(netloc=f"{parts.username}:s3cret@{parts.hostname}:{parts.port}")
    )
    schema = unique_schema_name()
    with pytest.raises(ConfigurationError) as raised:
        await PostgresBackend(dsn, schema=schema).open()
    message = str(raised.value)
    assert f"run `taskq migrate --dsn DSN --schema {schema}` first" in message
    assert "s3cret" not in message and message.count("***") == 1  # in the "in <url>" part


async def _ledger(pg_schema: PgSchema, sql: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(pg_schema.dsn)
    try:
        await conn.execute(sql.format(schema=pg_schema.name), name)
    finally:
        await conn.close()


async def test_a_schema_lacking_a_migration_this_code_needs_is_refused_at_open(
    pg_schema: PgSchema,
) -> None:
    # Only the jobs table was looked for: a worker started, then failed with the
    # driver's 'column "queue" of relation "actor_config" does not exist'.
    needed = "01.00.05_02_pre_actor_config_queue.sql"
    await _ledger(pg_schema, "DELETE FROM {schema}.schema_migrations WHERE version = $1", needed)
    backend = PostgresBackend(pg_schema.dsn, schema=pg_schema.name)
    hint = f"lacks migrations this version of TaskQ needs ({needed}): run `taskq migrate --dsn"
    with pytest.raises(ConfigurationError, match=re.escape(hint)):
        await backend.open()


async def test_a_schema_a_newer_taskq_changed_is_refused_or_warned_of(pg_schema: PgSchema) -> None:
    # Nothing looked at the ledger: an older worker ran on whatever a newer one had done.
    import structlog.testing

    record = (
        "INSERT INTO {schema}.schema_migrations (version, checksum) VALUES ($1, repeat('0', 64))"
    )
    await _ledger(pg_schema, record, "99.00.00_01_pre_add_things.sql")
    backend = PostgresBackend(pg_schema.dsn, schema=pg_schema.name)
    with structlog.testing.capture_logs() as logs:
        await backend.open()  # a newer version that only added: this one still fits
        await backend.close()
    [warned] = [e for e in logs if e["event"] == "taskq.schema-newer-than-code"]
    assert warned["migrations"] == ["99.00.00_01_pre_add_things.sql"]
    await _ledger(pg_schema, record, "99.00.00_50_post_drop_things.sql")
    with pytest.raises(ConfigurationError, match="migrated by a newer TaskQ .*99.00.00_50_post"):
        await PostgresBackend(pg_schema.dsn, schema=pg_schema.name).open()


async def test_use_before_open_or_after_close_is_a_clear_error(pg_schema: PgSchema) -> None:
    backend = PostgresBackend(pg_schema.dsn, schema=pg_schema.name)
    with pytest.raises(ConfigurationError, match="not open"):
        await backend.enqueue(EnqueueArgs(actor="a"))
    with pytest.raises(ConfigurationError, match="not open"):
        backend.subscribe_wake()
    await backend.open()
    await backend.enqueue(EnqueueArgs(actor="a"))
    await backend.close()
    with pytest.raises(ConfigurationError, match="not open"):
        await backend.get(EnqueueArgs(actor="a").id)


@pytest.mark.parametrize("option", ["min_pool_size", "dispatch_oversample"])
def test_nonsense_options_are_value_errors(option: str) -> None:
    with pytest.raises(ValueError, match=option):
        PostgresBackend(UNREACHABLE, **{option: 0})  # type: ignore[arg-type]


@pytest.mark.parametrize("option", ["min_pool_size", "max_pool_size", "dispatch_oversample"])
@pytest.mark.parametrize("value", [True, False, 2.5, "3"])
def test_a_count_option_takes_a_whole_number_only(option: str, value: object) -> None:
    # True passed for a count was taken as 1: a pool of one connection, unpinned.
    with pytest.raises(TypeError, match=f"{option} takes a whole number, not {value!r}"):
        PostgresBackend(UNREACHABLE, **{option: value})  # type: ignore[arg-type]


def test_more_connections_kept_open_than_the_default_maximum_raise_the_maximum() -> None:
    # TASKQ_MIN_POOL_SIZE=20 alone used to be refused against a maximum nobody set.
    assert PostgresBackend(UNREACHABLE, min_pool_size=20).max_pool_size == 20
    assert PostgresBackend(UNREACHABLE, min_pool_size=2).max_pool_size == 10
    with pytest.raises(ValueError, match="min_pool_size <= max_pool_size"):
        PostgresBackend(UNREACHABLE, min_pool_size=20, max_pool_size=10)


def test_instance_ids_must_fit_an_application_name() -> None:
    with pytest.raises(ValueError, match="instance_id"):
        PostgresBackend(UNREACHABLE, instance_id="no spaces or ünïcode")


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_both_url_schemes_open_a_postgres_backend(scheme: str) -> None:
    backend = taskq.open_backend(f"{scheme}://postgres@127.0.0.1:1/app", schema="tenant_a")
    assert isinstance(backend, PostgresBackend)
    assert backend.schema == "tenant_a"


def test_from_url_refuses_other_schemes() -> None:
    with pytest.raises(ValueError, match="postgresql://"):
        PostgresBackend.from_url("memory://")


def test_importing_the_package_and_its_plugin_does_not_import_asyncpg() -> None:
    code = (
        "import sys, taskq_postgres, taskq_postgres._plugin\n"
        "print(sorted(m for m in ('asyncpg', 'taskq_postgres._backend') if m in sys.modules))\n"
        "taskq_postgres.PostgresBackend\n"
        "print('asyncpg' in sys.modules)\n"
    )
    assert _fresh_python(code).split() == ["[]", "True"]


def _fresh_python(code: str) -> str:
    """What ``code`` prints, run by a fresh interpreter (nothing imported yet)."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout


async def test_migrate_on_an_unreachable_server_is_backend_unavailable() -> None:
    # What `taskq-worker --migrate` meets: one clear line, not the driver's traceback.
    backend = PostgresBackend(UNREACHABLE, schema="taskq")
    with pytest.raises(BackendUnavailableError, match="cannot connect to PostgreSQL"):
        await backend.migrate()


async def test_migrate_connects_with_the_backends_password_and_settings(
    pg_database_dsn: str,
) -> None:
    # A worker's --migrate must authenticate as the backend does (a password file or a
    # provider, not just the DSN), or it fails where the worker itself would connect.
    asked: list[str] = []

    def password() -> str:
        asked.append("asked")
        return "unused under trust auth"

    schema = unique_schema_name()
    backend = PostgresBackend(pg_database_dsn, schema=schema, password=password)
    try:
        assert await backend.migrate()
        assert asked
    finally:
        import psycopg

        with psycopg.connect(pg_database_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.parametrize("where", ["user", "query"])
async def test_a_password_never_shows_in_an_error(pg_pooled_schema: PgSchema, where: str) -> None:
    # The query-string form (libpq's ?password=) went into messages as given.
    parts = urlsplit(pg_pooled_schema.dsn)
    if where == "user":
        dsn = urlunsplit(parts._replace(netloc=f"postgres:s3cret@{parts.hostname}:{parts.port}"))
    else:
        dsn = urlunsplit(parts._replace(query="password=s3cret&application_name=x"))
    backend = PostgresBackend(dsn, schema=unique_schema_name())  # no TaskQ tables there
    with pytest.raises(ConfigurationError) as info:
        await backend.open()
    assert "s3cret" not in str(info.value)
    assert "***" in str(info.value)


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://u:secret@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:@h/db?password=secret", "postgresql://u:@h/db?password=***"),
        # Masked, an empty password read as "***", in a command a user copies.
        ("postgresql://u:@h/db", "postgresql://u:@h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("memory://", "memory://"),  # it read "invalid DSN memory:: ..."
        # libpq's other secret, and a key percent-encoded: both were shown.
        ("postgresql://u@h/db?sslpassword=secret&a=b", "postgresql://u@h/db?sslpassword=***&a=b"),
        ("postgresql://u@h/db?pass%77ord=secret", "postgresql://u@h/db?pass%77ord=***"),
        ("redis://:secret@h:6379/0", "redis://:***@h:6379/0"),
        # A raw / ? # or @ in a password moves the URL's parts: nothing of it is shown.
        ("postgresql://u:se/cret@h:5432/db", "postgresql://<hidden: its parts cannot be"),
        ("postgresql://u:se#cret@h/db", "postgresql://<hidden: its parts cannot be"),
        ("postgresql://u:se?cret@h/db", "postgresql://<hidden: its parts cannot be"),
        ("postgresql://h/db?password=se@cret", "postgresql://<hidden: its parts cannot be"),
        # Not scheme://...: a password could be anywhere in it.
        ("postgres:secret@h/db", "<hidden: not a scheme://"),
        ("host=h password=secret dbname=db", "<hidden: not a scheme://"),
        # user:PASSWORD/db with its @HOST forgotten: the password read as a port.
        ("postgresql://u:secret/db", "postgresql://<hidden: its parts cannot be"),
        # A unix socket's empty host keeps its //; several hosts are shown as given.
        ("postgresql:///db?host=/tmp&password=x", "postgresql:///db?host=/tmp&password=***"),
        ("postgresql://u@h1:5432,h2/db", "postgresql://u@h1:5432,h2/db"),
    ],
)
def test_a_dsn_is_shown_with_its_password_masked(dsn: str, shown: str) -> None:
    from taskq._dsn import redact

    assert redact(dsn).startswith(shown) and "cret" not in redact(dsn)
    assert redact(dsn) == shown or shown.startswith(("postgresql://<hidden", "<hidden"))


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:s3cr3t/XYZ@127.0.0.1:5999/test",  # a raw / cut the password short
        "postgres:s3cr3t@127.0.0.1:5999/test",  # no //: the password read as a database
        "postgresql+asyncpg://u:s3cr3t@127.0.0.1:5999/test",  # a scheme no backend serves
        "postgresql://u:s3cr3t%zz@127.0.0.1:5999/test",  # libpq quotes the bad token
        "postgresql://u@127.0.0.1:1/test?sslpassword=s3cr3t",
        "postgresql://u@127.0.0.1:1/test?password=ab%00s3cr3t",  # libpq quotes the value
        "postgresql://u:s3cr3t/test",  # @HOST forgotten: the password read as a port
        "host=127.0.0.1 port=5999password=s3cr3t",  # a space left out: libpq quotes the port
    ],
)
def test_no_error_of_a_bad_or_unreachable_dsn_shows_its_password(dsn: str) -> None:
    import traceback

    from taskq import TaskQ
    from taskq_postgres import SyncJobsClient

    for build in (lambda: TaskQ(dsn), lambda: SyncJobsClient(dsn, actors=[])):
        try:
            build()
        except Exception as exc:  # noqa: BLE001 - whichever error, it must not show it
            told = "".join(traceback.format_exception(exc))
            assert "s3cr3t" not in told, told


def test_a_raw_at_sign_in_a_password_is_refused_without_showing_the_password() -> None:
    # The drivers end the password at its first @ and read the rest as the host:
    # psycopg's "failed to resolve host 'cr3t@127.0.0.1'" showed the password's tail,
    # and the worker's start waited out an unreachable server that was a typo.
    from taskq_postgres import SyncJobsClient

    dsn = "postgresql://u:se@cr3t@127.0.0.1:5432/test"
    for build in (lambda: PostgresBackend(dsn), lambda: SyncJobsClient(dsn, actors=[])):
        with pytest.raises(ConfigurationError, match="raw @ .*%40") as info:
            build()
        assert "cr3t" not in str(info.value), info.value


def test_the_sync_client_takes_several_hosts_as_libpq_does(pg_pooled_schema: PgSchema) -> None:
    # check_dsn refused them ("Port could not be cast"), where psycopg connects.
    from taskq_postgres import SyncJobsClient

    parts = urlsplit(pg_pooled_schema.dsn)
    hosts = f"{parts.hostname}:{parts.port or 5432},{parts.hostname}:{parts.port or 5432}"
    dsn = urlunsplit(parts._replace(netloc=f"{parts.username}@{hosts}"))
    with SyncJobsClient(dsn, actors=[], schema=pg_pooled_schema.name):
        pass  # it connected (a client opens its connection at once)


def test_a_driver_message_about_the_server_is_kept_whole() -> None:
    # Scrubbing a one-letter password out of every message erased letters all over it
    # (and their places spelled the password out).
    from taskq_postgres import SyncJobsClient

    with pytest.raises(BackendUnavailableError) as info:
        SyncJobsClient("postgresql://nosuchuser:t@127.0.0.1:5432/test", actors=[])
    assert 'role "nosuchuser" does not exist' in str(info.value)


def test_every_exported_name_is_what_it_names_whatever_was_imported_first() -> None:
    # taskq_postgres.migrate was a submodule too: once something imported it (as
    # `from taskq_postgres import MigrationError` did), the package's `migrate` was the
    # module, and `from taskq_postgres import MigrationError, migrate` gave a module
    # that "is not callable".
    code = (
        "import inspect, taskq_postgres\n"
        "from taskq_postgres import MigrationError, MigrationStatus\n"
        "from taskq_postgres import migrate, migration_status\n"
        "print(inspect.isfunction(migrate), inspect.isfunction(migration_status))\n"
        "print(sorted(n for n in taskq_postgres.__all__\n"
        "      if inspect.ismodule(getattr(taskq_postgres, n))))\n"
    )
    assert _fresh_python(code).split("\n")[:2] == ["True True", "[]"]


def test_a_bad_schema_is_the_users_error_not_the_plugins() -> None:
    # It was a PluginError ending "if they are right, report it to taskq-postgres".
    import taskq
    from taskq.errors import InvalidIdentifierError

    with pytest.raises(InvalidIdentifierError, match="invalid SQL identifier") as caught:
        taskq.open_backend("postgresql://localhost/app", schema="bad-schema!")
    assert isinstance(caught.value, ValueError) and "report it" not in str(caught.value)


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://h/db", ("postgresql://h/db", 10.0)),
        ("postgresql://h/db?connect_timeout=5", ("postgresql://h/db", 5.0)),
        # Other parameters kept as written, in order; libpq's least is 2 seconds.
        (
            "postgresql://h/db?sslmode=disable&connect_timeout=1&options=-c%20jit%3Doff",
            ("postgresql://h/db?sslmode=disable&options=-c%20jit%3Doff", 2.0),
        ),
        ("postgresql://h/db?connect_timeout=%2030%20", ("postgresql://h/db", 30.0)),
        ("postgresql://h/db?connect_timeout=0", ("postgresql://h/db", 1e9)),  # no limit
    ],
)
def test_a_dsns_connect_timeout_is_read_as_libpq_reads_it(
    dsn: str, expected: tuple[str, float]
) -> None:
    from taskq_postgres._connect import libpq_connect_timeout

    assert libpq_connect_timeout(dsn, 10.0) == expected


def test_a_dsns_connect_timeout_that_is_no_number_is_refused_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="connect_timeout takes a whole number") as info:
        PostgresBackend("postgresql://u:secret@127.0.0.1/db?connect_timeout=10s")
    assert "secret" not in str(info.value)


async def test_a_dsn_with_libpqs_connect_timeout_connects(pg_database_dsn: str) -> None:
    # A DATABASE_URL shared with libpq and psycopg (SyncJobsClient takes it): asyncpg sent
    # connect_timeout to the server as a session setting, and every connection failed
    # with 'unrecognized configuration parameter "connect_timeout"'.
    from taskq_postgres import migrate

    dsn = f"{pg_database_dsn}?connect_timeout=5"
    schema = unique_schema_name()
    await migrate(dsn, schema)
    try:
        backend = PostgresBackend(dsn, schema=schema)
        await backend.open()
        try:
            row = await backend.enqueue(EnqueueArgs(actor="nap", payload={}))
            assert await backend.get(row.id) is not None
        finally:
            await backend.close()
    finally:
        with psycopg.connect(pg_database_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
