"""The embedded server's lifetime: started by the first command, reused, stopped on request."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from taskq_postgres._migrate import load_migrations
from tests.demo._support import needs_pgserver, taskq

pytestmark = needs_pgserver

BUNDLED = [m.name for m in load_migrations()]


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    stopped = taskq("embedded", "stop", cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr


def _status(project: Path) -> dict[str, object]:
    result = taskq("embedded", "status", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    status: dict[str, object] = json.loads(result.stdout)
    return status


def _exits_within(pid: int, *, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_migrate_without_a_dsn_uses_the_embedded_server(project: Path) -> None:
    assert _status(project)["running"] is False

    first = taskq("migrate", "--json", cwd=project)
    assert first.returncode == 0, first.stderr
    assert "started an embedded PostgreSQL under ./.taskq/" in first.stderr
    assert json.loads(first.stdout) == {"schema": "taskq", "applied": BUNDLED, "newer": []}

    running = _status(project)
    assert running["running"] is True
    assert str(running["dsn"]).startswith("postgresql://")
    assert running["data_dir"] == str(project / ".taskq" / "pgdata")

    again = taskq("migrate", cwd=project)
    assert again.returncode == 0, again.stderr
    assert "using the running embedded PostgreSQL under ./.taskq/" in again.stderr
    assert again.stdout.strip() == "schema taskq is up to date"
    assert _status(project)["pid"] == running["pid"]


def test_commands_started_together_share_the_server_one_of_them_starts(project: Path) -> None:
    # The others read its postmaster.pid while it was being written (initdb's backends
    # write their own): one command in three failed, with pgserver's AssertionError.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda _: taskq("migrate", cwd=project), range(3)))
    for result in results:
        assert result.returncode == 0, result.stderr
        assert "plugin-hook-failed" not in result.stderr
    assert _status(project)["running"] is True


def test_the_data_directory_is_made_before_pgserver_is_asked_for_a_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pgserver makes it with a check, then mkdir(exist_ok=False): a command started at
    # the same moment as another lost that race now and then, "[Errno 17] File exists".
    from taskq_postgres import _embedded

    with _embedded._quiet_runtime_dir():  # pgserver's import asks for a runtime dir
        import pgserver.postgres_server

    asked: list[bool] = []

    class Started:
        def get_uri(self) -> str:
            return "postgresql://postgres@/postgres"

    def get_server(pgdata: Path, **_: object) -> Started:
        asked.append(Path(pgdata).is_dir())
        return Started()

    monkeypatch.setattr(pgserver.postgres_server, "get_server", get_server)
    assert _embedded.default_dsn(tmp_path) == "postgresql://postgres@/postgres"
    assert asked == [True]


def test_stop_ends_the_server_and_keeps_its_data(project: Path) -> None:
    assert taskq("migrate", cwd=project).returncode == 0
    pid = _status(project)["pid"]
    assert isinstance(pid, int)

    stopped = taskq("embedded", "stop", cwd=project)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"stopped the embedded PostgreSQL under ./.taskq/ (pid {pid})"
    # Like `pg_ctl stop`, stop returns once the server removed postmaster.pid;
    # the process itself exits a moment later.
    assert _exits_within(pid, seconds=5)
    assert _status(project)["running"] is False

    idle = taskq("embedded", "stop", cwd=project)
    assert idle.returncode == 0, idle.stderr
    assert idle.stdout.strip() == "no embedded PostgreSQL is running under ./.taskq/"

    restarted = taskq("migrate", cwd=project)
    assert restarted.returncode == 0, restarted.stderr
    assert "started an embedded PostgreSQL" in restarted.stderr
    assert restarted.stdout.strip() == "schema taskq is up to date"


def test_a_start_replaces_a_short_postmaster_pid_whose_process_is_gone(project: Path) -> None:
    # Left by an initdb or a start that failed: taken as stale (no server runs), but
    # the start then failed on pgserver's reading of it, a bare line-count assertion.
    assert taskq("migrate", cwd=project).returncode == 0
    assert taskq("embedded", "stop", cwd=project).returncode == 0
    pid_file = project / ".taskq" / "pgdata" / "postmaster.pid"
    pid_file.write_text("-999999999\n/x\n")
    os.utime(pid_file, (1_700_000_000, 1_700_000_000))

    restarted = taskq("migrate", cwd=project)
    assert restarted.returncode == 0, restarted.stderr
    assert "started an embedded PostgreSQL" in restarted.stderr
    assert restarted.stdout.strip() == "schema taskq is up to date"
    assert _status(project)["running"] is True


def test_a_postmaster_pid_naming_another_process_is_refused_not_signalled(
    tmp_path: Path,
) -> None:
    # `taskq embedded stop` sent SIGINT to whatever pid the file named (a stale file whose
    # pid was reused, or a planted one), and the commands connected where it said.
    import signal

    from taskq_postgres._embedded import EmbeddedServerError, data_dir, find_running, stop

    pgdata = data_dir(tmp_path)
    pgdata.mkdir(parents=True)
    (pgdata / "PG_VERSION").write_text("15\n")
    (pgdata / "postmaster.pid").write_text(
        f"{os.getpid()}\n{pgdata}\n1700000000\n5432\n/tmp\n127.0.0.1\n  1  2\nready   \n"
    )
    interrupted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        for call in (find_running, stop):
            with pytest.raises(EmbeddedServerError, match="not a PostgreSQL server on this dir"):
                call(tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupted == []


@pytest.mark.parametrize("content", ["", "garbage\n", "0\n/x\n"])
def test_an_unreadable_postmaster_pid_is_said_not_a_traceback(tmp_path: Path, content: str) -> None:
    # pgserver's parse of the file failed with a bare AssertionError, in every command.
    from taskq_postgres._embedded import EmbeddedServerError, data_dir, find_running, stop

    pgdata = data_dir(tmp_path)
    pgdata.mkdir(parents=True)
    pid_file = pgdata / "postmaster.pid"
    pid_file.write_text(content)
    os.utime(pid_file, (1_700_000_000, 1_700_000_000))  # left long ago
    for call in (find_running, stop):
        with pytest.raises(EmbeddedServerError, match=r"postmaster.pid cannot be read .* delete"):
            call(tmp_path)


@pytest.mark.parametrize(
    "content", ["999999999\n/x\n", "-999999999\n/x\n", "99999999999999999999\n"]
)
def test_a_short_postmaster_pid_whose_process_is_gone_is_stale(
    tmp_path: Path, content: str
) -> None:
    # Left by an initdb that failed (its single-user backend's, pid negated): PostgreSQL
    # replaces such a file at its next start, and no server runs to stop.
    from taskq_postgres._embedded import data_dir, find_running, stop

    pgdata = data_dir(tmp_path)
    pgdata.mkdir(parents=True)
    pid_file = pgdata / "postmaster.pid"
    pid_file.write_text(content)
    os.utime(pid_file, (1_700_000_000, 1_700_000_000))
    assert find_running(tmp_path) is None
    assert stop(tmp_path) is None


def test_a_short_postmaster_pid_left_long_ago_naming_a_live_process_is_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its pid reused by another process (after a reboot): no server is writing it, and
    # every command read it again for the whole wait before saying so.
    from taskq_postgres._embedded import EmbeddedServerError, data_dir, find_running, stop

    pgdata = data_dir(tmp_path)
    pgdata.mkdir(parents=True)
    pid_file = pgdata / "postmaster.pid"
    pid_file.write_text(f"{os.getpid()}\n{pgdata}\n1700000000\n")
    os.utime(pid_file, (1_700_000_000, 1_700_000_000))

    def read_again(seconds: float) -> None:
        raise AssertionError("a file no server is writing was read again")

    monkeypatch.setattr(time, "sleep", read_again)  # the module _embedded sleeps with
    for call in (find_running, stop):
        with pytest.raises(EmbeddedServerError, match=r"postmaster.pid cannot be read .* delete"):
            call(tmp_path)


def test_a_postmaster_pid_this_user_may_not_read_is_said_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another user's server (pgdata theirs, 0700): every command read the file again for
    # the whole wait, then said to delete it, of a server that runs.
    from taskq_postgres._embedded import EmbeddedServerError, data_dir, find_running

    pgdata = data_dir(tmp_path)
    pgdata.mkdir(parents=True)
    pid_file = pgdata / "postmaster.pid"
    pid_file.write_text(f"{os.getpid()}\n{pgdata}\n")
    stat, read_text = Path.stat, Path.read_text

    def refused(method: Callable[..., object]) -> Callable[..., object]:
        def call(self: Path, *args: object, **kwargs: object) -> object:
            if self == pid_file:  # as a user outside pgdata's 0700 finds it (root is not)
                raise PermissionError(13, "Permission denied", str(self))
            return method(self, *args, **kwargs)

        return call

    def read_again(seconds: float) -> None:
        raise AssertionError("a file this user cannot read was read again")

    monkeypatch.setattr(Path, "stat", refused(stat))
    monkeypatch.setattr(Path, "read_text", refused(read_text))
    monkeypatch.setattr(time, "sleep", read_again)  # the module _embedded sleeps with
    with pytest.raises(EmbeddedServerError, match=r"cannot be read as this user .* another user"):
        find_running(tmp_path)


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(lambda: f"{os.getpid()}\n/x\n1700000000\n5432\n", id="short-live-pid"),
        # initdb's single-user backends write their pid negated; and a file just made.
        pytest.param(lambda: f"-{os.getpid()}\n/x\n", id="negated-pid"),
        pytest.param(lambda: "", id="just-created"),
    ],
)
def test_a_postmaster_pid_a_starting_server_is_still_writing_is_read_once_complete(
    tmp_path: Path, first: Callable[[], str]
) -> None:
    # A server starting writes the file in steps: a reading in between found it short,
    # and a command run while another started the server failed.
    import threading

    from taskq_postgres._embedded import EmbeddedServerError, data_dir, find_running

    pgdata = data_dir(tmp_path)
    pgdata.mkdir(parents=True)
    (pgdata / "PG_VERSION").write_text("15\n")
    pid_file = pgdata / "postmaster.pid"
    pid_file.write_text(first())
    complete = threading.Timer(
        0.3,
        pid_file.write_text,
        [f"{os.getpid()}\n{pgdata}\n1700000000\n5432\n/tmp\n127.0.0.1\n  1  2\nready   \n"],
    )
    complete.start()
    try:
        # Read whole: this process is no PostgreSQL, which only the whole file shows.
        with pytest.raises(EmbeddedServerError, match="not a PostgreSQL server on this dir"):
            find_running(tmp_path)
    finally:
        complete.join()


def test_a_project_path_too_long_for_a_socket_still_finds_and_stops_its_server(
    tmp_path: Path,
) -> None:
    # pgserver puts the socket in a short runtime directory then (-k), and the check of
    # the postmaster.pid refused the server's own file: no command worked, and stop
    # could not stop it.
    project = tmp_path / ("p" * 90)
    project.mkdir()
    try:
        first = taskq("migrate", cwd=project)
        assert first.returncode == 0, first.stderr
        running = _status(project)
        assert running["running"] is True
        assert ".taskq" not in str(running["dsn"])  # the socket is elsewhere
        assert taskq("jobs", "list", cwd=project).returncode == 0
    finally:
        stopped = taskq("embedded", "stop", cwd=project)
    assert stopped.returncode == 0, stopped.stderr
    assert _status(project)["running"] is False
