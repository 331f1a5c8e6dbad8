"""An application's actors are known by name: two may not share one."""

from __future__ import annotations

from typing import Any

import pytest

from taskq import TaskQ, actor
from taskq.errors import ConfigurationError


def _named(name: str) -> Any:
    @actor(name=name)
    async def job(payload: dict[str, Any]) -> None:
        return None

    return job


def test_two_actors_with_one_name_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match=r"two actors are named 'twin'.*@actor\(name="):
        TaskQ("memory://", actors=[_named("twin"), _named("twin")])


def test_actors_are_looked_up_by_their_names() -> None:
    first, second = _named("first"), _named("second")
    assert TaskQ("memory://", actors=[first, second]).actors == {"first": first, "second": second}
