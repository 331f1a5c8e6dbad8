"""What the commands read from their arguments: a JSON value, a name to match."""

from __future__ import annotations

import argparse
import json
from typing import Any, NoReturn

from taskq.backend.storable import dump_json

__all__ = ["json_argument", "name_argument"]


def name_argument(text: str) -> str:
    """An argparse type for a name matched against stored ones (an actor, a queue):
    ``text`` when a store could hold it, a usage error otherwise (bytes the locale
    cannot decode, which Python gives as lone surrogates: a pydantic or driver
    traceback where they reached the filter)."""
    from taskq.models import check_key_text

    try:
        check_key_text(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; check the shell's locale (LANG)") from None
    return text


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number; store it as a string or null")


def json_argument(text: str) -> Any:
    """``text`` as JSON; ``ValueError`` with the reason for anything a job could not
    store (``NaN``, which Python's parser takes; a number past a float's range, read as
    infinity; a lone surrogate escape; an integer past 4,300 digits; nesting deeper
    than the parser's stack), where each raised a traceback."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    dump_json(value)  # what no backend can store, said now (1e400, "\ud800")
    return value
