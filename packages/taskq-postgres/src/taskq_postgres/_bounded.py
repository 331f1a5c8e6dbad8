"""Calls bounded end to end by the backend's ``command_timeout``.

asyncpg's ``command_timeout`` bounds a statement, not the call around it. A
statement that times out leaves its connection waiting for a cancel request
(sent over a second connection, bounded by the same timeout again) before the
pool takes it back, and getting a connection may first open one
(``connect_timeout``). Over a black-holed network every one of those waits
runs to its end: one call took up to ``connect_timeout`` + 2 x
``command_timeout``, past the stale-tick budget a worker loop's iteration is
checked against (``WorkerSettings``), so a worker tripped its watchdog and
exited during exactly the outage its loops are meant to ride out.

Here a call (getting its connection, its statement or transaction, handing
the connection back) has one deadline. A one-statement call gives its statement
what is left of it and its hand-back the rest (a moment at least), after which
the pool closes the connection instead of waiting for the cancel; a transaction's
connection, still in use at the deadline, is closed by a timer: whatever waits
on it fails at once, as a ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import asyncpg

from taskq_postgres._connect import read_watch, readable
from taskq_postgres._privileges import ReadOnlyDatabaseError

__all__ = ["BoundedPool", "PinnedConnection", "ended_if_read_only"]

if TYPE_CHECKING:
    from typing import TypeAlias

    from asyncpg.prepared_stmt import PreparedStatement

    Proxy: TypeAlias = asyncpg.pool.PoolConnectionProxy[asyncpg.Record]

# What a statement, a rollback or a release raises once its connection was closed.
_CLOSED_ERRORS = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError)
_PREPARED_MAX = 16
"""Statements kept prepared per pinned connection: the one-job enqueue's few texts."""
_MIN_TIMEOUT = 0.001
_RELEASE_FLOOR = 0.1
"""Seconds a hand-back may take past the deadline: a live server's cancel takes a
millisecond or two."""


@contextmanager
def _closed_at(conn: Proxy, deadline: float, budget: float) -> Iterator[None]:
    """Close ``conn`` if the block still runs at ``deadline`` (loop time); what the
    closing interrupts is raised as a ``TimeoutError``."""
    fired = False

    def close() -> None:
        nonlocal fired
        fired = True
        conn.terminate()

    timer = asyncio.get_running_loop().call_at(deadline, close)
    try:
        yield
    except _CLOSED_ERRORS as exc:
        if not fired:
            raise
        raise TimeoutError(
            f"PostgreSQL did not answer within {budget:g}s (command_timeout); "
            f"the connection was closed"
        ) from exc
    finally:
        timer.cancel()


