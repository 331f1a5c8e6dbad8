"""TaskQ's hook specifications: the public extension API.

Every hook here is public API forever, so the list stays short. Hooks are
synchronous (pluggy cannot await) and take keyword arguments only. Core
calls each plugin's implementation on its own: one that raises is left out
and recorded as a plugin failure (``taskq.plugins.plugin_failures()``,
``taskq plugins``), logged in one line once per process, and the other
plugins still count.

A distribution implements hooks in a module it names in its ``taskq`` entry
point::

    # pyproject.toml
    [project.entry-points.taskq]
    mybackend = "taskq_mybackend._plugin"

    # taskq_mybackend/_plugin.py
    from taskq.plugins import hookimpl

    @hookimpl
    def taskq_backends():
        return {"mybackend": MyBackend.from_url}

Core registers its own built-ins (the ``memory`` backend, the core CLI
commands) through these same hooks, so a plugin is never second-class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from taskq.backend import Backend
    from taskq.cli._commands import CommandRegistry

__all__ = [
    "BackendFactory",
    "hookimpl",
    "hookspec",
    "taskq_backends",
    "taskq_cli_commands",
    "taskq_client_fault",
    "taskq_default_dsn",
    "taskq_transient_errors",
]

PROJECT_NAME = "taskq"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

BackendFactory = Callable[..., "Backend"]
"""Builds a backend from ``(url, **options)``.

Besides the options a caller gives ``open_backend``, a factory is offered the
application's ``schema`` and the worker settings that tune a backend
(:data:`~taskq.settings.BACKEND_TUNABLES`: ``command_timeout``,
``dispatch_oversample``, ``reclaim_event_visibility_delay``,
``cancel_reclaim_headroom``, ``wake_coalesce_window``, ``poll_only``,
``direct_dsn``, ``stale_batch_grace``, ``min_pool_size``, ``max_pool_size``), as a
worker passes them. A factory
that names its keyword parameters gets only those of these it names; one that
takes ``**options`` gets them all and should ignore those that do not apply to
it (as ``InMemoryBackend.from_url`` does).

It must not do I/O: connecting happens when the backend is opened
(``await backend.open()`` / ``async with TaskQ(...)``), so a factory can be
called to validate a URL without reaching the server.
"""


@hookspec
def taskq_backends() -> dict[str, BackendFactory]:  # type: ignore[empty-body]
    """Return the URL schemes this plugin serves, each mapped to a factory.

    Core returns ``{"memory": InMemoryBackend.from_url}``; taskq-postgres
    returns ``postgresql`` and ``postgres``. Return None (or ``{}``) to add none.
    A scheme is matched whatever its case, as URLs' schemes are; one no URL can have
    (a letter, then letters, digits, ``+``, ``-`` or ``.``) makes the answer a failure.

    A scheme belongs to one distribution. Claimed by two, it stays with the
    TaskQ distribution it belongs to (``memory`` with taskq-core,
    ``postgresql`` and ``postgres`` with taskq-postgres), whichever loads
    first; claimed by two third parties, neither gets it, and opening it is an
    error naming both and the ``TASKQ_DISABLE_PLUGINS`` values that settle it.
    Each clash, an exception raised here, or an answer that is no mapping of
    scheme to callable is a plugin failure (``taskq plugins`` lists it); every
    other scheme still works.

    A factory that raises anything but a ``TaskQError`` is reported as a
    :class:`~taskq.errors.PluginError` naming the distribution and the scheme
    (the URL with its password hidden), the original chained; one that returns
    no backend as an :class:`~taskq.errors.IncompatiblePluginError`.
    """


@hookspec
def taskq_cli_commands(cli: CommandRegistry) -> None:
    """Add subcommands to the ``taskq`` command.

    Call ``cli.add(name, help=..., configure=..., run=...)`` once per
    subcommand. ``configure`` receives the subcommand's
    :class:`argparse.ArgumentParser`; ``run`` receives the parsed namespace
    and returns the exit code. Register only subcommands that work.
    Import heavy modules inside ``run`` so ``taskq --help`` stays fast.
    """


@hookspec
def taskq_transient_errors() -> tuple[type[BaseException], ...]:  # type: ignore[empty-body]
    """Exception types that mean "the store is having a moment; retry next tick".

    Worker loops log these and carry on instead of counting them as bugs.
    Core contributes ``TimeoutError`` and ``OSError``; taskq-postgres its
    ``TRANSIENT_PG_ERRORS``. Authentication failures must not be listed:
    they are not transient for a static DSN. Anything in the answer that is
    no exception class, or a class as broad as ``Exception`` or outside it
    (``CancelledError``, ``KeyboardInterrupt``: every loop would swallow a stop),
    is left out and reported as a plugin failure.
    """


@hookspec
def taskq_client_fault(error: BaseException) -> bool | None:
    """Whether ``error``, of a type this plugin lists in ``taskq_transient_errors``, is
    in fact the driver refusing the calling code, not the store failing.

    Some driver errors mean either: asyncpg's ``InterfaceError`` says "connection is
    closed" after a restart, and "cannot perform operation: another operation is in
    progress" of a program that sends a second statement on a connection still busy
    with the first. Worker loops
    retry both (their next tick finds the connection replaced); the ``taskq`` and
    ``taskq-worker`` commands, which report a transient error as one line saying the
    database failed, show a fault with its traceback instead. Return True for a fault,
    None (or False) otherwise; an implementation that raises is a plugin failure and
    counts as None.
    """


@hookspec(firstresult=True)
def taskq_default_dsn() -> str | None:
    """A database URL to use when the user gave none (no ``--dsn``, no ``TASKQ_DSN``).

    taskq-postgres's ``[embedded]`` extra answers with an embedded server it
    starts under ``./.taskq/`` (and says so on stderr). Return None to pass.
    The first string answer wins; an implementation that raises, or answers
    with something else than a string, is reported as a plugin failure and
    the next one is asked.
    """
