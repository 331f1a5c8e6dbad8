"""What every producer does before it writes: validate payloads and build ``EnqueueArgs``
from an application's actors, and check ``max_pending``.

:class:`ArgsBuilder` is shared by :class:`~taskq.client.JobsClient` and by synchronous
clients (``taskq_postgres.SyncJobsClient``), which differ only in how they reach the
database.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Final
from uuid import UUID, SafeUUID, uuid4

import structlog
from pydantic import ValidationError

from taskq.actor import Actor, validation_problems
from taskq.errors import EnqueueOptionsError, MaxPendingExceededError, UnknownActorError
from taskq.models import EnqueueArgs, EnqueueItem, from_valid_values

__all__ = [
    "ActorRef",
    "ArgsBuilder",
    "AscendingIds",
    "BatchItem",
    "MaxPendingLimits",
    "check_capacity",
    "one_per_key",
]

_log = structlog.get_logger("taskq.client")

ActorRef = Actor[..., Any] | str
BatchItem = EnqueueItem | tuple[ActorRef, Any]
"""One item of a batch enqueue: an ``EnqueueItem``, or an ``(actor, payload)`` pair."""

_VERSION_4: Final = (0x4000 << 64) | (0x8000 << 48)
_NOT_VERSION_BITS: Final = ~((0xF000 << 64) | (0xC000 << 48))
# Looked up once: an enum member's attribute access alone costs a fresh id a fifth.
_NEW_UUID: Final = UUID.__new__
_SET_SLOT: Final = object.__setattr__
_UNKNOWN_SAFETY: Final = SafeUUID.unknown


def _version_4(value: int) -> UUID:
    """``value``'s bits as a version 4 UUID (its version and variant bits set), made as
    ``uuid4`` makes one but without the checks of ``UUID.__init__`` (a version 4 value
    is in range by construction)."""
    # As CPython's own UUID._from_int (3.14) does: set the two slots directly.
    fresh = _NEW_UUID(UUID)
    _SET_SLOT(fresh, "int", (value & _NOT_VERSION_BITS) | _VERSION_4)
    _SET_SLOT(fresh, "is_safe", _UNKNOWN_SAFETY)
    return fresh


def _fresh_id() -> UUID:
    """A random (version 4) UUID."""
    return _version_4(int.from_bytes(os.urandom(16)))


def _fresh_ids(n: int) -> list[UUID]:
    """``n`` fresh ids, as :func:`_fresh_id` makes them, from one ``os.urandom`` call, in
    ascending order: the jobs of one batch share their enqueue time, and the dispatch
    breaks that tie by id, so in random order they ran shuffled on a FIFO queue."""
    blob, take = os.urandom(16 * n), int.from_bytes
    values = sorted(
        (take(blob[i : i + 16]) & _NOT_VERSION_BITS) | _VERSION_4 for i in range(0, 16 * n, 16)
    )
    return [_version_4(value) for value in values]


_SEQUENCE_SHIFT: Final = 80  # above the version and variant bits: its 48 bits order the ids
_SEQUENCE_ROOM: Final = 1 << 47  # a first value below it leaves 2**47 ids of room


class AscendingIds:
    """Fresh version 4 ids, each greater than the one before, for jobs made one at a
    time that are written together (a job's sub-jobs): they share their enqueue time,
    and the dispatch breaks that tie by id, so random ids ran them shuffled.

    The top 48 bits count up from a random start, the other 74 stay random.
    """

    def __init__(self) -> None:
        self._sequence: int | None = None

    def __call__(self) -> UUID:
        """The next id."""
        if self._sequence is None:
            self._sequence = int.from_bytes(os.urandom(6)) % _SEQUENCE_ROOM
        else:
            self._sequence += 1
        return _version_4((self._sequence << _SEQUENCE_SHIFT) | int.from_bytes(os.urandom(10)))


def _or(value: timedelta | None, default: timedelta | None) -> timedelta | None:
    return default if value is None else value


def _seconds(value: timedelta | float | None, option: str) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        # timedelta(seconds=True) is a second: a flag passed for a duration.
        raise EnqueueOptionsError(
            f"{option} takes a timedelta or a number of seconds, not {value!r}"
        )
    try:
        return timedelta(seconds=value)
    except OverflowError:
        raise EnqueueOptionsError(f"{option}: {value} seconds is out of range") from None
    except (ValueError, TypeError):  # NaN, a string, a datetime
        raise EnqueueOptionsError(
            f"{option} takes a timedelta or a number of seconds, not {value!r}"
            + (" (there is no run-at option: give the delay)" if option == "delay" else "")
        ) from None


def _whole(value: int | None, option: str) -> int | None:
    # As @actor checks its own: pydantic read "3" as 3, True as 1 and 3.0 as 3.
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise EnqueueOptionsError(f"{option} must be a whole number, not {value!r}")
    return value


def _item_parts(
    item: BatchItem,
) -> tuple[ActorRef, Any, Mapping[str, Any]]:
    """A batch item's actor, payload and options (none for an ``(actor, payload)`` pair)."""
    # The tuple test first: a model class's isinstance goes through ABCMeta.
    if isinstance(item, tuple | list) and len(item) == 2:
        ref, payload = item
        return ref, payload, _NO_OPTIONS
    if isinstance(item, EnqueueItem):
        return item.actor, item.payload, item.options
    # A dict {"actor": ..., "payload": ...} unpacked as a pair read its keys as the actor.
    raise EnqueueOptionsError(
        f"a batch item is an EnqueueItem or an (actor, payload) pair, not "
        f"{type(item).__name__} {item!r:.80}"
    )


_NO_OPTIONS: Final[Mapping[str, Any]] = MappingProxyType({})


class ArgsBuilder:
    """Validates payloads against an application's ``actors`` (by name) and builds the
    ``EnqueueArgs`` of their jobs, merging each actor's defaults with per-call options."""

    def __init__(self, actors: Mapping[str, Actor[..., Any]]) -> None:
        self._actors = actors
        self._defaults: dict[str, dict[str, Any]] = {}
        """Per actor without an identity key: the fields of its option-less args."""

    def actor(self, ref: ActorRef) -> Actor[..., Any]:
        """The application's actor ``ref`` names; ``UnknownActorError`` otherwise."""
        if isinstance(ref, str):
            name = ref
        elif isinstance(ref, Actor):
            name = ref.name
        else:
            raise TypeError(
                f"an actor is given as an @actor function or its name, not "
                f"{type(ref).__name__} {ref!r}"
            )
        found = self._actors.get(name)
        if found is None:
            known = ", ".join(sorted(self._actors)) or "none"
            raise UnknownActorError(
                f"unknown actor {name!r}; registered actors: {known}. "
                f"Pass it to TaskQ(actors=[...])"
            )
        return found

    def build(
        self,
        actor: ActorRef,
        payload: Any,
        *,
        delay: timedelta | float | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        identity_key: str | None = None,
        singleton: bool = False,
        fairness_key: str | None = None,
        schedule_to_close: timedelta | float | None = None,
        timeout: timedelta | float | None = None,
        result_ttl: timedelta | float | None = None,
        metadata: Mapping[str, Any] | None = None,
        tags: Iterable[str] = (),
        job_id: UUID | None = None,
    ) -> EnqueueArgs:
        """Validate a payload and merge the actor's defaults with per-call options."""
        target = self.actor(actor)
        opts = target.options
        value = target.validate_payload(payload)
        if isinstance(tags, str) or tags is None:
            raise EnqueueOptionsError(f"tags must be a list of strings, not {tags!r}")
        if not isinstance(singleton, bool):
            raise EnqueueOptionsError(f"singleton must be True or False, not {singleton!r}")
        priority, max_attempts = _whole(priority, "priority"), _whole(max_attempts, "max_attempts")
        # An option given (even 0 or "") is the job's, checked as such; None: the actor's.
        try:
            args = EnqueueArgs(
                id=job_id or uuid4(),
                actor=target.name,
                queue=opts.queue if queue is None else queue,
                payload=target.dump_payload(value),
                priority=opts.priority if priority is None else priority,
                delay=_seconds(delay, "delay"),
                max_attempts=opts.max_attempts if max_attempts is None else max_attempts,
                idempotency_key=idempotency_key,
                identity_key=identity_key
                if identity_key is not None
                else target.identity_for(value),
                singleton=singleton,
                fairness_key=fairness_key,
                schedule_to_close=_or(
                    _seconds(schedule_to_close, "schedule_to_close"), opts.schedule_to_close
                ),
                timeout=_or(_seconds(timeout, "timeout"), opts.timeout),
                result_ttl=_or(_seconds(result_ttl, "result_ttl"), opts.result_ttl),
                metadata=dict(metadata or {}),
                tags=list(tags),
            )
        except ValidationError as exc:
            raise EnqueueOptionsError(
                f"invalid enqueue options for actor {target.name!r}: "
                f"{validation_problems(exc, '<options>')}"
            ) from None
        if args.delay and args.schedule_to_close and args.delay >= args.schedule_to_close:
            # Stored, it waited out its delay to be failed by the deadline sweep, unrun.
            raise EnqueueOptionsError(
                f"delay ({args.delay}) must be shorter than schedule_to_close "
                f"({args.schedule_to_close}) for actor {target.name!r}: both count from "
                f"the enqueue, so the job's deadline would pass before it could start"
            )
        if args.singleton and args.identity_key is None:
            raise EnqueueOptionsError(
                f"singleton=True needs an identity key: pass identity_key=..., or declare "
                f"@actor(identity_key=...) on {target.name!r} returning one for this payload"
            )
        return args

    def args(
        self, ref: ActorRef, payload: Any, options: Mapping[str, Any], job_id: UUID | None = None
    ) -> EnqueueArgs:
        """:meth:`build`, cheaper without options: then every field but the id and
        the payload is the actor's default, validated once and copied since.
        ``job_id`` (else a fresh one) unless the options name one."""
        if options:
            unknown = options.keys() - _OPTIONS
            if unknown:
                raise EnqueueOptionsError(
                    f"unknown enqueue option(s) {', '.join(sorted(unknown))}; "
                    f"the options are {', '.join(sorted(_OPTIONS))}"
                )
            return self.build(ref, payload, **{"job_id": job_id, **options})
        target = self.actor(ref)
        defaults = self._defaults.get(target.name)
        if defaults is None or target.options.identity_key is not None:
            # The identity key follows the payload: no copy can stand for it.
            args = self.build(target, payload, job_id=job_id)
            if target.options.identity_key is None:
                self._defaults[target.name] = dict(args)
            return args
        # Nothing to validate again: the payload is the actor's own dump, the id a
        # fresh UUID. Fresh containers: no two jobs share a mutable value.
        return from_valid_values(
            EnqueueArgs,
            {
                **defaults,
                "id": job_id or _fresh_id(),
                "payload": target.dump_payload(payload),
                "metadata": {},
                "tags": [],
            },
        )

    def each(self, listed: list[BatchItem]) -> Iterator[EnqueueArgs]:
        """The args of each item, validated one by one as they are pulled."""
        for item, job_id in zip(listed, _fresh_ids(len(listed)), strict=True):
            ref, payload, options = _item_parts(item)
            yield self.args(ref, payload, options, job_id)

    def counts(self, listed: Iterable[BatchItem]) -> dict[str, int]:
        """How many jobs the items can add to each actor (``UnknownActorError`` for an
        unknown one): items repeating an idempotency key of the call count once, as
        they make one job."""
        counts: dict[str, int] = {}
        keys: set[tuple[str, str]] = set()
        for item in listed:
            ref, _, options = _item_parts(item)
            name = self.actor(ref).name
            key = options.get("idempotency_key")
            if key is not None:
                if (name, key) in keys:
                    continue
                keys.add((name, key))
            counts[name] = counts.get(name, 0) + 1
        return counts

    def bounded(
        self, counts: Mapping[str, int], limits: Mapping[str, int | None]
    ) -> dict[str, int]:
        """The ``max_pending`` of each actor of ``counts`` that has one: the stored
        ``limits`` (what workers registered), else the decorator's."""
        return {name: limit for name in counts if (limit := self.limit(name, limits)) is not None}

    def limit(self, name: str, limits: Mapping[str, int | None]) -> int | None:
        """Actor ``name``'s ``max_pending``: the stored ``limits``, else the decorator's."""
        return limits.get(name, self._actors[name].options.max_pending)


_OPTIONS: Final = frozenset(inspect.signature(ArgsBuilder.build).parameters) - {
    "self",
    "actor",
    "payload",
}
"""The per-call options an enqueue takes (:meth:`ArgsBuilder.build`'s keywords)."""


def one_per_key(args_list: Iterable[EnqueueArgs]) -> list[EnqueueArgs]:
    """``args_list`` without the items repeating an idempotency key of the call: those
    make no job of their own, so ``max_pending`` counts them once (as :meth:`ArgsBuilder.counts`
    does), also when it counts only the items whose key is not stored yet."""
    keys: set[tuple[str, str]] = set()
    kept: list[EnqueueArgs] = []
    for args in args_list:
        if args.idempotency_key is not None:
            if (args.actor, args.idempotency_key) in keys:
                continue
            keys.add((args.actor, args.idempotency_key))
        kept.append(args)
    return kept


def check_capacity(
    counts: Mapping[str, int], bounded: Mapping[str, int], waiting: Mapping[str, int]
) -> None:
    """``MaxPendingExceededError`` when an actor's ``waiting`` jobs plus ``counts[actor]``
    would pass its ``bounded`` limit. ``waiting`` may be counted up to the limit only
    (``count_pending_jobs(up_to=...)``): a count at the limit reads "or more"."""
    for name, limit in bounded.items():
        have, more = waiting.get(name, 0), counts[name]
        if have + more > limit:
            # A batch alone can pass the limit: "already has 0 waiting" read as a bug.
            if limit == 0:  # counted up to 0: there is no count to report
                raise MaxPendingExceededError(
                    f"actor {name!r} takes no waiting jobs (max_pending=0); raise its "
                    f"max_pending to enqueue"
                )
            adding = "" if more == 1 else f" and this call adds {more}"
            many = f"{have} or more" if have >= limit else str(have)
            raise MaxPendingExceededError(
                f"actor {name!r} already has {many} waiting jobs{adding} "
                f"(max_pending={limit}); retry later or raise its max_pending"
            )


class MaxPendingLimits:
    """The fleet-wide ``max_pending`` limits as a producer last read them, re-read every
    ``ttl`` seconds.

    Workers store each actor's limit at start-up, so a stored value wins over the
    decorator's literal (:meth:`ArgsBuilder.bounded`); the literal applies to actors
    no worker has registered yet. A failed read fails open, loudly: the limits read
    before (the literals at first) apply until the next read, since a hiccup of
    that read must not stop producers. The producer does the reading (awaited or
    not) and hands the outcome to :meth:`update`.
    """

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._limits: dict[str, int | None] = {}
        self._read_at: float | None = None

    def cached(self) -> Mapping[str, int | None] | None:
        """The limits if read less than ``ttl`` ago, else None: read them and :meth:`update`."""
        if self._read_at is not None and time.monotonic() - self._read_at < self._ttl:
            return self._limits
        return None

    def update(self, read: Mapping[str, int | None] | Exception) -> Mapping[str, int | None]:
        """Keep what the read returned, or (it raised) log and keep the limits known; either
        way the next read is due in ``ttl`` seconds. Returns the limits in force."""
        if isinstance(read, Exception):
            _log.warning("taskq.max-pending-read-failed", error=repr(read))
        else:
            self._limits = dict(read)
        self._read_at = time.monotonic()
        return self._limits