class BoundedPool:
    """The backend's view of its asyncpg pool: each call, from getting a connection to
    handing it back, bounded by ``budget`` seconds (or the call's own ``timeout``).

    With no budget (a backend without ``command_timeout``) calls wait as long as the
    pool's own do. Either way a connection the server ended while it idled is replaced
    before a statement is sent on it (:func:`_ended`).
    """

    def __init__(self, pool: asyncpg.Pool[asyncpg.Record], budget: float | None) -> None:
        self.pool = pool
        self.budget = budget

    @asynccontextmanager
    async def acquire(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 - asyncpg's signature, as below
    ) -> AsyncIterator[Proxy]:
        """A pooled connection for a call of several statements (a transaction), closed
        if the call outlives its budget."""
        budget = timeout if timeout is not None else self.budget
        if budget is None:
            conn = await _acquire(self.pool, None)
            try:
                yield conn
            except asyncpg.ReadOnlySQLTransactionError:
                await _end_read_only(self.pool, conn)
                raise
            finally:
                await self.pool.release(conn)
            return
        deadline = asyncio.get_running_loop().time() + budget
        conn = await _acquire(self.pool, deadline)
        with _closed_at(conn, deadline, budget):
            try:
                yield conn
            except asyncpg.ReadOnlySQLTransactionError:
                await _end_read_only(self.pool, conn)
                raise
            finally:
                # Inside the deadline: should asyncpg's own statement timeout fire first,
                # the release waits for its cancel request, which a stalled network
                # never delivers.
                await self.pool.release(conn)

    async def execute(
        self,
        query: str,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> str:
        status: str = await self._one("execute", query, args, timeout)
        return status

    async def fetch(
        self,
        query: str,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[asyncpg.Record]:
        records: list[asyncpg.Record] = await self._one("fetch", query, args, timeout)
        return records

    async def fetchrow(
        self,
        query: str,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> asyncpg.Record | None:
        record: asyncpg.Record | None = await self._one("fetchrow", query, args, timeout)
        return record

    async def fetchval(
        self,
        query: str,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any:
        return await self._one("fetchval", query, args, timeout)

    async def _one(
        self,
        method: str,
        query: str,
        args: tuple[Any, ...],
        timeout: float | None,  # noqa: ASYNC109
    ) -> Any:
        """One statement: no timer of its own (it runs on the hot paths), but the
        statement gets what is left of the budget, and the hand-back the rest (or a
        moment, to let a healthy server's cancel come through). A read-only refusal is
        tried once more on a new session (:func:`_end_read_only`)."""
        budget = timeout if timeout is not None else self.budget
        deadline = None if budget is None else asyncio.get_running_loop().time() + budget
        conn = await _acquire(self.pool, deadline)
        read_only_retried = False
        try:
            # A restart ends every pooled connection: at worst each is replaced in turn.
            for _ in range(self.pool.get_max_size()):
                try:
                    return await _call(self.pool, conn, method, query, args, deadline)
                except asyncpg.InternalClientError as exc:
                    if not _unsent(exc):
                        raise
                    conn = await _replaced(self.pool, conn, deadline)
                except asyncpg.ReadOnlySQLTransactionError:
                    if read_only_retried:
                        raise
                    read_only_retried = True
                    conn = await _acquire(self.pool, deadline)  # _call ended the refused one
            return await _call(self.pool, conn, method, query, args, deadline)
        finally:
            await _release(self.pool, conn, deadline)


async def _call(
    pool: asyncpg.Pool[asyncpg.Record],
    conn: Proxy,
    method: str,
    query: str,
    args: tuple[Any, ...],
    deadline: float | None,
) -> Any:
    try:
        if deadline is None:
            return await getattr(conn, method)(query, *args)
        return await getattr(conn, method)(query, *args, timeout=_left(deadline))
    except asyncpg.ReadOnlySQLTransactionError:
        await _end_read_only(pool, conn)
        raise


async def _end_read_only(pool: asyncpg.Pool[asyncpg.Record], conn: Proxy) -> None:
    """Close ``conn``, on which a statement met a read-only session (25006), which hands
    it back to the ``pool`` to be replaced, and have the pool replace its other sessions
    too: the error is transient, and the retry needs a new session. (An ``except`` at
    each call, not a context manager: a try block costs the hot paths nothing.)

    A managed database's provider sets ``default_transaction_read_only`` while its disk
    is full and resets it once space is freed; an operator sets it for a maintenance
    window. The setting is read when a session begins: a session that began read-only
    stays so after the reset (the pool's ``RESET ALL`` on release keeps it), and every
    write on it failed for the worker's life. The pool's other sessions most likely
    began so too: replaced only as each met the refusal, every one of them failed a
    write after the reset. Expired, each is replaced when next taken from the pool (or,
    one in use, when handed back). A connection kept checked out (``PinnedConnection``)
    is not, until it meets the refusal itself: so the one-statement calls (``BoundedPool``'s
    and ``PinnedConnection``'s) try a refused statement once more, on a new session. A
    refused statement ran nothing; a database still read-only refuses it again.
    """
    conn.terminate()
    await pool.expire_connections()


@asynccontextmanager
async def ended_if_read_only(
    pool: asyncpg.Pool[asyncpg.Record], conn: Proxy
) -> AsyncIterator[None]:
    """:func:`_end_read_only` for a connection of ``pool`` lent to caller code
    (``PostgresBackend.connection``), whose block also sees the refusal as a backend
    method says it (:class:`ReadOnlyDatabaseError`)."""
    try:
        yield
    except (asyncpg.ReadOnlySQLTransactionError, ReadOnlyDatabaseError):
        await _end_read_only(pool, conn)
        raise


_UNSENT = ("cannot switch to state", "not connected")


def _unsent(exc: asyncpg.InternalClientError) -> bool:
    """Whether asyncpg refused the statement before sending anything: it has read the
    goodbye of a session the server just ended (a restart, ``pg_terminate_backend``) and
    takes no statement on it, while the end of the stream, which :func:`_ended` looks
    for, has yet to arrive. Nothing ran, so the statement may go on another connection.
    asyncpg gives this refusal no class of its own, only these words (its protocol's
    state check, made before anything is written)."""
    return str(exc).startswith(_UNSENT)


async def _replaced(
    pool: asyncpg.Pool[asyncpg.Record], conn: Proxy, deadline: float | None
) -> Proxy:
    """Another connection for a statement ``conn`` refused unsent (:func:`_unsent`);
    ``conn`` is closed, which hands it back to the pool, so it is not handed out again."""
    conn.terminate()
    return await _acquire(pool, deadline)


def _left(deadline: float) -> float:
    return max(deadline - asyncio.get_running_loop().time(), _MIN_TIMEOUT)


async def _release(pool: asyncpg.Pool[asyncpg.Record], conn: Proxy, deadline: float | None) -> None:
    """Hand ``conn`` back within what is left until ``deadline`` (at least a moment).

    After a statement timeout the pool waits for the cancel request, which a stalled
    network never delivers: past the deadline the pool closes the connection instead.
    """
    if deadline is None:
        await pool.release(conn)
        return
    with contextlib.suppress(TimeoutError, *_CLOSED_ERRORS):
        await pool.release(conn, timeout=max(_left(deadline), _RELEASE_FLOOR))


async def _acquire(pool: asyncpg.Pool[asyncpg.Record], deadline: float | None) -> Proxy:
    """A connection from ``pool`` (a connect included) that has not :func:`_ended`."""
    conn = await pool.acquire(timeout=None if deadline is None else _left(deadline))
    # A restart ends every pooled connection: at worst each is replaced in turn.
    for _ in range(pool.get_max_size()):
        try:
            ended = _ended(conn)
        except BaseException:
            await pool.release(conn)  # the check itself failed: the slot is not lost
            raise
        if not ended:
            break
        conn = await pool.acquire(timeout=None if deadline is None else _left(deadline))
    return conn


def _fd(conn: Proxy) -> int:
    """The socket of a checked-out connection (asyncpg's own attributes, not in its stubs:
    a connection shows no socket)."""
    proxy: Any = conn
    return int(proxy._con._transport.get_extra_info("socket").fileno())


def _ended(conn: Proxy, pending: Callable[[], bool] | None = None) -> bool:
    """Whether the server ended ``conn`` while it idled (a restart, ``idle_session_timeout``,
    ``pg_terminate_backend``): every statement on it would fail, and one sent may not be
    sent again (nothing tells whether it ran). One asyncpg has yet to see end is
    terminated here, which hands it back to the pool.

    asyncpg sees the end (and the pool stops handing the connection out) a few
    event-loop turns after the server's goodbye and the end of the stream arrive; the
    first call after a restart failed meanwhile. Its socket then has something to read
    while no statement runs, which tells it before one is sent, as the sync client's
    ``_dropped`` does: a poll, about a microsecond, no round trip. ``pending`` asks it
    (:func:`read_watch` of the socket; by default a poll made for this call).
    """
    # asyncpg's own attribute: a public call on a detached proxy costs a raised error.
    proxy: Any = conn
    if proxy._con is None:  # the pool took it back (asyncpg detaches one that closes)
        return True
    if not (pending() if pending is not None else readable(_fd(conn))):
        return False
    conn.terminate()
    return True


class PinnedConnection:
    """One pool connection kept checked out for the backend's one-statement writes
    (a one-job enqueue), used while idle; a concurrent caller goes to the pool.

    asyncpg's acquire and release take several event-loop turns, about as long
    as a one-row INSERT on a small machine. Any error hands the connection back
    to the pool, which waits out a cancelled query or replaces a broken
    connection; the next call pins another. Each call has the pool's budget, as
    :class:`BoundedPool`'s do.
    """

    def __init__(self, pool: BoundedPool, *, prepared: bool = False) -> None:
        self._pool = pool
        self._conn: Proxy | None = None
        self._pending: Callable[[], bool] | None = None
        """Whether the pinned connection's socket has something to read (:func:`_ended`)."""
        self._busy = False
        self._prepared = prepared
        """Whether ``fetchrow`` runs its statements prepared on the pinned connection."""
        self._statements: dict[str, PreparedStatement] = {}
        self._releases = 0
        """How many times :meth:`release` was called: a connection a call got while one
        came is handed back, not pinned."""
        """The statements prepared on the pinned connection (``prepared``), by their text."""

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        """``Pool.fetch``, on the pinned connection when it is idle."""
        result: list[asyncpg.Record] = await self._run("fetch", query, args)
        return result

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        """``Pool.fetchrow``, on the pinned connection when it is idle."""
        result: asyncpg.Record | None = await self._run("fetchrow", query, args)
        return result

    async def _run(self, method: str, query: str, args: tuple[Any, ...]) -> Any:
        if self._busy:
            return await getattr(self._pool, method)(query, *args)
        self._busy = True
        releases = self._releases
        pool, budget = self._pool.pool, self._pool.budget
        deadline = None if budget is None else asyncio.get_running_loop().time() + budget
        conn = self._conn
        kept = False
        try:
            if conn is not None and _ended(conn, self._pending):
                conn = self._conn = None
            if conn is None:
                conn = await _acquire(pool, deadline)
                self._statements = {}
                if self._releases == releases:  # else handed back below
                    self._conn = conn
                    self._pending = read_watch(_fd(conn))
            # As BoundedPool's: each connection that refuses the statement unsent, replaced,
            # and a read-only refusal tried once more on a new session.
            read_only_retried = False
            for _ in range(pool.get_max_size()):
                try:
                    result = await self._call(conn, method, query, args, deadline)
                    break
                except asyncpg.InternalClientError as exc:
                    if not _unsent(exc):
                        raise
                    replaced = await _replaced(pool, conn, deadline)
                except asyncpg.ReadOnlySQLTransactionError:
                    if read_only_retried:
                        raise
                    read_only_retried = True
                    replaced = await _acquire(pool, deadline)  # _call ended the refused one
                self._statements = {}  # prepared on the one replaced
                if self._releases == releases:  # else handed back below
                    self._conn = replaced
                    self._pending = read_watch(_fd(replaced))
                conn = replaced
            else:
                result = await self._call(conn, method, query, args, deadline)
            kept = True
            return result
        finally:
            self._busy = False
            # Handed back on an error, or when release() came meanwhile.
            if conn is not None and (not kept or self._conn is not conn):
                if self._conn is conn:
                    self._conn = None
                await _release(pool, conn, deadline)

    async def _call(
        self, conn: Proxy, method: str, query: str, args: tuple[Any, ...], deadline: float | None
    ) -> Any:
        if self._prepared and method == "fetchrow":
            try:
                return await self._fetchrow_prepared(conn, query, args, deadline)
            except asyncpg.ReadOnlySQLTransactionError:
                await _end_read_only(self._pool.pool, conn)
                raise
        return await _call(self._pool.pool, conn, method, query, args, deadline)

    async def _fetchrow_prepared(
        self, conn: Proxy, query: str, args: tuple[Any, ...], deadline: float | None
    ) -> asyncpg.Record | None:
        """``fetchrow`` on ``query`` prepared once for the pinned connection: a one-job
        enqueue then skips the statement cache's lookup and the pool proxy's layer,
        about a twentieth of its client instructions. A statement the server no longer
        takes as prepared (a migration changed its table's result type) runs once by its
        text, whose path re-prepares it (asyncpg retries there), and is prepared anew
        next time. Only that refusal is retried: the server raises it before the
        statement runs.
        asyncpg's ``OutdatedSchemaCacheError`` comes while decoding the rows of a
        statement that ran (an INSERT committed): the statement is dropped and the error
        raised, as asyncpg's own path does, where a second run inserted again."""
        statement = self._statements.get(query)
        if statement is None:
            if len(self._statements) >= _PREPARED_MAX:  # texts built per call: no growth
                self._statements.clear()
            timeout = None if deadline is None else _left(deadline)
            statement = self._statements[query] = await conn.prepare(query, timeout=timeout)
        try:
            if deadline is None:
                return await statement.fetchrow(*args)
            return await statement.fetchrow(*args, timeout=_left(deadline))
        except asyncpg.InvalidCachedStatementError:
            del self._statements[query]
        except asyncpg.OutdatedSchemaCacheError:
            del self._statements[query]
            raise
        if deadline is None:
            return await conn.fetchrow(query, *args)
        return await conn.fetchrow(query, *args, timeout=_left(deadline))

    async def release(self) -> None:
        """Hand the connection back now (before the pool closes, or so that a
        credential reload replaces it); a later call pins another."""
        self._releases += 1
        conn, self._conn = self._conn, None
        if conn is not None and not self._busy:  # a busy call hands it back itself
            await self._pool.pool.release(conn)
