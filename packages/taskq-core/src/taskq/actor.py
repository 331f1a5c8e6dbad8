"""``@actor``: turn a function into a job type.

The first parameter is the payload; its annotation (a pydantic model, a
dataclass, a TypedDict or ``dict``) is validated at enqueue and again at
dispatch. ``ctx`` is passed by name; every other parameter is injected by
type through the DI engine.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Final, Generic, ParamSpec, TypeVar, get_type_hints, overload

from pydantic import ConfigDict, PydanticUserError, TypeAdapter, ValidationError
from pydantic.errors import PydanticInvalidForJsonSchema
from pydantic_core import ErrorDetails, PydanticSerializationError, to_json

from taskq.errors import ConfigurationError, PayloadValidationError
from taskq.models import INT32_MAX, INT32_MIN, EnqueueArgs
from taskq.retry import Backoff, ExponentialBackoff, RetryPolicy

__all__ = ["IDENTITY_FROM_PAYLOAD", "Actor", "ActorOptions", "actor", "actors_by_name"]

P = ParamSpec("P")
R = TypeVar("R")

IDENTITY_FROM_PAYLOAD: Final = "identity_key_from_payload"
"""The key of :meth:`ActorOptions.job_defaults` that says the actor derives each job's
``identity_key`` from its payload (``@actor(identity_key=...)``): code a leader without
the actor does not have. No enqueue option has this name."""

CONTEXT_PARAMETER = "ctx"


def _as_timedelta(
    value: timedelta | float | None, option: str, *, zero: bool = False
) -> timedelta | None:
    """``value`` (seconds or a timedelta) as a timedelta: positive, or not negative
    with ``zero``."""
    if value is None:
        return None
    try:
        if isinstance(value, bool):  # timedelta(seconds=True) is a second
            raise TypeError
        delta = value if isinstance(value, timedelta) else timedelta(seconds=value)
    except (OverflowError, ValueError, TypeError):
        raise ConfigurationError(
            f"@actor option {option} takes a timedelta or seconds, got {value!r}"
        ) from None
    if delta < timedelta(0) or (delta == timedelta(0) and not zero):
        rule = "must not be negative" if zero else "must be positive"
        raise ConfigurationError(f"@actor option {option} {rule}, got {value!r}")
    return delta


_KEEP_NAN: Final = ConfigDict(ser_json_inf_nan="constants")


def _payload_adapter(payload_type: Any) -> TypeAdapter[Any]:
    """The payload type's adapter. A dict or list payload keeps a NaN as a number when
    serialised, so that storing refuses it (pydantic's default writes it as null); a
    model, dataclass or TypedDict serialises as its own config says."""
    try:
        return TypeAdapter(payload_type, config=_KEEP_NAN)
    except PydanticUserError:  # a type with a config of its own
        return TypeAdapter(payload_type)


@dataclass(frozen=True)
class ActorOptions:
    """The options of one actor (API: ``@actor(...)``)."""

    name: str
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 3
    retry_backoff: Backoff | Callable[[int], timedelta | float] = field(
        default_factory=ExponentialBackoff
    )
    timeout: timedelta | None = None
    schedule_to_close: timedelta | None = None
    max_concurrent: int | None = None
    max_pending: int | None = None
    result_ttl: timedelta | None = None
    identity_key: Callable[[Any], str | None] | None = None

    def job_defaults(self) -> dict[str, Any]:
        """The options declared for the actor's jobs, as JSON enqueue options (durations
        in seconds), for a worker that does not have the actor (``ActorConfig``); with
        :data:`IDENTITY_FROM_PAYLOAD` when the actor computes its jobs' identity key."""
        durations = {
            "timeout": self.timeout,
            "schedule_to_close": self.schedule_to_close,
            "result_ttl": self.result_ttl,
        }
        return {
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            **{name: value.total_seconds() for name, value in durations.items() if value},
            **({IDENTITY_FROM_PAYLOAD: True} if self.identity_key is not None else {}),
        }


