"""Scope: the order of lifetimes, and the re-export shim."""

from __future__ import annotations

from taskq._di import scope as scope_shim
from taskq._scope import Scope


def test_scopes_are_ordered_from_widest_to_narrowest() -> None:
    assert [s.name for s in sorted(Scope)] == ["PROCESS", "THREAD", "LOOP", "TRANSIENT"]
    assert [int(s) for s in Scope] == [0, 1, 2, 3]
    assert Scope.PROCESS < Scope.THREAD < Scope.LOOP < Scope.TRANSIENT


def test_the_di_package_re_exports_the_one_scope_enum() -> None:
    assert scope_shim.Scope is Scope
