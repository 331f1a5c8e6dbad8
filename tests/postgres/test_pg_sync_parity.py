"""``SyncJobsClient`` and ``JobsClient`` (asyncpg) enqueue alike: the same calls, made
through each into a schema of its own, store the same rows and answer the same way
(ids and times aside)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import dict_row
from pydantic import BaseModel

from taskq import EnqueueItem, actor
from taskq.actor import Actor, actors_by_name
from taskq.client import JobsClient
from taskq.models import JobRow
from taskq_postgres import PostgresBackend, SyncJobsClient, wake_channel
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


class Model(BaseModel):
    n: int
    s: str = ""


@actor(name="par.plain")
async def plain(payload: dict[str, Any]) -> None:
    return None


@actor(name="par.model", queue="q2", priority=3, max_attempts=7, timeout=30, result_ttl=600)
async def model(payload: Model) -> None:
    return None


@actor(name="par.ident", identity_key=lambda p: p.get("who"), schedule_to_close=3600)
async def ident(payload: dict[str, Any]) -> None:
    return None


@actor(name="par.capped", max_pending=2)
async def capped(payload: dict[str, Any]) -> None:
    return None


ACTORS: list[Actor[..., Any]] = [plain, model, ident, capped]

Op = tuple[str, Any]


_ZONE = "America/New_York"
"""A caller's session zone with DST: a day added there is a calendar day."""


def _sync_run(dsn: str, schema: str, ops: list[Op], mode: str) -> list[Any]:
    """``ops`` through a SyncJobsClient: on its own connection (``own``; ``pooler``: one
    that sets no session settings, on a DSN whose zone has DST), or each op in a
    transaction of a caller's connection (``callers``: committed, or rolled back when
    it raised)."""
    out: list[Any] = []
    with psycopg.connect(dsn, options=f"-c TimeZone={_ZONE}") as conn:
        target: str | psycopg.Connection[Any] = conn
        if mode != "callers":
            target = f"{dsn}?options=-c%20TimeZone%3D{_ZONE}" if mode == "pooler" else dsn
        with SyncJobsClient(
            target,
            actors=ACTORS,
            schema=schema,
            max_pending_cache_ttl=0,
            behind_pooler=mode == "pooler",
        ) as client:
            for kind, arg in ops:
                try:
                    if kind == "enqueue":
                        ref, payload, options = arg
                        out.append(client.enqueue(ref, payload, **options))
                    elif kind == "batch":
                        out.append(client.enqueue_batch(arg))
                    elif kind == "fast":
                        out.append(client.enqueue_batch_fast(arg))
                    else:
                        raise AssertionError(kind)
                except Exception as exc:  # noqa: BLE001 - compared with the other client's
                    out.append(exc)
                    conn.rollback()
                else:
                    conn.commit()
    return out


async def _async_op(client: JobsClient, kind: str, arg: Any, conn: Any) -> Any:
    if kind == "enqueue":
        ref, payload, options = arg
        if conn is None:
            return await client.enqueue(ref, payload, **options)
        return await client.enqueue_with_conn(conn, ref, payload, **options)
    if kind == "batch":
        return await client.enqueue_batch(arg, connection=conn)
    if kind == "fast":
        return await client.enqueue_batch_fast(arg, connection=conn)
    raise AssertionError(kind)


async def _async_run(dsn: str, schema: str, ops: list[Op], callers: bool) -> list[Any]:
    """``ops`` through JobsClient on asyncpg, as :func:`_sync_run` makes them."""
    out: list[Any] = []
    backend = PostgresBackend(dsn, schema=schema)
    await backend.open()
    try:
        client = JobsClient(backend, actors_by_name(ACTORS), max_pending_cache_ttl=0)
        for kind, arg in ops:
            try:
                if not callers:
                    out.append(await _async_op(client, kind, arg, None))
                    continue
                async with backend.connection() as conn:
                    await conn.execute(f"SET TimeZone = '{_ZONE}'")
                    async with conn.transaction():
                        out.append(await _async_op(client, kind, arg, conn))
            except Exception as exc:  # noqa: BLE001 - compared with the other client's
                out.append(exc)
    finally:
        await backend.close()
    return out


_TIMES = ("created_at", "enqueued_at", "updated_at")
_RELATIVE = ("scheduled_at", "schedule_to_close_deadline")


def _stored(dsn: str, schema: str) -> tuple[list[dict[str, Any]], dict[Any, int]]:
    """Every job, in enqueue order: ids as their rank, times relative to ``created_at``."""
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        rows = conn.execute(f"SELECT * FROM {schema}.jobs ORDER BY created_at, id").fetchall()
    ranks = {row["id"]: k for k, row in enumerate(rows)}
    shown = []
    for row in rows:
        created = row["created_at"]
        shown.append(
            {
                **{k: v for k, v in row.items() if k not in _TIMES and k not in _RELATIVE},
                "id": ranks[row["id"]],
                **{k: None if row[k] is None else row[k] - created for k in _RELATIVE},
            }
        )
    return shown, ranks


