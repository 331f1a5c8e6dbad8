"""Cron schedules: create, list, update and delete; ``next_fire_at`` from the backend clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4
from zoneinfo import ZoneInfo

import pytest

from taskq.backend import Backend
from taskq.models import ScheduleCreateArgs, ScheduleRecord, ScheduleUpdateArgs
from taskq_testing.conformance._support import (
    TICK,
    AdvanceTime,
    assert_utc,
    covers,
)

# Fires once a year, at local midnight on 1 January: the next fire time after any
# instant is 1 January of the following local year, so a test can compute it from
# the row's created_at alone.
_YEARLY = "0 0 1 1 *"
_DAILY_NINE = "0 9 * * *"
_A_DAY_AT_MOST = timedelta(hours=25)
"""The longest gap between two daily fire times (a day that gains a DST hour)."""


def _next_new_year(after: datetime, timezone: str) -> datetime:
    local = after.astimezone(ZoneInfo(timezone))
    return datetime(local.year + 1, 1, 1, tzinfo=ZoneInfo(timezone))


def _args(**overrides: Any) -> ScheduleCreateArgs:
    fields: dict[str, Any] = {"name": "nightly", "actor": "conformance.echo", "cron": _YEARLY}
    fields.update(overrides)
    return ScheduleCreateArgs.model_validate(fields)


class ScheduleTests:
    """``create_schedule``, ``list_schedules``, ``update_schedule``, ``delete_schedule``."""

    @covers("create_schedule", "update_schedule", "list_schedules")
    async def test_a_schedule_stores_its_payload_and_options_as_json(
        self, backend: Backend
    ) -> None:
        payload = {"text": "a\x00b", "pair": (1, 2)}
        record = await backend.create_schedule(_args(payload=payload, options={"tags": ["x"]}))
        assert record.payload == {"text": "a\ufffdb", "pair": [1, 2]}
        assert [r.payload for r in await backend.list_schedules()] == [record.payload]
        with pytest.raises(ValueError, match="is not a JSON number"):
            await backend.create_schedule(_args(name="other", payload={"x": float("nan")}))
        with pytest.raises(ValueError, match="is not a JSON number"):
            await backend.update_schedule(
                record.id, ScheduleUpdateArgs(options={"priority": float("inf")})
            )
        assert await backend.list_schedules() == [record]

    @covers("create_schedule", "update_schedule", "list_schedules")
    async def test_a_schedule_that_can_never_fire_again_is_refused_enabled(
        self, backend: Backend
    ) -> None:
        # Stored enabled, it had no next fire time and fired nothing, ever.
        past = "0 0 1 1 * 0 2001"  # midnight, 1 January 2001 (a seventh field: the year)
        with pytest.raises(ValueError, match="never fires after now"):
            await backend.create_schedule(_args(cron=past))
        record = await backend.create_schedule(_args(cron=past, enabled=False))
        assert record.next_fire_at is None
        with pytest.raises(ValueError, match="never fires after now"):
            await backend.update_schedule(record.id, ScheduleUpdateArgs(enabled=True))
        assert await backend.list_schedules() == [record]

    @pytest.mark.parametrize("timezone", ["UTC", "Asia/Tokyo", "America/New_York"])
    @covers("create_schedule")
    async def test_create_schedule_stores_it_with_the_next_fire_time(
        self, backend: Backend, timezone: str
    ) -> None:
        args = _args(
            payload={"report": "daily"},
            queue="cron",
            timezone=timezone,
            options={"priority": 3},
        )
        record = await backend.create_schedule(args)
        assert (record.name, record.actor, record.cron) == (args.name, args.actor, args.cron)
        assert (record.payload, record.queue, record.options) == (
            args.payload,
            "cron",
            args.options,
        )
        assert (record.timezone, record.enabled, record.last_fired_at) == (timezone, True, None)
        assert_utc(record.created_at, record.updated_at, record.next_fire_at)
        assert record.created_at == record.updated_at
        # Strictly after now: a schedule created exactly at a fire time waits for the next.
        assert record.next_fire_at == _next_new_year(record.created_at, timezone)

    @covers("create_schedule")
    async def test_next_fire_at_follows_the_schedule_timezone(self, backend: Backend) -> None:
        record = await backend.create_schedule(_args(cron=_DAILY_NINE, timezone="America/New_York"))
        assert record.next_fire_at is not None
        local = record.next_fire_at.astimezone(ZoneInfo("America/New_York"))
        assert (local.hour, local.minute) == (9, 0)
        assert record.created_at < record.next_fire_at <= record.created_at + _A_DAY_AT_MOST

    @covers("create_schedule")
    async def test_a_disabled_schedule_has_no_next_fire_time(self, backend: Backend) -> None:
        record = await backend.create_schedule(_args(enabled=False))
        assert (record.enabled, record.next_fire_at) == (False, None)

    @covers("create_schedule", "list_schedules")
    async def test_schedule_names_are_unique(self, backend: Backend) -> None:
        first = await backend.create_schedule(_args())
        with pytest.raises(ValueError):
            await backend.create_schedule(_args(actor="conformance.other"))
        assert await backend.list_schedules() == [first]

    @covers("list_schedules")
    async def test_list_schedules_filters_and_orders_by_name(self, backend: Backend) -> None:
        made: dict[str, ScheduleRecord] = {}
        for name, actor, enabled in [
            ("c", "x", True),
            ("a", "y", False),
            ("d", "x", False),
            ("b", "x", True),
        ]:
            made[name] = await backend.create_schedule(
                _args(name=name, actor=actor, enabled=enabled)
            )

        async def names(**filters: Any) -> list[str]:
            return [record.name for record in await backend.list_schedules(**filters)]

        assert await names() == ["a", "b", "c", "d"]
        assert await names(actor="x") == ["b", "c", "d"]
        assert await names(enabled=False) == ["a", "d"]
        assert await names(actor="x", enabled=True) == ["b", "c"]
        assert await names(actor="nobody") == []
        assert await backend.list_schedules(actor="y") == [made["a"]]

    @covers("list_schedules")
    async def test_list_schedules_orders_names_by_code_point(self, backend: Backend) -> None:
        # Not by the database's collation (which puts "a_report" before "B-weekly").
        for name in ["b-nightly", "Z-last", "a_report", "B-weekly", "é-late"]:
            await backend.create_schedule(_args(name=name))
        names = [record.name for record in await backend.list_schedules()]
        assert names == ["B-weekly", "Z-last", "a_report", "b-nightly", "é-late"]

    @covers("update_schedule")
    async def test_update_schedule_changes_only_the_given_fields(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        record = await backend.create_schedule(_args(payload={"v": 1}, options={"priority": 1}))
        await advance_time(TICK)
        updated = await backend.update_schedule(
            record.id, ScheduleUpdateArgs(payload={"v": 2}, queue="elsewhere")
        )
        assert (updated.id, updated.name, updated.actor) == (record.id, record.name, record.actor)
        assert (updated.payload, updated.queue) == ({"v": 2}, "elsewhere")
        assert (updated.cron, updated.timezone, updated.options) == (
            record.cron,
            record.timezone,
            record.options,
        )
        assert updated.created_at == record.created_at
        assert updated.updated_at > record.updated_at
        assert await backend.list_schedules() == [updated]

    @covers("update_schedule", "list_schedules")
    async def test_actor_queue_puts_a_schedule_back_on_its_actors_queue(
        self, backend: Backend
    ) -> None:
        # queue=None keeps the queue: a schedule given one could never go back to its
        # actor's own.
        record = await backend.create_schedule(_args(queue="elsewhere", payload={"v": 1}))
        kept = await backend.update_schedule(record.id, ScheduleUpdateArgs(queue=None))
        assert kept.queue == "elsewhere"
        back = await backend.update_schedule(record.id, ScheduleUpdateArgs(actor_queue=True))
        assert (back.queue, back.payload, back.next_fire_at) == (
            None,
            {"v": 1},
            record.next_fire_at,
        )
        assert await backend.list_schedules() == [back]
        moved = await backend.update_schedule(record.id, ScheduleUpdateArgs(queue="again"))
        assert moved.queue == "again"

    @covers("update_schedule")
    async def test_an_update_that_keeps_the_timing_keeps_the_slots_due(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # Computed again from now on every update, a payload change dropped the slots
        # due and not yet fired (a catch-up's whole backlog).
        record = await backend.create_schedule(_args(cron="* * * * * *"))
        await advance_time(timedelta(seconds=1.5))  # its first slot is due, unfired
        updated = await backend.update_schedule(record.id, ScheduleUpdateArgs(payload={"v": 2}))
        assert updated.next_fire_at == record.next_fire_at

    @covers("update_schedule")
    async def test_update_schedule_recomputes_next_fire_at(self, backend: Backend) -> None:
        record = await backend.create_schedule(_args())
        moved = await backend.update_schedule(
            record.id, ScheduleUpdateArgs(cron=_DAILY_NINE, timezone="Asia/Tokyo")
        )
        assert moved.next_fire_at is not None
        local = moved.next_fire_at.astimezone(ZoneInfo("Asia/Tokyo"))
        assert (local.hour, local.minute) == (9, 0)
        assert moved.updated_at < moved.next_fire_at <= moved.updated_at + _A_DAY_AT_MOST
        disabled = await backend.update_schedule(record.id, ScheduleUpdateArgs(enabled=False))
        assert (disabled.enabled, disabled.next_fire_at) == (False, None)
        enabled = await backend.update_schedule(
            record.id, ScheduleUpdateArgs(enabled=True, cron=_YEARLY, timezone="UTC")
        )
        assert enabled.enabled
        assert enabled.next_fire_at == _next_new_year(enabled.updated_at, "UTC")

    @covers("update_schedule")
    async def test_updating_an_unknown_schedule_is_a_key_error(self, backend: Backend) -> None:
        with pytest.raises(KeyError):
            await backend.update_schedule(uuid4(), ScheduleUpdateArgs(enabled=False))

    @covers("delete_schedule", "list_schedules")
    async def test_delete_schedule_removes_it_once(self, backend: Backend) -> None:
        gone = await backend.create_schedule(_args(name="gone"))
        kept = await backend.create_schedule(_args(name="kept"))
        await backend.delete_schedule(gone.id)
        assert await backend.list_schedules() == [kept]
        with pytest.raises(KeyError):
            await backend.delete_schedule(gone.id)
