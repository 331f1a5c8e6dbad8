"""``watch_reclaims``: its arguments checked at the call."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from taskq import TaskQ


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"poll_interval": timedelta(0)}, "poll_interval must be a positive timedelta"),
        ({"poll_interval": timedelta(seconds=-1)}, "poll_interval must be a positive"),
        ({"poll_interval": 1.0}, "poll_interval must be a positive timedelta, got 1.0"),
        ({"visibility_delay": timedelta(seconds=-1)}, "visibility_delay must be a timedelta >= 0"),
        ({"after_id": -1}, "after_id must be an event id"),
        ({"after_id": "0"}, "after_id must be an event id"),
    ],
)
def test_bad_arguments_are_refused_at_the_call_not_at_the_first_iteration(
    kwargs: dict[str, Any], message: str
) -> None:
    # A zero interval polled the database in a tight loop (9,000 queries a second on
    # Postgres); a float failed with an AttributeError once the feed went idle.
    tq = TaskQ("memory://")
    after_id = kwargs.pop("after_id", 0)
    with pytest.raises(ValueError, match=message):
        tq.watch_reclaims(after_id, **kwargs)
