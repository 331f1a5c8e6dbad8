"""Cost of resolving one actor invocation with a warm plan cache.

The actor takes five LOOP-scoped dependencies and one TRANSIENT one; each
iteration enters and exits ``build_actor_scope`` (resolution plus the
TRANSIENT teardown), without calling the actor. The TRANSIENT provider is a
generator (sync teardown) in the headline figure, and an async generator
(teardown in a shielded task) in ``us_per_invocation_async_teardown``.
Prints one JSON line.

    uv run --frozen python bench/di_resolution.py [--iterations N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator

from taskq._di import LoopScope, ProcessScope, ProviderRegistry, ThreadScope, build_actor_scope
from taskq._di.solver import Containers
from taskq._scope import Scope


class Loop1: ...


class Loop2: ...


class Loop3: ...


class Loop4: ...


class Loop5: ...


class Session:
    def __init__(self, first: Loop1) -> None:
        self.first = first


def open_session(first: Loop1) -> Iterator[Session]:
    yield Session(first)


async def open_session_async(first: Loop1) -> AsyncIterator[Session]:
    yield Session(first)


async def actor(
    payload: int, ctx: object, a: Loop1, b: Loop2, c: Loop3, d: Loop4, e: Loop5, s: Session
) -> None:
    """The benchmarked actor; never called."""


def _registry(
    session: Callable[[Loop1], Iterator[Session] | AsyncIterator[Session]],
) -> ProviderRegistry:
    registry = ProviderRegistry()
    for key in (Loop1, Loop2, Loop3, Loop4, Loop5):
        registry.register(key, key, scope=Scope.LOOP)
    registry.register(Session, session, scope=Scope.TRANSIENT)
    return registry


async def _round_times_us(registry: ProviderRegistry, iterations: int, rounds: int) -> list[float]:
    loops = LoopScope()
    containers: Containers = {
        Scope.PROCESS: ProcessScope(),
        Scope.THREAD: ThreadScope(),
        Scope.LOOP: loops.current(),
    }
    passthrough = {"payload": 1, "ctx": None}
    # Warm the plan cache and the LOOP values.
    async with build_actor_scope(actor, registry, containers, passthrough):
        pass
    per_round = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iterations):
            async with build_actor_scope(actor, registry, containers, passthrough):
                pass
        per_round.append((time.perf_counter() - start) / iterations * 1e6)
    await loops.aclose()
    return per_round


async def _measure(iterations: int, rounds: int) -> dict[str, object]:
    sync_teardown = await _round_times_us(_registry(open_session), iterations, rounds)
    async_teardown = await _round_times_us(_registry(open_session_async), iterations, rounds)
    return {
        "benchmark": "di_resolution",
        "dependencies": {"LOOP": 5, "TRANSIENT": 1},
        "iterations": iterations,
        "rounds": rounds,
        "us_per_invocation": round(statistics.median(sync_teardown), 2),
        "us_per_invocation_min": round(min(sync_teardown), 2),
        "us_per_invocation_async_teardown": round(statistics.median(async_teardown), 2),
        "us_per_invocation_async_teardown_min": round(min(async_teardown), 2),
    }


def main() -> None:
    """Run the benchmark and print its JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_measure(args.iterations, args.rounds))))


if __name__ == "__main__":
    main()