class Actor(Generic[P, R]):
    """A registered job type. Calling it calls the function directly (handy in tests)."""

    def __init__(self, fn: Callable[P, R], options: ActorOptions) -> None:
        self.fn = fn
        self.options = options
        self.is_async = inspect.iscoroutinefunction(fn)
        self.retry = RetryPolicy(options.retry_backoff)
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            # Refused here, not only at the worker's start: an actor returns its result.
            raise ConfigurationError(
                f"actor {options.name!r} is a generator function; an actor returns its "
                f"result (use `return`, not `yield`)"
            )
        params = list(inspect.signature(fn).parameters.values())
        # The payload is passed by name, as every injected value is: a positional-only
        # one passed the decoration and stopped the worker's start.
        if not params or params[0].kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            raise ConfigurationError(
                f"actor {options.name!r}: the first parameter must be the payload, an "
                f"ordinary parameter (not positional-only, *args or keyword-only), e.g. "
                f"`def {fn.__name__}(payload: MyModel, ctx: Context) -> ...`"
            )
        self.payload_parameter = params[0].name
        self.payload_type: Any = _payload_hint(fn, options.name, self.payload_parameter)
        try:
            self._adapter: TypeAdapter[Any] = _payload_adapter(self.payload_type)
        except PydanticUserError as exc:  # a type pydantic cannot validate (a Context)
            raise ConfigurationError(
                f"actor {options.name!r}: the first parameter is the payload, and pydantic "
                f"cannot validate {self.payload_type!r}: {str(exc).splitlines()[0]}"
            ) from exc
        _check_object_payload(options.name, self.payload_type, self._adapter)
        self.wants_context = CONTEXT_PARAMETER in {p.name for p in params[1:]}
        self.passthrough = frozenset({self.payload_parameter, CONTEXT_PARAMETER})

    @property
    def name(self) -> str:
        """The actor's name, as jobs store it (``@actor(name=...)``, else the function's
        qualified name)."""
        return self.options.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Actor {self.name} queue={self.options.queue}>"

    def validate_payload(self, payload: Any) -> Any:
        """The payload as the actor's payload type; ``PayloadValidationError`` names each bad field."""
        try:
            return self._validate(payload)
        except ValidationError as exc:
            # Not chained: pydantic's own text quotes each bad value (input_value=...),
            # a payload's personal data in every traceback that prints it.
            raise PayloadValidationError(
                f"invalid payload for actor {self.name!r}: {validation_problems(exc, '<payload>')}"
                f"{self._other_type_hint(payload, exc)}{_key_hint(exc)}"
            ) from None

    def _other_type_hint(self, payload: Any, exc: ValidationError) -> str:
        """Why a payload object of another type is refused, and what to pass instead: such
        an object (a model for a ``dict`` actor too) was once converted through JSON, so
        pydantic's bare "Input should be a valid dictionary" reads as a TaskQ bug. Only
        type names are shown, never values."""
        if _stored_form(payload) or not any(error["loc"] == () for error in exc.errors()):
            return ""
        given = type(payload).__qualname__
        wanted = getattr(self.payload_type, "__name__", repr(self.payload_type))
        return (
            f" (given a {given}, not a {wanted}: an object of another type is not "
            f"converted, so that another actor's model is not taken for this one's; pass "
            f"its fields as a dict, e.g. payload.model_dump(mode='json') for a pydantic model)"
        )

    def dump_payload(self, payload: Any) -> dict[str, Any]:
        """Validate and serialise a payload to the JSON object stored on the job.

        Stored by alias and without computed fields, and refused unless that form
        validates back (a serializer the type's own validation rejects): the worker
        validates the stored payload before the actor runs, so what is accepted
        here runs. A NaN or infinity is refused, unless a payload model's (or
        dataclass's, TypedDict's) own config writes it as null, pydantic's default.
        """
        value = self.validate_payload(payload)
        try:
            dumped = self._adapter.serializer.to_python(
                value, mode="json", by_alias=True, round_trip=True
            )
        except (PydanticSerializationError, ValueError) as exc:  # UnicodeError included
            said = str(exc)
            if "Maximum serialization depth" in said:
                said = "it is nested too deep: flatten it, or send that part as a string"
            raise PayloadValidationError(
                f"payload for actor {self.name!r} cannot be stored as JSON: {said}"
            ) from exc
        if not isinstance(dumped, dict):
            raise PayloadValidationError(
                f"payload for actor {self.name!r} must serialise to a JSON object, "
                f"got {type(dumped).__name__}; use a pydantic model, dataclass, TypedDict or dict"
            )
        try:
            self._validate(dumped)
        except ValidationError as exc:
            raise PayloadValidationError(
                f"payload for actor {self.name!r} does not validate back from its stored "
                f"form (a serializer, alias or computed field its validation refuses; its "
                f"values are not shown, they may be personal): "
                f"{validation_problems(exc, '<payload>')}"
            ) from None  # not chained, as in validate_payload
        return dumped

    def _validate(self, payload: Any) -> Any:
        """``payload`` as the payload type, from a Python value or its stored JSON form."""
        # The adapter's core validator directly: TypeAdapter.validate_python adds
        # ~3 µs of argument handling per call, paid on every enqueue and job start.
        validator = self._adapter.validator
        try:
            return validator.validate_python(payload)
        except ValidationError as exc:
            # A strict type takes the stored form (times, UUIDs, enum members as JSON
            # strings) only as JSON: pydantic's strict Python mode wants the objects.
            # Only a value refused *in* that form is read again as JSON: an object of
            # another type (another model's instance, a datetime for a str) is refused
            # as pydantic refuses it, or a Crop model passed to a resize actor was
            # enqueued as a resize job, the fields it lacked set to their defaults.
            if not all(_in_stored_form(error) for error in exc.errors()):
                raise
            try:
                as_json = to_json(payload)
            except (PydanticSerializationError, ValueError):
                raise exc from None
            try:
                return validator.validate_json(as_json)
            except ValidationError:
                raise exc from None

    def identity_for(self, payload: Any) -> str | None:
        """The identity key for a (validated) payload, if the actor declares one."""
        fn = self.options.identity_key
        return None if fn is None else fn(payload)