def _answer(value: Any, ranks: dict[Any, int]) -> Any:
    if isinstance(value, Exception):
        return (type(value).__name__, _masked(str(value)))
    if isinstance(value, list):
        return [_answer(v, ranks) for v in value]
    if isinstance(value, JobRow):
        fields = value.model_dump()
        created = fields["created_at"]
        return {
            **{k: v for k, v in fields.items() if k not in _TIMES and k not in _RELATIVE},
            "id": ranks.get(value.id, "absent"),
            "zones": {str(v.tzinfo) for v in fields.values() if isinstance(v, datetime)},
            "scheduled_at": fields["scheduled_at"] - created,
            "deadline_at": None if value.deadline_at is None else value.deadline_at - created,
        }
    return value


def _masked(text: str) -> str:
    """An error message without the ids and seconds that differ between runs."""
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", text)
    return re.sub(r"retry_after=[0-9.e+-]+", "retry_after=<s>", text)


@pytest.fixture
def two_schemas(_pg_schema_pool: Any) -> Iterator[tuple[PgSchema, PgSchema]]:
    with _pg_schema_pool.schema() as a, _pg_schema_pool.schema() as b:
        yield a, b


def _item(ref: str, payload: Any, **options: Any) -> EnqueueItem:
    return EnqueueItem(actor=ref, payload=payload, options=options)


_FIXED = UUID("00000000-0000-4000-8000-000000000001")

SCENARIOS: dict[str, list[Op]] = {
    "plain and options": [
        ("enqueue", (plain, {"a": 1}, {})),
        ("enqueue", ("par.plain", {"a": "x\x00y", "b": [1, 2.5, None]}, {})),
        (
            "enqueue",
            (
                plain,
                {"k": "\u0000"},
                {
                    "delay": timedelta(days=3),
                    "priority": -5,
                    "queue": "other",
                    "max_attempts": 1,
                    "fairness_key": "f\x00",
                    "schedule_to_close": timedelta(days=40),
                    "timeout": 1.5,
                    "result_ttl": 0,
                    "metadata": {"m": "v\x00", "nested": {"x": [1]}},
                    "tags": ["NULL", 'q"uote', "a,b", "{br}", "back\\slash", "nul\x00", ""],
                },
            ),
        ),
        ("enqueue", (model, {"n": 1}, {})),
        ("enqueue", (model, Model(n=2, s="é"), {"delay": 0})),
        ("enqueue", (model, {"n": "bad"}, {})),
        ("enqueue", (plain, {}, {"delay": -5})),
        ("enqueue", (plain, {}, {"bogus": 1})),
        ("enqueue", ("nope", {}, {})),
        ("enqueue", (ident, {"who": "w"}, {"delay": 7200})),
        ("enqueue", (plain, {"s": "\ud800", "\x00k": 1}, {"tags": ["\udfff"]})),
        ("enqueue", (plain, {}, {"priority": 2**31 - 1, "delay": 0.000001, "metadata": {}})),
        ("enqueue", (plain, {}, {"job_id": _FIXED})),
        ("enqueue", (plain, {}, {"job_id": _FIXED})),
        ("batch", [_item("par.plain", {}, job_id=str(_FIXED))]),
        ("fast", [_item("par.plain", {}, job_id=str(_FIXED))]),
        ("enqueue", (plain, {}, {"idempotency_key": "bad\x00key"})),
        ("enqueue", (plain, [1, "two"], {"identity_key": ""})),
    ],
    "idempotency": [
        ("enqueue", (plain, {"a": 1}, {"idempotency_key": "k"})),
        ("enqueue", (plain, {"a": 2}, {"idempotency_key": "k"})),
        (
            "batch",
            [
                _item("par.plain", {"a": 3}, idempotency_key="k"),
                _item("par.plain", {"a": 4}, idempotency_key="k2"),
                _item("par.plain", {"a": 5}, idempotency_key="k2"),
                _item("par.plain", {"a": 6}),
            ],
        ),
        ("fast", [_item("par.plain", {"a": 7}, idempotency_key="k")]),
        ("fast", [_item("par.plain", {"a": 8}, idempotency_key="k3", delay=60)]),
    ],
    "singletons": [
        ("enqueue", (ident, {"who": "a"}, {"singleton": True})),
        ("enqueue", (ident, {"who": "a"}, {"singleton": True})),
        ("enqueue", (ident, {"who": "a"}, {})),
        ("enqueue", (plain, {}, {"singleton": True})),
        ("enqueue", (plain, {}, {"singleton": True, "identity_key": "p"})),
        (
            "batch",
            [
                _item("par.ident", {"who": "b"}, singleton=True),
                _item("par.ident", {"who": "b"}, singleton=True),
            ],
        ),
        (
            "batch",
            [
                _item("par.ident", {"who": "c"}, singleton=True, idempotency_key="s1"),
                _item("par.ident", {"who": "c"}, singleton=True, idempotency_key="s1"),
            ],
        ),
        ("enqueue", (ident, {"who": "c"}, {"singleton": True, "idempotency_key": "s1"})),
        ("fast", [_item("par.ident", {"who": "d"}, singleton=True)]),
        ("fast", [_item("par.ident", {"who": "d"}, singleton=True)]),
        ("fast", [_item("par.ident", {"who": "a"}, singleton=True)]),
    ],
    "max_pending": [
        ("enqueue", (capped, {}, {"idempotency_key": "a"})),
        (
            "batch",
            [
                _item("par.capped", {}, idempotency_key="a"),
                _item("par.capped", {}, idempotency_key="b"),
                _item("par.capped", {}, idempotency_key="b"),
            ],
        ),
        ("enqueue", (capped, {}, {})),
        ("enqueue", (capped, {}, {"idempotency_key": "a"})),
        ("enqueue", (capped, {}, {"idempotency_key": "z"})),
        ("batch", [_item("par.capped", {}, idempotency_key="a")]),
        ("batch", [_item("par.capped", {}, idempotency_key="a"), ("par.capped", {})]),
        ("fast", [("par.capped", {})]),
        ("batch", []),
        ("fast", []),
    ],
    "batches": [
        ("batch", [(plain, {"i": i}) for i in range(5)] + [(model, {"n": 9})]),
        ("batch", [(plain, {"i": 1}), (model, {"n": "bad"})]),
        ("fast", [(plain, {"i": i}) for i in range(3)] + [_item("par.model", {"n": 1}, delay=5)]),
        ("fast", [(plain, {"i": 1}), (model, {"n": "bad"})]),
        (
            "fast",
            [
                _item(
                    "par.plain",
                    {"x": "\x00", "esc": "a\\b\nc\td\re\\N", "\\N": None},
                    tags=["NULL", 'q"uote', "a,b", "{br}", "back\\slash", "nul\x00", ""],
                    metadata={"m": "\x00"},
                    schedule_to_close=86400 * 3,
                    timeout=90061.5,
                    fairness_key="f",
                )
            ],
        ),
        ("batch", [{"actor": "par.plain", "payload": {}}]),
    ],
}


