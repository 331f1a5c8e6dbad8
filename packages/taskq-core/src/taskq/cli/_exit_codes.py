"""The exit codes of ``taskq`` and ``taskq-worker`` (API.md section 6)."""

from __future__ import annotations

from typing import Final

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_WATCHDOG"]

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
"""Bad input or configuration, an unreachable database, a third stop signal; and
``taskq migrate --status`` while a migration is pending."""
EXIT_WATCHDOG: Final = 2
"""A watchdog ended a hung process; nothing else exits with it, so a supervisor can
tell a hang (restart, alert) from a mistake."""