_STORED_SCALARS: Final = (str, int, float, bool, type(None))


def _key_hint(exc: ValidationError) -> str:
    """What to do about a refused key that is no text."""
    if any(_untextual_key(error) for error in exc.errors()):
        return " (a payload is stored as JSON, whose keys are text: give its keys as str)"
    return ""


def _untextual_key(error: ErrorDetails) -> bool:
    """Whether ``error`` refused a dict key that is no text."""
    return error["loc"][-1:] == ("[key]",) and not isinstance(error.get("input"), str)


def _in_stored_form(error: ErrorDetails) -> bool:
    """Whether the value ``error`` refused is one a stored payload can hold. A key that
    is no text is not (JSON's keys are): read again as JSON, ``{1: "a", "1": "b"}`` was
    stored as ``{"1": "b"}``, ``None`` and ``(1, 2)`` as ``"None"`` and ``"1,2"``."""
    return not _untextual_key(error) and _stored_form(error.get("input"))


def _stored_form(value: object) -> bool:
    """Whether ``value`` is made of JSON values only (what a stored payload is).
    Iterative: a payload nested past the recursion limit is checked too; a cycle is not JSON."""
    pending, seen = [value], set()
    while pending:
        item = pending.pop()
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                return False  # a cycle: no JSON value
            seen.add(id(item))
        if isinstance(item, dict):
            if not all(isinstance(key, str) for key in item):
                return False
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
        elif not isinstance(item, _STORED_SCALARS):
            return False
    return True


