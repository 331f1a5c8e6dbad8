"""One arbiter per predicate: no Backend method takes a "now" from its caller."""

from __future__ import annotations

import inspect

from taskq.backend import PROTOCOL_MEMBERS, Backend

# Members allowed a datetime parameter, each with its reason.
ALLOWED = {
    # a retention boundary the leader derives from the backend's own clock
    # (SupportsPrune.now), never from its host's
    ("prune_old_batches", "cutoff"),
}


def test_no_backend_method_takes_a_datetime() -> None:
    offenders = []
    for name in sorted(PROTOCOL_MEMBERS):
        member = vars(Backend).get(name)
        if not callable(member):
            continue
        for param in inspect.signature(member).parameters.values():
            annotation = str(param.annotation)
            if "datetime" in annotation and (name, param.name) not in ALLOWED:
                offenders.append(f"{name}({param.name}: {annotation})")
            if param.name in {"now", "current_time", "at"}:
                offenders.append(f"{name}({param.name})")
    assert offenders == []
