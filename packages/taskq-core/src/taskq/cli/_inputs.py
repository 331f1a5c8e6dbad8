"""What the commands read from their arguments: a JSON value, a name to match, an
application."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, NoReturn

from taskq.backend.storable import dump_json

if TYPE_CHECKING:
    from taskq.app import TaskQ

__all__ = ["import_app", "json_argument", "name_argument"]


def import_app(spec: str) -> TaskQ:
    """The application ``spec`` (``module:attribute``) names, imported; then the standard
    library's records routed as TaskQ's, unless the application configured ``logging``
    as it was imported (its set-up wins, as in ``taskq-worker``). :func:`taskq.cli.main`
    leaves the routing of a command given an APP to this."""
    from taskq.logs import route_stdlib_logging
    from taskq.worker.cli import load_app

    app = load_app(spec)
    route_stdlib_logging()
    return app


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