@pytest.mark.parametrize("mode", ["own", "pooler", "callers"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_both_clients_store_and_answer_alike(
    two_schemas: tuple[PgSchema, PgSchema], scenario: str, mode: str
) -> None:
    ops = SCENARIOS[scenario]
    a, b = two_schemas
    answered_async = asyncio.run(_async_run(a.dsn, a.name, ops, mode == "callers"))
    answered_sync = _sync_run(b.dsn, b.name, ops, mode)
    stored_async, ranks_async = _stored(a.dsn, a.name)
    stored_sync, ranks_sync = _stored(b.dsn, b.name)
    for k, (got, want) in enumerate(zip(answered_sync, answered_async, strict=True)):
        assert _answer(got, ranks_sync) == _answer(want, ranks_async), (k, ops[k][0])
    assert stored_sync == stored_async


WAKE_OPS: list[tuple[Op, bool]] = [
    (("enqueue", (plain, {}, {})), True),
    (("enqueue", (plain, {}, {"delay": 3600})), True),
    (("enqueue", (plain, {}, {"idempotency_key": "w"})), True),
    (("enqueue", (plain, {}, {"idempotency_key": "w"})), True),  # a hit: nothing new to run
    (("enqueue", (ident, {"who": "w"}, {"singleton": True})), True),
    # Refused. A failed call may wake the workers or not: the asyncpg backend's
    # coalesced wake owes one after it, as it cannot tell whether it committed.
    (("enqueue", (ident, {"who": "w"}, {"singleton": True})), False),
    (("batch", [(plain, {}), (plain, {})]), True),
    (("batch", [_item("par.plain", {}, idempotency_key="w")]), True),
    (("fast", [(plain, {})]), True),
    (("fast", [(model, {"n": "bad"})]), False),
]


def _woken(listener: psycopg.Connection[Any]) -> bool:
    return bool(list(listener.notifies(timeout=0.6, stop_after=1)))


@pytest.mark.parametrize("callers", [False, True], ids=["own", "callers"])
def test_both_clients_wake_the_workers_alike(
    two_schemas: tuple[PgSchema, PgSchema], callers: bool
) -> None:
    a, b = two_schemas
    woken: dict[str, list[bool]] = {}
    for name, pg in (("async", a), ("sync", b)):
        seen = woken[name] = []
        with psycopg.connect(pg.dsn, autocommit=True) as listener:
            listener.execute(f"LISTEN {wake_channel(pg.name)}")
            for op, _ in WAKE_OPS:
                if name == "async":
                    asyncio.run(_async_run(pg.dsn, pg.name, [op], callers))
                else:
                    _sync_run(pg.dsn, pg.name, [op], "callers" if callers else "own")
                seen.append(_woken(listener))
    compared = [k for _, k in WAKE_OPS]
    assert [w for w, k in zip(woken["sync"], compared, strict=True) if k] == [
        w for w, k in zip(woken["async"], compared, strict=True) if k
    ], woken
