"""The Postgres backend's SQL keeps the state machine and the clock rule visible.

Every statement tagged as a ``TransitionSQL`` moves jobs along edges of
``VALID_TRANSITIONS`` and selects its rows with the ``status = 'from'``
guard (the serialization gate: only one writer's UPDATE can match a row);
every terminal write is tagged; every statement names its clock.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

import pytest

import taskq_postgres._sql as sql_package
from taskq.backend.statemachine import VALID_TRANSITIONS
from taskq_postgres._sql import TransitionSQL


def _modules() -> list[ModuleType]:
    return [
        importlib.import_module(f"{sql_package.__name__}.{info.name}")
        for info in pkgutil.iter_modules(sql_package.__path__)
    ]


def _constants() -> dict[str, object]:
    return {
        f"{module.__name__.rsplit('.', 1)[-1]}.{name}": getattr(module, name)
        for module in _modules()
        for name in module.__all__
    }


CONSTANTS = _constants()
TRANSITIONS = {name: value for name, value in CONSTANTS.items() if isinstance(value, TransitionSQL)}
_STATEMENT_START = re.compile(r"--|(?:SELECT|WITH|INSERT|UPDATE|DELETE)\b")


def _statements() -> dict[str, str]:
    found = {}
    for name, value in CONSTANTS.items():
        text = value.sql if isinstance(value, TransitionSQL) else value
        if isinstance(text, str) and _STATEMENT_START.match(text.lstrip()):
            found[name] = text
    return found


def test_the_sql_modules_are_all_found() -> None:
    names = {module.__name__.rsplit(".", 1)[-1] for module in _modules()}
    assert {"batch", "cancel", "dispatch", "enqueue", "reads", "schedules", "sweeps"} <= names
    assert {"terminal"} <= names


def test_every_terminal_write_is_tagged_with_its_transition() -> None:
    terminal = importlib.import_module("taskq_postgres._sql.terminal")
    writes = [name for name in terminal.__all__ if name.startswith("MARK_")]
    assert len(writes) == 8
    untagged = [name for name in writes if not isinstance(getattr(terminal, name), TransitionSQL)]
    assert untagged == []
    assert {"dispatch.DISPATCH_STRICT_FIFO", "dispatch.DISPATCH_ROUND_ROBIN"} <= set(TRANSITIONS)


@pytest.mark.parametrize("name", sorted(TRANSITIONS))
def test_each_tagged_move_is_a_valid_transition(name: str) -> None:
    tagged = TRANSITIONS[name]
    assert tagged.to, f"{name} names no target status"
    invalid = sorted(to.value for to in tagged.to if to not in VALID_TRANSITIONS[tagged.from_])
    assert invalid == [], f"{name}: {tagged.from_.value} -> {invalid} is not a valid transition"


@pytest.mark.parametrize("name", sorted(TRANSITIONS))
def test_each_tagged_statement_guards_on_its_source_status(name: str) -> None:
    tagged = TRANSITIONS[name]
    guard = re.compile(
        rf"\bWHERE\b(?:(?!\b(?:SELECT|UPDATE|INSERT)\b).)*?"
        rf"\b(?:\w+\.)?status\s*=\s*'{tagged.from_.value}'",
        re.DOTALL,
    )
    assert guard.search(tagged.sql), (
        f"{name} lacks its WHERE ... status = '{tagged.from_.value}' guard"
    )


@pytest.mark.parametrize("name", sorted(_statements()))
def test_every_statement_opens_by_naming_its_arbiter(name: str) -> None:
    first_line = _statements()[name].strip().splitlines()[0]
    assert first_line.startswith("-- arbiter: "), f"{name} starts with {first_line!r}"
