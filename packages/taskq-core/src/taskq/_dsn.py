"""Database URLs: where a command's URL and schema come from (flag, then env, then a
default), and how a URL is shown in a message (:func:`redact`)."""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Mapping
from typing import Final
from urllib.parse import parse_qs, unquote, urlsplit

from taskq.errors import ConfigurationError
from taskq.identifiers import validate_schema_name

__all__ = [
    "NO_DSN_MESSAGE",
    "ports_read",
    "redact",
    "resolve_dsn",
    "resolve_schema",
    "same_login",
    "same_servers",
    "url_scheme",
]

_GIVE_A_DSN: Final = "pass --dsn postgresql://USER@HOST/DB or set TASKQ_DSN"

NO_DSN_MESSAGE = (
    f"no database given: {_GIVE_A_DSN} "
    "(or install taskq-postgres[embedded] to use an embedded server under ./.taskq/)"
)


_SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
"""A URL's scheme (RFC 3986), up to its colon."""


def url_scheme(text: str) -> str | None:
    """The scheme ``text`` starts with (``postgresql`` of ``postgresql://...``), in lower
    case; None when it starts with none (a libpq ``key=value`` string)."""
    found = _SCHEME.match(text)
    return found.group(1).lower() if found else None


_SECRET_KEYS: Final = frozenset({"password", "sslpassword"})
"""Query parameters that hold a secret (libpq's names; a key may come percent-encoded)."""


def redact(url: str) -> str:
    """``url`` fit for a message or a log line: its password shown as ``***`` (an empty
    one stays empty: ``user:***@`` would read as a password), and so is every query
    parameter holding one (``password``, ``sslpassword``, percent-encoded or not).

    Fails closed: a password holding a raw ``/``, ``?``, ``#`` or ``@`` (a generated
    one often does) moves the URL's parts about, and a string that is not
    ``scheme://...`` (a libpq ``key=value`` string, a URL missing its ``//``) may hold
    one anywhere; those show as much as is surely no secret (the scheme).
    """
    scheme, sep, rest = url.partition("://")
    if not sep or url_scheme(url) != scheme.lower():  # a ":" before "://": no scheme
        return "<hidden: not a scheme://... URL>"
    hidden = f"{scheme}://<hidden: its parts cannot be told apart; a / ? # or @ in a password must be percent-encoded>"
    try:
        parts = urlsplit(url)
    except ValueError:
        return hidden
    # An @ outside the authority, or a fragment: a raw / ? or # cut a password short.
    if "@" in rest.replace(parts.netloc, "", 1) or "#" in url:
        return hidden
    if "@" not in parts.netloc and not ports_read(parts.netloc):
        return hidden  # user:PASSWORD/db, its @HOST forgotten: the password read as a port
    netloc = parts.netloc
    if parts.password:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:***@{host}"
    query = "&".join(_masked(pair) for pair in parts.query.split("&")) if parts.query else ""
    # By hand: urlunsplit drops an empty authority's // (postgresql:///db?host=/tmp).
    return f"{scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


def ports_read(hosts: str) -> bool:
    """Whether every ``host[:port]`` of a comma-separated list has a port that parses
    (or none): libpq and asyncpg take several hosts, which ``urlsplit`` cannot read."""
    for host in hosts.rpartition("@")[2].split(","):
        try:
            urlsplit(f"//{host}").port  # noqa: B018 - parsing it is the check
        except ValueError:
            return False
    return True


def _masked(pair: str) -> str:
    key, eq, _ = pair.partition("=")
    return f"{key}=***" if eq and unquote(key).lower() in _SECRET_KEYS else pair


_DEFAULT_PORT: Final = 5432


def _servers(url: str) -> frozenset[tuple[str, int]] | None:
    """The ``(host, port)`` pairs a Postgres URL connects to, as libpq reads it (a
    ``host``/``port`` query parameter over the authority's, one port for every host or one
    each, no port PGPORT's or 5432, a unix-socket directory spelt out or percent-encoded);
    None for a URL of another scheme or one that cannot be read, or not alike by every
    driver."""
    if url_scheme(url) not in ("postgresql", "postgres"):
        return None
    try:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
    except ValueError:
        return None
    authority = parts.netloc.rpartition("@")[2]
    if (
        parts.netloc.count("@") > 1  # asyncpg splits at the first, libpq at the last
        or (authority and ("host" in query or "port" in query))  # asyncpg: the authority's
        or "service" in query  # a service file's host
        or "hostaddr" in query  # libpq connects there, whatever the host
    ):
        return None
    hosts: list[str] = []
    ports: list[str] = []
    for item in authority.split(","):
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        hosts.append(unquote(host))
        ports.append(port)
    if "host" in query:
        hosts = query["host"][-1].split(",")
    if "port" in query:
        ports = query["port"][-1].split(",")
    if len(ports) == 1:
        ports *= len(hosts)
    # A port left out is PGPORT's, as both drivers take it (a list of them: unreadable).
    ports = [port or os.environ.get("PGPORT") or str(_DEFAULT_PORT) for port in ports]
    if len(ports) != len(hosts) or not all(port.isdecimal() for port in ports):
        return None
    return frozenset((_host_key(host), int(port)) for host, port in zip(hosts, ports, strict=True))


