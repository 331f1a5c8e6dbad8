"""``taskq embedded status|stop``: the embedded server that outlives the commands.

Registered only when the ``[embedded]`` extra is installed (see
:mod:`taskq_postgres._embedded` for why the server keeps running).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskq.cli import CommandRegistry


def _configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    status = actions.add_parser(
        "status",
        help="say whether the server under ./.taskq/ of this directory runs, and its DSN",
        description="Say whether the embedded server under ./.taskq/ runs, and its DSN "
        "(export it as TASKQ_DSN to reach it from your own code). Exits 0 either way.",
    )
    status.add_argument("--json", action="store_true", help="print JSON for scripts")
    actions.add_parser(
        "stop",
        help="stop the server under ./.taskq/ of this directory (its data stays)",
        description="Stop the embedded server under ./.taskq/ with a fast shutdown: sessions "
        "are disconnected, the data stays. Succeeds when none is running.",
    )


def _status(as_json: bool) -> int:
    from taskq_postgres._embedded import SHOWN_DIR, data_dir, find_running

    server = find_running()
    if as_json:
        print(
            json.dumps(
                {
                    "running": server is not None,
                    "pid": server.pid if server else None,
                    "dsn": server.dsn if server else None,
                    "data_dir": str(data_dir()),
                },
                indent=2,
            )
        )
    elif server is None:
        print(f"no embedded PostgreSQL is running under {SHOWN_DIR}")
    else:
        print(f"the embedded PostgreSQL under {SHOWN_DIR} is running (pid {server.pid})")
        print(f"DSN: {server.dsn}")
    return 0


def _stop() -> int:
    from taskq_postgres._embedded import SHOWN_DIR, stop

    pid = stop()
    if pid is None:
        print(f"no embedded PostgreSQL is running under {SHOWN_DIR}")
    else:
        print(f"stopped the embedded PostgreSQL under {SHOWN_DIR} (pid {pid})")
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.action == "status":
        return _status(args.json)
    return _stop()


def register(cli: CommandRegistry) -> None:
    """Add ``taskq embedded`` to the ``taskq`` command."""
    cli.add(
        "embedded",
        help="show or stop the embedded PostgreSQL that commands start under ./.taskq/ "
        "when no DSN is given",
        configure=_configure,
        run=_run,
    )
