"""`taskq-worker` as a command: arguments, settings precedence, errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import MutableMapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
import structlog.testing
from pydantic import ValidationError

from taskq import WorkerSettings
from taskq.errors import TaskQError
from taskq.settings import SettingsError

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def worker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    return subprocess.run(
        [str(BIN / "taskq-worker"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**base, **(env or {})},
        check=False,
    )


def test_help_lists_every_flag() -> None:
    proc = worker("--help")
    assert proc.returncode == 0
    for flag in ["--dsn", "--schema", "--queues", "--concurrency", "--until-idle", "--migrate"]:
        assert flag in proc.stdout


def test_until_idle_on_an_empty_memory_backend_exits_cleanly() -> None:
    proc = worker("tests.apps.basic:tq", "--until-idle", env={"TASKQ_POLL_INTERVAL": "50ms"})
    assert proc.returncode == 0, proc.stderr


def test_sighup_and_sigusr2_while_the_app_imports_leave_the_worker_to_run() -> None:
    # Before the event loop's handlers (a large application imports for seconds) their
    # default action ended the process: a credential rotation's SIGHUP killed a
    # worker that was starting.
    base = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    proc = subprocess.Popen(
        [str(BIN / "taskq-worker"), "tests.apps.slow_import:tq", "--until-idle"],
        cwd=REPO,
        env={**base, "TASKQ_POLL_INTERVAL": "50ms"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "importing\n"
        proc.send_signal(signal.SIGHUP)
        proc.send_signal(signal.SIGUSR2)
        _, err = proc.communicate("go\n", timeout=60)  # the import goes on
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]


@pytest.mark.parametrize(
    ("env", "flag", "needle"),
    [
        ({"TASKQ_CONCURRENCY": "0"}, [], "TASKQ_CONCURRENCY='0'"),
        ({}, ["--concurrency", "-3"], "--concurrency=-3"),
        ({"TASKQ_LOCK_LEASE": "5s", "TASKQ_HEARTBEAT_INTERVAL": "2s"}, [], "at least 4 x"),
        ({"TASKQ_POLL_INTERVAL": "soon"}, [], "expected a duration"),
        ({"TASKQ_SCHEMA": "x; drop table jobs"}, [], "invalid SQL identifier"),
        # `--dsn "$DATABASE_URL"` with the variable unset ran on the app's database.
        ({"TASKQ_DSN": "postgresql://u@h/db"}, ["--dsn", ""], "--dsn='': is empty"),
        ({"TASKQ_DSN": " "}, [], "TASKQ_DSN=' ': is empty"),
        # It failed later saying the backend "needs a DSN", which was given.
        ({"TASKQ_DIRECT_DSN": ""}, [], "TASKQ_DIRECT_DSN='': is empty: give the server's own"),
        # A queue no job can be on: undecodable bytes failed in the driver, a traceback.
        ({}, ["--queues", "default,\udcff"], "lone surrogate"),
        ({}, ["--queues", "q" * 257], "at most 256 bytes"),
    ],
)
def test_an_invalid_setting_is_one_line_and_exit_1(
    env: dict[str, str], flag: list[str], needle: str
) -> None:
    proc = worker("tests.apps.basic:tq", "--until-idle", *flag, env=env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("taskq-worker: error: invalid setting")
    assert needle in lines[0]


def test_bad_app_spec_is_a_clear_error() -> None:
    proc = worker("tests.apps.nosuch:tq")
    assert proc.returncode == 1
    assert "cannot import 'tests.apps.nosuch'" in proc.stderr
    proc = worker("tests.apps.basic:nope")
    assert proc.returncode == 1
    # It said "tests.apps.basic:nope is missing, not a TaskQ".
    assert "'tests.apps.basic' has no attribute 'nope'; its TaskQ objects: " in proc.stderr
    assert "tests.apps.basic:tq" in proc.stderr
    proc = worker("tests.apps.basic:nap")
    assert proc.returncode == 1
    assert "tests.apps.basic:nap is of type Actor, not TaskQ" in proc.stderr


def test_flags_beat_env_which_beats_defaults() -> None:
    env = {"TASKQ_CONCURRENCY": "7", "TASKQ_QUEUES": "a,b"}
    assert WorkerSettings.load({}, env=env).concurrency == 7
    assert WorkerSettings.load({"concurrency": 3}, env=env).concurrency == 3
    assert WorkerSettings.load({}, env=env).queues == ["a", "b"]
    assert WorkerSettings.load({}, env={}).concurrency == 10


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://taskq:pw-s3cret-9@db.internal:5432/app",
        "postgresql://taskq@db.internal/app?password=pw-s3cret-9&sslmode=prefer",
    ],
)
@pytest.mark.parametrize("field", ["dsn", "direct_dsn"])
def test_the_dsns_password_shows_nowhere_the_settings_are_shown(dsn: str, field: str) -> None:
    # repr, str, model_dump and model_dump_json all gave the DSN whole (a settings
    # object logged or printed while debugging put the password in the logs).
    from taskq.settings import SHOW_SECRETS

    settings = WorkerSettings.load({field: dsn}, env={})
    shown = [
        repr(settings),
        str(settings),
        str(settings.model_dump()),
        str(settings.model_dump(mode="json")),
        settings.model_dump_json(),
        str(settings.model_dump(by_alias=True)),
    ]
    for text in shown:
        assert "pw-s3cret-9" not in text and "db.internal" in text, text
    assert settings.model_dump()[field].count("***") == 1
    # A rule across settings quoted the whole input in its ValidationError.
    with pytest.raises(ValidationError) as info:
        WorkerSettings(**{field: dsn}, lock_lease=timedelta(seconds=1))
    assert "pw-s3cret-9" not in str(info.value)
    # The DSN itself, for whoever needs it: the attribute, or a dump asking for it.
    assert getattr(settings, field) == dsn
    assert settings.model_dump(context={SHOW_SECRETS: True})[field] == dsn
    rebuilt = settings.model_dump(context={SHOW_SECRETS: True}, by_alias=True)
    assert WorkerSettings.model_validate(rebuilt) == settings
    assert WorkerSettings().model_dump()[field] is None


def test_durations_accept_units() -> None:
    s = WorkerSettings.load({"poll_interval": "250ms", "lock_lease": "2m"}, env={})
    assert s.poll_interval.total_seconds() == 0.25
    assert s.lock_lease.total_seconds() == 120


def test_lease_must_outlive_four_heartbeats() -> None:
    with pytest.raises(SettingsError, match="lock_lease"):
        WorkerSettings.load({"lock_lease": "10s", "heartbeat_interval": "3s"}, env={})


def test_a_backend_instance_the_app_was_given_is_the_one_the_worker_uses() -> None:
    from taskq import TaskQ
    from taskq.backend.memory import InMemoryBackend
    from taskq.errors import ConfigurationError
    from taskq.worker.cli import _rebuild_app

    mine = InMemoryBackend()
    app = TaskQ("memory://", backend=mine)
    assert _rebuild_app(app, WorkerSettings.load({}, env={})).backend is mine
    for env in ({"TASKQ_SCHEMA": "other"}, {"TASKQ_POLL_ONLY": "true"}):
        with pytest.raises(ConfigurationError, match="was given its backend"):
            _rebuild_app(app, WorkerSettings.load({}, env=env))


def test_backend_tunables_reach_the_backend_and_keep_the_apps_own_options() -> None:
    from taskq import TaskQ
    from taskq.worker.cli import _rebuild_app

    app = TaskQ(
        "postgresql://postgres@127.0.0.1:5432/none", schema="s1", password_file="/run/secret"
    )
    settings = WorkerSettings.load(
        {},
        env={
            "TASKQ_DISPATCH_OVERSAMPLE": "5",
            "TASKQ_RECLAIM_EVENT_VISIBILITY_DELAY": "500ms",
            "TASKQ_CANCEL_RECLAIM_HEADROOM": "3s",
        },
    )
    rebuilt = _rebuild_app(app, settings)
    backend: Any = rebuilt.backend
    assert backend.dispatch_oversample == 5
    assert backend.reclaim_event_visibility_delay.total_seconds() == 0.5
    assert backend.cancel_reclaim_headroom.total_seconds() == 3
    assert rebuilt.backend_options["password_file"] == "/run/secret"
    assert rebuilt.schema == "s1"
    # the in-memory backend takes what applies to it and ignores dispatch sampling
    memory: Any = _rebuild_app(TaskQ("memory://"), settings).backend
    assert memory.cancel_reclaim_headroom.total_seconds() == 3


@pytest.mark.parametrize(
    ("target", "kept"),
    [
        ("postgresql://app@DB.example/elsewhere", True),  # the same server, spelt otherwise
        ("postgresql://other@db.example:5432/app", False),  # another role's login
        ("postgresql://app@db.example:5433/app", False),
        ("postgresql://app@evil.example:5432/app", False),
    ],
)
@pytest.mark.parametrize("command", ["taskq-worker", "taskq enqueue"])
def test_the_codes_password_goes_only_to_the_server_of_the_codes_url(
    monkeypatch: pytest.MonkeyPatch, command: str, target: str, kept: bool
) -> None:
    # A --dsn or TASKQ_DSN naming another server was sent the password the code gave for
    # its own URL's.
    from taskq import TaskQ
    from taskq.cli._enqueue_cmd import _target
    from taskq.worker.cli import _rebuild_app

    monkeypatch.delenv("TASKQ_DSN", raising=False)
    monkeypatch.delenv("TASKQ_SCHEMA", raising=False)
    # The backend's options, not TaskQ's own arguments.
    secrets: tuple[dict[str, Any], ...] = ({"password": "s3cret"}, {"password_file": "/run/secret"})
    for secret in secrets:
        app = TaskQ("postgresql://app@db.example:5432/app", poll_only=True, **secret)
        with structlog.testing.capture_logs() as logs:
            if command == "taskq-worker":
                app = _rebuild_app(app, WorkerSettings.load({"dsn": target}, env={}))
            else:
                app = _target(app, None, target)
        backend: Any = app.backend
        assert app.url == target
        assert app.backend_options["poll_only"] is True  # the code's other options stay
        assert all((name in app.backend_options) is kept for name in secret)
        assert (backend._password is not None) is kept
        dropped = [log for log in logs if log["event"] == "taskq.code-password-dropped"]
        if kept:
            assert not dropped
        else:
            (log,) = dropped
            assert log["dropped"] == list(secret)
            assert "PGPASSWORD" in log["hint"]


@pytest.mark.parametrize(
    ("target", "home", "same"),
    [
        ("postgresql:///db?host=/run/pg/", "postgres://%2Frun%2Fpg:5432/db", True),
        ("postgresql:///db?host=/run/pg", "postgresql:///db?host=/tmp", False),
        ("postgresql://b:5433,a/x", "postgresql:///y?host=a,b,c&port=5432,5433,5432", True),
        ("postgresql://a,b/x", "postgresql://a/x", False),  # b is not the code's
        ("postgresql://[::1]/x", "postgresql://[::1]:5432/x", True),
        ("postgresql://h:x/db", "postgresql://h/db", False),  # unreadable: not the same
        ("postgresql://h:\u00b2/db", "postgresql://h/db", False),  # a digit, not a number
        ("memory://", "postgresql://h/db", False),
        # Read otherwise by asyncpg, which connects (the authority's host and port over
        # the query's; the user part ends at the first @), or naming no server itself.
        ("postgresql://evil.example/db?host=h", "postgresql://h/db", False),
        ("postgresql://h:6432/db?port=5432", "postgresql://h/db", False),
        ("postgresql://u@evil.example,x@h/db", "postgresql://h/db", False),
        ("postgresql:///db?service=other", "postgresql:///db", False),
        ("postgresql://h/db?hostaddr=192.0.2.1", "postgresql://h/db", False),
    ],
)
def test_servers_are_compared_as_libpq_reads_the_urls(
    monkeypatch: pytest.MonkeyPatch, target: str, home: str, same: bool
) -> None:
    from taskq._dsn import same_servers

    monkeypatch.delenv("PGPORT", raising=False)
    assert same_servers(target, home) is same


@pytest.mark.parametrize(
    ("target", "home", "same"),
    [
        ("postgresql://h:5432/db", "postgresql://h/db", False),  # the code's is h:6432
        ("postgresql://h:6432/db", "postgresql://h/db", True),
        ("postgresql://h/x", "postgresql://h/db", True),
    ],
)
def test_a_port_left_out_is_pgports(
    monkeypatch: pytest.MonkeyPatch, target: str, home: str, same: bool
) -> None:
    # Taken as 5432, where both drivers take PGPORT's: the code's password went to
    # another server on its host.
    from taskq._dsn import same_servers

    monkeypatch.setenv("PGPORT", "6432")
    assert same_servers(target, home) is same


@pytest.mark.parametrize(
    ("target", "pguser", "same"),
    [
        ("postgresql://DB/elsewhere?sslmode=require", "app", True),  # PGUSER's
        ("postgresql://db/app?user=app", "other", True),
        ("postgresql://other@db/app", "app", False),  # a password is a role's
        ("postgresql://db/app", "other", False),
        ("postgresql://app@db/app?user=other", "app", False),  # asyncpg: app; libpq: other
        ("postgresql://app@elsewhere/app", "app", False),
    ],
)
def test_a_login_is_the_same_with_the_same_user_on_the_same_servers(
    monkeypatch: pytest.MonkeyPatch, target: str, pguser: str, same: bool
) -> None:
    # The code's password went with a login as another role on the code's server: it
    # failed, and shadowed that role's own in PGPASSWORD or ~/.pgpass.
    from taskq._dsn import same_login

    monkeypatch.setenv("PGUSER", pguser)
    assert same_login(target, "postgresql://app@db/app") is same


def test_a_login_by_an_os_user_with_no_name_is_no_known_login(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A container's arbitrary uid has no passwd entry: getpass.getuser() raised KeyError
    # (before Python 3.13), which escaped the app's retarget instead of dropping the password.
    import pwd

    from taskq._dsn import same_login

    for name in ("PGUSER", "LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert same_login("postgresql://db/elsewhere", "postgresql://app@db/app") is False


def test_a_worker_on_another_schema_than_its_code_warns_of_producers_left_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # TASKQ_SCHEMA moved the workers; a producer built from the same code enqueued to
    # the code's schema, and its jobs waited there unseen, with no word in any log.
    from taskq import TaskQ
    from taskq.worker.cli import _rebuild_app

    app = TaskQ("memory://", schema="taskq")
    monkeypatch.delenv("TASKQ_SCHEMA", raising=False)
    with structlog.testing.capture_logs() as logs:
        # A --schema flag is the worker's own choice: no warning.
        _rebuild_app(
            TaskQ("memory://", schema="taskq"), WorkerSettings.load({"schema": "mine"}, env={})
        )
        monkeypatch.setenv("TASKQ_SCHEMA", "Other")  # one name with "other", as Postgres folds
        rebuilt = _rebuild_app(app, WorkerSettings.load({}))
        _rebuild_app(TaskQ("memory://", schema="OTHER"), WorkerSettings.load({}))
    assert rebuilt.schema == "other"
    [warning] = [e for e in logs if e["event"] == "taskq.schema-differs-from-code"]
    assert (warning["schema"], warning["code_schema"]) == ("other", "taskq")
    assert "TASKQ_SCHEMA" in warning["hint"] and "schema='other'" in warning["hint"]


def test_an_application_takes_the_fleets_backend_tunables_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A reclaim feed read in an application process (watch_reclaims) kept the 2 s
    # default whatever TASKQ_RECLAIM_EVENT_VISIBILITY_DELAY said: only workers read it.
    from taskq import TaskQ
    from taskq.worker.cli import _rebuild_app

    url = "postgresql://postgres@127.0.0.1:5432/none"
    unset: Any = TaskQ(url).backend
    assert unset.command_timeout is None  # only what the environment sets is taken
    monkeypatch.setenv("TASKQ_RECLAIM_EVENT_VISIBILITY_DELAY", "10s")
    monkeypatch.setenv("TASKQ_POLL_ONLY", "true")
    # Valid together for a worker (the watchdog off): valid for the application too.
    monkeypatch.setenv("TASKQ_DISPATCHER_COMMAND_TIMEOUT", "40s")
    monkeypatch.setenv("TASKQ_WATCHDOG_ENABLED", "false")
    backend: Any = TaskQ(url).backend
    assert backend.reclaim_event_visibility_delay == timedelta(seconds=10)
    assert backend.poll_only is True
    assert backend.command_timeout == timedelta(seconds=40)
    # The environment wins over options given in code, in the application as in its
    # workers (which rebuild its backend with their settings).
    app = TaskQ(url, poll_only=False, reclaim_event_visibility_delay=timedelta(seconds=1))
    rebuilt: Any = _rebuild_app(app, WorkerSettings.load({}, env=dict(os.environ))).backend
    built: Any  # a PostgresBackend's attributes, not the protocol's
    for built in (app.backend, rebuilt):
        assert (built.poll_only, built.reclaim_event_visibility_delay.total_seconds()) == (
            True,
            10,
        )
    memory: Any = TaskQ("memory://").backend  # poll-only means nothing in memory
    assert memory.reclaim_event_visibility_delay == timedelta(seconds=10)
    # What a worker refuses fails the application too, with the same message.
    monkeypatch.setenv("TASKQ_RECLAIM_EVENT_VISIBILITY_DELAY", "soon")
    with pytest.raises(SettingsError, match="TASKQ_RECLAIM_EVENT_VISIBILITY_DELAY='soon'"):
        TaskQ("memory://")


def test_the_pool_bounds_are_settings_of_the_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    # An operator sizing the fleet's connections (max_connections) had to change code.
    from taskq import TaskQ

    monkeypatch.setenv("TASKQ_MIN_POOL_SIZE", "2")
    monkeypatch.setenv("TASKQ_MAX_POOL_SIZE", "4")
    backend: Any = TaskQ("postgresql://postgres@127.0.0.1:5432/none").backend
    assert (backend.min_pool_size, backend.max_pool_size) == (2, 4)
    TaskQ("memory://")  # nothing to pool in memory: ignored
    monkeypatch.setenv("TASKQ_MIN_POOL_SIZE", "5")
    with pytest.raises(
        SettingsError,
        match=r"TASKQ_MIN_POOL_SIZE='5', TASKQ_MAX_POOL_SIZE='4'.*must not exceed",
    ):
        TaskQ("memory://")


def test_worker_rows_must_outlive_a_lease() -> None:
    # The reclaim spares a job whose worker was seen within a lease: a row swept sooner
    # let a live but slow worker's jobs be reclaimed and run twice.
    with pytest.raises(SettingsError, match=r"stale_worker_after \(20.0s\) must be above"):
        WorkerSettings.load({"stale_worker_after": "20s"}, env={})
    WorkerSettings.load({"stale_worker_after": "31s"}, env={})
    # Not set: a long lease is no error, and the rows outlive it.
    long_lease = WorkerSettings.load({"lock_lease": "10m"}, env={})
    assert long_lease.worker_row_ttl == timedelta(minutes=20)
    assert WorkerSettings.load({}, env={}).worker_row_ttl == timedelta(minutes=5)


def test_a_stops_waits_fit_in_its_termination_grace() -> None:
    s = timedelta(seconds=1)
    # The defaults leave the end of a stop its room: unchanged.
    assert WorkerSettings.load({}, env={}).stop_waits == (10 * s, 30 * s, 10 * s)
    # Kubernetes' 30 s with the defaults: the three scaled together, 7 s kept for the end.
    k8s = WorkerSettings.load({"termination_grace_period": "30s"}, env={})
    assert k8s.stop_end_reserve == 7 * s
    assert k8s.stop_waits == (23 * s / 5, 69 * s / 5, 23 * s / 5)
    assert sum(k8s.stop_waits, timedelta(0)) + k8s.stop_end_reserve == 30 * s
    # Nothing enforces the wall with the watchdog off: the graces are as set.
    off = WorkerSettings.load({"termination_grace_period": "3s", "watchdog_enabled": False}, env={})
    assert off.stop_waits == (10 * s, 30 * s, 10 * s)


def test_a_command_timeout_that_cannot_fit_a_loops_stale_budget_is_refused() -> None:
    with pytest.raises(SettingsError, match="dispatcher_command_timeout.*poll_interval"):
        WorkerSettings.load({"dispatcher_command_timeout": "12s"}, env={})
    ok = WorkerSettings.load(
        {"dispatcher_command_timeout": "12s", "watchdog_stale_floor": "20s"}, env={}
    )
    assert ok.backend_options()["command_timeout"].total_seconds() == 12
    # The leader's bounded loops too, with the floor their work gets after confirming
    # the leadership: 8 s + 2 s + 1.5 s does not fit max(1.5 s x 5, 10 s). Without that
    # floor counted, a confirmation that took the whole bound was followed by 2 s of
    # work, and the loop went stale.
    slower = {"poll_interval": "3s", "maintenance_interval": "3s", "cron_interval": "3s"}
    with pytest.raises(
        SettingsError,
        match=r"dispatcher_command_timeout \+ leader_work_floor \(10s: its bound and a quarter "
        r"more for each of the rest\) \+ result_expiry_interval",
    ):
        WorkerSettings.load(
            {**slower, "dispatcher_command_timeout": "8s", "result_expiry_interval": "1.5s"},
            env={},
        )
    # The grace a cut-short iteration has to apply its batch ends counts: 8 s + 2 s + 1 s
    # passed, and a hung apply then tripped the watchdog.
    with pytest.raises(
        SettingsError,
        match=r"dispatcher_command_timeout \+ batch_ends_grace \(10s.* \+ poll_interval",
    ):
        WorkerSettings.load({"dispatcher_command_timeout": "8s"}, env={})
    with pytest.raises(SettingsError, match=r"\+ batch_ends_grace .* \+ maintenance_interval"):
        WorkerSettings.load(
            {"dispatcher_command_timeout": "7s", "poll_interval": "500ms"}
            | {"maintenance_interval": "1.5s"},
            env={},
        )
    # Only the loops that apply batch ends (the producer's hand-back, the leader's sweep)
    # have that grace: 6 s + 1.5 s + 1.5 s fits the result expiry's 10 s.
    WorkerSettings.load(
        {"dispatcher_command_timeout": "6s", "result_expiry_interval": "1.5s"}, env={}
    )


def test_the_command_timeout_bounds_every_postgres_statement() -> None:
    from taskq import TaskQ
    from taskq.worker.cli import _rebuild_app

    app = TaskQ("postgresql://postgres@127.0.0.1:5432/none")
    settings = WorkerSettings.load({"dispatcher_command_timeout": "2s"}, env={})
    backend: Any = _rebuild_app(app, settings).backend
    assert backend.command_timeout.total_seconds() == 2


def test_the_worker_command_keeps_its_start_up_objects_out_of_the_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    from taskq.worker.cli import main

    for name in [k for k in os.environ if k.startswith("TASKQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TASKQ_POLL_INTERVAL", "50ms")
    # configure_logging is once per process: keep this test's from reaching the others.
    monkeypatch.setattr("taskq.logs.configure_logging", lambda **_: None)
    gc.unfreeze()
    try:
        assert main(["tests.apps.basic:tq", "--until-idle"]) == 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_queues_given_as_a_json_list_are_those_queues() -> None:
    # Split at its commas, it named the queues '["a"' and ' "b"]': the worker idled.
    assert WorkerSettings.load({}, env={"TASKQ_QUEUES": '["a", "b"]'}).queues == ["a", "b"]
    assert WorkerSettings.load({}, env={"TASKQ_QUEUES": " a, b "}).queues == ["a", "b"]
    with pytest.raises(SettingsError, match=r"TASKQ_QUEUES='\[a, b\]': expected names separated"):
        WorkerSettings.load({}, env={"TASKQ_QUEUES": "[a, b]"})


def test_a_queue_named_with_brackets_is_still_a_queue() -> None:
    # A queue's name may begin with "[" (@actor(queue="[batch]")): the JSON-list reading
    # refused TASKQ_QUEUES='[batch]' and --queues '[batch]', which had named it.
    env = {"TASKQ_QUEUES": "[batch], [low]"}
    assert WorkerSettings.load({}, env=env).queues == ["[batch]", "[low]"]
    assert WorkerSettings.load({"queues": "[batch]"}, env={}).queues == ["[batch]"]
    assert WorkerSettings.load({}, env={"TASKQ_QUEUES": '["[batch]"]'}).queues == ["[batch]"]
    for cut in ('["a", "b"', '["a" "b"]'):
        with pytest.raises(SettingsError, match="expected names separated by commas"):
            WorkerSettings.load({}, env={"TASKQ_QUEUES": cut})


def test_a_negative_duration_is_said_to_be_negative() -> None:
    # It read "expected a duration such as 30, 0.5, 500ms ...", as for a typo.
    with pytest.raises(SettingsError, match="TASKQ_LOCK_LEASE.*must not be negative, got '-5s'"):
        WorkerSettings.load({}, env={"TASKQ_LOCK_LEASE": "-5s"})
    with pytest.raises(SettingsError, match="expected a duration such as"):
        WorkerSettings.load({}, env={"TASKQ_LOCK_LEASE": "-five"})


def test_a_duration_out_of_range_is_a_clear_setting_error() -> None:
    with pytest.raises(SettingsError, match="TASKQ_POLL_INTERVAL.*out of range"):
        WorkerSettings.load({}, env={"TASKQ_POLL_INTERVAL": "99999999999999d"})
    # Given from Python: a bare OverflowError, or "cannot convert float NaN to integer".
    for seconds in (1e20, float("inf"), float("nan")):
        with pytest.raises(SettingsError, match="--lock-lease=.*(out of range|finite number)"):
            WorkerSettings.load({"lock_lease": seconds}, env={})


@pytest.mark.parametrize(
    ("env", "error"),
    [
        # Each passed the start-up check, then failed the running worker: no leader
        # ever (Postgres refused the lease), a busy loop of stack dumps, an error
        # blaming the DSN, detector 2 switched off, a loop crashing on a datetime.
        ({"TASKQ_LEADER_LEASE": "25d"}, "TASKQ_LEADER_LEASE.*at most 24 days"),
        ({"TASKQ_WATCHDOG_DUMP_INTERVAL": "0"}, "TASKQ_WATCHDOG_DUMP_INTERVAL.*greater than 0"),
        (
            {"TASKQ_DISPATCHER_COMMAND_TIMEOUT": "0"},
            "TASKQ_DISPATCHER_COMMAND_TIMEOUT.*greater than 0",
        ),
        ({"TASKQ_WATCHDOG_TICK_GRACE_FACTOR": "inf"}, "TASKQ_WATCHDOG_TICK_GRACE_FACTOR"),
        # NaN was "less than or equal to 1000", of a value that is no number at all.
        ({"TASKQ_WATCHDOG_TICK_GRACE_FACTOR": "nan"}, "GRACE_FACTOR='nan': .*finite number"),
        ({"TASKQ_WATCHDOG_DUMP_AFTER_FRACTION": "nan"}, "FRACTION='nan': .*finite number"),
        ({"TASKQ_WATCHDOG_CHECK_INTERVAL": "120000d"}, "CHECK_INTERVAL.*at most 36500 days"),
        ({"TASKQ_PRUNE_INTERVAL": "999999999d"}, "TASKQ_PRUNE_INTERVAL.*at most 36500 days"),
        # A leader skipped slots every tick (none fired at all, for 1 ms).
        (
            {"TASKQ_CRON_CATCH_UP": "1ms"},
            r"settings \(TASKQ_CRON_CATCH_UP='1ms'\).*at least 2 x cron_interval",
        ),
        # Every failover from a frozen leader skipped the cron slots due meanwhile.
        (
            # A lease within the catch-up, but not its successor's election and tick.
            {"TASKQ_LEADER_LEASE": "2m", "TASKQ_CRON_CATCH_UP": "2m"},
            r"cron_catch_up \(120s\) must be at least .* \(126s\)",
        ),
        (
            {"TASKQ_LEADER_LEASE": "2m"},
            (
                r"settings \(TASKQ_LEADER_LEASE='2m'\): cron_catch_up \(60s\) must be at "
                r"least leader_lease \+ heartbeat_interval \+ cron_interval \(126s\).*set "
                r"cron_catch_up \(TASKQ_CRON_CATCH_UP\) to 126s or more"
            ),
        ),
        # A fence stopping live jobs on a slow database: 25 s <= 3 x 5 s + 2 x 5 s.
        (
            {"TASKQ_LEASE_FENCE": "true", "TASKQ_LOCK_LEASE": "25s"},
            r"lease_fence on, lock_lease \(25.0s\) must exceed .* \(25.0s\)",
        ),
        # A rule across settings names the ones given, not "setting settings".
        ({"TASKQ_LOCK_LEASE": "1s"}, r"invalid settings \(TASKQ_LOCK_LEASE='1s'\): lock_lease"),
    ],
)
def test_a_setting_no_worker_can_run_with_is_refused_at_start_up(
    env: dict[str, str], error: str
) -> None:
    with pytest.raises(SettingsError, match=error):
        WorkerSettings.load({}, env=env)
    WorkerSettings.load({}, env={"TASKQ_ARCHIVE_RETENTION": "3650d"})  # years are fine
    WorkerSettings.load({}, env={"TASKQ_LEASE_FENCE": "true"})  # the defaults leave room
    WorkerSettings.load({}, env={"TASKQ_LEADER_LEASE": "2m", "TASKQ_CRON_CATCH_UP": "126s"})


async def test_a_health_port_already_taken_is_a_clear_error() -> None:
    import socket

    from taskq import TaskQ
    from taskq.errors import ConfigurationError
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        tq = TaskQ("memory://")
        async with tq:
            settings = WorkerSettings.load(
                {**TEST_SETTINGS, "health_port": port, "health_host": "127.0.0.1"}, env={}
            )
            with pytest.raises(ConfigurationError, match=f"cannot listen on 127.0.0.1:{port}"):
                await Worker(tq, settings).run()


@pytest.mark.parametrize(
    "argv",
    [
        ["tests.apps.basic:tq", "--concurrency", "abc"],
        ["--until-idle"],  # APP missing
    ],
)
def test_a_usage_error_exits_1_not_the_watchdogs_2(argv: list[str]) -> None:
    from taskq.worker.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 1


def test_a_subcommands_usage_error_exits_1_too() -> None:
    from taskq.cli import _collect_commands, build_parser

    parser = build_parser(_collect_commands())
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["enqueue", "tests.apps.basic:tq", "nap", "{}", "--delay", "5x"])
    assert exited.value.code == 1


def test_a_connection_lost_while_starting_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gc

    from taskq.worker.cli import main

    for name in [k for k in os.environ if k.startswith("TASKQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr("taskq.logs.configure_logging", lambda **_: None)
    monkeypatch.setenv("TASKQ_STARTUP_WAIT", "0")
    try:
        assert main(["tests.apps.lost_at_start:tq"]) == 1
    finally:
        gc.unfreeze()  # main() froze what it had loaded
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("taskq-worker: error: the connection to the backend failed")
    assert "ConnectionResetError" in err[0]


def _start_late(
    monkeypatch: pytest.MonkeyPatch,
    refusals: int,
    error: Exception,
    wait: str,
    *args: str,
    **env: str,
) -> tuple[int, int, list[MutableMapping[str, Any]]]:
    """``taskq-worker tests.apps.late_backend:tq --until-idle ARGS`` in-process, with the
    ``TASKQ_*`` ``env``, its backend refusing ``refusals`` opens with ``error``: (exit
    code, opens, warnings logged)."""
    import gc

    from structlog.testing import capture_logs

    from taskq.worker.cli import main
    from tests.apps import late_backend

    for name in [k for k in os.environ if k.startswith("TASKQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr("taskq.logs.configure_logging", lambda **_: None)
    monkeypatch.setenv("TASKQ_STARTUP_WAIT", wait)
    monkeypatch.setenv("TASKQ_POLL_INTERVAL", "50ms")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    backend = late_backend.LateBackend()
    backend.refusals, backend.error = refusals, error
    monkeypatch.setattr(late_backend.tq, "backend", backend)
    try:
        with capture_logs() as logs:
            code = main(["tests.apps.late_backend:tq", "--until-idle", *args])
    finally:
        gc.unfreeze()  # main() froze what it had loaded
    warnings = [e for e in logs if e["event"] == "taskq.backend-unreachable-at-start"]
    return code, backend.opens, warnings


def test_health_settings_without_a_health_port_are_said_to_do_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # TASKQ_HEALTH_HOST and TASKQ_HEALTH_TASKS_ENABLED set fleet-wide, the port left out:
    # no health server ran, with no word anywhere.
    import gc

    from structlog.testing import capture_logs

    from taskq.worker.cli import main

    for name in [k for k in os.environ if k.startswith("TASKQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr("taskq.logs.configure_logging", lambda **_: None)
    monkeypatch.setenv("TASKQ_HEALTH_HOST", "127.0.0.1")
    monkeypatch.setenv("TASKQ_HEALTH_TASKS_ENABLED", "true")
    try:
        with capture_logs() as logs:
            assert main(["tests.apps.basic:tq", "--dsn", "memory://", "--until-idle"]) == 0
    finally:
        gc.unfreeze()  # main() froze what it had loaded
    said = [e for e in logs if e["event"] == "taskq.setting-without-effect"]
    assert [e["setting"] for e in said] == ["health_host", "health_tasks_enabled"]
    assert "TASKQ_HEALTH_PORT" in said[0]["hint"]
    # With a port, they take effect: nothing to say.
    assert WorkerSettings.load({"health_port": 0}, env=dict(os.environ)).inert_settings() == {}


def test_a_misspelt_setting_is_named_with_the_one_it_resembles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # TASKQ_CONCURENCY=50 ran at the default concurrency, with no word anywhere.
    import gc

    from structlog.testing import capture_logs

    from taskq.worker.cli import main

    for name in [k for k in os.environ if k.startswith("TASKQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr("taskq.logs.configure_logging", lambda **_: None)
    monkeypatch.setenv("TASKQ_CONCURENCY", "50")
    monkeypatch.setenv("TASKQ_REDIS_URL", "redis://127.0.0.1")  # like no setting: a plugin's
    try:
        with capture_logs() as logs:
            assert main(["tests.apps.basic:tq", "--dsn", "memory://", "--until-idle"]) == 0
    finally:
        gc.unfreeze()  # main() froze what it had loaded
    [warning] = [e for e in logs if e["event"] == "taskq.unknown-setting"]
    assert warning["variable"] == "TASKQ_CONCURENCY"
    assert "did you mean TASKQ_CONCURRENCY?" in warning["hint"]
    assert WorkerSettings.misspelt_env({"TASKQ_DISABLE_PLUGIN": "x", "TASKQ_DSN": "y"}) == {
        "TASKQ_DISABLE_PLUGIN": "TASKQ_DISABLE_PLUGINS"
    }


def test_a_settings_python_name_as_its_variable_is_named_with_the_right_one() -> None:
    # TASKQ_SCHEMA_NAME (the field is schema_name, its variable TASKQ_SCHEMA) was too
    # unlike any variable to be warned about: the worker ran on the default schema.
    assert WorkerSettings.misspelt_env({"TASKQ_SCHEMA_NAME": "tenant"}) == {
        "TASKQ_SCHEMA_NAME": "TASKQ_SCHEMA"
    }


def _translated(cause: BaseException) -> TaskQError:
    # What PostgresBackend.open raises: a TaskQ error whose cause is the driver's.
    error = TaskQError("cannot connect to PostgreSQL at postgresql://127.0.0.1:5432/x")
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    "error",
    [ConnectionRefusedError("connection refused"), _translated(ConnectionRefusedError())],
    ids=["driver-error", "translated"],
)
def test_a_worker_waits_for_a_backend_that_is_not_up_yet(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    code, opens, warnings = _start_late(monkeypatch, 2, error, "30s")
    assert code == 0
    assert opens == 3
    assert len(warnings) == 2
    assert warnings[0]["error"] == (" ".join(str(error).split()) or "ConnectionRefusedError")
    assert warnings[0]["retry_in"] == 0.25 and warnings[1]["retry_in"] == 0.5


def test_an_error_that_cannot_heal_fails_at_once_without_waiting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = _translated(ValueError("password authentication failed for user x"))
    code, opens, warnings = _start_late(monkeypatch, 100, refused, "30s")
    assert (code, opens, warnings) == (1, 1, [])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "taskq-worker: error: cannot connect to PostgreSQL at postgresql://127.0.0.1:5432/x"
    ]


def test_a_read_only_server_fails_the_start_at_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # ReadOnlyDatabaseError is transient for a worker's loops (a provider's disk full):
    # a start (--migrate on a standby) took it for a server not up yet, said it was
    # unreachable and waited startup_wait before saying what it was.
    from taskq_postgres import ReadOnlyDatabaseError

    refused = ReadOnlyDatabaseError("the database refused a write: point the DSN at the primary")
    code, opens, warnings = _start_late(monkeypatch, 100, refused, "30s")
    assert (code, opens, warnings) == (1, 1, [])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"taskq-worker: error: {refused}"]


def test_a_worker_gives_up_after_startup_wait(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, opens, warnings = _start_late(monkeypatch, 100, _translated(OSError("down")), "600ms")
    assert code == 1
    assert opens == len(warnings) + 1 >= 3  # 0.25 s, then what is left of the wait
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("taskq-worker: error: cannot connect")


def test_startup_wait_0_fails_at_the_first_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    code, opens, warnings = _start_late(monkeypatch, 1, ConnectionRefusedError(), "0")
    assert (code, opens, warnings) == (1, 1, [])


def test_a_health_port_already_taken_fails_before_waiting_for_the_backend(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The port was bound once the backend opened: after the whole wait (30 s by default).
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, opens, warnings = _start_late(
            monkeypatch,
            100,
            ConnectionRefusedError(),
            "30s",
            "--health-port",
            str(port),
            TASKQ_HEALTH_HOST="127.0.0.1",
        )
    assert (code, opens, warnings) == (1, 0, [])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        f"taskq-worker: error: health server: cannot listen on 127.0.0.1:{port}"
    )


def test_no_duration_setting_may_be_negative() -> None:
    durations = [
        name
        for name, field in WorkerSettings.model_fields.items()
        if "timedelta" in str(field.annotation)
    ]
    assert "startup_wait" in durations and "drain_grace_period" in durations
    for name in durations:
        with pytest.raises(ValidationError, match="must not be negative"):
            WorkerSettings(**{name: -1})


def test_no_number_setting_takes_true_or_false() -> None:
    # pydantic's lax numbers read True as 1 and False as 0: concurrency=True ran one job
    # at a time, health_port=False served on any free port, completion_window=True
    # delayed every success by a second.
    numbers = [
        name
        for name, field in WorkerSettings.model_fields.items()
        if any(kind in str(field.annotation) for kind in ("int", "float", "timedelta"))
    ]
    assert {"concurrency", "prefetch", "health_port", "watchdog_dump_after_fraction"} <= set(
        numbers
    )
    assert "completion_window" in numbers and "leader_reclaim_grace" in numbers
    for name in numbers:
        flag = "--" + name.replace("_", "-")
        for value in (True, False):
            with pytest.raises(
                SettingsError, match=rf"^invalid setting {flag}={value}: .*, not {value}$"
            ):
                WorkerSettings.load({name: value}, env={})
    with pytest.raises(
        SettingsError, match=r"--concurrency=True: must be a whole number, not True"
    ):
        WorkerSettings.load({"concurrency": True}, env={})


def test_a_number_setting_from_the_environment_is_read_as_before() -> None:
    settings = WorkerSettings.load({}, env={"TASKQ_CONCURRENCY": "8", "TASKQ_HEALTH_PORT": "0"})
    assert (settings.concurrency, settings.health_port) == (8, 0)
    with pytest.raises(SettingsError, match="TASKQ_CONCURRENCY='true'"):
        WorkerSettings.load({}, env={"TASKQ_CONCURRENCY": "true"})


def test_the_applications_own_logging_set_up_is_kept() -> None:
    # The worker took the root logger before importing the application: its
    # basicConfig did nothing, its lines vanished.
    proc = worker("tests.apps.own_logging:tq", "--until-idle", env={"TASKQ_POLL_INTERVAL": "50ms"})
    assert proc.returncode == 0, proc.stderr
    assert "APP INFO configured its own logging" in proc.stderr.splitlines()


def test_a_worker_builds_its_application_anew_in_place_from_the_codes_values() -> None:
    # In place, so that the actors' code using the app reaches an opened backend; from
    # the code's values each time, so that a second worker of the same process (a
    # test's) did not start on the first one's --dsn.
    from taskq import TaskQ
    from taskq.worker.cli import _rebuild_app

    app = TaskQ("memory://", schema="code")
    first = app.backend
    assert _rebuild_app(app, WorkerSettings.load({"schema": "mine"}, env={})) is app
    assert app.schema == "mine" and app.backend is not first
    assert app.client._backend is app.backend  # the client goes with it
    _rebuild_app(app, WorkerSettings.load({}, env={}))
    assert app.schema == "code"
