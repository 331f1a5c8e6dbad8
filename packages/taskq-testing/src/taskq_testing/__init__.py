"""taskq-testing: part of TaskQ."""

from __future__ import annotations

__all__: list[str] = []