@overload
def actor(fn: Callable[P, R], /) -> Actor[P, R]: ...
@overload
def actor(
    *,
    name: str | None = None,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int = 3,
    retry_backoff: Backoff | Callable[[int], timedelta | float] | None = None,
    timeout: timedelta | float | None = None,
    schedule_to_close: timedelta | float | None = None,
    max_concurrent: int | None = None,
    max_pending: int | None = None,
    result_ttl: timedelta | float | None = None,
    identity_key: Callable[[Any], str | None] | None = None,
) -> Callable[[Callable[P, R]], Actor[P, R]]: ...
def actor(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int = 3,
    retry_backoff: Backoff | Callable[[int], timedelta | float] | None = None,
    timeout: timedelta | float | None = None,
    schedule_to_close: timedelta | float | None = None,
    max_concurrent: int | None = None,
    max_pending: int | None = None,
    result_ttl: timedelta | float | None = None,
    identity_key: Callable[[Any], str | None] | None = None,
) -> Actor[P, R] | Callable[[Callable[P, R]], Actor[P, R]]:
    """Declare an actor: ``@actor`` or ``@actor(queue="images", max_attempts=5, ...)``.

    ``name`` defaults to the function's qualified name. ``timeout`` bounds each
    attempt (a ``TimeoutError``, retried), ``schedule_to_close`` the whole job
    (``DeadlineExceeded``, not retried; a job dispatched past it is not run). A
    sync actor's thread cannot be stopped: past either limit its attempt has
    failed, but the outcome is written (and a retry can start) once the thread
    returns. An actor still running ``cleanup_grace_period`` past its limit (a sync
    actor's thread, an async one that swallowed the cancellation) is given up on: its
    attempt is written ``failed`` with the limit's error, not retried (its code may
    run on), and its slot freed. ``max_concurrent`` caps running jobs fleet-wide; ``max_pending``
    refuses enqueues beyond it (``MaxPendingExceededError``; counted before the
    insert, so producers enqueueing at the same moment may overshoot it by the
    enqueues they have in flight) and skips the cron slots beyond it (not fired
    later); ``identity_key(payload)`` serializes jobs with the same key;
    ``result_ttl`` expires stored results.
    """
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ConfigurationError(
            f"@actor name must not be empty (leave it out for the function's), got {name!r}"
        )
    for option, value, low in (
        ("max_attempts", max_attempts, 1),
        ("priority", priority, INT32_MIN),
        ("max_concurrent", max_concurrent, 1),
        ("max_pending", max_pending, 0),
    ):
        # Checked here, not at each enqueue or at the worker's start: a "3" or a 2.5
        # passed the decoration and failed every enqueue after it.
        if value is None and option in ("max_concurrent", "max_pending"):
            continue  # no cap
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT32_MAX:
            raise ConfigurationError(
                f"@actor {option} must be a whole number between {low} and {INT32_MAX}, "
                f"got {value!r}"
            )
    for option, given, shape in (
        ("retry_backoff", retry_backoff, "a taskq.retry backoff, or attempt -> delay"),
        ("identity_key", identity_key, "payload -> key or None"),
    ):
        if given is not None and not callable(given):
            raise ConfigurationError(f"@actor {option} must be callable ({shape}), got {given!r}")
    if retry_backoff is not None:
        # Tried once now: a backoff giving something else than a delay was accepted, then
        # failed the job at its first error, the actor's own error lost.
        try:
            RetryPolicy(retry_backoff).delay(1)
        except TypeError as exc:
            raise ConfigurationError(f"@actor retry_backoff: {exc}") from None
        except Exception:  # noqa: BLE001, S110 - a backoff that fails is its job's outcome to record
            pass

    def decorate(func: Callable[P, R]) -> Actor[P, R]:
        if not callable(func):
            raise ConfigurationError(
                f"@actor decorates a function, not {func!r}: its options are keywords, "
                f"as in @actor(name={func!r}) or @actor(queue=...)"
            )
        options = ActorOptions(
            name=name or func.__qualname__,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            retry_backoff=retry_backoff if retry_backoff is not None else ExponentialBackoff(),
            timeout=_as_timedelta(timeout, "timeout"),
            schedule_to_close=_as_timedelta(schedule_to_close, "schedule_to_close"),
            max_concurrent=max_concurrent,
            max_pending=max_pending,
            # 0 as enqueue takes it: the result is not kept past the job's end.
            result_ttl=_as_timedelta(result_ttl, "result_ttl", zero=True),
            identity_key=identity_key,
        )
        _check_enqueueable(options)
        return Actor(func, options)

    return decorate(fn) if fn is not None else decorate