def _host_key(host: str) -> str:
    # A socket directory is a path (case counts, a trailing / does not); a name is not.
    return (host.rstrip("/") or "/") if host.startswith("/") else host.lower()


def same_servers(target: str, home: str) -> bool:
    """Whether every server ``target`` may connect to is one ``home`` names (host and
    port, however spelt): what a password meant for ``home`` may be sent to, as libpq's
    .pgpass matches per host and port. False when either cannot be read."""
    if target == home:
        return True
    servers, home_servers = _servers(target), _servers(home)
    return servers is not None and home_servers is not None and servers <= home_servers


def _user(url: str) -> str | None:
    """The user a Postgres URL logs in as (the authority's, else a ``user`` query
    parameter, else ``PGUSER``, else the OS user's name, as asyncpg and libpq default);
    None when the drivers read it otherwise (asyncpg the authority's, libpq the query's)."""
    try:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
    except ValueError:
        return None
    userinfo, at, _ = parts.netloc.rpartition("@")
    named = unquote(userinfo.partition(":")[0]) if at else ""
    if named and "user" in query:
        return None
    named = named or query.get("user", [""])[-1] or os.environ.get("PGUSER", "")
    if not named:
        try:
            named = getpass.getuser()
        except (OSError, KeyError):  # no name for the OS user: the drivers fail alike
            # (KeyError before Python 3.13, from the password database)
            return None
    return named


def same_login(target: str, home: str) -> bool:
    """Whether ``target`` logs in as ``home`` does, on servers ``home`` names
    (:func:`same_servers`), as the same user: what a password meant for ``home`` may be
    sent with (a password is a role's, as .pgpass matches its user too; sent for
    another, it failed the login and shadowed that role's own in PGPASSWORD or .pgpass).
    False when either cannot be read."""
    if target == home:
        return True
    user = _user(target)
    return same_servers(target, home) and user is not None and user == _user(home)


def resolve_dsn(flag: str | None, env: Mapping[str, str] | None = None) -> str:
    """``--dsn`` beats ``TASKQ_DSN``, which beats a plugin's default (the embedded
    server); with none of them, a :class:`ConfigurationError` says how to give one.

    Each plugin's ``taskq_default_dsn`` is asked on its own: one that raises, or
    answers with no string, is recorded as a plugin failure (``taskq plugins``) and
    logged once, and the next is asked."""
    if flag is not None:
        if not flag:
            # `--dsn "$DATABASE_URL"` with the variable unset: it meant TASKQ_DSN's
            # database, or an embedded server, in silence, as `--schema ""` meant taskq.
            raise ConfigurationError(
                "--dsn is empty: give a database URL (postgresql://USER@HOST/DB), or leave "
                "--dsn out to use TASKQ_DSN"
            )
        return flag
    from_env = (os.environ if env is None else env).get("TASKQ_DSN")
    if from_env:
        return from_env
    from taskq.plugins._registry import first_answer

    default: str | None = first_answer(
        "taskq_default_dsn",
        accepts=lambda answer: isinstance(answer, str),
        expected="a database URL (str) or None",
    )
    if default:
        return default
    from taskq.errors import PluginHookError, TaskQError
    from taskq.plugins import plugin_failures

    raised = [
        f
        for f in plugin_failures()
        if isinstance(f, PluginHookError) and f.hook == "taskq_default_dsn" and f.cause
    ]
    if raised:
        # Its own words (the embedded server that could not start, where its log is):
        # "install taskq-postgres[embedded]" said to install what was installed.
        failed = raised[-1]
        # A TaskQError says what to do itself (the embedded one: its log, or --dsn).
        then = "" if isinstance(failed.cause, TaskQError) else f"; {_GIVE_A_DSN}"
        raise ConfigurationError(
            f"no database given, and the default of {failed.distribution or failed.name} "
            f"failed: {failed.cause}{then}"
        ) from failed.cause
    raise ConfigurationError(NO_DSN_MESSAGE)


def resolve_shared_dsn(flag: str | None) -> str:
    """:func:`resolve_dsn` for a command acting on jobs other processes see (enqueue,
    jobs, schedules): ``memory://`` is refused, as its store lives and dies with the
    command's own process."""
    dsn = resolve_dsn(flag)
    if dsn.partition(":")[0].lower() == "memory":
        raise ConfigurationError(
            "memory:// lives inside one process: this command would act on an empty store "
            "that vanishes when it exits; give a Postgres DSN (--dsn or TASKQ_DSN)"
        )
    return dsn


def resolve_schema(flag: str | None, default: str) -> str:
    """The schema ``--schema`` names, else ``TASKQ_SCHEMA``, else ``default``;
    ``ConfigurationError`` naming whichever gave a bad one."""
    env = os.environ.get("TASKQ_SCHEMA")
    if flag is not None:  # given empty, refused as the worker refuses it, not ignored
        schema, source = flag, "--schema"
    elif env:
        schema, source = env, "TASKQ_SCHEMA"
    else:
        schema, source = default, "the schema"
    try:
        return validate_schema_name(schema)
    except ValueError as exc:
        raise ConfigurationError(f"{source}: {exc}") from None
