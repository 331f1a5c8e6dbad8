"""Where a command's database URL comes from: flag, then env, then a plugin default."""

from __future__ import annotations

import os
from collections.abc import Mapping

from taskq.errors import ConfigurationError

__all__ = ["NO_DSN_MESSAGE", "resolve_dsn"]

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
