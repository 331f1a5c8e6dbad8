"""``TRANSIENT_PG_ERRORS``: the one tuple of "Postgres is having a moment" errors.

Every worker loop that awaits Postgres logs these and retries on its next
tick (the tuple reaches core through the ``taskq_transient_errors`` hook).
Authentication failures are deliberately absent: with a static DSN they do
not heal by themselves, and retrying them silently would hide the outage.
"""

from __future__ import annotations

from typing import Final

import asyncpg
from asyncpg import exceptions as pg

from taskq_postgres._privileges import ReadOnlyDatabaseError

__all__ = ["STATEMENT_CANCELLATIONS", "TRANSIENT_PG_ERRORS", "client_fault"]

TRANSIENT_PG_ERRORS: Final[tuple[type[BaseException], ...]] = (
    TimeoutError,  # client-side deadlines
    asyncpg.PostgresConnectionError,  # connection gone
    asyncpg.InterfaceError,  # unusable connection
    # A statement sent on a connection the server has just terminated (restart,
    # pg_terminate_backend), before the client read the socket's end: asyncpg finds
    # the protocol mid-operation ("another operation is in progress"). Not a bug of
    # ours: a moment later the same call raises InterfaceError.
    asyncpg.InternalClientError,
    OSError,  # dead socket
    pg.QueryCanceledError,  # server-side statement_timeout / command_timeout
    pg.AdminShutdownError,  # 57P01: restart or shutdown
    pg.CannotConnectNowError,  # 57P03: crash recovery
    pg.TooManyConnectionsError,  # 53300: server saturated
    # 53100 and 53200: the server out of disk space or memory for the moment. Each lasts
    # until someone else frees some; not retried, an outcome write failed for good (and
    # the job whose code had run ran again), and five in a row ended the worker.
    pg.DiskFullError,
    pg.OutOfMemoryError,
    # 55000 and its kin: the database is not accepting connections (ALLOW_CONNECTIONS
    # false, for a maintenance window), a lock wait past the session's lock_timeout
    # (55P03), an object in use (55006). Each lasts until someone else is done. Of the
    # class's two deterministic members, 55P04 (an enum value used in the transaction
    # that added it) arises from no statement TaskQ sends, and 55P02 (a server-wide
    # setting given per session, in a DSN's options) at connect, which refuses it as
    # a ConfigurationError (_connect.translated_errors).
    pg.ObjectNotInPrerequisiteStateError,
    # 25006: a read-only session (a provider's default_transaction_read_only while the
    # disk is full, an operator's for a maintenance window). It lasts until the setting
    # is reset; the connection that met it is replaced (_bounded): a session keeps the
    # value it began with.
    pg.ReadOnlySQLTransactionError,
    ReadOnlyDatabaseError,  # the same, as the backend's methods raise it (_privileges)
    pg.DeadlockDetectedError,  # 40P01
    pg.SerializationError,  # 40001
    pg.IdleSessionTimeoutError,
    pg.IdleInTransactionSessionTimeoutError,
)

STATEMENT_CANCELLATIONS: Final[tuple[type[BaseException], ...]] = (
    # 57014, of the transient errors above: the server cancelled the statement (its
    # statement_timeout, or an operator's pg_cancel_backend). A statement that carries
    # too much meets it at every try. asyncpg's client-side command_timeout raises
    # TimeoutError instead, as a broken connection does.
    pg.QueryCanceledError,
)
"""The errors by which Postgres cancels one statement on its own account
(``SupportsStatementCancellations``)."""


def client_fault(exc: BaseException) -> bool:
    """Whether ``exc``, of asyncpg's client-side errors among the transient ones above,
    is asyncpg refusing the calling code rather than saying the connection is gone.

    A worker loop retries these with a connection replaced; a one-shot command (the
    ``taskq`` and ``taskq-worker`` CLIs, through ``taskq_client_fault``) shows them with
    their traceback, where "the database failed" hid a bug: a second statement sent on
    a connection still busy ("cannot perform operation: another operation is in
    progress"), one used after its release to the pool. Only the InterfaceError of a
    closed connection ("connection is closed", "the underlying connection is closed")
    is the database's. An ``InternalClientError`` is not the calling code's either: a
    statement on a connection the server has just terminated meets one ("cannot switch
    to state 15; another operation (2) is in progress", "not connected").
    """
    # asyncpg gives a closed connection no class of its own, only these words.
    return isinstance(exc, asyncpg.InterfaceError) and "connection is closed" not in str(exc)
