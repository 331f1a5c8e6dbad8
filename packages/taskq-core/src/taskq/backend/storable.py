"""What a backend can store: JSON as text, strings without NUL characters or lone
surrogates, and times a delay of at most a century away.

Postgres, the reference store, rejects NUL (``\\x00``) in ``text`` and ``\\u0000``
in ``jsonb``, and text that is not UTF-8 (a lone surrogate such as ``\\udcff``, which
``os.fsdecode`` makes of a file name's undecodable bytes); JSON has no NaN or
Infinity. A terminal write must not fail over a stray NUL in a result, or a NUL or
surrogate in an error message, so those are stored as U+FFFD; a NaN, an infinite
number or a surrogate in JSON is refused (a replacement would lose what a payload
meant: the file name). Every backend stores through these functions, so a job holds
the same values on each.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any, Final, NoReturn, TypeVar, overload

from pydantic_core import PydanticSerializationError, from_json, to_json

from taskq.errors import UnstorableValueError
from taskq.models import MAX_DURATION, ErrorInfo

__all__ = [
    "MAX_JSON_BYTES",
    "REPLACEMENT_CHARACTER",
    "check_delay",
    "clean_text",
    "dump_json",
    "load_json",
    "stored_error",
    "stored_json",
]

REPLACEMENT_CHARACTER: Final = "\ufffd"

# A \u0000 escape that is not itself escaped: preceded by an even number of backslashes.
_JSON_NUL: Final = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")

MAX_JSON_BYTES: Final = 268_435_455
"""The largest JSON value (payload, result, progress, metadata) a job holds, as UTF-8
text: PostgreSQL's jsonb limit, enforced on every backend."""
_MAX_INT_DIGITS: Final = 4300
"""The longest integer the JSON reader takes back (as Python's ``int`` from text)."""
_LONG_DIGIT_RUN: Final = re.compile(f"[0-9]{{{_MAX_INT_DIGITS + 1}}}")

_MAX_DEPTH: Final = 254
"""The deepest nesting of arrays and objects the JSON writer takes."""

_TOO_DEEP: Final = (
    f"a JSON value nested more than {_MAX_DEPTH} levels deep (arrays and objects within "
    f"each other) cannot be stored: flatten it, or send that part as a string"
)

_SURROGATE: Final = re.compile("[\ud800-\udfff]")

_V = TypeVar("_V")


@overload
def clean_text(value: str) -> str: ...
@overload
def clean_text(value: None) -> None: ...
@overload
def clean_text(value: str | None) -> str | None: ...
def clean_text(value: str | None) -> str | None:
    """``value`` with NUL characters and lone surrogates replaced by U+FFFD."""
    if value is None:
        return value
    if "\x00" in value:
        value = value.replace("\x00", REPLACEMENT_CHARACTER)
    if value.isascii():
        return value
    return _SURROGATE.sub(REPLACEMENT_CHARACTER, value)


def stored_error(error: ErrorInfo) -> ErrorInfo:
    """``error`` as a backend stores it (its texts through :func:`clean_text`): what a
    worker compares the row it wrote with."""
    return ErrorInfo(
        error_class=clean_text(error.error_class),
        message=clean_text(error.message),
        traceback=clean_text(error.traceback),
    )


