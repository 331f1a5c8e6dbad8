"""An application's actors are known by name: two may not share one, and each is an actor."""

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


def test_a_plain_function_is_refused_with_the_fix() -> None:
    async def job(payload: dict[str, Any]) -> None:
        return None

    with pytest.raises(ConfigurationError, match="is not an actor: decorate the function"):
        TaskQ("memory://", actors=[job])  # type: ignore[list-item]


def test_an_empty_name_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="name must not be empty"):
        _named("")
