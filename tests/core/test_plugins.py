"""Plugin discovery and open_backend, in-process."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import taskq
from taskq.backend.memory import InMemoryBackend
from taskq.errors import (
    IncompatiblePluginError,
    PluginError,
    ProtocolVersionMismatch,
    UnknownBackendError,
)
from taskq.plugins import backend_factories, get_plugin_manager, hookimpl


@pytest.fixture
def extra_plugins() -> Iterator[list[object]]:
    """Register throwaway plugins for one test, unregistering them afterwards."""
    registered: list[object] = []
    yield registered
    pm = get_plugin_manager()
    for plugin in registered:
        pm.unregister(plugin)


def _register(extra: list[object], name: str, **hooks: Any) -> None:
    plugin = SimpleNamespace(**{k: hookimpl(v) for k, v in hooks.items()})
    get_plugin_manager().register(plugin, name=name)
    extra.append(plugin)


def test_plugin_manager_is_loaded_once_per_process() -> None:
    assert get_plugin_manager() is get_plugin_manager()


def test_memory_scheme_is_registered_by_core() -> None:
    backend = taskq.open_backend("memory://")
    assert isinstance(backend, InMemoryBackend)
    assert backend_factories()["memory"][1] == "taskq-core"


def test_unknown_scheme_lists_installed_schemes() -> None:
    with pytest.raises(UnknownBackendError) as info:
        taskq.open_backend("nosuchthing://host/db")
    message = str(info.value)
    assert "'nosuchthing'" in message
    assert "memory" in message
    assert isinstance(info.value, ValueError)


def test_unknown_first_party_scheme_names_the_distribution_to_install(
    extra_plugins: list[object],
) -> None:
    pm = get_plugin_manager()
    blocked = pm.get_plugin("postgres")
    if blocked is not None:  # pretend taskq-postgres is not installed
        pm.unregister(name="postgres")
    try:
        with pytest.raises(UnknownBackendError, match="pip install taskq-postgres"):
            taskq.open_backend("postgresql://localhost/app")
    finally:
        if blocked is not None:
            pm.register(blocked, name="postgres")


def test_url_without_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="not a backend URL"):
        taskq.open_backend("localhost/app")


def test_duplicate_scheme_names_both_distributions(extra_plugins: list[object]) -> None:
    _register(extra_plugins, "dupe", taskq_backends=lambda: {"memory": InMemoryBackend.from_url})
    with pytest.raises(PluginError, match=r"'memory' is claimed by both taskq-core and dupe"):
        taskq.open_backend("memory://")


def test_backend_with_another_protocol_version_is_refused(extra_plugins: list[object]) -> None:
    class OldBackend(InMemoryBackend):
        BACKEND_PROTOCOL_VERSION = 2

    _register(extra_plugins, "old", taskq_backends=lambda: {"old": lambda url: OldBackend()})
    with pytest.raises(ProtocolVersionMismatch, match="protocol 2.*speaks protocol 3"):
        taskq.open_backend("old://")


def test_object_missing_protocol_members_is_refused(extra_plugins: list[object]) -> None:
    class Half:
        BACKEND_PROTOCOL_VERSION = 3

    _register(extra_plugins, "half", taskq_backends=lambda: {"half": lambda url: Half()})
    with pytest.raises(IncompatiblePluginError, match="missing: .*dispatch_batch"):
        taskq.open_backend("half://")


def test_a_backend_without_simulation_or_transactions_is_refused(
    extra_plugins: list[object],
) -> None:
    class NoTransactions(InMemoryBackend):
        supports_transactional_simulation = False  # but no transaction(): sub-jobs unsafe

    _register(extra_plugins, "notx", taskq_backends=lambda: {"notx": lambda url: NoTransactions()})
    with pytest.raises(IncompatiblePluginError, match="missing: transaction"):
        taskq.open_backend("notx://")


def test_a_failing_hook_does_not_hide_other_plugins(extra_plugins: list[object]) -> None:
    def explode() -> dict[str, object]:
        raise RuntimeError("boom")

    _register(extra_plugins, "exploding", taskq_backends=explode)
    assert isinstance(taskq.open_backend("memory://"), InMemoryBackend)
