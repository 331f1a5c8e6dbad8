"""The ``taskq`` and ``taskq-worker`` console scripts' entry points.

A module of its own, outside the ``taskq`` package: importing anything in it first
imports the package's facade (pydantic, the models, the app), a good part of a second
in which a Ctrl-C printed the import's traceback. Here that import runs inside the
``try``, and an interrupt exits as one does elsewhere: with ``EXIT_ERROR``, quietly
(nothing has been changed yet; the commands say so themselves once they act).
"""

from __future__ import annotations

__all__ = ["taskq", "taskq_worker"]

_EXIT_INTERRUPTED = 1
"""``taskq.cli.EXIT_ERROR``, written out: importing it is the import this guards."""


def taskq() -> int:
    """The ``taskq`` command."""
    try:
        from taskq.cli import main

        return main()
    except KeyboardInterrupt:
        return _EXIT_INTERRUPTED


def taskq_worker() -> int:
    """The ``taskq-worker`` command."""
    try:
        from taskq.worker.cli import main

        return main()
    except KeyboardInterrupt:
        return _EXIT_INTERRUPTED
