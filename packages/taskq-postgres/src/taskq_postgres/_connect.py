"""Connecting: DSN checks, the settings every TaskQ connection carries, error
translation, and the socket check that tells an idle connection the server ended.

asyncpg reports a bad DSN or an unreachable server with exceptions from deep
inside its connect machinery (``ValueError`` from ``int()``, ``OSError``,
``ClientConfigurationError``...). Callers get one of two TaskQ errors instead,
each with a one-line message naming the problem and the (password-masked) DSN:
:class:`~taskq.errors.ConfigurationError` for a DSN that cannot work, and
:class:`BackendUnavailableError` for a server that cannot be reached or
refuses the login.
"""

from __future__ import annotations

import os
import re
import select
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from typing import Any, Final
from urllib.parse import parse_qs, unquote_plus, urlsplit

import asyncpg

from taskq._dsn import ports_read, redact
from taskq.errors import ConfigurationError, TaskQError
from taskq_postgres._service import service_settings

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_IDLE_IN_TRANSACTION",
    "POSTGRES_SCHEMES",
    "BackendUnavailableError",
    "LentConnections",
    "check_dsn",
    "check_instance_id",
    "connect",
    "connection_settings",
    "create_pool",
    "libpq_connect_timeout",
    "read_watch",
    "readable",
    "redact",
    "through_pooler",
    "unmigrated",
]

POSTGRES_SCHEMES: Final = ("postgresql", "postgres")

_INSTANCE_ID_RE: Final = re.compile(r"[A-Za-z0-9_.:-]{1,40}")


class BackendUnavailableError(TaskQError):
    """The PostgreSQL server could not be reached, or refused the connection or login.

    Raised by ``PostgresBackend.open()`` (and the first wake subscription) with
    the server's address and reason. Check that the server runs, the DSN's
    host, port, database and credentials, and the network in between.
    """


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def check_dsn(dsn: str) -> str:
    """Refuse a DSN that cannot work, before any connection is tried; return it without
    the whitespace around it (a secret's trailing newline or space, which the drivers
    read into the database name: 'database "app " does not exist')."""
    if isinstance(dsn, str):
        dsn = dsn.strip()
    if not isinstance(dsn, str) or not dsn:
        raise ConfigurationError(
            "PostgresBackend needs a DSN such as postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
        )
    expected = (
        "expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE (a / ? # or @ in the "
        "password percent-encoded)"
    )
    shown = redact(dsn)
    try:
        parts = urlsplit(dsn)
        if not ports_read(parts.netloc):  # each of several hosts too (libpq takes them)
            parts.port  # noqa: B018 - raises the parser's reason
            raise ValueError("a port cannot be read")
    except ValueError as exc:
        # The parser's reason may quote a piece of a password it took for a port.
        reason = "its host or port cannot be read" if "<hidden" in shown else _one_line(exc)
        raise ConfigurationError(f"invalid DSN {shown}: {reason}; {expected}") from None

    if parts.scheme.lower() not in POSTGRES_SCHEMES:
        raise ConfigurationError(
            f"invalid DSN {shown}: TaskQ on PostgreSQL takes postgresql:// and postgres:// "
            f"URLs, not {parts.scheme or 'scheme-less'} ones"
        )
    if not dsn.partition(":")[2].startswith("//"):
        # postgres:USER:PASSWORD@HOST/DB reads as a path: the password a database name.
        raise ConfigurationError(f"invalid DSN {shown}: no //HOST part; {expected}")
    if parts.netloc.count("@") > 1:
        # The drivers end the password at the first @, the rest read as the host: the
        # connection failed naming that host, the password's tail (psycopg quotes it).
        raise ConfigurationError(
            f"invalid DSN {shown}: its user or password holds a raw @ (percent-encode it as "
            f"%40); {expected}"
        )
    if not dsn.isascii():
        try:
            dsn.encode()
        except UnicodeEncodeError:
            # Bytes the locale could not decode (a --dsn or TASKQ_DSN): asyncpg failed
            # to encode them as it connected, with a traceback of its own internals.
            raise ConfigurationError(
                f"invalid DSN {shown}: it holds bytes that are not UTF-8 text; "
                f"percent-encode them (%FF) or check the shell's locale (LANG)"
            ) from None
    libpq_connect_timeout(dsn, 0.0)  # its value refused here, before any connection
    return dsn


