"""Plugin discovery and the public hook markers.

Third-party distributions declare an entry point in the ``taskq`` group and
implement hooks from :mod:`taskq.plugins.hookspecs` with :data:`hookimpl`.
"""

from __future__ import annotations

from taskq.plugins._registry import PluginInfo as PluginInfo
from taskq.plugins._registry import backend_factories as backend_factories
from taskq.plugins._registry import get_plugin_manager as get_plugin_manager
from taskq.plugins._registry import loaded_plugins as loaded_plugins
from taskq.plugins._registry import open_backend as open_backend
from taskq.plugins._registry import plugin_failures as plugin_failures
from taskq.plugins.hookspecs import BackendFactory as BackendFactory
from taskq.plugins.hookspecs import hookimpl as hookimpl

__all__ = [
    "BackendFactory",
    "PluginInfo",
    "backend_factories",
    "get_plugin_manager",
    "hookimpl",
    "loaded_plugins",
    "open_backend",
    "plugin_failures",
]
