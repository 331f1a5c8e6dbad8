"""A broken plugin never takes the rest down: a URL scheme claimed twice, a hook that
raises or answers nonsense, a backend factory that raises or builds no backend, an
entry point whose value cannot be read. Each is recorded as a plugin failure
(``taskq plugins`` lists it and exits 1), logged in one line once per process, and
says what to do."""

from __future__ import annotations

import gc
import json
import os
from typing import Any

import pytest
import structlog

import taskq
from taskq.backend.memory import InMemoryBackend
from taskq.errors import (
    ConfigurationError,
    IncompatiblePluginError,
    PluginError,
    PluginHookError,
    PluginLoadError,
    UnknownBackendError,
)
from taskq.plugins import backend_factories, plugin_failures
from tests.core.plugin_stubs import AddPlugin, InstallEntryPoints


def _backends(**schemes: str) -> str:
    """A plugin module serving each scheme with ``InMemoryBackend`` (or a subclass
    named ``schemes[scheme]``, defined in the module, to tell them apart)."""
    classes = "\n".join(
        f"class {name}(InMemoryBackend):\n    pass\n" for name in sorted(set(schemes.values()))
    )
    mapping = ", ".join(f"{scheme!r}: lambda url: {cls}()" for scheme, cls in schemes.items())
    return (
        "from taskq.backend.memory import InMemoryBackend\n"
        "from taskq.plugins import hookimpl\n\n"
        f"{classes}\n"
        f"@hookimpl\ndef taskq_backends():\n    return {{{mapping}}}\n"
    )


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


# ---------------------------------------------------------------- URL scheme clashes


def test_a_scheme_of_core_claimed_by_a_third_party_stays_with_core(
    entry_points: InstallEntryPoints,
) -> None:
    # Every backend, the worker and `taskq plugins` failed: "claimed by both taskq-core and
    # taskq-dupscheme", and the hint said TASKQ_DISABLE_PLUGINS=core, which does nothing.
    entry_points(
        dupscheme=_backends(memory="Impostor", dup2="Dup2"),
        distributions={"dupscheme": "taskq-dupscheme"},
    )
    assert type(taskq.open_backend("memory://")) is InMemoryBackend
    assert type(taskq.open_backend("dup2://")).__name__ == "Dup2"  # its other scheme works
    assert backend_factories()["memory"][1] == "taskq-core"

    [failure] = _hook_failures()
    assert (failure.name, failure.distribution, failure.hook) == (
        "dupscheme",
        "taskq-dupscheme",
        "taskq_backends",
    )
    assert "'memory'" in str(failure) and "stays with taskq-core" in str(failure)
    assert "TASKQ_DISABLE_PLUGINS=dupscheme" in str(failure)
    assert "TASKQ_DISABLE_PLUGINS=core" not in str(failure)


@pytest.mark.parametrize("order", ["first-second", "second-first"])
def test_a_scheme_two_third_parties_claim_is_refused_alone_whatever_their_order(
    entry_points: InstallEntryPoints, order: str
) -> None:
    first = _backends(shared="FirstShared", one="One")
    second = _backends(shared="SecondShared", two="Two")
    distributions = {"first": "taskq-first", "second": "taskq-second"}
    if order == "first-second":
        entry_points(first=first, second=second, distributions=distributions)
    else:
        entry_points(second=second, first=first, distributions=distributions)
    # every other scheme keeps working
    assert type(taskq.open_backend("memory://")) is InMemoryBackend
    assert type(taskq.open_backend("one://")).__name__ == "One"
    assert type(taskq.open_backend("two://")).__name__ == "Two"
    assert "shared" not in backend_factories()

    with pytest.raises(PluginError) as info:
        taskq.open_backend("shared://user:hunter2@host/db")
    message = str(info.value)
    assert "'shared'" in message and "taskq-first" in message and "taskq-second" in message
    assert "TASKQ_DISABLE_PLUGINS=first" in message
    assert "TASKQ_DISABLE_PLUGINS=second" in message
    assert "hunter2" not in message and "core" not in message

    failures = _hook_failures()
    assert sorted(f.name for f in failures) == ["first", "second"]
    assert all("'shared'" in str(f) for f in failures)