_CONNECT_TIMEOUT: Final = "connect_timeout"
"""libpq's query parameter for a connection attempt's bound, which asyncpg does not read."""

_NO_CONNECT_LIMIT: Final = 1e9
"""A connection attempt's bound when a DSN's connect_timeout is 0 (asyncpg takes none)."""


def libpq_connect_timeout(dsn: str, default: float) -> tuple[str, float]:
    """``dsn`` without libpq's ``connect_timeout`` query parameter, for asyncpg, and the
    seconds a connection attempt may take: the DSN's, as libpq reads it (0 or less: as
    long as it takes; 1 counts as 2, libpq's least), else ``default``.

    asyncpg sends a query parameter it does not know to the server as a session
    setting: a DSN that libpq, psycopg and ``SyncJobsClient`` take (a shared
    ``DATABASE_URL`` with ``?connect_timeout=10``) failed every connection of the
    backend with 'unrecognized configuration parameter "connect_timeout"'."""
    base, mark, query = dsn.partition("?")
    if not mark:
        return dsn, default
    query, hash_mark, fragment = query.partition("#")
    kept: list[str] = []
    given: str | None = None
    for item in query.split("&"):
        key, _, value = item.partition("=")
        if unquote_plus(key) == _CONNECT_TIMEOUT:
            given = unquote_plus(value)
        else:
            kept.append(item)
    if given is None:
        return dsn, default
    try:
        seconds = int(given.strip())
    except ValueError:
        raise ConfigurationError(
            f"invalid DSN {redact(dsn)}: connect_timeout takes a whole number of seconds "
            f"(0: no limit), got {given!r}"
        ) from None
    rest = "&".join(kept)
    stripped = base + ("?" + rest if rest else "") + hash_mark + fragment
    return stripped, (_NO_CONNECT_LIMIT if seconds <= 0 else float(max(seconds, 2)))


def check_instance_id(instance_id: str) -> str:
    """Refuse an instance id that would not survive in ``application_name``."""
    if not isinstance(instance_id, str) or _INSTANCE_ID_RE.fullmatch(instance_id) is None:
        raise ValueError(
            f"invalid instance_id {instance_id!r}: use 1 to 40 ASCII letters, digits or . _ : -"
        )
    return instance_id


NOTIFY_ROLE = "taskq-notify"
LEADER_ROLE = "taskq-leader"


def connection_settings(
    role: str, instance_id: str, idle_in_transaction_timeout: timedelta | None
) -> dict[str, str]:
    """Session settings for a TaskQ connection of ``role`` (``taskq-pool``,
    ``taskq-notify``, ``taskq-leader``).

    ``application_name`` lets operators find the connection in
    ``pg_stat_activity``; ``idle_in_transaction_session_timeout`` ends a
    transaction left open (by a stuck caller) so its row locks cannot hide
    rows from the ``SKIP LOCKED`` sweeps forever.
    """
    timeout_ms = (
        0
        if idle_in_transaction_timeout is None
        else max(int(idle_in_transaction_timeout / timedelta(milliseconds=1)), 1)
    )
    settings = {
        "application_name": f"{role}/{instance_id}",
        "idle_in_transaction_session_timeout": str(timeout_ms),
        # TaskQ's statements are short OLTP work whose plan costs the planner
        # overestimates (CTE row guesses); JIT then compiled ~200 functions per
        # dispatch, ~110 ms each time on a 20,000-job backlog, for nothing.
        "jit": "off",
        # A duration TaskQ adds to a timestamp is exact: asyncpg sends a timedelta's
        # days as interval days, and timestamptz + '1 day' is a calendar day in the
        # session's zone (23 or 25 hours across a DST change). The enqueue statements,
        # which may run on a caller's connection, do their arithmetic in seconds.
        "TimeZone": "UTC",
    }
    if role in (NOTIFY_ROLE, LEADER_ROLE):
        # The LISTEN and leader connections idle between uses: TCP keepalives let
        # the server notice a vanished peer (releasing the leader's lock), and
        # stop middleboxes from silently dropping the idle flow.
        settings.update(
            tcp_keepalives_idle="30", tcp_keepalives_interval="10", tcp_keepalives_count="3"
        )
    return settings


