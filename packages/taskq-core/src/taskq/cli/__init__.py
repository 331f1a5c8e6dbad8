"""The ``taskq`` command: a thin argparse front over subcommands that core
and plugins register through the ``taskq_cli_commands`` hook."""

from __future__ import annotations

import argparse
import errno
import io
import os
import sys
from collections.abc import Sequence
from typing import Final

from taskq.cli._commands import Command as Command
from taskq.cli._commands import CommandRegistry as CommandRegistry
from taskq.cli._exit_codes import EXIT_ERROR as EXIT_ERROR
from taskq.cli._exit_codes import EXIT_OK as EXIT_OK
from taskq.cli._exit_codes import EXIT_WATCHDOG as EXIT_WATCHDOG
from taskq.cli._parser import ArgumentParser
from taskq.errors import TaskQError

__all__ = [
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_WATCHDOG",
    "Command",
    "CommandRegistry",
    "build_parser",
    "main",
]


def _version_text() -> str:
    from taskq.errors import PluginLoadError
    from taskq.plugins import loaded_plugins, plugin_failures

    lines: list[str] = []
    seen: set[str] = set()
    for info in loaded_plugins():
        if info.distribution in seen:
            continue
        seen.add(info.distribution)
        lines.append(f"{info.distribution} {info.version or 'unknown'}")
    lines.extend(
        f"{f.distribution or f.name} failed to load: {f.cause}"
        for f in plugin_failures()
        if isinstance(f, PluginLoadError)  # a hook's failure: its plugin is listed above
    )
    return "\n".join(lines)


class _VersionAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings, dest, nargs=0, help="show every installed TaskQ distribution and exit"
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(_version_text())
        # A closed pipe (`taskq --version | head -1`) shows here, where main() says
        # nothing of it, not as a traceback or at the interpreter's exit.
        sys.stdout.flush()
        parser.exit(EXIT_OK)


def _collect_commands() -> CommandRegistry:
    from taskq.plugins._registry import call_each

    registry = CommandRegistry()
    # a plugin whose commands fail to register is recorded (`taskq plugins`) and logged
    # once; the others still appear
    call_each("taskq_cli_commands", before=registry._set_distribution, cli=registry)
    return registry


