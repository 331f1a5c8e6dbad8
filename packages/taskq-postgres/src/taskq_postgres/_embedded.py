"""The embedded PostgreSQL server behind the ``taskq`` commands' default DSN.

With the ``[embedded]`` extra installed, a command given no ``--dsn`` and no
``TASKQ_DSN`` gets a server that pgserver runs from its bundled binaries,
with its data under ``./.taskq/pgdata`` of the current directory.

Lifetime: the server outlives the command that started it. Someone who runs
``taskq demo`` and then ``taskq jobs list`` expects to see the demo's jobs,
and a fresh start per command would cost a second or more each time. The
next command in the same directory finds the running server through its
``postmaster.pid`` and reuses it; ``taskq embedded stop`` stops it and
``taskq embedded status`` shows it. The data stays in ``./.taskq/`` across
stops; delete that directory (after stopping) to start from nothing.

pgserver is imported inside the functions, so that loading the plugin stays
cheap and works without the extra.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from taskq.errors import TaskQError

__all__ = [
    "SHOWN_DIR",
    "EmbeddedServer",
    "EmbeddedServerError",
    "data_dir",
    "default_dsn",
    "find_running",
    "is_available",
    "stop",
]

SHOWN_DIR: Final = "./.taskq/"
"""How messages name the directory: relative, as the user typed nothing."""

_STOP_TIMEOUT_SECONDS: Final = 30.0
_STARTING_WAIT_SECONDS: Final = 30.0
"""How long a ``postmaster.pid`` that a server may still be writing is read again."""


class EmbeddedServerError(TaskQError):
    """The embedded PostgreSQL server could not be started or stopped.

    Its log is ``./.taskq/pgdata/log``. Pass ``--dsn`` (or set ``TASKQ_DSN``)
    to use another server instead.
    """


@dataclass(frozen=True)
class EmbeddedServer:
    """A running embedded server: its postmaster's pid and a DSN to reach it."""

    pid: int
    dsn: str


def is_available() -> bool:
    """Whether the ``[embedded]`` extra (pgserver) is installed."""
    return importlib.util.find_spec("pgserver") is not None


def data_dir(base: Path | None = None) -> Path:
    """The server's data directory: ``.taskq/pgdata`` under ``base`` (default: the cwd)."""
    return (base if base is not None else Path.cwd()) / ".taskq" / "pgdata"


@contextmanager
def _quiet_runtime_dir() -> Iterator[None]:
    # pgserver asks platformdirs for a runtime directory (for its lock file and a
    # fallback socket directory) when it is imported and when it starts a server.
    # Without XDG_RUNTIME_DIR platformdirs warns and falls back to a directory
    # that works; the warning would only alarm users (and fail warning-strict tests).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"platformdirs(\.|$)")
        yield


def find_running(base: Path | None = None) -> EmbeddedServer | None:
    """The server running on ``data_dir(base)``, or None when none is.

    ``EmbeddedServerError`` when its ``postmaster.pid`` names a live process that is
    not this directory's PostgreSQL, or a socket outside it: a stale file whose pid was
    reused, or one planted there. Trusted, it had ``taskq embedded stop`` signal that
    process, and the commands connect wherever the file said.
    """
    pgdata = data_dir(base)
    info = _read_postmaster_pid(pgdata)
    if info is None or not info.is_running():
        return None
    problem = _not_ours(info, pgdata)
    if problem is not None:
        raise EmbeddedServerError(
            f"{SHOWN_DIR}pgdata/postmaster.pid names pid {info.pid}, {problem}: the file is "
            f"stale or was not written by its server. If no PostgreSQL runs on "
            f"{SHOWN_DIR}pgdata, delete the file and run the command again"
        )
    return EmbeddedServer(pid=info.pid, dsn=info.get_uri())