POOLER_PASSES: Final = frozenset({"application_name", "TimeZone"})
"""The session settings a connection pooler passes on at connect (PgBouncer refuses any
other it is not told to ignore, and applies none it ignores)."""


def same_address(one: str, other: str) -> bool:
    """Whether two checked DSNs name the same server, database and user, however spelt
    (``postgres://`` or ``postgresql://``, a default port written out or not, host case,
    the order of query parameters, a ``connect_timeout``: how long to wait for the
    server, not which one it is)."""

    def address(dsn: str) -> tuple[object, ...]:
        parts = urlsplit(dsn)
        host = (parts.hostname or "").lower()
        try:
            port = parts.port or 5432
        except ValueError:  # several hosts: compared as written
            host, port = parts.netloc.rpartition("@")[2].lower(), 0
        query = sorted(
            (k, tuple(v)) for k, v in parse_qs(parts.query).items() if k != _CONNECT_TIMEOUT
        )
        return host, port, parts.path, parts.username, parts.password, query

    return address(one) == address(other)


def through_pooler(settings: dict[str, str]) -> dict[str, str]:
    """What of ``settings`` a connection through a pooler can carry."""
    return {name: value for name, value in settings.items() if name in POOLER_PASSES}


_QUOTED: Final = re.compile(r'(?<!for connection option )"[^"]*"')
"""A piece of a driver's message in double quotes (libpq quotes what it could not read),
but for the name of the option whose value libpq refused: a name libpq knows."""


_NO_SSL: Final = ("rejected SSL upgrade", "server does not support SSL")
"""How asyncpg and libpq say a server refused an SSL request. asyncpg says so of any
answer but PostgreSQL's yes, a program that is no PostgreSQL server too (an HTTP
server answering ``HTTP/1.1 400``), and asks for SSL unless the DSN says otherwise."""

_STATEMENT_CACHE_SIZE: Final = 100
"""asyncpg's default: the statements kept prepared per connection."""

DEFAULT_CONNECT_TIMEOUT: Final = timedelta(seconds=10)
"""How long TaskQ's own connections wait for a server to answer (per attempt): the
backend's ``connect_timeout``, and ``SyncJobsClient``'s where neither its DSN, the libpq
service it names nor ``PGCONNECT_TIMEOUT`` gives one."""

DEFAULT_IDLE_IN_TRANSACTION: Final = timedelta(seconds=60)
"""How long a transaction of TaskQ's own may idle before the server ends it: the
backend's ``idle_in_transaction_session_timeout``, and ``SyncJobsClient``'s."""

_DIRECT_DSN_HINT: Final = (
    "give the backend the server's own address as direct_dsn (TASKQ_DIRECT_DSN), and the "
    "pooler's as the DSN; TaskQ's pooled connections then send only what a pooler passes"
)

_POOLER_REFUSED: Final = "unsupported startup parameter"
_POOLER_LOGIN_REFUSED: Final = ("authentication failed", "no such user", "no such database")
"""How PgBouncer refuses a login itself."""
"""How PgBouncer refuses a session setting sent at connect that it does not pass on."""

_NOT_POSTGRES: Final = (
    "received invalid response to SSL negotiation",
    "expected authentication request from server, but received",
)
"""How libpq says the server answered in a protocol that is not PostgreSQL's."""

_SSL_REQUIRED: Final = frozenset({"require", "verify-ca", "verify-full"})
"""The sslmodes that refuse a connection without SSL (libpq's names)."""

_SERVER_AT: Final = re.compile(
    r'(?:PostgreSQL server at|connection to server at) "([^"]*)"(?:, port (\d+))?'
)
"""Where a driver's message says the server it tried is (asyncpg's, then libpq's)."""


_SERVER_WIDE: Final = ("55P02", re.compile(r'FATAL:\s+parameter "[^"]*" cannot be changed\b'))
"""``cant_change_runtime_param``: a server-wide setting (``shared_buffers``) given for a
session, which the server refuses at every connect; and how libpq passes it on."""

_UNKNOWN_SETTING: Final = ("42704", re.compile(r'FATAL:\s+unrecognized configuration parameter "'))
"""``undefined_object`` at connect: a setting the server does not know, refused at every
connect; and how libpq passes it on."""


