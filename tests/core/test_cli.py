"""The `taskq` console script, run as a subprocess like a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.core.plugin_stubs import AddPlugin

BIN = Path(sys.executable).parent


def taskq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "taskq"), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_help_lists_subcommands() -> None:
    proc = taskq("--help")
    assert proc.returncode == 0
    assert "plugins" in proc.stdout


def test_every_subcommand_has_help() -> None:
    from taskq.cli import _collect_commands

    for command in _collect_commands().commands():
        proc = taskq(command.name, "--help")
        assert proc.returncode == 0, (command.name, proc.stderr)
        assert f"usage: taskq {command.name}" in proc.stdout


def test_version_lists_every_installed_distribution() -> None:
    proc = taskq("--version")
    assert proc.returncode == 0
    names = {line.split()[0] for line in proc.stdout.splitlines()}
    assert {
        "taskq-core",
        "taskq-postgres",
        "taskq-ratelimit-redis",
        "taskq-admin",
        "taskq-otel",
        "taskq-testing",
    } <= names


def test_no_subcommand_prints_help_and_fails() -> None:
    proc = taskq()
    assert proc.returncode == 1
    assert "usage: taskq" in proc.stdout


def test_unknown_subcommand_is_a_usage_error() -> None:
    proc = taskq("frobnicate")
    assert proc.returncode == 1  # a usage error; 2 is a watchdog trip
    assert "invalid choice" in proc.stderr


def test_plugins_json_is_machine_readable() -> None:
    proc = taskq("plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    core = next(p for p in data["plugins"] if p["name"] == "core")
    assert core["distribution"] == "taskq-core"
    assert "memory" in core["backend_schemes"]
    assert data["failures"] == []


def test_a_subcommand_name_cannot_be_taken_twice() -> None:
    import pytest

    from taskq.cli import CommandRegistry

    registry = CommandRegistry()
    registry.add("x", help="x", configure=lambda p: None, run=lambda a: 0)
    registry._set_distribution("taskq-other")
    with pytest.raises(ValueError, match="registered by both taskq-core and taskq-other"):
        registry.add("x", help="x", configure=lambda p: None, run=lambda a: 0)


def _command_paths(parser: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    import argparse

    paths = [prefix] if prefix else []
    for action in getattr(parser, "_actions", []):
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += _command_paths(sub, (*prefix, name))
    return paths


def test_every_nested_subcommand_answers_help(capsys: object) -> None:
    import pytest

    from taskq.cli import _collect_commands, build_parser

    parser = build_parser(_collect_commands())
    paths = _command_paths(parser)
    # jobs, schedules and embedded have subcommands of their own
    assert {("jobs", "show"), ("schedules", "create"), ("embedded", "stop")} <= set(paths)
    for path in paths:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([*path, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out  # type: ignore[attr-defined]
        assert f"usage: taskq {' '.join(path)}" in out


@pytest.mark.parametrize("argv", [["plugins"], ["--version"]])
def test_a_reader_that_went_away_is_no_traceback(
    monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    # `taskq jobs list | head`: head exits, the next write meets a closed pipe. And
    # `taskq --version | head -1`, whose text argparse prints: a BrokenPipeError
    # traceback, or a SystemExit(0) whose flush at exit failed.
    import io
    import os

    from taskq.cli import main

    read, write = os.pipe()
    os.close(read)
    closed = io.TextIOWrapper(io.FileIO(write, "w"), write_through=False)
    monkeypatch.setattr("sys.stdout", closed)
    # In-process: leave the logging configuration of the tests that follow alone.
    monkeypatch.setattr("taskq.logs.configure_logging", lambda **_: None)
    assert main(argv) == 1  # and no BrokenPipeError escaped
    closed.close()  # what is left in its buffer goes to /dev/null now, without an error


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError(2, "No such file or directory", "app.toml"),
        PermissionError(13, "Permission denied", "/var/lib/taskq"),
        OSError(28, "No space left on device"),
    ],
)
def test_a_files_oserror_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch, error: OSError
) -> None:
    # Only a socket's failures are the database's: a command's missing file was told
    # to the operator as "the database failed the command", with no traceback.
    from taskq.cli import main

    _add_a_command_raising(monkeypatch, error)
    with pytest.raises(type(error)):
        main(["fails"])


@pytest.mark.parametrize(
    "error",
    [ConnectionResetError(104, "Connection reset by peer"), OSError(113, "No route to host")],
)
def test_a_sockets_oserror_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: OSError
) -> None:
    from taskq.cli import main

    _add_a_command_raising(monkeypatch, error)
    assert main(["fails"]) == 1
    assert capsys.readouterr().err.startswith("taskq: error: the database failed the command")


def _closed() -> BaseException:
    import asyncpg

    return asyncpg.InterfaceError("cannot perform operation: connection is closed")


def _gone() -> BaseException:
    import asyncpg

    return asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")


def _busy() -> BaseException:
    import asyncpg

    return asyncpg.InterfaceError("cannot perform operation: another operation is in progress")


def _released() -> BaseException:
    import asyncpg

    return asyncpg.InterfaceError(
        "cannot call Transaction.commit(): the underlying connection has been released back "
        "to the pool"
    )


def _terminated() -> BaseException:
    import asyncpg

    # What a statement meets on a connection the server has just terminated (a restart,
    # pg_terminate_backend) before asyncpg read the socket's end: the database's doing.
    return asyncpg.InternalClientError(
        "cannot switch to state 15; another operation (2) is in progress"
    )


def _not_connected() -> BaseException:
    import asyncpg

    return asyncpg.InternalClientError("not connected")


@pytest.mark.parametrize(
    "error",
    [_closed, _gone, _terminated, _not_connected],
    ids=["closed", "gone", "terminated", "not-connected"],
)
def test_a_lost_connection_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: Callable[[], BaseException],
) -> None:
    from taskq.cli import main

    _add_a_command_raising(monkeypatch, error())
    assert main(["fails"]) == 1
    assert capsys.readouterr().err.startswith("taskq: error: the database failed the command")


@pytest.mark.parametrize("error", [_busy, _released], ids=["busy", "released"])
def test_a_drivers_refusal_of_the_code_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch, error: Callable[[], BaseException]
) -> None:
    # asyncpg's InterfaceError is transient to a worker loop (a restart's closed
    # connection), but most of them are a bug of the code: said as "the database failed
    # the command", the traceback that showed where was lost.
    from taskq.cli import main

    raised = error()
    _add_a_command_raising(monkeypatch, raised)
    with pytest.raises(type(raised)):
        main(["fails"])


def test_a_plugin_calls_its_transient_error_a_fault_of_the_code(
    monkeypatch: pytest.MonkeyPatch, add_plugin: AddPlugin
) -> None:
    from taskq.cli import main

    add_plugin("faults", taskq_client_fault=lambda error: isinstance(error, TimeoutError))
    _add_a_command_raising(monkeypatch, TimeoutError("the lock was taken twice"))
    with pytest.raises(TimeoutError):
        main(["fails"])


def _add_a_command_raising(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """A ``taskq fails`` command whose run raises ``error`` (in-process, logging left alone)."""
    import taskq.cli

    collect = taskq.cli._collect_commands

    def with_a_failing_command() -> taskq.cli.CommandRegistry:
        registry = collect()

        def run(_: object) -> int:
            raise error

        registry.add("fails", help="fails", configure=lambda _: None, run=run)
        return registry

    monkeypatch.setattr(taskq.cli, "_collect_commands", with_a_failing_command)
    monkeypatch.setattr("taskq.logs.configure_logging", lambda **_: None)


_INTERRUPTED_IMPORT = """
import importlib, signal, sys