def _check_enqueueable(options: ActorOptions) -> None:
    """Refuse, at the decoration, what every enqueue of the actor would refuse (a queue
    name or a duration no job can hold)."""
    try:
        EnqueueArgs(
            actor=options.name,
            queue=options.queue,
            timeout=options.timeout,
            schedule_to_close=options.schedule_to_close,
            result_ttl=options.result_ttl,
        )
    except ValidationError as exc:
        raise ConfigurationError(
            f"@actor {options.name!r}: {validation_problems(exc, 'options')}"
        ) from None


def _check_object_payload(actor: str, payload_type: Any, adapter: TypeAdapter[Any]) -> None:
    """Refuse, at the decoration, a payload type that is no JSON object (``int``,
    ``list[str]``): it passed, and then every enqueue failed."""
    try:
        kind = adapter.json_schema().get("type")
    except PydanticInvalidForJsonSchema:  # a type without a schema: enqueue checks it
        return
    if kind is not None and kind != "object":
        raise ConfigurationError(
            f"actor {actor!r}: the payload is stored as a JSON object, and {payload_type!r} "
            f"is a JSON {kind}; use a pydantic model, dataclass, TypedDict or dict"
        )


def _payload_hint(fn: Callable[..., Any], actor: str, parameter: str) -> Any:
    """The payload parameter's type (``dict[str, Any]`` when it has none).

    Only its own hint is read now: the types of injected parameters may be defined
    later in the module, or imported under ``TYPE_CHECKING`` with a provider
    registered for them; the worker reads those at its start.
    """
    annotation = inspect.get_annotations(fn).get(parameter)
    if annotation is None:
        return dict[str, Any]
    only = SimpleNamespace(__annotations__={parameter: annotation})
    source = inspect.unwrap(fn)
    try:
        hints = get_type_hints(
            only, globalns=getattr(source, "__globals__", {}), include_extras=True
        )
    except Exception as exc:
        # Evaluating a hint may raise anything (as the DI's reading of the others says):
        # a NameError, an attribute missing from a module ("mod.Typo"), a string that
        # is no expression (SyntaxError).
        raise ConfigurationError(
            f"actor {actor!r}: cannot read the payload type {annotation!r}: {exc}. Define or "
            f"import it before the actor, outside `if TYPE_CHECKING`"
        ) from exc
    return hints[parameter]


def validation_problems(exc: ValidationError, whole: str) -> str:
    """Each error of ``exc`` as ``field: message`` on one line (``whole`` names the value
    itself when an error has no field)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or whole}: {err['msg']}" for err in exc.errors()
    )


def actors_by_name(actors: Iterable[Actor[..., Any]]) -> dict[str, Actor[..., Any]]:
    """``actors`` by name; ``ConfigurationError`` when two share one."""
    if isinstance(actors, Actor) or not isinstance(actors, Iterable):
        # One actor for the list raised "'Actor' object is not iterable".
        raise ConfigurationError(
            f"actors takes a list of actors, not {actors!r}: write actors=[{actors!r}, ...]"
        )
    named: dict[str, Actor[..., Any]] = {}
    for a in actors:
        if not isinstance(a, Actor):
            raise ConfigurationError(
                f"{a!r} is not an actor: decorate the function with @actor before passing it"
            )
        if named.get(a.name) is a:
            # Renaming, as the message below says, cannot part an actor from itself.
            raise ConfigurationError(f"actor {a.name!r} is listed twice in actors; list it once")
        if a.name in named:
            raise ConfigurationError(
                f"two actors are named {a.name!r}; give one an explicit @actor(name=...)"
            )
        named[a.name] = a
    return named
