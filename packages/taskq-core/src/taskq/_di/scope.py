"""Re-export of :class:`~taskq._scope.Scope`, which is defined outside the DI package."""

from __future__ import annotations

from taskq._scope import Scope

__all__ = ["Scope"]
