"""Fixtures of the core tests."""

from tests.core.plugin_stubs import add_plugin, entry_points  # noqa: F401 - fixtures, found here