def _refused_at_connect(exc: BaseException, refusal: tuple[str, re.Pattern[str]]) -> bool:
    """Whether the server refused the connection with ``refusal``'s SQLSTATE."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate is not None:  # asyncpg's errors carry it
        return bool(sqlstate == refusal[0])
    # psycopg attaches no SQLSTATE to a failure to connect (libpq keeps the server's
    # error to itself: no result, sqlstate and diag are None), so the server's words
    # are the fallback; from a server whose lc_messages is not English it stays an outage.
    return refusal[1].search(str(exc)) is not None


def _ssl_required(dsn: str, sslmode: str | None = None) -> bool:
    """Whether ``dsn`` (its ``sslmode`` query parameter, else the one of the service its
    query names, else ``PGSSLMODE``, as asyncpg reads them; the last of several wins), or
    the ``sslmode`` its driver read (given when known), refuses a connection without SSL."""
    mode = sslmode
    if mode is None:
        try:
            query = parse_qs(urlsplit(dsn).query)
        except ValueError:
            query = {}
        given = query.get("sslmode")
        services = query.get("service")
        from_service = service_settings({"service": services[-1]}) if services else {}
        mode = (
            given[-1] if given else from_service.get("sslmode") or os.environ.get("PGSSLMODE", "")
        )
    return mode.strip().lower().replace("_", "-") in _SSL_REQUIRED


def _server_at(dsn: str, said: str) -> str:
    """The ``host:port`` the driver says it tried, else the DSN's host(s)."""
    found = _SERVER_AT.search(said)
    if found:
        return found.group(1) + (f":{found.group(2)}" if found.group(2) else "")
    try:
        return urlsplit(dsn).netloc.rpartition("@")[2] or "localhost"
    except ValueError:
        return "its address"