def build_parser(registry: CommandRegistry) -> argparse.ArgumentParser:
    """The ``taskq`` argument parser with every registered subcommand."""
    parser = ArgumentParser(
        prog="taskq",
        description="TaskQ: a Postgres-backed job queue. Run `taskq COMMAND --help` for details.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in registry.commands():
        cmd_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        try:
            command.configure(cmd_parser)
        except Exception as exc:  # noqa: BLE001 - a plugin's code: isolated, reported
            # Raised here, a broken plugin's command took every other down, `taskq
            # plugins` among them, with a traceback: left out and recorded instead.
            _drop_subcommand(sub, command.name)
            from taskq.plugins._registry import report_command_failure

            report_command_failure(command.name, command.distribution, exc)
            continue
        cmd_parser.set_defaults(_run=command.run)
    return parser


def _drop_subcommand(sub: argparse._SubParsersAction[ArgumentParser], name: str) -> None:
    """Take subcommand ``name`` back out of ``sub``: argparse has no public way."""
    sub._name_parser_map.pop(name, None)
    sub._choices_actions = [a for a in sub._choices_actions if a.dest != name]


# The first-party commands that come with another distribution (and an extra of it, for
# a command its plugin registers only with the extra), for the hint when one is asked for
# without it installed.
_COMMAND_PROVIDERS: dict[str, tuple[str, str | None]] = {
    "migrate": ("taskq-postgres", None),
    "embedded": ("taskq-postgres", "embedded"),
}


def _missing_command(registry: CommandRegistry, argv: Sequence[str]) -> str | None:
    """The message for a first-party command whose distribution (or extra) is not
    installed."""
    name = next((arg for arg in argv if not arg.startswith("-")), None)
    found = _COMMAND_PROVIDERS.get(name or "")
    if found is None or any(command.name == name for command in registry.commands()):
        return None
    from taskq.plugins import loaded_plugins
    from taskq.plugins._registry import why_absent

    provider, extra = found
    if extra is not None and any(p.distribution == provider for p in loaded_plugins()):
        return (
            f"`taskq {name}` comes with the [{extra}] extra of {provider}, "
            f"which is not installed: pip install '{provider}[{extra}]'"
        )
    return f"`taskq {name}` comes with {provider}, {why_absent(provider)}"


_NETWORK_ERRNOS: Final = frozenset(
    getattr(errno, name)
    for name in ("ENETDOWN", "ENETUNREACH", "ENETRESET", "EHOSTDOWN", "EHOSTUNREACH")
    if hasattr(errno, name)
)
"""A socket's failures raised as a bare OSError (its subclasses are ConnectionError's)."""


_SHOWN_BY: Final = {"schedules": "taskq schedules list"}
"""The command that shows what a command changes, where not `taskq jobs list`."""


def _reader_gone() -> int:
    """The reader of stdout went away (`taskq jobs list | head`): no traceback, and none
    either from the flush at exit (Python's documented recipe)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``taskq`` console script; returns the exit code."""
    from taskq.logs import configure_logging, route_stdlib_logging
    from taskq.plugins._registry import plugin_trace_requested

    try:
        configure_logging()
        plugin_trace_requested()
    except TaskQError as exc:  # TASKQ_LOG_LEVEL, TASKQ_TRACE_PLUGINS
        print(f"taskq: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if isinstance(sys.stdout, io.TextIOWrapper):
        # Stored text (a queue name, a payload) is anyone's: on a stdout whose encoding
        # cannot hold it (a latin-1 locale, a Windows file redirect) a character it
        # lacks is escaped, as on stderr, not a traceback that printed nothing.
        sys.stdout.reconfigure(errors="backslashreplace")
    registry = _collect_commands()
    missing = _missing_command(registry, sys.argv[1:] if argv is None else argv)
    if missing is not None:
        print(f"taskq: error: {missing}", file=sys.stderr)
        return EXIT_ERROR
    parser = build_parser(registry)
    try:
        args = parser.parse_args(argv)
    except BrokenPipeError:
        return _reader_gone()
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help()
        return EXIT_ERROR
    if getattr(args, "app", None) is None:
        # A command given an APP routes once it is imported (cli._inputs.import_app):
        # routed before, the application's own logging.basicConfig did nothing.
        route_stdlib_logging()
    # Where to see whether an interrupted or failed change was made.
    shows = _SHOWN_BY.get(args.command, "taskq jobs list")
    try:
        code: int = run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
    except TaskQError as exc:
        print(f"taskq: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        # Said, not a silent exit 1: a change it was making may have been made.
        print(
            "taskq: interrupted (a change the command was making may have been made: "
            f"`{shows}` shows)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except BrokenPipeError:
        return _reader_gone()
    except Exception as exc:
        from taskq.worker._transient import transient_cause

        failed = transient_cause(exc)
        # Of the OSErrors, only a socket's failures are the database's (a reset, a
        # timeout, a network gone): a bare one is the output's (stdout on a full disk),
        # and a file's (FileNotFoundError, PermissionError of a plugin's command, of
        # the embedded server's files) keeps its traceback.
        if failed is None or (
            isinstance(failed, OSError)
            and not isinstance(failed, ConnectionError | TimeoutError)
            and failed.errno not in _NETWORK_ERRNOS
        ):
            raise
        # The database failed the command after it connected (a statement_timeout or
        # lock_timeout of the role, a restart, a cut connection): one line to act on,
        # where the driver's traceback came out.
        print(
            f"taskq: error: the database failed the command ({type(failed).__name__}: "
            f"{' '.join(str(failed).split())}); check that it is reachable and not held "
            f"up by a lock or a statement_timeout, then run the command again (a change "
            f"it was making may have been made: `{shows}` shows)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return code
