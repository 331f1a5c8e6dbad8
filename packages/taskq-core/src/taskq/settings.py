"""``WorkerSettings``: every knob of a worker, validated at start-up.

Values come from command-line flags, then ``TASKQ_<NAME>`` environment
variables, then the defaults below. Durations accept seconds (``30``,
``0.5``) or a unit suffix (``500ms``, ``30s``, ``5m``, ``1h``). A bad value
stops start-up with one line naming the setting, the value and the rule.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from datetime import time, timedelta
from typing import Annotated, Any, Final, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializationInfo,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from taskq._dsn import redact
from taskq.errors import ConfigurationError
from taskq.identifiers import validate_schema_name
from taskq.models import MAX_DURATION, check_name, refuse_a_flag

__all__ = [
    "BACKEND_TUNABLES",
    "ENV_PREFIX",
    "MAX_PREFETCH",
    "SHOW_SECRETS",
    "NegativeDurationError",
    "SettingsError",
    "WorkerSettings",
    "parse_duration",
]

ENV_PREFIX = "TASKQ_"

_OTHER_ENV: Final = (
    "TASKQ_DISABLE_PLUGINS",
    "TASKQ_TRACE_PLUGINS",
    "TASKQ_LOG_LEVEL",
    "TASKQ_TEST_DSN",
)
"""``TASKQ_*`` variables that are not worker settings (plugins; logging; the test
fixtures)."""

_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def _number(value: object) -> object:
    return refuse_a_flag(value, "must be a number")


_WholeNumber = Annotated[int, BeforeValidator(refuse_a_flag)]
_Number = Annotated[float, BeforeValidator(_number)]


class NegativeDurationError(ValueError):
    """A duration given below zero (``"-5s"``): each command says what to give instead."""


def parse_duration(value: object) -> object:
    """``"500ms"``, ``"30s"``, ``"5m"``, ``"1h"``, ``"2d"`` or plain seconds -> timedelta."""
    # completion_window=True delayed every success by a second.
    refuse_a_flag(value, "expected a duration such as 30, 0.5, 500ms, 30s, 5m or 1h")
    if isinstance(value, int | float):
        # From Python (WorkerSettings(lock_lease=...), a flag's value): timedelta's
        # OverflowError is no ValueError, and came out as a bare traceback.
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number of seconds, got {value!r}")
        try:
            return timedelta(seconds=value)
        except OverflowError:
            raise ValueError(f"duration {value!r} is out of range") from None
    if isinstance(value, str):
        match = _DURATION_RE.fullmatch(value)
        if match is None:
            if _DURATION_RE.fullmatch(value.strip().removeprefix("-")):
                raise NegativeDurationError(f"must not be negative, got {value.strip()!r}")
            raise ValueError("expected a duration such as 30, 0.5, 500ms, 30s, 5m or 1h")
        try:
            return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])
        except OverflowError:
            raise ValueError(f"duration {value!r} is out of range") from None
    return value


def _zero_to_a_century(value: timedelta) -> timedelta:
    # A negative timedelta passed from Python (a string is refused when parsed) would
    # turn a grace period into none and a retention into pruning at once.
    if value < timedelta(0):
        raise ValueError(f"must not be negative, got {value.total_seconds():g} s")
    # Past it a time computed from a setting overflows (a datetime, Postgres's
    # timestamps, a thread's wait): the worker started, then crashed in a loop.
    if value > MAX_DURATION:
        raise ValueError(f"must be at most {MAX_DURATION.days} days")
    return value


Duration = Annotated[timedelta, BeforeValidator(parse_duration), AfterValidator(_zero_to_a_century)]

_MAX_LEADER_LEASE: Final = timedelta(milliseconds=2**31 - 1)
"""Postgres takes the leader's lease as its session's ``idle_session_timeout``, an
integer of milliseconds: about 24.8 days."""


MAX_PREFETCH: Final = 10_000
"""The most jobs a worker locks ahead of its consumers: a fixed ``prefetch``'s bound, and
``auto``'s (32 per consumer, see ``taskq.worker.prefetch``, would pass it above
concurrency 312)."""


def _prefetch(value: object) -> object:
    refuse_a_flag(value, "must be auto or a whole number of jobs (0: none)")
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "auto":
            return "auto"
        if not re.fullmatch(r"\d+", text):
            raise ValueError("must be auto or a whole number of jobs (0: none)")
        return int(text)
    return value


def _split_list(value: object) -> object:
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",") if part.strip()]
        if value.strip().startswith("["):
            # A JSON list (pydantic-settings' way, TASKQ_QUEUES='["a","b"]') was split at
            # its commas: the worker worked the queues '["a"' and '"b"]', and idled.
            try:
                items = json.loads(value)
            except ValueError:
                items = None
            if isinstance(items, list) and all(isinstance(i, str) for i in items):
                return items
            # A name may begin with "[" ("[batch]"): only a list cut at its commas (a
            # part with a bracket it does not close, or a JSON string's quote) is refused.
            if any(
                part.startswith("[") != part.endswith("]") or part.startswith('["')
                for part in parts
            ):
                raise ValueError(
                    'expected names separated by commas (a,b) or a JSON list of strings (["a", "b"])'
                )
        return parts
    return value


class SettingsError(ConfigurationError):
    """A worker setting is invalid; the message names it, its value and the rule."""


BACKEND_TUNABLES: Final = {
    "dispatcher_command_timeout": "command_timeout",
    "dispatch_oversample": "dispatch_oversample",
    "reclaim_event_visibility_delay": "reclaim_event_visibility_delay",
    "cancel_reclaim_headroom": "cancel_reclaim_headroom",
    "wake_coalesce_window": "wake_coalesce_window",
    "poll_only": "poll_only",
    "direct_dsn": "direct_dsn",
    "stale_batch_grace": "stale_batch_grace",
    "min_pool_size": "min_pool_size",
    "max_pool_size": "max_pool_size",
}
"""Worker settings that are backend constructor options: setting field -> option."""


_URLS: Final = frozenset({"dsn", "direct_dsn"})
"""The settings that may hold a password."""

SHOW_SECRETS: Final = "show_secrets"
"""The serialization context key that has ``WorkerSettings.model_dump`` (and
``model_dump_json``) give the DSN with its password: ``context={SHOW_SECRETS: True}``."""


class WorkerSettings(BaseModel):
    """Settings of one worker process (see each field for its env variable).

    The DSN's password never shows: ``repr``, ``str``, ``model_dump`` and
    ``model_dump_json`` give it as ``***`` (:func:`taskq._dsn.redact`), and a validation
    error does not quote its input. ``.dsn`` is the DSN as given; a dump that must carry
    it (to rebuild the settings elsewhere) asks with ``context={"show_secrets": True}``.
    """

    # hide_input_in_errors: a rule across settings quoted the whole input, the DSN with
    # the start of its password among it.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    dsn: str | None = None
    """Backend URL (``TASKQ_DSN``); defaults to the application's URL. Its password is
    masked wherever the settings are shown or dumped."""
    schema_name: str | None = Field(default=None, alias="schema")
    """Database schema (``TASKQ_SCHEMA``); defaults to the application's."""
    queues: Annotated[list[str], BeforeValidator(_split_list)] = Field(
        default_factory=lambda: ["default"], min_length=1
    )
    """Queues this worker works (``TASKQ_QUEUES``: ``a,b`` or ``["a", "b"]``). Not given:
    a ``Worker`` works ``default`` and every queue its application's actors are on or
    configures."""
    concurrency: _WholeNumber = Field(default=10, ge=1, le=10_000)
    """Jobs executed at once by this process."""
    prefetch: Annotated[
        Annotated[int, Field(ge=0, le=MAX_PREFETCH)] | Literal["auto"],
        BeforeValidator(_prefetch),
    ] = "auto"
    """Jobs locked ahead of execution beyond ``concurrency`` (``TASKQ_PREFETCH``): the
    next jobs are dispatched while the current ones run. ``auto``: as many as this
    worker expects to start within ``prefetch_horizon``, judged from how long its
    recent and running jobs take, at most 4 x ``concurrency``; none for long jobs
    (:mod:`taskq.worker.prefetch`); one that has waited ten horizons anyway (the
    jobs running turned long) is handed back, unstarted. A number fixes it (0: none):
    a job locked ahead then waits behind this worker's running ones even when another
    worker is idle."""
    prefetch_horizon: Duration = timedelta(milliseconds=20)
    """With ``prefetch=auto``: about how long a job locked ahead may expect to wait here
    for a consumer (0: none is locked ahead)."""
    dispatch_batch_size: _WholeNumber = Field(default=100, ge=1, le=10_000)
    poll_interval: Duration = timedelta(seconds=1)
    """Dispatch poll when no NOTIFY arrives (a fallback, not the usual path)."""
    completion_window: Duration = timedelta(0)
    """How long the completer waits to gather more successes into one write (0: write
    at once; successes finishing while a write is in flight always share the next)."""
    heartbeat_interval: Duration = timedelta(seconds=5)
    lock_lease: Duration = timedelta(seconds=30)
    """How long a dispatched job stays locked without a heartbeat; at least 4 heartbeats."""
    lease_fence: bool = False
    """Stop a job whose lease this worker has had no confirmed renewal of for
    ``lock_lease - heartbeat_interval`` (cut off from the database), before the leader
    can reclaim it and another worker run it alongside: its attempt fails with
    ``LeaseLost`` and is retried. Needs ``lock_lease`` above 3 x
    ``dispatcher_command_timeout`` + 2 x ``heartbeat_interval``. Off by default: a
    database outage longer than that then stops every running job."""
    maintenance_interval: Duration = timedelta(seconds=1)
    """Leader only: cadence of scheduled -> pending promotion and the deadline/reclaim
    sweeps (Sweeps 1-2; tighter than a 30 s sweep so crash recovery is lease + 1 s)."""
    leader_lease: Duration = timedelta(seconds=30)
    """A leader that stops renewing (frozen, partitioned) loses leadership within this;
    the election ticks every ``heartbeat_interval``."""
    leader_reclaim_grace: Duration | None = None
    """After winning an election, how long the new leader waits before its first
    reclaim, so workers cut off with it (a database outage) renew their leases first
    (None: 2 x heartbeat_interval)."""
    cron_interval: Duration = timedelta(seconds=1)
    """Leader only: how often due cron schedules are fired."""
    cron_catch_up: Duration = timedelta(minutes=1)
    """Cron slots missed by longer than this (no leader) are skipped, not fired late; at
    least 2 x ``cron_interval`` (a tick sees a slot up to one interval late) and at least
    ``leader_lease + heartbeat_interval + cron_interval`` (a frozen leader's successor is
    elected a lease and a heartbeat later, and ticks a cron interval after that)."""
    result_expiry_interval: Duration = timedelta(seconds=30)
    """Leader only: how often stored results past ``result_expires_at`` are cleared."""
    stale_batch_interval: Duration = timedelta(seconds=30)
    """Leader only: how often active batches whose children all finished are completed
    (the safety net for a terminal hook lost to a crash, and for empty batches)."""
    queue_depth_interval: Duration = timedelta(seconds=15)
    """Leader only: how often the per-queue job counts are sampled and logged."""
    stranded_check_interval: Duration = timedelta(seconds=60)
    """Leader only: how often waiting jobs of unregistered actors are looked for."""
    stale_worker_after: Duration = timedelta(minutes=5)
    """Leader only: a worker row unseen for this long is deleted (the worker died
    without deregistering); above ``lock_lease``, as the reclaim reads the rows. Not
    set, twice the lease when that is longer (:attr:`worker_row_ttl`)."""
    prune_at: time = time(3, 0)
    """Leader only: the UTC time of day Sweep 5 (terminal jobs -> archive) runs at, then
    every ``prune_interval`` (``03:00``: off-peak, not at each deploy or failover). A slot
    no leader ran (none elected at its time) is run once by the next leader, at once."""
    prune_interval: Duration = timedelta(days=1)
    """Leader only: cadence of Sweep 5 from ``prune_at``, counted from Monday 1970-01-05
    (the same slots whichever worker leads: seven days runs on Mondays)."""
    archive_expiry_at: time = time(4, 0)
    """Leader only: the UTC time of day Sweep 6 (archived jobs past expire_at are deleted)
    runs at, then every ``archive_expiry_interval``; an hour after the prune by default."""
    archive_expiry_interval: Duration = timedelta(days=1)
    """Leader only: cadence of Sweep 6 from ``archive_expiry_at``, counted as
    ``prune_interval`` is."""
    prune_retention_succeeded: Duration = timedelta(days=7)
    prune_retention_failed: Duration = timedelta(days=30)
    prune_retention_cancelled: Duration = timedelta(days=7)
    prune_retention_crashed: Duration = timedelta(days=30)
    prune_retention_abandoned: Duration = timedelta(days=30)
    """How long a terminal job of each status stays in ``jobs`` before it is archived; a
    job whose result expires later (a longer ``result_ttl``) stays until it does."""
    archive_retention: Duration = timedelta(days=365)
    """How long an archived job is kept before Sweep 6 deletes it."""
    prune_batch_size: _WholeNumber = Field(default=10_000, ge=1, le=1_000_000)
    """Jobs moved per atomic prune statement."""
    drain_grace_period: Duration = timedelta(seconds=10)
    """Shutdown: how long running jobs may finish on their own before being asked to stop."""
    cancellation_grace_period: Duration = timedelta(seconds=30)
    """How long a job asked to stop (cancel or shutdown) has before its task is cancelled."""
    cleanup_grace_period: Duration = timedelta(seconds=10)
    """How long a cancelled task has to unwind before it is abandoned."""
    termination_grace_period: Duration = timedelta(seconds=60)
    """Hard wall for a whole shutdown, from the first signal (watchdog detector 1). With
    the watchdog on, the three graces above are shortened together to fit in it, with
    room for the end of the stop (:attr:`stop_waits`)."""
    watchdog_enabled: bool = True
    """Master switch of the watchdogs (detectors 1, 2 and 4 off; detector 3, a loop that
    returned early, then fails the worker instead of ending the process at once)."""
    watchdog_loop_lag_budget: Duration | None = None
    """How long the event loop may go unscheduled before detector 4 trips; below lock_lease
    (default: half the lease, at most 30 s)."""
    watchdog_loop_lag_startup_grace: Duration = timedelta(seconds=30)
    watchdog_tick_grace_factor: _Number = Field(default=5.0, gt=1.0, le=1000.0, allow_inf_nan=False)
    watchdog_stale_floor: Duration = timedelta(seconds=10)
    watchdog_check_interval: Duration = timedelta(seconds=1)
    watchdog_dump_interval: Duration = timedelta(seconds=5)
    """Between straggler dumps in the back half of a slow shutdown (detector 1)."""
    watchdog_dump_after_fraction: _Number = Field(default=0.5, ge=0.0, le=1.0, allow_inf_nan=False)
    """Fraction of termination_grace_period after which straggler dumps begin."""
    fallback_result_ttl: Duration | None = None
    """Result lifetime for actors without ``result_ttl`` (None: keep until pruned)."""
    dispatcher_command_timeout: Duration = timedelta(seconds=5)
    """Backend: client-side bound on every call the worker's loops make (getting a
    connection, its statement, handing it back), so a stalled database or network
    errors an iteration instead of hanging it past the watchdog."""
    dispatch_oversample: _WholeNumber | None = Field(default=None, ge=1, le=100)
    """Backend: candidates sampled per actor per free slot in dispatch (default 2)."""
    reclaim_event_visibility_delay: Duration | None = None
    """Backend: how old a reclaim event must be before pollers see it (default 2 s)."""
    cancel_reclaim_headroom: Duration | None = None
    """Backend: extra wait before reclaiming a job whose cancel is in progress (default 60 s)."""
    wake_coalesce_window: Duration | None = None
    """Backend: enqueues within this long of a NOTIFYing one share one trailing NOTIFY
    (default 2 ms; 0: one NOTIFY per enqueue)."""
    poll_only: bool | None = None
    """Backend: no LISTEN/NOTIFY at all; dispatch every ``poll_interval`` and see cancels
    at each heartbeat (for poolers without LISTEN, e.g. PgBouncer transaction mode)."""
    stale_batch_grace: Duration | None = None
    """Backend: how long the leader's stale-batch sweep leaves a batch alone after its
    last child ended, or its creation, so as not to race the worker's own batch hook
    (default 10 s)."""
    direct_dsn: str | None = None
    """Backend: the server's own URL for the sessions that must each stay one server
    session, the leader's lock and LISTEN (``TASKQ_DIRECT_DSN``; default: the DSN). Set it
    when the DSN goes through a transaction-mode pooler (PgBouncer). Its password is
    masked as the DSN's."""
    min_pool_size: _WholeNumber | None = Field(default=None, ge=1)
    """Backend: the connections its pool keeps open (default 1)."""
    max_pool_size: _WholeNumber | None = Field(default=None, ge=1)
    """Backend: the most connections its pool opens (default 10, or ``min_pool_size``
    when larger). A worker keeps up to three checked out (one-job enqueues,
    dispatches, batched successes; with 5 or more), and opens two more of its own: the
    LISTEN session and, while it competes for leadership, the leader's."""
    health_port: _WholeNumber | None = Field(default=None, ge=0, le=65535)
    """Serve /healthz, /readyz (and /tasks) on this port (0: any free port)."""
    health_host: str = "0.0.0.0"
    """Interface the health server binds."""
    health_tasks_enabled: bool = False
    """Serve /tasks (asyncio task stacks: code structure only, no values)."""
    eager_dependencies: bool = True
    """Create the shared values the worker's actors need (their PROCESS and LOOP
    providers', and the event loop thread's THREAD ones, transitively) as it starts,
    before its first job and before the loop-lag watchdog starts: a provider that
    raises stops the start, naming itself, its scope and the actor needing it. Only
    the actors on this worker's ``queues`` count. False: each is created by the first
    job that needs it (a slow sync provider then blocks the event loop during a job,
    and a failing one fails jobs)."""
    until_idle: bool = False
    """Exit once no job is active in this worker's queues (scripts and tests)."""
    migrate: bool = False
    """Apply pending migrations before starting."""
    startup_wait: Duration = timedelta(seconds=30)
    """How long a starting worker waits for its backend to accept connections (a server
    still starting or restarting, a network not up yet: containers started together
    start in any order; a host name not resolvable yet), retrying with a warning each
    time (the health port serves meanwhile, ``/readyz`` saying why the worker is not
    ready); 0: fail at once. An error that does not heal by itself (a login refused, a
    missing database, a malformed DSN) fails at once."""

    @field_serializer("dsn", "direct_dsn")
    def _dsn_masked(self, value: str | None, info: SerializationInfo) -> str | None:
        context = info.context
        if value is None or (isinstance(context, Mapping) and context.get(SHOW_SECRETS)):
            return value
        return redact(value)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # repr() and str() (and rich's and devtools' pretty-printing) list these.
        for name, value in super().__repr_args__():
            masked = name in _URLS and isinstance(value, str)
            yield name, redact(value) if masked else value

    @field_validator("schema_name")
    @classmethod
    def _valid_schema(cls, value: str | None) -> str | None:
        return None if value is None else validate_schema_name(value)

    @field_validator("dsn", "direct_dsn")
    @classmethod
    def _not_empty(cls, value: str | None, info: ValidationInfo) -> str | None:
        # `--dsn "$DATABASE_URL"` (or TASKQ_DSN=$DATABASE_URL) with the variable unset:
        # the worker ran on the application's database in silence. An empty direct_dsn
        # failed later saying the backend "needs a DSN", which the user had given.
        if value is not None and not value.strip():
            if info.field_name == "direct_dsn":
                raise ValueError(
                    "is empty: give the server's own URL (postgresql://USER@HOST/DB), or "
                    "leave it unset to use the DSN"
                )
            raise ValueError(
                "is empty: give a database URL (postgresql://USER@HOST/DB), or leave it "
                "unset to use the application's"
            )
        return value

    @field_validator("queues")
    @classmethod
    def _storable_queues(cls, value: list[str]) -> list[str]:
        # The rule a job's queue meets at enqueue: a name no job can have is a typo (or
        # undecodable bytes), where it failed later with a driver's traceback.
        for queue in value:
            try:
                check_name(queue)
            except ValueError as exc:
                raise ValueError(f"queue {queue!r} {exc}") from None
        return value

    @field_validator(
        "poll_interval",
        "heartbeat_interval",
        "lock_lease",
        "maintenance_interval",
        "termination_grace_period",
        "watchdog_loop_lag_budget",
        "watchdog_check_interval",
        "watchdog_dump_interval",
        "dispatcher_command_timeout",
        "leader_lease",
        "cron_interval",
        "cron_catch_up",
        "result_expiry_interval",
        "stale_batch_interval",
        "queue_depth_interval",
        "stranded_check_interval",
        "stale_worker_after",
        "prune_interval",
        "archive_expiry_interval",
        "archive_retention",
    )
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError("must be greater than 0")
        return value

    @field_validator("leader_lease")
    @classmethod
    def _leader_lease_postgres_can_hold(cls, value: timedelta) -> timedelta:
        if value > _MAX_LEADER_LEASE:
            raise ValueError(
                "must be at most 24 days (a frozen leader keeps its role this long; "
                "Postgres holds it as an idle_session_timeout in milliseconds)"
            )
        return value

    @field_validator("prune_at", "archive_expiry_at")
    @classmethod
    def _utc_time_of_day(cls, value: time) -> time:
        offset = value.utcoffset()
        if offset is not None and offset != timedelta(0):
            raise ValueError("give the time of day in UTC, without an offset (e.g. 03:00)")
        return value.replace(tzinfo=None)

    @field_validator("completion_window")
    @classmethod
    def _short_window(cls, value: timedelta) -> timedelta:
        if not timedelta(0) <= value <= timedelta(seconds=1):
            raise ValueError("must be between 0 and 1 second (it delays every success)")
        return value

    @model_validator(mode="after")
    def _pool_bounds_in_order(self) -> Self:
        low, high = self.min_pool_size, self.max_pool_size
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_pool_size ({low}) must not exceed max_pool_size ({high})")
        return self

    @model_validator(mode="after")
    def _lease_outlives_heartbeats(self) -> Self:
        if self.lock_lease < 4 * self.heartbeat_interval:
            raise ValueError(
                f"lock_lease ({self.lock_lease.total_seconds()}s) must be at least 4 x "
                f"heartbeat_interval ({self.heartbeat_interval.total_seconds()}s), so one slow "
                f"heartbeat cannot let a live job's lock expire"
            )
        if (
            "stale_worker_after" in self.model_fields_set
            and self.stale_worker_after <= self.lock_lease
        ):
            raise ValueError(
                f"stale_worker_after ({self.stale_worker_after.total_seconds()}s) must be above "
                f"lock_lease ({self.lock_lease.total_seconds()}s): the reclaim leaves a job whose "
                f"worker was seen within a lease, and a row deleted sooner takes that proof away"
            )
        budget = self.watchdog_loop_lag_budget
        if self.watchdog_enabled and budget is not None and budget >= self.lock_lease:
            raise ValueError(
                f"watchdog_loop_lag_budget ({budget.total_seconds()}s) must "
                f"be below lock_lease ({self.lock_lease.total_seconds()}s): a loop blocked longer "
                f"than the lease lets its jobs be reclaimed and run twice before the watchdog fires"
            )
        if self.lease_fence:
            # A job's lease counts from when its dispatch was sent. On a slow but healthy
            # database the dispatch takes up to the bound, the heartbeat tick under way
            # (which does not know the job yet) the bound again, then a sleep, then the
            # renewal that covers the job the bound once more; the fence falls one
            # heartbeat before the lease ends.
            bound, interval = self.dispatcher_command_timeout, self.heartbeat_interval
            slowest = 3 * bound + 2 * interval
            if self.lock_lease <= slowest:
                raise ValueError(
                    f"with lease_fence on, lock_lease ({self.lock_lease.total_seconds()}s) "
                    f"must exceed 3 x dispatcher_command_timeout + 2 x heartbeat_interval "
                    f"({slowest.total_seconds()}s), or a slow but healthy database would "
                    f"have live jobs stopped; raise lock_lease"
                )
        if self.watchdog_enabled:
            self._check_staleness_budgets()
        return self

    def _check_staleness_budgets(self) -> None:
        # A timeout-capped iteration of a bounded loop must fit its stale-tick
        # budget, or a healthy worker on a slow database trips detector 2.
        floor = self.watchdog_stale_floor.total_seconds()
        leader_loops = (
            "maintenance_interval",
            "cron_interval",
            "result_expiry_interval",
            "stale_batch_interval",
            "queue_depth_interval",
            "stranded_check_interval",
        )
        for name in ("poll_interval", "heartbeat_interval", *leader_loops):
            period = getattr(self, name).total_seconds()
            budget = max(period * self.watchdog_tick_grace_factor, floor)
            parts = [("dispatcher_command_timeout", self.dispatcher_command_timeout)]
            if name in leader_loops:
                # Its work comes after confirming the leadership, and gets a floor of its
                # own however long that took.
                parts.append(("leader_work_floor", self.leader_work_floor))
            if name in ("poll_interval", "maintenance_interval"):
                # A cut-short iteration of the loops that apply batch ends (the producer's
                # hand-back, the leader's sweep) applies those it committed within a grace.
                parts.append(("batch_ends_grace", self.batch_ends_grace))
            timeout = sum((value for _, value in parts), timedelta(0)).total_seconds()
            if timeout + period > budget:
                what = " + ".join(part for part, _ in parts)
                if len(parts) > 1:
                    what += f" ({timeout:g}s: its bound and a quarter more for each of the rest)"
                else:
                    what += f" ({timeout:g}s)"
                raise ValueError(
                    f"{what} + {name} ({period}s) exceeds "
                    f"that loop's stale-tick budget ({budget}s = max({name} x "
                    f"watchdog_tick_grace_factor, watchdog_stale_floor)); lower the timeout "
                    f"or raise watchdog_stale_floor"
                )

    @classmethod
    def backend_options_from_env(cls, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The backend tunables the ``TASKQ_*`` environment (``os.environ`` by default)
        sets, as backend constructor options: the fleet's settings reach an
        application's backend (a producer's, a ``watch_reclaims`` reader's) as they reach
        its workers, and win over options given in code, as there. Read and checked
        with the rest of the environment, as a worker reads it: what a worker would
        refuse fails the application too, with the same message, and what a worker
        accepts (a long command timeout with the watchdog off) passes."""
        settings = cls.load(env=env)
        return {
            option: getattr(settings, field)
            for field, option in BACKEND_TUNABLES.items()
            if field in settings.model_fields_set
        }

    def inert_settings(self) -> dict[str, str]:
        """The settings given that change nothing as the others stand, each with what
        it needs to: the health server's ``health_host`` and ``health_tasks_enabled``
        without a ``health_port`` (a fleet's environment that sets them and leaves the
        port out runs no health server, where a probe was expected), and
        ``prefetch_horizon`` with a fixed ``prefetch``."""
        needs: dict[str, str] = {}
        if self.health_port is None:
            health = "a health port (--health-port, TASKQ_HEALTH_PORT): no health server runs"
            needs |= {"health_host": health, "health_tasks_enabled": health}
        if self.prefetch != "auto":
            needs["prefetch_horizon"] = f"prefetch=auto (TASKQ_PREFETCH); it is {self.prefetch}"
        return {name: needs[name] for name in sorted(needs.keys() & self.model_fields_set)}

    @classmethod
    def misspelt_env(cls, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """``TASKQ_*`` variables of the environment (``os.environ`` by default) that name
        no setting but look like one: each to the setting's variable it resembles
        (``TASKQ_CONCURENCY``: ``TASKQ_CONCURRENCY``). A typo is otherwise ignored, the
        default applying without a word. Variables like no setting are left alone: a
        plugin may read its own."""
        import difflib
        import os

        known = [ENV_PREFIX + (f.alias or name).upper() for name, f in cls.model_fields.items()]
        known += _OTHER_ENV
        # A field's Python name where its variable takes the alias (TASKQ_SCHEMA_NAME for
        # TASKQ_SCHEMA): too unlike it for the match below, it was ignored in silence.
        by_field_name = {
            ENV_PREFIX + name.upper(): ENV_PREFIX + f.alias.upper()
            for name, f in cls.model_fields.items()
            if f.alias and f.alias != name
        }
        environ = os.environ if env is None else env
        found: dict[str, str] = {}
        for name in sorted(environ):
            if name in by_field_name:
                found[name] = by_field_name[name]
            elif name.startswith(ENV_PREFIX) and name not in known:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
                if close:
                    found[name] = close[0]
        return found

    def backend_options(self) -> dict[str, Any]:
        """The backend tunables that were set, as backend constructor options."""
        tunables = {option: getattr(self, field) for field, option in BACKEND_TUNABLES.items()}
        return {name: value for name, value in tunables.items() if value is not None}

    @property
    def worker_row_ttl(self) -> timedelta:
        """How long a silent worker's row stays: ``stale_worker_after`` when set, else
        its default or twice ``lock_lease``, whichever is longer (a long lease kept
        the default, and a row swept within a lease took away the reclaim's proof
        that its worker was alive)."""
        if "stale_worker_after" in self.model_fields_set:
            return self.stale_worker_after
        return max(self.stale_worker_after, 2 * self.lock_lease)

    @property
    def stop_end_reserve(self) -> timedelta:
        """What a stop keeps of ``termination_grace_period`` after its phases' waits: for
        the hand-backs and the teardown (a command timeout, with room), at most a
        quarter of it."""
        return min(
            self.dispatcher_command_timeout + timedelta(seconds=2),
            self.termination_grace_period / 4,
        )

    @property
    def stop_waits(self) -> tuple[timedelta, timedelta, timedelta]:
        """A stop's drain, cooperative and cleanup waits: the three graces, scaled down
        together when, with the watchdog on, they would not leave
        :attr:`stop_end_reserve` of ``termination_grace_period`` (the watchdog ended the
        stop with exit 2 and jobs still locked, each losing an attempt to the reclaim,
        where they would have been handed back)."""
        graces = (
            self.drain_grace_period,
            self.cancellation_grace_period,
            self.cleanup_grace_period,
        )
        room = self.termination_grace_period - self.stop_end_reserve
        total = sum(graces, timedelta(0))
        if not self.watchdog_enabled or total <= room:
            return graces
        factor = max(room, timedelta(0)) / total
        return (graces[0] * factor, graces[1] * factor, graces[2] * factor)

    @property
    def loop_lag_budget(self) -> timedelta:
        """Detector 4's budget: the setting, else half the lease capped at 30 s."""
        if self.watchdog_loop_lag_budget is not None:
            return self.watchdog_loop_lag_budget
        return min(timedelta(seconds=30), self.lock_lease / 2)

    @model_validator(mode="after")
    def _catch_up_outlasts_a_cron_tick(self) -> Self:
        # A tick sees a slot up to one interval after it came due; a shorter catch-up
        # skipped slots with a healthy leader (none at all, for a very short one).
        if self.cron_catch_up < 2 * self.cron_interval:
            raise ValueError(
                f"cron_catch_up ({self.cron_catch_up.total_seconds()}s) must be at least 2 x "
                f"cron_interval ({self.cron_interval.total_seconds()}s): a tick sees a slot "
                f"up to one interval late, and a slot older than cron_catch_up is skipped"
            )
        return self

    @model_validator(mode="after")
    def _leader_renews_within_its_lease(self) -> Self:
        if self.leader_lease < 2 * self.heartbeat_interval:
            raise ValueError(
                f"leader_lease ({self.leader_lease.total_seconds()}s) must be at least 2 x "
                f"heartbeat_interval ({self.heartbeat_interval.total_seconds()}s): the leader "
                f"renews once per heartbeat_interval"
            )
        return self

    @model_validator(mode="after")
    def _catch_up_outlasts_a_failover(self) -> Self:
        # A frozen leader keeps its lock for a lease; its successor is elected at its
        # next heartbeat after that and ticks a cron_interval later, when the slots that
        # came due just after the freeze are that much older.
        failover = self.leader_lease + self.heartbeat_interval + self.cron_interval
        if self.cron_catch_up < failover:
            raise ValueError(
                f"cron_catch_up ({self.cron_catch_up.total_seconds():g}s) must be at least "
                f"leader_lease + heartbeat_interval + cron_interval "
                f"({failover.total_seconds():g}s): a frozen leader is replaced a lease and a "
                f"heartbeat later, whose first cron tick comes a cron_interval after that, "
                f"when the slots that came due meanwhile are older than cron_catch_up, so "
                f"every such failover skips them; set cron_catch_up (TASKQ_CRON_CATCH_UP) to "
                f"{failover.total_seconds():g}s or more, or lower leader_lease or "
                f"heartbeat_interval"
            )
        return self

    @property
    def leader_work_floor(self) -> timedelta:
        """What a bounded leader loop's work gets at least (a quarter of
        ``dispatcher_command_timeout``) after confirming the leadership, however long that
        took: such a turn may run this much past the bound, and its stale-tick budget
        counts it."""
        return self.dispatcher_command_timeout / 4

    @property
    def batch_ends_grace(self) -> timedelta:
        """How much longer than its bound a loop's iteration may run to apply the batch
        ends it committed before the bound cut it short (a quarter of
        ``dispatcher_command_timeout``); counted in the stale-tick budget of the loops
        that apply batch ends (the producer's, by ``poll_interval``, and the leader's
        sweep, by ``maintenance_interval``)."""
        return self.dispatcher_command_timeout / 4

    @property
    def reclaim_grace(self) -> timedelta:
        """``leader_reclaim_grace``, or its default of two heartbeats."""
        if self.leader_reclaim_grace is not None:
            return self.leader_reclaim_grace
        return 2 * self.heartbeat_interval

    @property
    def prune_retention(self) -> dict[str, timedelta]:
        """Retention of each terminal status, for Sweep 5."""
        return {
            "succeeded": self.prune_retention_succeeded,
            "failed": self.prune_retention_failed,
            "cancelled": self.prune_retention_cancelled,
            "crashed": self.prune_retention_crashed,
            "abandoned": self.prune_retention_abandoned,
        }

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
            message = str(err["msg"]).removeprefix("Value error, ")
            if not err["loc"]:  # a rule across settings: name those the user set
                given = [
                    f"{source}={values[key]!r}"
                    for key, source in sources.items()
                    if re.search(rf"\b{key}\b", message)
                ]
                shown = f" ({', '.join(given)})" if given else ""
                raise SettingsError(f"invalid settings{shown}: {message}") from None
            loc = str(err["loc"][0])
            source = sources.get(loc, loc)
            shown = f"={values[loc]!r}" if loc in values else ""
            raise SettingsError(f"invalid setting {source}{shown}: {message}") from None
