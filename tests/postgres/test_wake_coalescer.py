"""``WakeCoalescer`` on its own: which enqueue notifies, and when the trailing wake goes."""

from __future__ import annotations

import asyncio

import pytest

from taskq_postgres._wake import WakeCoalescer

HOUR = 3600.0


class Sends:
    """A ``send`` that records each trailing NOTIFY."""

    def __init__(self, fail: bool = False) -> None:
        self.count = 0
        self.fail = fail
        self.event = asyncio.Event()

    async def __call__(self) -> None:
        self.count += 1
        self.event.set()
        if self.fail:
            raise ConnectionError("server went away")


async def test_only_the_first_enqueue_of_a_window_notifies() -> None:
    sends = Sends()
    wakes = WakeCoalescer(sends, HOUR)
    with wakes.around("ch") as first:
        pass
    with wakes.around("ch") as second:
        pass
    assert (first, second) == ("ch", None)
    assert sends.count == 0  # the trailing wake waits for the window's end
    await wakes.close()
    assert sends.count == 1


async def test_a_skipped_enqueue_still_running_is_not_covered_until_it_finishes() -> None:
    sends = Sends()
    wakes = WakeCoalescer(sends, 0.01)
    with wakes.around("ch"):
        pass
    with wakes.around("ch") as channel:
        assert channel is None
        # The window ends while this enqueue has not committed: nothing is sent for it.
        await asyncio.sleep(0.05)
        assert sends.count == 0
    await asyncio.wait_for(sends.event.wait(), 10)
    assert sends.count == 1


async def test_a_zero_window_never_coalesces() -> None:
    sends = Sends()
    wakes = WakeCoalescer(sends, 0.0)
    with wakes.around("ch") as first, wakes.around("ch") as second:
        assert (first, second) == ("ch", "ch")
    await wakes.close()
    assert sends.count == 0


async def test_a_failed_skipped_enqueue_is_owed_a_wake() -> None:
    # Its commit may have happened with only the reply lost.
    sends = Sends()
    wakes = WakeCoalescer(sends, HOUR)
    with wakes.around("ch"):
        pass
    with pytest.raises(RuntimeError), wakes.around("ch"):
        raise RuntimeError("insert failed")
    await wakes.close()
    assert sends.count == 1


async def test_a_failed_trailing_notify_is_logged_not_raised() -> None:
    sends = Sends(fail=True)
    wakes = WakeCoalescer(sends, HOUR)
    with wakes.around("ch"):
        pass
    with wakes.around("ch"):
        pass
    await wakes.close()
    assert sends.count == 1


async def test_enqueues_one_after_another_send_no_trailing_notify() -> None:
    # Each window's first enqueue notifies in its own statement and covers the
    # skipped ones before it, even when one of them was still running as its
    # window ended: a loop of single enqueues needs no NOTIFY statement of its own.
    sends = Sends()
    # A window many round trips long: only a stall of a whole window (a loaded CI
    # machine) would let one end with the same enqueue still running.
    wakes = WakeCoalescer(sends, 0.1)
    notified = []
    for _ in range(60):
        with wakes.around("ch") as channel:
            notified.append(channel)
            await asyncio.sleep(0.004)  # the statement's round trip
    assert sends.count == 0
    assert notified[0] == "ch"
    assert 2 <= notified.count("ch") < len(notified)
    # End on a skipped enqueue (the loop's last one may have led a window, on a slow
    # machine, and then nothing is owed): on to the next leader, then one right after.
    leads = []
    for _ in range(100):  # a window's worth of round trips, many times over
        with wakes.around("ch") as lead:
            await asyncio.sleep(0.004)
        leads.append(lead)
        if lead is not None:
            break
    assert leads[-1] == "ch"
    with wakes.around("ch") as last:
        await asyncio.sleep(0.004)
    assert last is None
    # With no enqueue to follow, the last window's skipped ones get their wake.
    await asyncio.wait_for(sends.event.wait(), 10)
    assert sends.count == 1


async def test_a_running_enqueue_delays_an_owed_wake_by_one_window_at_most() -> None:
    sends = Sends()
    wakes = WakeCoalescer(sends, 0.01)
    with wakes.around("ch"):
        pass
    with wakes.around("ch") as finished:
        pass
    with wakes.around("ch") as running:
        # The wake owed to the finished one goes while this one still runs.
        await asyncio.wait_for(sends.event.wait(), 10)
        assert sends.count == 1
    assert (finished, running) == (None, None)
    await wakes.close()
    assert sends.count == 2


async def test_a_failed_leading_enqueue_leaves_a_wake_owed() -> None:
    # Its claim cleared what earlier skipped enqueues were owed; its NOTIFY never went.
    sends = Sends()
    wakes = WakeCoalescer(sends, HOUR)
    with pytest.raises(RuntimeError), wakes.around("ch") as channel:
        assert channel == "ch"
        raise RuntimeError("insert failed")
    await wakes.close()
    assert sends.count == 1
