"""``PostgresLeaderElector``: maintenance-leader election over a session advisory lock.

The lock lives on a dedicated, non-pooled connection (``taskq-leader/<id>``
in ``pg_stat_activity``): it is held exactly as long as that session lives.
A killed leader's session ends with its socket; a frozen (SIGSTOPped) or
partitioned one would keep it forever, so the session carries
``idle_session_timeout = lease``: a leader that stops renewing is
disconnected by the server within the lease, which releases the lock. The
renewals (one statement per tick) keep a live leader's session from idling
that long.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Final
from uuid import UUID

import asyncpg
import structlog

from taskq_postgres._sql import leader, render

__all__ = ["LeaderStatements", "PostgresLeaderElector"]

_log = structlog.get_logger("taskq.leader")

# What a statement or a close on the session may raise once it is lost. InternalClientError
# among them: a statement sent as the server ends the session (a restart) meets it, and
# raised from release() it skipped the session's end and failed the worker's stop.
_SESSION_ERRORS: Final[tuple[type[BaseException], ...]] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


class LeaderStatements:
    """The election, cron and maintenance-run statements of one schema."""

    def __init__(self, schema: str) -> None:
        self.try_lock = render(leader.LEADER_TRY_LOCK, schema)
        self.claim_row = render(leader.LEADER_CLAIM_ROW, schema)
        self.renew = render(leader.LEADER_RENEW, schema)
        self.resign_row = render(leader.LEADER_RESIGN_ROW, schema)
        self.cron_due = render(leader.CRON_DUE, schema)
        self.cron_advance = render(leader.CRON_ADVANCE, schema)
        self.cron_max_pending = render(leader.CRON_MAX_PENDING, schema)
        self.maintenance_run_last = render(leader.MAINTENANCE_RUN_LAST, schema)
        self.maintenance_run_record = render(leader.MAINTENANCE_RUN_RECORD, schema)


class PostgresLeaderElector:
    """One worker's candidacy (see :class:`taskq.backend._protocol.LeaderElector`).

    ``connect`` opens the dedicated session (already carrying the
    ``idle_session_timeout``); ``command_timeout`` bounds each :meth:`try_acquire`
    end to end (a reconnect included), so a silent network cannot hold a tick past
    the lease, nor the election loop past its stale-tick budget.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection[Any]]],
        statements: LeaderStatements,
        worker_id: UUID,
        *,
        command_timeout: timedelta,
    ) -> None:
        self._connect = connect
        self._sql = statements
        self._worker_id = worker_id
        self._timeout = command_timeout.total_seconds()
        self._conn: asyncpg.Connection[Any] | None = None
        self._leading = False
        self._pid = 0
        """The server session that took the lock."""

    async def try_acquire(self) -> bool:
        """Take the lock once per session, then only confirm the session still holds it."""
        async with asyncio.timeout(self._timeout):
            return await self._try_acquire()

    async def _try_acquire(self) -> bool:
        try:
            if self._conn is None or self._conn.is_closed():
                if self._leading:
                    # The session holding the lock ended, and the lock with it: this
                    # leadership is over (another candidate may have led since), said
                    # so, where taking the lock again at once hid the loss and kept the
                    # old election's reclaim grace. The next tick stands again.
                    self._leading = False
                    self._conn = None
                    return False
                self._conn = await self._connect()
            conn = self._conn
            if self._leading:
                held = await conn.fetchrow(self._sql.renew, self._worker_id, timeout=self._timeout)
                assert held is not None  # one row, always
                if held["pid"] != self._pid:
                    _session_moved(self._pid, held["pid"])
                self._leading = held["ok"] and held["pid"] == self._pid
                if not self._leading:
                    await self._drop()
                return self._leading
            taken = await conn.fetchrow(self._sql.try_lock, timeout=self._timeout)
            assert taken is not None
            if taken["ok"]:
                self._leading, self._pid = True, taken["pid"]
                await conn.execute(self._sql.claim_row, self._worker_id, timeout=self._timeout)
            return self._leading
        except BaseException:
            # Whatever state the session is in, it no longer proves leadership.
            await self._drop()
            raise

    async def release(self) -> None:
        """Clear the observability row when leading, then end the session (which
        releases the lock however many times it was taken)."""
        conn = self._conn
        if conn is not None and not conn.is_closed() and self._leading:
            try:
                await conn.execute(self._sql.resign_row, self._worker_id, timeout=self._timeout)
            except _SESSION_ERRORS as exc:
                _log.warning("taskq.leader-resign-row-failed", error=repr(exc))
        await self._drop(graceful=True)

    async def _drop(self, *, graceful: bool = False) -> None:
        conn, self._conn = self._conn, None
        self._leading = False
        if conn is None or conn.is_closed():
            return
        if graceful:
            # A clean close returns once the server ended the session, so the
            # lock is free for a successor the moment release() returns.
            try:
                await asyncio.wait_for(conn.close(), self._timeout)
                return
            except _SESSION_ERRORS:
                pass
        # terminate(), not close(): a dead peer must not hold the step-down.
        conn.terminate()


def _session_moved(pid: int, now: int) -> None:
    _log.error(
        "taskq.leader-session-moved",
        locked_in=pid,
        now_in=now,
        hint="the leader's statements reached another server session than the one holding "
        "its lock: its DSN goes through a transaction-mode pooler (PgBouncer?), which leaves "
        "the lock on a server connection it lends to others. Give the backend the "
        "server's own address as direct_dsn (TASKQ_DIRECT_DSN)",
    )
