"""Fixtures that stand in for installed plugins (``tests/core/conftest.py`` offers
them): registered straight on the process's plugin manager (``add_plugin``), or as
entry points discovered afresh (``entry_points``). Either way what a test adds, and
the plugin failures it makes, are gone after it."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import pytest

from taskq.plugins import _registry, get_plugin_manager, hookimpl
from taskq.worker._transient import transient_errors


class AddPlugin(Protocol):
    def __call__(self, name: str, **hooks: Callable[..., Any]) -> None: ...


class InstallEntryPoints(Protocol):
    def __call__(
        self,
        *,
        distributions: Mapping[str, str] | None = None,
        values: Mapping[str, str] | None = None,
        **plugins: str,
    ) -> None: ...


@pytest.fixture
def add_plugin() -> Iterator[AddPlugin]:
    """Register throwaway plugins (``name``, then its hooks as functions) for one test,
    unregistering them afterwards; the failures their hooks recorded go with them."""
    loaded = _registry._load()
    failures, recorded = list(loaded.failures), set(loaded.recorded)
    registered: list[object] = []

    def add(name: str, **hooks: Callable[..., Any]) -> None:
        plugin = SimpleNamespace(**{k: hookimpl(v) for k, v in hooks.items()})
        get_plugin_manager().register(plugin, name=name)
        registered.append(plugin)

    yield add
    for plugin in registered:
        get_plugin_manager().unregister(plugin)
    loaded.failures[:] = failures
    loaded.recorded.clear()
    loaded.recorded.update(recorded)


@pytest.fixture
def entry_points(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[InstallEntryPoints]:
    """Stand in for the installed ``taskq`` entry points: ``name=source`` plugins,
    each a module of its own, shipped by the distribution ``distributions`` names
    (none: the entry point's name stands for it); ``values`` adds entry points with
    a raw value and no module. Discovery runs again on the next use."""
    monkeypatch.syspath_prepend(str(tmp_path))
    points: list[importlib.metadata.EntryPoint] = []

    def install(
        *,
        distributions: Mapping[str, str] | None = None,
        values: Mapping[str, str] | None = None,
        **plugins: str,
    ) -> None:
        raw = dict(values or {})
        distributions = distributions or {}
        for name, source in plugins.items():
            module = f"fake_taskq_plugin_{name}"
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
            # another test's module of that name must not stand in for this one
            monkeypatch.delitem(sys.modules, module, raising=False)
            raw[name] = module
        for name, value in raw.items():
            point = importlib.metadata.EntryPoint(name, value, "taskq")
            if name in distributions:  # what importlib does for an installed one
                point = point._for(SimpleNamespace(name=distributions[name]))  # type: ignore[attr-defined]
            points.append(point)
        importlib.invalidate_caches()
        _registry._load.cache_clear()
        transient_errors.cache_clear()

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: list(points))
    yield install
    # the real entry points again from the next use on
    _registry._load.cache_clear()
    transient_errors.cache_clear()
