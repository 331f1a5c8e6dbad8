"""Core's own plugin: built-ins are registered through the same hooks as
third-party plugins (datasette's DEFAULT_PLUGINS), so ``pip install
taskq-core`` works with no entry points at all."""

from __future__ import annotations

from typing import TYPE_CHECKING

from taskq.plugins.hookspecs import hookimpl

if TYPE_CHECKING:
    from taskq.cli._commands import CommandRegistry
    from taskq.plugins.hookspecs import BackendFactory


@hookimpl
def taskq_backends() -> dict[str, BackendFactory]:
    # Imported here so loading the plugin manager does not import the backend.
    from taskq.backend.memory import InMemoryBackend

    return {"memory": InMemoryBackend.from_url}


@hookimpl
def taskq_cli_commands(cli: CommandRegistry) -> None:
    from taskq.cli import _demo_cmd, _enqueue_cmd, _jobs_cmd, _plugins_cmd, _schedules_cmd

    _plugins_cmd.register(cli)
    _enqueue_cmd.register(cli)
    _jobs_cmd.register(cli)
    _schedules_cmd.register(cli)
    _demo_cmd.register(cli)


@hookimpl
def taskq_transient_errors() -> tuple[type[BaseException], ...]:
    # client-side deadlines and dead sockets, whatever the backend
    return (TimeoutError, OSError)