def test_a_scheme_of_taskq_postgres_stays_with_it_whatever_else_claims_it(
    entry_points: InstallEntryPoints,
) -> None:
    # the fork loads first, then the real owner: the rule does not hang on the order
    entry_points(
        pgfork=_backends(postgresql="Fork"),
        postgres=_backends(postgresql="Owner", postgres="Owner"),
        distributions={"pgfork": "taskq-pgfork", "postgres": "taskq-postgres"},
    )
    assert type(taskq.open_backend("postgresql://h/db")).__name__ == "Owner"
    [failure] = _hook_failures()
    assert failure.name == "pgfork" and "stays with taskq-postgres" in str(failure)


def test_taskq_plugins_lists_a_scheme_clash_and_exits_1(
    entry_points: InstallEntryPoints,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    entry_points(
        dupscheme=_backends(memory="Impostor", dup2="Dup2"),
        distributions={"dupscheme": "taskq-dupscheme"},
    )
    assert _run_taskq(monkeypatch, "plugins", "--json") == 1
    listing = json.loads(capsys.readouterr().out)
    schemes = {p["name"]: p["backend_schemes"] for p in listing["plugins"]}
    assert schemes["core"] == ["memory"] and schemes["dupscheme"] == ["dup2"]
    [failure] = listing["failures"]
    assert failure["name"] == "dupscheme" and failure["hook"] == "taskq_backends"
    assert "'memory'" in failure["error"]


# ---------------------------------------------------------------- taskq_default_dsn


_DSN_HOOK = """
    from taskq.plugins import hookimpl

    @hookimpl
    def taskq_default_dsn():
        {body}
"""


def test_a_default_dsn_hook_that_raises_is_skipped_for_the_next(
    entry_points: InstallEntryPoints,
) -> None:
    from taskq._dsn import resolve_dsn

    # pluggy asks the last registered first: the broken one
    entry_points(
        vault=_DSN_HOOK.format(body="return 'postgresql://fallback/app'"),
        broken=_DSN_HOOK.format(body="raise RuntimeError('vault unreachable')"),
    )
    assert resolve_dsn(None, env={}) == "postgresql://fallback/app"
    [failure] = _hook_failures()
    assert (failure.name, failure.hook) == ("broken", "taskq_default_dsn")
    assert "RuntimeError: vault unreachable" in str(failure)
    assert isinstance(failure.cause, RuntimeError)


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        # The embedded server's own error, which says what to do: said as it is.
        (
            "__import__('taskq.errors').errors.TaskQError('cannot start: see its log')",
            "failed: cannot start: see its log",
        ),
        ("RuntimeError('disk full')", "failed: disk full; pass --dsn postgresql://"),
    ],
)
def test_a_default_dsn_hook_that_raised_is_what_no_dsn_says(
    entry_points: InstallEntryPoints, raised: str, said: str
) -> None:
    from taskq._dsn import resolve_dsn

    # It said "install taskq-postgres[embedded]" when that extra's server failed to start.
    entry_points(embedded=_DSN_HOOK.format(body=f"raise {raised}"))
    with pytest.raises(ConfigurationError) as info:
        resolve_dsn(None, env={})
    message = str(info.value)
    assert message.startswith("no database given, and the default of "), message
    assert said in message and "install" not in message, message
    assert message.endswith(("see its log", "set TASKQ_DSN")), message


def test_a_default_dsn_hook_answering_no_string_is_skipped(
    entry_points: InstallEntryPoints,
) -> None:
    from taskq._dsn import NO_DSN_MESSAGE, resolve_dsn

    entry_points(port=_DSN_HOOK.format(body="return 5432"))
    with pytest.raises(ConfigurationError) as info:  # was: 5432 handed on as the DSN
        resolve_dsn(None, env={})
    assert str(info.value) == NO_DSN_MESSAGE
    [failure] = _hook_failures()
    assert failure.name == "port" and "returned 5432, not a database URL" in str(failure)


# ---------------------------------------------------------------- backend factories


def test_a_factory_raising_an_ordinary_error_is_a_plugin_error_naming_it(
    add_plugin: AddPlugin,
) -> None:
    def factory(url: str, **options: Any) -> Any:
        raise ValueError(f"cannot use {url}")

    add_plugin("nbraise", taskq_backends=lambda: {"nbraise": factory})
    with pytest.raises(PluginError) as info:
        taskq.open_backend("nbraise://user:hunter2@host/db")
    message = str(info.value)
    assert "nbraise" in message and "'nbraise'" in message  # distribution and scheme
    assert "ValueError: cannot use nbraise://user:***@host/db" in message
    assert "hunter2" not in message
    assert isinstance(info.value.__cause__, ValueError)


