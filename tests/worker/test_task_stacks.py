"""Task-stack dumps name where each task waits, not only its outermost frame."""

from __future__ import annotations

import asyncio

from taskq.worker._stacks import describe_tasks


async def _innermost(gate: asyncio.Event) -> None:
    await gate.wait()  # the line a dump must name


async def _middle(gate: asyncio.Event) -> None:
    await _innermost(gate)


async def test_a_suspended_tasks_await_chain_is_shown_innermost_first() -> None:
    gate = asyncio.Event()
    task = asyncio.create_task(_middle(gate), name="stuck")
    await asyncio.sleep(0)
    try:
        [described] = describe_tasks({task})
    finally:
        gate.set()
        await task
    sites = [str(site) for site in described["await_sites"]]  # type: ignore[attr-defined]
    line = _innermost.__code__.co_firstlineno + 1
    here = __file__
    assert f"{here}:{line}" in sites, sites
    assert sites.index(f"{here}:{line}") < sites.index(
        f"{here}:{_middle.__code__.co_firstlineno + 1}"
    )