def _read_postmaster_pid(pgdata: Path) -> Any:
    """pgserver's reading of ``pgdata``'s ``postmaster.pid`` (None: no file).

    A server that is starting writes the file in steps, and while ``initdb`` runs, each
    of its single-user backends writes one of its own (its pid negated) and removes it;
    a reading in between finds it empty or short. So a file written within the last
    seconds is read again, for a while. One whose pid is gone is stale, as PostgreSQL
    takes it (a start replaces it): None, no server runs (an initdb that failed left one
    behind). One that stays unreadable is ``EmbeddedServerError`` (pgserver's own parse
    failed with a bare traceback, and PostgreSQL refuses to start over a file with no
    pid).
    """
    with _quiet_runtime_dir():
        from pgserver.utils import PostmasterInfo

    pid_file = pgdata / "postmaster.pid"
    deadline = time.monotonic() + _STARTING_WAIT_SECONDS
    while True:
        try:
            return PostmasterInfo.read_from_pgdata(pgdata)
        except AssertionError:  # pgserver's check of the line count
            problem = "it lacks lines a running server's file has"
        except PermissionError as exc:
            # Another user's server (started with sudo, pgdata theirs): no reading again
            # makes it readable, and deleting the file is not the fix.
            raise EmbeddedServerError(
                f"{SHOWN_DIR}pgdata/postmaster.pid cannot be read as this user "
                f"({exc.strerror}): the embedded PostgreSQL under {SHOWN_DIR} belongs to "
                f"another user; run the command as that user, or pass --dsn / set TASKQ_DSN "
                f"to use another server"
            ) from None
        except (ValueError, OSError) as exc:
            problem = " ".join(str(exc).split())[:160] or type(exc).__name__
        try:
            named = abs(int(pid_file.read_text().split("\n", 1)[0]))
        except FileNotFoundError:
            continue  # removed meanwhile: read its absence
        except (OSError, ValueError):
            named = 0
        if named > 0 and not _alive(named):
            return None
        # Only a file written lately: a server, or initdb's backend, adds its lines within
        # moments of the first. A live pid alone is no sign, a stale file's pid reused by
        # another process (after a reboot) waited out the whole wait in every command.
        being_written = _written_within(pid_file, _STARTING_WAIT_SECONDS)
        if not being_written or time.monotonic() > deadline:
            raise EmbeddedServerError(
                f"{SHOWN_DIR}pgdata/postmaster.pid cannot be read ({problem}): left incomplete "
                f"by a server that crashed while it started? If no PostgreSQL runs on "
                f"{SHOWN_DIR}pgdata, delete the file and run the command again"
            )
        time.sleep(0.05)


def _remove_stale_pid_file(pgdata: Path) -> None:
    """Remove ``pgdata``'s ``postmaster.pid`` that pgserver cannot parse (short: left by
    an initdb or a start that failed) and whose pid is gone, as PostgreSQL's start would:
    pgserver's own reading of it failed the start with a bare line-count assertion.
    Under pgserver's lock, which every start through it holds, so no server or initdb
    is writing it meanwhile."""
    from pgserver.postgres_server import PostgresServer
    from pgserver.utils import PostmasterInfo

    pid_file = pgdata / "postmaster.pid"
    with PostgresServer._lock:
        try:
            PostmasterInfo.read_from_pgdata(pgdata)
            return  # none, or one pgserver reads (and PostgreSQL replaces when stale)
        except (AssertionError, ValueError, OSError):
            pass
        try:
            named = abs(int(pid_file.read_text().split("\n", 1)[0]))
        except (OSError, ValueError):
            return  # no pid to judge by: find_running said what to do with it
        if named > 0 and not _alive(named):
            pid_file.unlink(missing_ok=True)


def _written_within(path: Path, seconds: float) -> bool:
    try:
        age = time.time() - path.stat().st_mtime  # noqa: TID251 - a file's age: wall time
    except FileNotFoundError:  # removed meanwhile: read it (or its absence) again
        return True
    except OSError:  # not to be known by waiting
        return False
    return age < seconds


