"""The backend's statements, read as text (no database needed)."""

from __future__ import annotations

import re

import pytest

from taskq_postgres._statements import Statements, statements_for

_JOBS_UPDATE = re.compile(
    r"UPDATE \S+\.jobs\b(?: AS)?(?: \w+)?\s+SET\b(.*?)\b(?:FROM|WHERE)\b", re.DOTALL
)


def _statements() -> dict[str, str]:
    rendered = statements_for("t_sqltext")
    return {name: getattr(rendered, name) for name in Statements.__dataclass_fields__}


@pytest.mark.parametrize("name", sorted(_statements()))
def test_every_update_of_jobs_sets_updated_at(name: str) -> None:
    # The jobs trigger only runs when updated_at was left alone: TaskQ's own
    # statements set it, so the hottest table pays no plpgsql call per row.
    for set_list in _JOBS_UPDATE.findall(_statements()[name]):
        assert "updated_at" in set_list, f"{name}: an UPDATE of jobs leaves updated_at alone"


def test_updates_of_jobs_are_found() -> None:
    found = sum(len(_JOBS_UPDATE.findall(sql)) for sql in _statements().values())
    assert found >= 15


def test_rendering_validates_the_schema_again() -> None:
    with pytest.raises(ValueError):
        statements_for("x; drop table jobs")