entry, script, interrupted = sys.argv[1:]

class Interrupt:
    # Ctrl-C as Python imports the command's modules: a real SIGINT, from inside the
    # import of one deep in it.
    def find_spec(self, name, path=None, target=None):
        if name == interrupted:
            sys.meta_path.remove(self)
            print("interrupted", flush=True)
            signal.raise_signal(signal.SIGINT)
        return None

sys.meta_path.insert(0, Interrupt())
module, _, function = entry.partition(":")
sys.argv = [script, "--version" if script == "taskq" else "--help"]  # else exit 0
sys.exit(getattr(importlib.import_module(module), function)())
"""


@pytest.mark.parametrize(
    ("script", "module"),
    [("taskq", "taskq.app"), ("taskq", "taskq.cli._commands"), ("taskq-worker", "taskq.worker")],
)
def test_ctrl_c_while_the_command_imports_exits_quietly(script: str, module: str) -> None:
    # It printed a KeyboardInterrupt traceback of the import, the entry point's module
    # being the command's own, which imports the whole taskq package first.
    import tomllib

    from taskq.cli import EXIT_ERROR

    pyproject = Path(__file__).parents[2] / "packages/taskq-core/pyproject.toml"
    entry = tomllib.loads(pyproject.read_text())["project"]["scripts"][script]
    assert entry.startswith("_taskq_entry:")  # no module inside the package
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_IMPORT, entry, script, module],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.stdout == "interrupted\n"  # the import was interrupted, not the command
    assert proc.stderr == ""
    assert proc.returncode == EXIT_ERROR