def test_a_factory_quoting_its_options_shows_no_password_of_theirs(
    add_plugin: AddPlugin,
) -> None:
    def factory(url: str, **options: Any) -> Any:
        raise TypeError(f"unexpected options {options}")

    add_plugin("nbopts", taskq_backends=lambda: {"nbopts": factory})
    with pytest.raises(PluginError) as info:
        taskq.open_backend("nbopts://host/db", direct_dsn="postgresql://u:hunter2@db/app")
    assert "hunter2" not in str(info.value) and "postgresql://u:***@db/app" in str(info.value)


def test_a_taskq_error_of_a_factory_goes_through_as_it_is(add_plugin: AddPlugin) -> None:
    def factory(url: str, **options: Any) -> Any:
        raise ConfigurationError("invalid DSN: no host")

    add_plugin("strict", taskq_backends=lambda: {"strict": factory})
    with pytest.raises(ConfigurationError, match=r"^invalid DSN: no host$"):
        taskq.open_backend("strict://")


def test_taskq_and_the_worker_say_a_factory_error_in_one_line(
    add_plugin: AddPlugin,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from taskq.worker.cli import main as worker_main

    def factory(url: str, **options: Any) -> Any:
        raise ValueError("factory says no")

    add_plugin("nbraise", taskq_backends=lambda: {"nbraise": factory})
    for name in [k for k in os.environ if k.startswith("TASKQ_")]:
        monkeypatch.delenv(name)
    dsn = "nbraise://user:hunter2@host/db"

    assert _run_taskq(monkeypatch, "jobs", "list", "--dsn", dsn) == 1
    try:
        assert worker_main(["tests.apps.basic:tq", "--dsn", dsn]) == 1
    finally:
        gc.unfreeze()  # main() froze what it had loaded
    err = capsys.readouterr().err.strip().splitlines()
    assert [line.split(": error: ")[0] for line in err] == ["taskq", "taskq-worker"]
    for line in err:
        assert "nbraise" in line and "ValueError: factory says no" in line
        assert "hunter2" not in line


@pytest.mark.parametrize(
    ("result", "said"),
    [
        (None, "returned None, not a Backend"),
        (object(), "returned a builtins.object (it declares no BACKEND_PROTOCOL_VERSION)"),
        (InMemoryBackend, "returned the class taskq.backend.memory.InMemoryBackend itself"),
    ],
    ids=["None", "object", "class"],
)
def test_a_factory_returning_no_backend_is_told_so_not_a_version_mismatch(
    add_plugin: AddPlugin, result: object, said: str
) -> None:
    # It read "implements backend protocol None, but this taskq-core speaks protocol 3".
    add_plugin("nb", taskq_backends=lambda: {"nb": lambda url: result})
    with pytest.raises(IncompatiblePluginError) as info:
        taskq.open_backend("nb://")
    assert said in str(info.value)
    assert "protocol None" not in str(info.value)


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


# ---------------------------------------------------------------- entry points


def test_a_malformed_entry_point_value_is_named_as_such(entry_points: InstallEntryPoints) -> None:
    # It read "'NoneType' object has no attribute 'group'".
    entry_points(values={"nothing3": "not a valid :: ref"})
    [failure] = plugin_failures()
    assert isinstance(failure, PluginLoadError) and failure.name == "nothing3"
    assert "entry point value 'not a valid :: ref' is not module[:attr]" in str(failure)
    assert "NoneType" not in str(failure)
    assert isinstance(taskq.open_backend("memory://"), InMemoryBackend)


def test_an_entry_point_named_core_leaves_cores_built_ins_alone(
    entry_points: InstallEntryPoints,
) -> None:
    # Its registration's name clash unregistered core's own plugin: memory:// and the
    # core commands were gone, and the failure blamed the third party alone.
    entry_points(core=_backends(mine="Mine"), distributions={"core": "taskq-core2"})
    [failure] = plugin_failures()
    assert isinstance(failure, PluginLoadError) and failure.name == "core"
    assert "already taken by taskq-core's plugin" in str(failure)
    assert "ask taskq-core2 to rename it" in str(failure)
    assert isinstance(taskq.open_backend("memory://"), InMemoryBackend)


def test_an_entry_point_name_taken_twice_keeps_the_first_plugin(
    entry_points: InstallEntryPoints,
) -> None:
    entry_points(
        first=_backends(one="One"),
        second=_backends(two="Two"),
        distributions={"first": "taskq-first", "second": "taskq-second"},
    )
    # a second distribution's entry point also named "first" (its module: "second"'s)
    entry_points(values={"first": "fake_taskq_plugin_second"})
    [failure] = plugin_failures()
    assert isinstance(failure, PluginLoadError) and failure.name == "first"
    assert "already taken by taskq-first's plugin" in str(failure)
    assert isinstance(taskq.open_backend("one://"), InMemoryBackend)
    assert isinstance(taskq.open_backend("two://"), InMemoryBackend)
    assert [p.name for p in taskq.plugins.loaded_plugins()] == ["core", "first", "second"]


def test_disabling_an_entry_point_named_core_keeps_cores_built_ins(
    entry_points: InstallEntryPoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pm.set_blocked("core") unregistered core's own plugin with the third party's.
    monkeypatch.setenv("TASKQ_DISABLE_PLUGINS", "core")
    entry_points(core=_backends(mine="Mine"))
    assert plugin_failures() == []
    assert isinstance(taskq.open_backend("memory://"), InMemoryBackend)
    with pytest.raises(UnknownBackendError):
        taskq.open_backend("mine://")


_BAD_COMMAND = """
    from taskq.plugins import hookimpl

    def configure(parser):
        parser.add_argument("--dsn")
        parser.add_argument("--dsn")  # argparse: conflicting option string

    @hookimpl
    def taskq_cli_commands(cli):
        cli.add("badcmd", help="a broken command", configure=configure, run=lambda args: 0)
"""


def test_a_plugin_command_whose_configure_raises_leaves_the_others(
    entry_points: InstallEntryPoints,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Its argparse error came out of every `taskq` command, `taskq plugins` among them,
    # as a traceback.
    entry_points(badcmd=_BAD_COMMAND, distributions={"badcmd": "taskq-badcmd"})
    assert _run_taskq(monkeypatch, "plugins") == 1
    out = capsys.readouterr().out
    [failed] = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert failed.startswith(
        "FAILED badcmd (taskq-badcmd): taskq_cli_commands hook added command 'badcmd', "
        "whose configure raised ArgumentError"
    )
    with pytest.raises(SystemExit):  # argparse's "invalid choice": no such command
        _run_taskq(monkeypatch, "badcmd")


def test_an_entry_point_exiting_at_import_is_a_load_failure(
    entry_points: InstallEntryPoints,
) -> None:
    # Its SystemExit ended whatever command loaded the plugins, with its message alone.
    entry_points(exits="import sys\nsys.exit('needs libfoo 2')\n")
    [failure] = plugin_failures()
    assert isinstance(failure, PluginLoadError) and failure.name == "exits"
    assert "SystemExit: needs libfoo 2" in str(failure)
    assert isinstance(taskq.open_backend("memory://"), InMemoryBackend)


@pytest.mark.parametrize("value", ["1", "true", "Yes", "ON"])
def test_taskq_trace_plugins_logs_each_hook_call(
    entry_points: InstallEntryPoints, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # pluggy's call monitoring sees only pm.hook calls, and core calls each
    # implementation itself: the variable logged nothing. It took `1` alone, and
    # `true` (as a setting takes it) left the trace off.
    monkeypatch.setenv("TASKQ_TRACE_PLUGINS", value)
    entry_points(mine=_backends(mine="Mine"))
    with structlog.testing.capture_logs() as logs:
        backend_factories()
    calls = [(e["hook"], e["plugin"]) for e in logs if e["event"] == "taskq.hook-call"]
    done = [(e["hook"], e["plugin"]) for e in logs if e["event"] == "taskq.hook-done"]
    assert calls == done == [("taskq_backends", "core"), ("taskq_backends", "mine")]


@pytest.mark.parametrize("value", ["0", "false", "No", "OFF", ""])
def test_taskq_trace_plugins_false_logs_no_hook_call(
    entry_points: InstallEntryPoints, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TASKQ_TRACE_PLUGINS", value)
    entry_points(mine=_backends(mine="Mine"))
    with structlog.testing.capture_logs() as logs:
        backend_factories()
    assert [e for e in logs if e["event"].startswith("taskq.hook-")] == []


def test_an_invalid_taskq_trace_plugins_loads_no_plugin_and_names_it(
    entry_points: InstallEntryPoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKQ_TRACE_PLUGINS", "verbose")
    entry_points(mine=_backends(mine="Mine"))
    with pytest.raises(ConfigurationError, match="TASKQ_TRACE_PLUGINS='verbose'"):
        backend_factories()
