"""The argument parser of TaskQ's commands (``taskq``, ``taskq-worker``).

argparse's own, except for the exit code of a bad argument: argparse exits 2, which
TaskQ's commands keep for a watchdog trip (``EXIT_WATCHDOG``), so that a supervisor can
tell a typo in a deploy from a wedged worker. A usage error is an error: exit 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

__all__ = ["ArgumentParser"]

_EXIT_USAGE = 1


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors exit 1 (subcommands' too)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(_EXIT_USAGE, f"{self.prog}: error: {message}\n")