def dump_json(value: Any) -> str:
    """``value`` as the JSON text a backend stores (``\\u0000`` escapes replaced);
    :class:`~taskq.errors.UnstorableValueError` (a ``ValueError``) for a NaN or
    infinite number, which JSON cannot hold, for text with a lone surrogate, which no
    store can hold, for an integer of more than 4,300 digits, which could be stored
    but never read back, for arrays and objects nested more than 254 deep, and for a
    value of more than :data:`MAX_JSON_BYTES`.

    pydantic-core's serializer: compact, UTF-8 as is, and about ten times faster than
    ``json.dumps`` on a small object (it runs for every payload a COPY enqueues).
    """
    try:
        raw = to_json(value)
    except PydanticSerializationError as exc:
        if "Maximum serialization depth" in str(exc):
            raise UnstorableValueError(_TOO_DEEP) from None
        if "surrogates not allowed" not in str(exc):
            # A value JSON has no form for (an object, bytes that are no UTF-8): the
            # serializer's own error was no TaskQError and said nothing of what to send.
            raise UnstorableValueError(
                f"a value cannot be stored as JSON ({exc}): send JSON values (text, "
                f"numbers, booleans, None, lists and dicts of them), converted yourself "
                f"(str(value), value.isoformat(), base64 for bytes)"
            ) from None
        raise UnstorableValueError(
            "text with a lone surrogate (such as '\\udcff', what os.fsdecode makes of "
            "undecodable bytes) cannot be stored as JSON: decode it with errors='replace', "
            "or send the bytes base64-encoded"
        ) from None
    if len(raw) > MAX_JSON_BYTES:
        # Accepted in memory, refused by Postgres with a driver's error (or a dropped
        # connection past 1 GB): one limit on every backend, said in its own words.
        raise UnstorableValueError(
            f"a JSON value of {len(raw):,} bytes cannot be stored: at most {MAX_JSON_BYTES:,} "
            f"(PostgreSQL's jsonb); store large data elsewhere (a file, an object store) "
            f"and pass its address"
        )
    text = raw.decode()
    if "NaN" in text or "Infinity" in text:
        # Maybe only inside strings: the parser tells a bare constant apart.
        json.loads(text, parse_constant=_refuse_constant)
    if len(text) > _MAX_INT_DIGITS and _LONG_DIGIT_RUN.search(text):
        # Maybe only inside a string: the reader tells a number apart.
        _refuse_unreadable(text)
    if "\\u0000" not in text:
        return text
    return _JSON_NUL.sub(r"\1\\ufffd", text)


def _refuse_constant(constant: str) -> NoReturn:
    raise UnstorableValueError(
        f"{constant} is not a JSON number, and jobs store JSON: "
        f"send None or a string for it instead"
    )


def _refuse_unreadable(text: str) -> None:
    try:
        from_json(text)
    except ValueError:
        raise UnstorableValueError(
            f"an integer of more than {_MAX_INT_DIGITS} digits cannot be read back from "
            f"JSON: send it as a string instead"
        ) from None


def load_json(text: str | None) -> Any:
    """Stored JSON text read back; None (SQL NULL) stays None. Numbers come back as
    Postgres's ``jsonb`` keeps them (it stores decimals, written without an exponent):
    a float of 1e16 or more is an ``int``, ``-0.0`` is ``0.0``, so a job's values
    read the same from every backend and from the row its enqueue returned."""
    if text is None:
        return None
    try:
        value = from_json(text)
    except ValueError as exc:
        if "recursion limit" not in str(exc):
            raise
        # pydantic-core's reader stops at 200 levels, its writer at 254: a value the
        # writer took is read the slow way (it poisoned every dispatch that took it).
        value = json.loads(text)
    if "e+" in text or "-0.0" in text:  # maybe only inside strings: the walk tells
        return _as_jsonb_numbers(value)
    return value


def _as_jsonb_numbers(value: Any) -> Any:
    if isinstance(value, float):
        if value == 0.0:
            return 0.0
        # As jsonb: the decimal the text wrote (1e+300 is 10**300 exactly).
        return int(Decimal(repr(value))) if abs(value) >= 1e16 else value
    if isinstance(value, dict):
        return {k: _as_jsonb_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_jsonb_numbers(item) for item in value]
    return value


def stored_json(value: _V) -> _V:
    """``value`` as a backend holds it once stored and read back (what :func:`dump_json`
    makes of it: NULs replaced, tuples as lists, dates as ISO strings, …), a copy
    the caller's later mutations cannot reach. For stores that keep objects."""
    result: _V = load_json(dump_json(value))
    return result


def check_delay(delay: timedelta) -> timedelta:
    """``delay`` if a job may be put off by it: ``ValueError`` below zero or above
    :data:`~taskq.models.MAX_DURATION` (a century), whose times a job could not hold
    (Postgres would store a year past 9999 that no reader can decode)."""
    if not timedelta(0) <= delay <= MAX_DURATION:
        raise ValueError(f"a delay must be between 0 and {MAX_DURATION.days} days, got {delay}")
    return delay