@contextmanager
def translated_errors(
    dsn: str,
    *,
    invalid: tuple[type[Exception], ...] = (),
    unavailable: tuple[type[Exception], ...] = (),
    behind_pooler: str = _DIRECT_DSN_HINT,
    sslmode: str | None = None,
) -> Iterator[None]:
    """A failure to connect as :class:`BackendUnavailableError` (a bad DSN as
    ``ConfigurationError``), with the redacted address and the reason. ``invalid``
    and ``unavailable`` add another driver's errors (psycopg's) to asyncpg's;
    ``behind_pooler`` says what to do when a pooler refuses the settings sent;
    ``sslmode`` is the one the driver connects with, where the caller read it (libpq's
    from a key=value DSN or a service file, which a URL's query does not tell)."""
    bad_dsn: tuple[type[Exception], ...] = (asyncpg.ClientConfigurationError, ValueError, *invalid)
    unreachable: tuple[type[Exception], ...] = (
        OSError,
        TimeoutError,
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        *unavailable,
    )
    try:
        yield
    except bad_dsn as exc:
        # A driver's complaint about a DSN quotes the piece it could not read (libpq's
        # does, a password's or the whole DSN): quoted pieces masked, not chained.
        reason = _QUOTED.sub('"***"', _one_line(exc).replace(dsn, redact(dsn)))
        raise ConfigurationError(f"invalid DSN {redact(dsn)}: {reason}") from None
    except unreachable as exc:
        said = str(exc)
        refused_ssl = any(words in said for words in _NO_SSL)
        if refused_ssl and _ssl_required(dsn, sslmode):
            # Not an outage to wait out (the worker's start retried it for its whole
            # startup wait): the server and the DSN disagree until one is changed.
            raise ConfigurationError(
                f"cannot connect to PostgreSQL at {redact(dsn)}: the DSN requires SSL "
                f"(sslmode) and the server does not offer it: turn ssl on in the "
                f"server, or give sslmode=prefer (or disable) in the DSN (or, if the "
                f"server at {_server_at(dsn, said)} is no PostgreSQL, fix the port)"
            ) from None
        if isinstance(exc, asyncpg.ProtocolViolationError) and any(
            words in said for words in _POOLER_LOGIN_REFUSED
        ):
            # PgBouncer's own refusal of the login comes as a protocol violation (08P01),
            # a connection error like an outage: the worker's start waited out its whole
            # startup wait where a server's refusal fails at once.
            raise ConfigurationError(
                f"cannot connect to PostgreSQL at {redact(dsn)}: the connection pooler "
                f"there refused the login ({_one_line(exc)}): check the user, password and "
                f"database against the pooler's own (PgBouncer: its auth_file or auth_query, "
                f"its [databases])"
            ) from None
        if _refused_at_connect(exc, _SERVER_WIDE):
            # 55P02, among the transient 55000 family: refused at every try.
            raise ConfigurationError(
                f"cannot connect to PostgreSQL at {redact(dsn)}: the server refuses a "
                f"setting sent at connect ({_one_line(exc)}): a server-wide setting "
                f"cannot be given per session; remove it from the DSN's options"
            ) from None
        if isinstance(exc, asyncpg.exceptions.UndefinedObjectError):
            # 42704 at connect: a query parameter asyncpg does not read (libpq's
            # hostaddr; connect_timeout is read here, libpq_connect_timeout) is sent as a
            # server setting, which the server refuses at every try; it was said as an
            # outage.
            raise ConfigurationError(
                f"cannot connect to PostgreSQL at {redact(dsn)}: the server knows no setting "
                f"the DSN's query gives ({_one_line(exc)}): asyncpg sends a query parameter it "
                f"does not read itself as a server setting; remove it from the DSN"
            ) from None
        if _refused_at_connect(exc, _UNKNOWN_SETTING):
            # libpq sends only the options' settings (it refuses a query parameter it
            # does not know itself): a misspelt one, refused at every try.
            raise ConfigurationError(
                f"cannot connect to PostgreSQL at {redact(dsn)}: the server knows no setting "
                f"the connection's options give ({_one_line(exc)}): correct or remove it in "
                f"the DSN's options (or its service's, or PGOPTIONS)"
            ) from None
        if _POOLER_REFUSED in said:
            # Not an outage either: the same settings are refused at every try.
            raise ConfigurationError(
                f"cannot connect to PostgreSQL at {redact(dsn)}: a connection pooler "
                f"answers there and refuses a session setting TaskQ sends ({_one_line(exc)}): "
                f"{behind_pooler}"
            ) from None
        if refused_ssl or any(words in said for words in _NOT_POSTGRES):
            # A PostgreSQL server without SSL says so, and the DSN's prefer goes on
            # without: something else listens there (another service, a proxy not yet
            # routed). Retried at a worker's start as any unreachable server is.
            reason = (
                "it answered the opening SSL request as no PostgreSQL server does"
                if refused_ssl
                else _one_line(exc).replace(dsn, redact(dsn))
            )
            raise BackendUnavailableError(
                f"cannot connect to PostgreSQL at {redact(dsn)}: the server at "
                f"{_server_at(dsn, said)} does not answer as PostgreSQL (wrong port?): {reason}"
            ) from exc
        raise BackendUnavailableError(
            f"cannot connect to PostgreSQL at {redact(dsn)}: "
            f"{_one_line(exc).replace(dsn, redact(dsn))}"
        ) from exc


def readable(fd: int) -> bool:
    """Whether the socket ``fd`` has something to read now (the peer's goodbye or the
    end of the stream count)."""
    if hasattr(select, "poll"):  # select() refuses descriptors past FD_SETSIZE (1024)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    try:
        ready, _, _ = select.select([fd], [], [], 0)
    except OSError:  # the socket is gone
        return True
    return bool(ready)


def read_watch(fd: int) -> Callable[[], bool]:
    """:func:`readable` for one socket asked again and again (a pinned connection's
    check before each enqueue): its poll object made and registered once, a third of
    the cost of a fresh one."""
    if not hasattr(select, "poll"):
        return partial(readable, fd)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return lambda: bool(poller.poll(0))


def unmigrated(
    schema: str, dsn: str | None, missing: list[str] | None = None
) -> ConfigurationError:
    """The error for a schema without TaskQ's tables, or without the ``missing``
    migrations this code needs (of the database ``dsn`` names, or of a caller's
    connection: None), with the command that makes them."""
    shown = None if dsn is None else redact(dsn)
    where = "" if shown is None else f" in {shown}"
    # The DSN too: without it the command migrates its own default database (the
    # embedded server), and this one stays as it is. Not a masked one: copied, it
    # would send *** as the password.
    target = f"--dsn '{shown}'" if shown is not None and shown == dsn else "--dsn DSN"
    lacks = (
        "has no TaskQ tables"
        if missing is None
        else f"lacks migrations this version of TaskQ needs ({', '.join(missing)})"
    )
    return ConfigurationError(
        f"schema {schema!r}{where} {lacks}: run `taskq migrate {target} --schema {schema}` first"
    )


