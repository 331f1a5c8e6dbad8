"""``WakeCoalescer`` on its own: which enqueue notifies, and when the trailing wake goes."""

from __future__ import annotations

import asyncio
import itertools

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


async def test_only_the_first_of_overlapping_enqueues_notifies() -> None:
    sends = Sends()
    wakes = WakeCoalescer(sends, HOUR)
    with wakes.around("ch") as first, wakes.around("ch") as second:
        pass
    assert (first, second) == ("ch", None)
    assert sends.count == 0  # the trailing wake waits for the window's end
    await wakes.close()
    assert sends.count == 1


async def test_an_enqueue_while_none_other_runs_notifies_inside_the_window() -> None:
    # Its commits contend with none of this backend's, and no timer is armed for it.
    sends = Sends()
    wakes = WakeCoalescer(sends, HOUR)
    notified = []
    for _ in range(5):
        with wakes.around("ch") as channel:
            notified.append(channel)
            await asyncio.sleep(0.001)  # the statement's round trip
    assert notified == ["ch"] * 5
    await wakes.close()
    assert sends.count == 0  # each notified in its own statement: nothing owed


async def test_a_skipped_enqueue_still_running_is_not_covered_until_it_finishes() -> None:
    sends = Sends()
    wakes = WakeCoalescer(sends, 0.01)
    with wakes.around("ch"), wakes.around("ch") as channel:
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
    with wakes.around("ch"), pytest.raises(RuntimeError), wakes.around("ch") as channel:
        assert channel is None
        raise RuntimeError("insert failed")
    await wakes.close()
    assert sends.count == 1


async def test_a_failed_trailing_notify_is_logged_not_raised() -> None:
    sends = Sends(fail=True)
    wakes = WakeCoalescer(sends, HOUR)
    with wakes.around("ch"), wakes.around("ch") as channel:
        assert channel is None
    await wakes.close()
    assert sends.count == 1


async def test_two_producers_side_by_side_share_the_windows_and_lose_no_wake() -> None:
    # Each window's first enqueue notifies in its own statement and covers the
    # skipped ones that finished before it started; a skipped one that finished
    # after the last such start is covered by a trailing wake.
    steps = itertools.count()
    sent: list[int] = []  # the step of each trailing NOTIFY

    async def send() -> None:
        sent.append(next(steps))

    wakes = WakeCoalescer(send, 0.05)
    enqueues: list[tuple[str | None, int, int]] = []  # (channel, started, finished)

    async def produce() -> None:
        for _ in range(30):
            started = next(steps)
            with wakes.around("ch") as channel:
                await asyncio.sleep(0.004)  # the statement's round trip
            enqueues.append((channel, started, next(steps)))

    await asyncio.gather(produce(), produce())
    await asyncio.sleep(0.2)  # past two windows: an owed wake has gone
    notifying = [started for channel, started, _ in enqueues if channel is not None]
    assert 2 <= len(notifying) < len(enqueues) // 2
    skipped_last = max(finished for channel, _, finished in enqueues if channel is None)
    if skipped_last > max(notifying):
        assert sent and sent[-1] > skipped_last
    await wakes.close()


async def test_a_running_enqueue_delays_an_owed_wake_by_one_window_at_most() -> None:
    sends = Sends()
    wakes = WakeCoalescer(sends, 0.01)
    with wakes.around("ch") as leading:
        with wakes.around("ch") as finished:
            pass
        with wakes.around("ch") as running:
            # The wake owed to the finished one goes while this one still runs.
            await asyncio.wait_for(sends.event.wait(), 10)
            assert sends.count == 1
    assert (leading, finished, running) == ("ch", None, None)
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
