"""``WorkerSettings``: every knob of a worker, validated at start-up.

Values come from command-line flags, then ``TASKQ_<NAME>`` environment
variables, then the defaults below. Durations accept seconds (``30``,
``0.5``) or a unit suffix (``500ms``, ``30s``, ``5m``, ``1h``). A bad value
stops start-up with one line naming the setting, the value and the rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from taskq.errors import ConfigurationError
from taskq.identifiers import validate_schema_name

__all__ = ["ENV_PREFIX", "SettingsError", "WorkerSettings", "parse_duration"]

ENV_PREFIX = "TASKQ_"

_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: object) -> object:
    """``"500ms"``, ``"30s"``, ``"5m"``, ``"1h"``, ``"2d"`` or plain seconds -> timedelta."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    if isinstance(value, str):
        match = _DURATION_RE.fullmatch(value)
        if match is None:
            raise ValueError("expected a duration such as 30, 0.5, 500ms, 30s, 5m or 1h")
        return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])
    return value


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def _split_list(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class SettingsError(ConfigurationError):
    """A worker setting is invalid; the message names it, its value and the rule."""


class WorkerSettings(BaseModel):
    """Settings of one worker process (see each field for its env variable)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dsn: str | None = None
    """Backend URL (``TASKQ_DSN``); defaults to the application's URL."""
    schema_name: str | None = Field(default=None, alias="schema")
    """Database schema (``TASKQ_SCHEMA``); defaults to the application's."""
    queues: Annotated[list[str], BeforeValidator(_split_list)] = Field(
        default_factory=lambda: ["default"], min_length=1
    )
    concurrency: int = Field(default=10, ge=1, le=10_000)
    """Jobs executed at once by this process."""
    prefetch: int = Field(default=0, ge=0, le=10_000)
    """Jobs locked ahead of execution beyond ``concurrency`` (0: none)."""
    dispatch_batch_size: int = Field(default=100, ge=1, le=10_000)
    poll_interval: Duration = timedelta(seconds=1)
    """Dispatch poll when no NOTIFY arrives (a fallback, not the usual path)."""
    heartbeat_interval: Duration = timedelta(seconds=5)
    lock_lease: Duration = timedelta(seconds=30)
    """How long a dispatched job stays locked without a heartbeat; at least 4 heartbeats."""
    maintenance_interval: Duration = timedelta(seconds=1)
    """Cadence of scheduled -> pending promotion and the deadline/reclaim sweeps."""
    cancellation_grace_period: Duration = timedelta(seconds=30)
    cleanup_grace_period: Duration = timedelta(seconds=10)
    termination_grace_period: Duration = timedelta(seconds=60)
    """How long shutdown waits for running jobs before leaving them to the reclaim sweep."""
    fallback_result_ttl: Duration | None = None
    """Result lifetime for actors without ``result_ttl`` (None: keep until pruned)."""
    health_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve /healthz, /readyz (and /tasks) on this port (0: any free port)."""
    health_host: str = "0.0.0.0"
    """Interface the health server binds."""
    health_tasks_enabled: bool = False
    """Serve /tasks (asyncio task stacks: code structure only, no values)."""
    until_idle: bool = False
    """Exit once no job is active in this worker's queues (scripts and tests)."""
    migrate: bool = False
    """Apply pending migrations before starting."""

    @field_validator("schema_name")
    @classmethod
    def _valid_schema(cls, value: str | None) -> str | None:
        return None if value is None else validate_schema_name(value)

    @field_validator(
        "poll_interval",
        "heartbeat_interval",
        "lock_lease",
        "maintenance_interval",
        "termination_grace_period",
    )
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be greater than 0")
        return value

    @model_validator(mode="after")
    def _lease_outlives_heartbeats(self) -> Self:
        if self.lock_lease < 4 * self.heartbeat_interval:
            raise ValueError(
                f"lock_lease ({self.lock_lease.total_seconds()}s) must be at least 4 x "
                f"heartbeat_interval ({self.heartbeat_interval.total_seconds()}s), so one slow "
                f"heartbeat cannot let a live job's lock expire"
            )
        return self

    @classmethod
    def load(
        cls, flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> WorkerSettings:
        """Flags (None values ignored) beat ``TASKQ_*`` env vars, which beat defaults."""
        import os

        environ = os.environ if env is None else env
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, field in cls.model_fields.items():
            key = field.alias or name
            env_name = ENV_PREFIX + key.upper()
            if env_name in environ:
                values[key] = environ[env_name]
                sources[key] = env_name
        for key, value in (flags or {}).items():
            if value is not None:
                values[key] = value
                sources[key] = "--" + key.replace("_", "-")
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = str(err["loc"][0]) if err["loc"] else ""
            source = sources.get(loc, loc or "settings")
            shown = f"={values[loc]!r}" if loc in values else ""
            message = str(err["msg"]).removeprefix("Value error, ")
            raise SettingsError(f"invalid setting {source}{shown}: {message}") from None
