"""taskq-testing: the pytest plugin, the backend conformance suite, and a worker run
until idle for tests of an application's actors."""

from __future__ import annotations

from taskq_testing.worker import TEST_SETTINGS, run_until_idle

__all__ = ["TEST_SETTINGS", "run_until_idle"]
