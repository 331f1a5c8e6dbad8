"""Every log event TaskQ emits is named ``taskq.<what-happened>``: one prefix to filter
on in an aggregator, whichever package logged it."""

from __future__ import annotations

import ast
from pathlib import Path

_SOURCES = Path(__file__).resolve().parents[2] / "packages"
_LEVELS = frozenset({"debug", "info", "warning", "error", "critical", "exception", "msg"})


def _events() -> list[tuple[str, str]]:
    """(file:line, event) of each ``<logger>.<level>("literal", ...)`` call."""
    found = []
    for path in sorted(_SOURCES.glob("*/src/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _LEVELS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id.lstrip("_").endswith("log")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.append((f"{path.relative_to(_SOURCES)}:{node.lineno}", node.args[0].value))
    return found


def test_every_log_event_is_named_under_taskq() -> None:
    events = _events()
    assert len(events) > 50  # the scan finds the project's calls
    assert [(where, event) for where, event in events if not event.startswith("taskq.")] == []
