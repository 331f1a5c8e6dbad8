"""Every log event TaskQ emits is named ``taskq.<what-happened>``: one prefix to filter
on in an aggregator, whichever package logged it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TypeGuard

_SOURCES = Path(__file__).resolve().parents[2] / "packages"
_LEVELS = frozenset({"debug", "info", "warning", "error", "critical", "exception", "msg"})


def _is_event_call(node: ast.AST) -> TypeGuard[ast.Call]:
    """``<...log>.<level>("literal", ...)``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _LEVELS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id.lstrip("_").endswith("log")
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def _events() -> list[tuple[str, str]]:
    """(file:line, event) of each log call naming its event literally."""
    return [
        (f"{path.relative_to(_SOURCES)}:{node.lineno}", str(ast.literal_eval(node.args[0])))
        for path in sorted(_SOURCES.glob("*/src/**/*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if _is_event_call(node)
    ]


def test_every_log_event_is_named_under_taskq() -> None:
    events = _events()
    assert len(events) > 50  # the scan finds the project's calls
    assert [(where, event) for where, event in events if not event.startswith("taskq.")] == []