def _not_ours(info: Any, pgdata: Path) -> str | None:
    """Why ``info``'s process is not the PostgreSQL serving ``pgdata``, or None."""
    try:
        argv = [str(arg) for arg in info.process.cmdline()]
    except Exception as exc:  # noqa: BLE001 - psutil's own errors (gone, not allowed)
        return f"whose command line cannot be read ({type(exc).__name__})"
    here = pgdata.resolve()
    served = [Path(argv[i + 1]).resolve() for i, arg in enumerate(argv[:-1]) if arg == "-D"]
    if not argv or not Path(argv[0]).name.startswith("postgres") or here not in served:
        return f"which is not a PostgreSQL server on this directory ({' '.join(argv)[:120]!r})"
    # Its socket is in the data directory, or where the server was told to put it (-k:
    # pgserver moves it to a short runtime path when the directory's is too long).
    sockets = {here, *(Path(argv[i + 1]).resolve() for i, a in enumerate(argv[:-1]) if a == "-k")}
    if info.socket_dir is not None:
        if Path(info.socket_dir).resolve() not in sockets:
            return f"with its socket where the server was not told to put it ({info.socket_dir})"
    elif info.hostname not in ("localhost", "127.0.0.1", "::1"):
        return f"listening on {info.hostname}, not on this machine"
    return None


def default_dsn(base: Path | None = None) -> str | None:
    """Start (or reuse) the embedded server and return its DSN; None without pgserver.

    Says on stderr, in one line, that the embedded server is in use and how to
    stop it, so nobody mistakes it for their own database.
    """
    if not is_available():
        return None
    pgdata = data_dir(base)
    # Checked before pgserver, which would connect wherever a running pid's file said.
    already_running = find_running(base) is not None
    try:
        # Made here, not by pgserver: its check-then-mkdir (exist_ok=False) lost the race
        # to another command started at the same moment, which failed with "File exists".
        # initdb takes the empty directory (pgserver's lock keeps to one initdb).
        pgdata.mkdir(parents=True, exist_ok=True)
        with _quiet_runtime_dir():
            from pgserver.postgres_server import get_server

            if not already_running:
                _remove_stale_pid_file(pgdata)
            # cleanup_mode=None: leave the server running when this process exits.
            dsn = get_server(pgdata, cleanup_mode=None).get_uri()
    except (OSError, subprocess.SubprocessError, RuntimeError, AssertionError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise EmbeddedServerError(
            f"could not start the embedded PostgreSQL under {SHOWN_DIR}: {reason}. "
            f"Its log is {SHOWN_DIR}pgdata/log; or pass --dsn / set TASKQ_DSN to use another server"
        ) from exc
    verb = "using the running" if already_running else "started an"
    print(
        f"taskq: no --dsn or TASKQ_DSN given; {verb} embedded PostgreSQL under {SHOWN_DIR} "
        f"(stop it with: taskq embedded stop)",
        file=sys.stderr,
    )
    return dsn


def stop(base: Path | None = None, *, timeout: float = _STOP_TIMEOUT_SECONDS) -> int | None:
    """Stop the server on ``data_dir(base)``; return its pid, or None if none was running.

    SIGINT asks the postmaster for a *fast* shutdown: open sessions are
    disconnected and their transactions rolled back, then the server writes a
    checkpoint and removes ``postmaster.pid``, which is what we wait for.
    Signalling works whoever owns the server (pgserver runs it as a dedicated
    user when we are root), where ``pg_ctl stop`` would have to switch users.
    """
    server = find_running(base)
    if server is None:
        return None
    pid_file = data_dir(base) / "postmaster.pid"
    try:
        os.kill(server.pid, signal.SIGINT)
    except ProcessLookupError:
        return server.pid  # it exited on its own in between
    except PermissionError as exc:
        raise EmbeddedServerError(
            f"not allowed to stop the embedded PostgreSQL under {SHOWN_DIR} (pid {server.pid}): "
            f"it runs as another user; stop it as that user"
        ) from exc
    deadline = time.monotonic() + timeout
    while pid_file.exists() and _alive(server.pid):
        if time.monotonic() > deadline:
            raise EmbeddedServerError(
                f"the embedded PostgreSQL under {SHOWN_DIR} (pid {server.pid}) did not stop "
                f"within {timeout:.0f} s; see {SHOWN_DIR}pgdata/log"
            )
        time.sleep(0.05)
    return server.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such pid; none so large (a bad file)
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
