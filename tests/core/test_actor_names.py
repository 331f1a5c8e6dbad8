"""An application's actors are known by name: two may not share one, and each is an actor."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from taskq import Actor, Context, TaskQ, actor
from taskq.errors import ConfigurationError


def _named(name: str) -> Actor[..., Any]:
    @actor(name=name)
    async def job(payload: dict[str, Any]) -> None:
        return None

    return job


def test_two_actors_with_one_name_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match=r"two actors are named 'twin'.*@actor\(name="):
        TaskQ("memory://", actors=[_named("twin"), _named("twin")])


def test_one_actor_listed_twice_is_refused_saying_so() -> None:
    # It said to give one of the two an explicit name: the same actor cannot have two.
    twice = _named("twice")
    with pytest.raises(ConfigurationError, match="actor 'twice' is listed twice in actors"):
        TaskQ("memory://", actors=[twice, twice])


def test_actors_are_looked_up_by_their_names() -> None:
    first, second = _named("first"), _named("second")
    assert TaskQ("memory://", actors=[first, second]).actors == {"first": first, "second": second}


def test_a_plain_function_is_refused_with_the_fix() -> None:
    async def job(payload: dict[str, Any]) -> None:
        return None

    with pytest.raises(ConfigurationError, match="is not an actor: decorate the function"):
        TaskQ("memory://", actors=[job])  # type: ignore[list-item]


def test_one_actor_given_for_the_list_is_refused_with_the_fix() -> None:
    # It raised TypeError: 'Actor' object is not iterable.
    one = _named("one")
    with pytest.raises(
        ConfigurationError, match=r"actors takes a list of actors.*actors=\[<Actor one"
    ):
        TaskQ("memory://", actors=one)  # type: ignore[arg-type]


def test_a_name_given_as_a_positional_argument_is_refused_with_the_fix() -> None:
    # It raised AttributeError: 'str' object has no attribute '__qualname__'.
    with pytest.raises(ConfigurationError, match=r"options are keywords, as in @actor\(name='x'\)"):
        actor("x")  # type: ignore[call-overload]


def test_an_empty_name_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="name must not be empty"):
        _named("")


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"name": "n\x00ul"}, "actor: .*must not contain NUL"),
        ({"name": "n" * 257}, "actor: .*at most 256 bytes"),
        ({"queue": ""}, "queue: String should have at least 1 character"),
        ({"queue": "a\x00b"}, "queue: .*must not contain NUL"),
        ({"timeout": 40_000 * 86_400}, "timeout: .*must be at most 36500 days"),
        ({"result_ttl": float("nan")}, "result_ttl takes a timedelta or seconds"),
        ({"schedule_to_close": 1e30}, "schedule_to_close takes a timedelta or seconds"),
        ({"timeout": True}, "timeout takes a timedelta or seconds, got True"),
        # Wrong types passed the decoration, then failed every enqueue or the worker's
        # start (a raw TypeError, or a pydantic error about ActorConfig).
        ({"name": 123}, "name must not be empty.*got 123"),
        ({"max_attempts": "3"}, "max_attempts must be a whole number between 1 and"),
        ({"max_attempts": 2.5}, "max_attempts must be a whole number"),
        ({"max_attempts": 0}, "max_attempts must be a whole number between 1 and"),
        ({"priority": "high"}, "priority must be a whole number"),
        ({"priority": 2**31}, "priority must be a whole number between -2147483648"),
        ({"max_concurrent": 1.5}, "max_concurrent must be a whole number between 1"),
        ({"max_concurrent": 0}, "max_concurrent must be a whole number between 1"),
        ({"max_pending": 2.5}, "max_pending must be a whole number between 0"),
        ({"max_pending": True}, "max_pending must be a whole number"),
        ({"identity_key": "id"}, r"identity_key must be callable \(payload -> key"),
        ({"retry_backoff": "exp"}, r"retry_backoff must be callable \(a taskq.retry backoff"),
    ],
)
def test_options_no_enqueue_could_take_are_refused_at_the_decoration(
    options: dict[str, Any], error: str
) -> None:
    # Accepted, they made every enqueue fail, blaming options its caller never gave.
    with pytest.raises(ConfigurationError, match=error):

        @actor(**options)
        async def job(payload: dict[str, Any]) -> None:
            return None


_LATER_TYPES = '''
from __future__ import annotations
from taskq import actor

@actor(name="uses_store")
async def uses_store(payload: Order, store: Store) -> None:
    return None

class Store:
    """Defined after the actor, as the worker reads it at its start."""
'''


def test_only_the_payload_type_is_read_at_the_decoration() -> None:
    # Every hint was read at the decoration: an injected type defined later in the
    # module (or imported under TYPE_CHECKING) raised a bare NameError there.
    namespace: dict[str, Any] = {"Order": dict[str, int]}
    exec(_LATER_TYPES, namespace)  # noqa: S102 - a module of its own, written here
    assert namespace["uses_store"].payload_type == dict[str, int]
    del namespace["Order"]
    with pytest.raises(ConfigurationError, match="cannot read the payload type 'Order'"):
        exec(_LATER_TYPES, namespace)  # noqa: S102


@pytest.mark.parametrize("payload_type", [int, str, list[int]])
def test_a_payload_type_that_is_no_json_object_is_refused_at_the_decoration(
    payload_type: Any,
) -> None:
    # It passed, and every enqueue then failed ("must serialise to a JSON object").
    with pytest.raises(ConfigurationError, match="the payload is stored as a JSON object"):
        actor(name="scalar")(_taking(payload_type))


def _taking(payload_type: Any) -> Any:
    async def job(payload: Any) -> None:
        return None

    job.__annotations__["payload"] = payload_type
    return job


def test_signatures_no_worker_could_run_are_refused_at_the_decoration() -> None:
    # Each passed @actor and stopped the worker's start (or failed every job).
    async def positional_only(payload: dict[str, Any], /) -> None:
        return None

    async def generator(payload: dict[str, Any]) -> AsyncIterator[int]:
        yield 1

    async def context_first(ctx: Context) -> None:
        return None

    # Callable: the three functions' shapes differ, and their join is a bare `function`.
    cases: list[tuple[Callable[..., Any], str]] = [
        (positional_only, "the first parameter must be the payload, an ordinary parameter"),
        (generator, "is a generator function; an actor returns its result"),
        (context_first, "pydantic cannot validate <class 'taskq.context.Context'>"),
    ]
    for fn, error in cases:
        with pytest.raises(ConfigurationError, match=error):
            actor(name="unrunnable")(fn)


@pytest.mark.parametrize("annotation", ["pytest.Typo", "dict[str, int"])
def test_any_unevaluable_payload_type_names_the_actor_and_the_hint(annotation: str) -> None:
    # An attribute missing from a module, or a hint that is no expression, escaped from
    # the decoration as a bare AttributeError / SyntaxError, naming no actor.
    hint = re.escape(repr(annotation))
    with pytest.raises(
        ConfigurationError, match=f"actor 'typo': cannot read the payload type {hint}"
    ):
        actor(name="typo")(_taking(annotation))
