"""Detectors 2 and 3, and the liveness registry, in-process (the exit is intercepted)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import NoReturn

import pytest

from taskq.errors import ContractViolation
from taskq.worker import _watchdog
from taskq.worker._liveness import LoopLiveness

_REAL_EXIT = _watchdog._exit


class Tripped(Exception):
    pass


@pytest.fixture(autouse=True)
def no_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_exit(code: int) -> NoReturn:
        raise Tripped(code)

    monkeypatch.setattr(_watchdog, "_exit", fake_exit)


async def test_a_loop_that_stops_ticking_trips_detector_2() -> None:
    liveness = LoopLiveness(grace_factor=2, stale_floor=0.05)
    liveness.tick("sweeper", period=0.01)
    with pytest.raises(Tripped, match="2"):
        await asyncio.wait_for(_watchdog.stale_tick_loop(liveness, 0.02), 5)


async def test_a_ticking_or_forgotten_loop_does_not_trip() -> None:
    liveness = LoopLiveness(grace_factor=2, stale_floor=0.05)
    liveness.tick("gated", period=0.01)
    liveness.forget("gated")  # its gate closed: parked legitimately

    async def ticker() -> None:
        while True:
            liveness.tick("busy", period=0.01)
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(_watchdog.stale_tick_loop(liveness, 0.02), 0.3)
    finally:
        task.cancel()
    assert set(liveness.ages()) == {"busy"}


async def test_a_pause_of_the_event_loop_itself_is_not_held_against_the_loops() -> None:
    # No loop could tick while the event loop stood still (a GC pause, a blocking call):
    # counted, any pause past the stale floor tripped detector 2 as the loop resumed,
    # within detector 4's own (larger) budget.
    import time

    liveness = LoopLiveness(grace_factor=2, stale_floor=0.2)
    liveness.tick("sweeper", period=0.1)
    checker = asyncio.create_task(_watchdog.stale_tick_loop(liveness, 0.05))
    await asyncio.sleep(0.07)  # a check or so
    liveness.tick("sweeper", period=0.1)
    time.sleep(0.5)  # noqa: ASYNC251 - the whole event loop stops, past twice the budget
    await asyncio.sleep(0.01)  # the check due meanwhile runs before the sweeper ticks
    liveness.tick("sweeper", period=0.1)
    assert not checker.done()
    # A loop that truly stops ticking is still caught after the pause.
    with pytest.raises(Tripped, match="2"):
        await asyncio.wait_for(checker, 5)


async def test_a_sibling_returning_early_trips_detector_3() -> None:
    async def returns() -> None:
        return None

    with pytest.raises(Tripped, match="2"):
        await _watchdog.guard_sibling("producer", returns, lambda: False)()
    # during shutdown returning is the contract
    await _watchdog.guard_sibling("producer", returns, lambda: True)()


async def test_with_the_watchdogs_off_detector_3_raises_instead_of_exiting() -> None:
    async def returns() -> None:
        return None

    with pytest.raises(ContractViolation, match="'heartbeat' returned while the worker runs"):
        await _watchdog.guard_sibling("heartbeat", returns, lambda: False, exits=False)()


def test_budget_has_a_floor() -> None:
    liveness = LoopLiveness(grace_factor=5, stale_floor=10)
    assert liveness.budget(0.1) == 10
    assert liveness.budget(30) == 150


async def test_a_worker_with_the_watchdogs_off_fails_when_a_loop_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from taskq import TaskQ, WorkerSettings
    from taskq.worker import Worker, _runtime
    from taskq_testing import TEST_SETTINGS

    async def heartbeat_that_returns(state: object) -> None:
        return None

    monkeypatch.setattr(_runtime, "heartbeat_loop", heartbeat_that_returns)
    tq = TaskQ("memory://")
    async with tq:
        settings = WorkerSettings.load({**TEST_SETTINGS, "watchdog_enabled": False}, env={})
        with pytest.raises(ExceptionGroup) as raised:
            await asyncio.wait_for(Worker(tq, settings).run(), 10)
    assert raised.group_contains(ContractViolation, match="'heartbeat' returned")


def test_a_trip_exits_whatever_the_applications_logging_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # structlog rendered to the standard library's `extra` (a structlog recipe) refuses a
    # field named `name`, as the task dump's records have: its KeyError came before
    # os._exit, and the wedged worker ran on.
    class RefusingLogger:
        def critical(self, *args: object, **kwargs: object) -> None:
            raise KeyError("Attempt to overwrite 'name' in LogRecord")

    def refusing_dump(*args: object, **kwargs: object) -> int:
        raise KeyError("Attempt to overwrite 'name' in LogRecord")

    exits: list[int] = []
    monkeypatch.setattr(_watchdog, "_exit", _REAL_EXIT)
    monkeypatch.setattr(os, "_exit", exits.append)  # the os _watchdog calls
    monkeypatch.setattr(_watchdog, "_log", RefusingLogger())
    monkeypatch.setattr(_watchdog, "dump_task_stacks", refusing_dump)
    _watchdog.trip("stale-tick", "a loop stopped ticking")
    assert exits == [2]


def test_a_trip_exits_with_stdout_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A process started with stdout closed (`>&-`) has sys.stdout None: the flush before
    # os._exit raised AttributeError, and the wedged worker ran on.
    exits: list[int] = []
    monkeypatch.setattr(_watchdog, "_exit", _REAL_EXIT)
    monkeypatch.setattr(os, "_exit", exits.append)  # the os _watchdog calls
    with monkeypatch.context() as patched:
        patched.setattr(sys, "stdout", None)
        _watchdog.trip("stale-tick", "a loop stopped ticking", in_loop=False)
    assert exits == [2]


async def test_a_trip_exits_with_stderr_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    # With stderr gone (a log shipper's pipe closed), the flush of what it held raised
    # BrokenPipeError before os._exit: the wedged worker ran on.
    read, write = os.pipe()
    os.close(read)
    gone = os.fdopen(write, "w")  # closed below
    try:
        gone.write("an earlier line, held in the buffer every flush fails to empty\n")
        exits: list[int] = []
        monkeypatch.setattr(_watchdog, "_exit", _REAL_EXIT)
        monkeypatch.setattr(os, "_exit", exits.append)  # the os _watchdog calls
        with monkeypatch.context() as patched:
            patched.setattr(sys, "stderr", gone)
            _watchdog.trip("stale-tick", "a loop stopped ticking")
        assert exits == [2]
    finally:
        with contextlib.suppress(OSError):
            gone.close()
