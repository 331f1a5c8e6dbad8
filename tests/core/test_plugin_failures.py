"""A broken plugin never takes the rest down: a URL scheme claimed twice, a hook that
raises or answers nonsense, a backend factory that raises or builds no backend, an
entry point whose value cannot be read. Each is recorded as a plugin failure
(``taskq plugins`` lists it and exits 1), logged in one line once per process, and
says what to do."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

import taskq
from taskq.backend.memory import InMemoryBackend
from taskq.errors import (
    PluginHookError,
)
from taskq.plugins import plugin_failures
from tests.core.plugin_stubs import AddPlugin, InstallEntryPoints


def _hook_failures() -> list[PluginHookError]:
    return [f for f in plugin_failures() if isinstance(f, PluginHookError)]


def _run_taskq(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    """``taskq ARGV`` in this process, its log records kept off stdout and out of the
    process's logging set-up."""
    from taskq.cli import main

    monkeypatch.setattr("taskq.logs.configure_logging", lambda **_: None)
    monkeypatch.setattr("taskq.logs.route_stdlib_logging", lambda **_: None)
    with structlog.testing.capture_logs():
        return main(list(argv))


# ---------------------------------------------------------------- hooks that raise


_RAISING_HOOKS = """
    from taskq.plugins import hookimpl

    @hookimpl
    def taskq_backends():
        raise RuntimeError("hook boom")

    @hookimpl
    def taskq_cli_commands(cli):
        raise RuntimeError("cli hook boom")

    @hookimpl
    def taskq_transient_errors():
        return "not a tuple"
"""


def test_a_hook_that_raises_is_a_plugin_failure_logged_once(
    entry_points: InstallEntryPoints,
) -> None:
    entry_points(hookraise=_RAISING_HOOKS, distributions={"hookraise": "taskq-hookraise"})
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):  # the worker opens its backend twice, commands once or more
            assert isinstance(taskq.open_backend("memory://"), InMemoryBackend)
    [failure] = _hook_failures()
    assert (failure.name, failure.distribution, failure.hook) == (
        "hookraise",
        "taskq-hookraise",
        "taskq_backends",
    )
    assert "RuntimeError: hook boom" in str(failure)
    assert "TASKQ_DISABLE_PLUGINS=hookraise" in str(failure)

    [error] = [e for e in logs if e["log_level"] == "error"]
    assert error["event"] == "taskq.plugin-hook-failed"
    assert error["plugin"] == "hookraise" and error["error"] == "raised RuntimeError: hook boom"
    assert "exc_info" not in error  # the traceback goes to debug
    [debug] = [e for e in logs if e["log_level"] == "debug"]
    assert isinstance(debug["exc_info"], RuntimeError)


def test_taskq_plugins_reports_hooks_that_failed_and_exits_1(
    entry_points: InstallEntryPoints,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # It said all was well (exit 0), the traceback of each hook logged at error level.
    entry_points(hookraise=_RAISING_HOOKS, distributions={"hookraise": "taskq-hookraise"})
    assert _run_taskq(monkeypatch, "plugins") == 1
    out = capsys.readouterr().out
    assert "schemes: memory" in out
    failed = sorted(line for line in out.splitlines() if line.startswith("FAILED"))
    assert failed == [
        "FAILED hookraise (taskq-hookraise): taskq_backends hook raised RuntimeError: hook boom",
        (
            "FAILED hookraise (taskq-hookraise): taskq_cli_commands hook raised "
            "RuntimeError: cli hook boom"
        ),
        (
            "FAILED hookraise (taskq-hookraise): taskq_transient_errors hook returned "
            "'not a tuple', not exception classes"
        ),
    ]


def test_a_core_hook_that_raises_is_not_said_to_be_turned_off_by_disabling_core(
    add_plugin: AddPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    from taskq.errors import UnknownBackendError
    from taskq.plugins import get_plugin_manager

    # (add_plugin: the failure this records goes with the test)
    def broken() -> dict[str, Any]:
        raise RuntimeError("core bug")

    [impl] = [
        i
        for i in get_plugin_manager().hook.taskq_backends.get_hookimpls()
        if i.plugin_name == "core"
    ]
    monkeypatch.setattr(impl, "function", broken)
    with pytest.raises(UnknownBackendError, match="a bug in taskq-core"):
        taskq.open_backend("memory://")
    [failure] = _hook_failures()
    assert failure.name == "core" and "TASKQ_DISABLE_PLUGINS" not in str(failure)
