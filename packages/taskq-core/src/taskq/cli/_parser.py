"""The argument parser of TaskQ's commands (``taskq``, ``taskq-worker``).

argparse's own, except for two things:

* the exit code of a bad argument: argparse exits 2, which TaskQ's commands keep for a
  watchdog trip (``EXIT_WATCHDOG``), so that a supervisor can tell a typo in a deploy
  from a wedged worker. A usage error is an error: exit 1.
* what counts as a value rather than an option: argparse takes ``-5`` and ``-0.5`` as
  values but ``-5s`` as an unknown option, so ``--delay -5s`` failed with "expected one
  argument" while ``--delay=-5s`` reached the duration parser. Here any argument that
  is a minus followed by a digit is a value (no TaskQ option is spelled so), and each
  duration option says itself what is wrong with a negative one.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn

__all__ = ["ArgumentParser"]

_EXIT_USAGE = 1

_NEGATIVE_VALUE = re.compile(r"^-\.?\d")
"""A negative number or duration: ``-5``, ``-.5``, ``-5s``, ``-500ms``."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors exit 1 (subcommands' too), and
    whose options take a negative duration as a separate argument (``--delay -5s``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse's own test (r"^-\d+$|^-\d*\.\d+$") knows bare numbers only.
        # Subcommands' parsers are built from this class, so they share it.
        self._negative_number_matcher = _NEGATIVE_VALUE

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(_EXIT_USAGE, f"{self.prog}: error: {message}\n")
