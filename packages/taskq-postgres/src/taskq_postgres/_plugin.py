"""taskq-postgres's registration with TaskQ (entry point group `taskq`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from taskq.plugins import hookimpl

if TYPE_CHECKING:
    from taskq.cli import CommandRegistry
    from taskq.plugins.hookspecs import BackendFactory


@hookimpl
def taskq_backends() -> dict[str, BackendFactory]:
    # Imported here so that loading the plugin (e.g. for `taskq --help`) does not
    # import asyncpg.
    from taskq_postgres._backend import PostgresBackend

    return {"postgresql": PostgresBackend.from_url, "postgres": PostgresBackend.from_url}


@hookimpl
def taskq_cli_commands(cli: CommandRegistry) -> None:
    from taskq_postgres import _cli, _embedded

    _cli.register(cli)
    if _embedded.is_available():
        from taskq_postgres import _embedded_cli

        _embedded_cli.register(cli)


@hookimpl
def taskq_transient_errors() -> tuple[type[BaseException], ...]:
    from taskq_postgres._transient import TRANSIENT_PG_ERRORS

    return TRANSIENT_PG_ERRORS


@hookimpl
def taskq_client_fault(error: BaseException) -> bool:
    from taskq_postgres._transient import client_fault

    return client_fault(error)


@hookimpl
def taskq_default_dsn() -> str | None:
    # With the [embedded] extra: a server under ./.taskq/, started or reused.
    # Without it: pass (None), so core's message says how to give a DSN.
    from taskq_postgres._embedded import default_dsn

    return default_dsn()
