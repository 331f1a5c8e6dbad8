"""Every log event TaskQ emits is named ``taskq.<what-happened>``: one prefix to filter
on in an aggregator, whichever package logged it; and none carries a field named as a
``LogRecord`` attribute, which the standard library refuses in ``extra``."""

from __future__ import annotations

import ast
import inspect
import logging
from pathlib import Path
from typing import TypeGuard

_SOURCES = Path(__file__).resolve().parents[2] / "packages"
_LEVELS = frozenset({"debug", "info", "warning", "error", "critical", "exception", "msg"})


def _is_log_call(node: ast.AST) -> TypeGuard[ast.Call]:
    """``<...log>.<level>(...)``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _LEVELS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id.lstrip("_").endswith("log")
    )


def _is_event_call(node: ast.AST) -> TypeGuard[ast.Call]:
    """``<...log>.<level>("literal", ...)``."""
    return (
        _is_log_call(node)
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


# What `logging.Logger.makeRecord` refuses in `extra` (KeyError): the record's own
# attributes, the two its formatting adds, and `taskName` (Python 3.12's); less
# `exc_info` and `stack_info`, which the recipe passes as the logging call's own.
_RECORD_ATTRIBUTES = (
    frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
) - {"exc_info", "stack_info"}


def _field_names(node: ast.Call) -> list[str]:
    """The fields a log call passes by keyword (not its ``**`` expansions)."""
    return [keyword.arg for keyword in node.keywords if keyword.arg is not None]


def _repeated_warning_fields() -> list[tuple[str, str]]:
    """(file:line, field) of the fields given to ``RepeatedWarning``, logged on each line."""
    return [
        (f"{path.relative_to(_SOURCES)}:{node.lineno}", field)
        for path in sorted(_SOURCES.glob("*/src/**/*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "RepeatedWarning"
        for field in _field_names(node)
        if field != "every"
    ]


def test_no_log_field_is_a_logrecord_attribute() -> None:
    # structlog routed to the standard library with the fields as `extra` (its
    # render_to_log_kwargs) raised "Attempt to overwrite 'name' in LogRecord" out of
    # the SIGUSR2 dump's `name` field, and out of the start's `created`.
    clashes = [
        (f"{path.relative_to(_SOURCES)}:{node.lineno}", field)
        for path in sorted(_SOURCES.glob("*/src/**/*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if _is_log_call(node)
        for field in _field_names(node)
        if field in _RECORD_ATTRIBUTES
    ]
    assert clashes == []


def test_the_fields_logged_by_expansion_are_no_logrecord_attributes() -> None:
    # The job's fields (`**job_fields(row)`) and a hook's arguments in the plugin trace
    # (`**arguments`) reach the record as fields too.
    from taskq.logs import job_fields
    from taskq.plugins import hookspecs
    from tests.core.test_logs import _job

    hook_arguments = {
        parameter
        for name, hook in vars(hookspecs).items()
        if name.startswith("taskq_") and callable(hook)
        for parameter in inspect.signature(hook).parameters
    }
    assert set(job_fields(_job("a"))) & _RECORD_ATTRIBUTES == set()
    assert hook_arguments & _RECORD_ATTRIBUTES == set()
    repeated = _repeated_warning_fields()
    assert [where for where, field in repeated if field == "loop"]  # the scan finds them
    assert [(where, field) for where, field in repeated if field in _RECORD_ATTRIBUTES] == []