Password = str | Callable[[], str] | Callable[[], Awaitable[str]] | None
"""A password, or a callable asyncpg calls for each new connection (credential
rotation: a reload makes new connections ask again)."""


def password_from_file(path: str) -> Callable[[], str]:
    """A password provider reading ``path`` at every new connection (mounted secrets)."""

    def read() -> str:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()

    return read


class LentConnections:
    """The pool connections handed to caller code: only they get asyncpg's session
    reset when released.

    asyncpg resets every connection returned to a pool (advisory locks,
    cursors, LISTENs, ``RESET ALL``): one more round trip per pooled statement,
    as much again as a one-job enqueue. TaskQ's own statements leave no session
    state behind (transaction-scoped advisory locks only; no ``SET``, ``LISTEN``
    or held cursor), so a connection needs the reset only after a caller had it
    (``PostgresBackend.connection``). An open transaction is rolled back on
    release either way.

    ``through_pooler``: no reset at all. A transaction-mode pooler keeps no session
    for a caller to leave state in, and ``RESET ALL`` on the server connection it lent
    dropped the session's UTC: TaskQ's next statements ran in the database's zone.
    """

    def __init__(self, *, through_pooler: bool = False) -> None:
        # Server pids: the pool hands the reset hook the raw connection, the caller
        # gets a proxy of it, and both report the same backend process.
        self._pids: set[int] = set()
        self._resets = not through_pooler

    def lend(self, conn: Any) -> None:
        """Mark ``conn`` (a pooled connection or its proxy) as handed to caller code."""
        self._pids.add(conn.get_server_pid())

    async def reset(self, conn: asyncpg.Connection[Any]) -> None:
        """The pool's reset hook: asyncpg's full reset for a lent connection, else nothing."""
        pid = conn.get_server_pid()
        if pid not in self._pids:
            return
        self._pids.discard(pid)
        if not self._resets:
            return
        query = conn.get_reset_query()
        if query:
            await conn.execute(query)


async def create_pool(
    dsn: str,
    *,
    min_size: int,
    max_size: int,
    settings: dict[str, str],
    connect_timeout: timedelta,
    password: Password = None,
    command_timeout: timedelta | None = None,
    lent: LentConnections | None = None,
    prepared_statements: bool = True,
) -> asyncpg.Pool[asyncpg.Record]:
    """An asyncpg pool whose connections carry ``settings``; errors translated.

    ``command_timeout`` bounds every statement (client side), so a stalled
    server turns into a ``TimeoutError`` the worker loops treat as transient.
    With ``lent``, a released connection is reset only if it was lent (see
    :class:`LentConnections`); without, always (asyncpg's default).
    Without ``prepared_statements`` no statement is kept prepared (for a
    transaction-mode pooler, which runs each statement on any server session).
    """
    target, timeout = libpq_connect_timeout(dsn, connect_timeout.total_seconds())
    with translated_errors(dsn):
        pool: asyncpg.Pool[asyncpg.Record] = await asyncpg.create_pool(
            target,
            min_size=min_size,
            max_size=max_size,
            server_settings=settings,
            timeout=timeout,
            command_timeout=None if command_timeout is None else command_timeout.total_seconds(),
            password=password,
            reset=None if lent is None else lent.reset,
            statement_cache_size=_STATEMENT_CACHE_SIZE if prepared_statements else 0,
        )
    return pool


async def connect(
    dsn: str, *, settings: dict[str, str], connect_timeout: timedelta, password: Password = None
) -> asyncpg.Connection[Any]:
    """One dedicated (non-pooled) connection carrying ``settings``; errors translated."""
    target, timeout = libpq_connect_timeout(dsn, connect_timeout.total_seconds())
    with translated_errors(dsn):
        conn: asyncpg.Connection[Any] = await asyncpg.connect(
            target,
            server_settings=settings,
            timeout=timeout,
            password=password,
        )
    return conn
