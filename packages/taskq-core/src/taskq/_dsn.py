"""Where a command's database URL and schema come from: flag, then env, then a default."""

from __future__ import annotations

import os
from collections.abc import Mapping

from taskq.errors import ConfigurationError
from taskq.identifiers import validate_schema_name

__all__ = ["NO_DSN_MESSAGE", "resolve_dsn", "resolve_schema"]

NO_DSN_MESSAGE = (
    "no database given: pass --dsn postgresql://USER@HOST/DB or set TASKQ_DSN "
    "(or install taskq-postgres[embedded] to use an embedded server under ./.taskq/)"
)


def resolve_dsn(flag: str | None, env: Mapping[str, str] | None = None) -> str:
    """``--dsn`` beats ``TASKQ_DSN``, which beats a plugin's default (the embedded
    server); with none of them, a :class:`ConfigurationError` says how to give one."""
    if flag:
        return flag
    from_env = (os.environ if env is None else env).get("TASKQ_DSN")
    if from_env:
        return from_env
    from taskq.plugins import get_plugin_manager

    default: str | None = get_plugin_manager().hook.taskq_default_dsn()
    if default:
        return default
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
