"""What the commands read from their arguments: a JSON value, and the schema."""

from __future__ import annotations

import json
import os
from typing import Any, NoReturn

from taskq.errors import ConfigurationError
from taskq.identifiers import validate_schema_name

__all__ = ["json_argument", "schema_argument"]


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number; store it as a string or null")


def json_argument(text: str) -> Any:
    """``text`` as JSON; ``ValueError`` with the reason for anything a job could not
    store (``NaN``, which Python's parser takes; an integer past 4,300 digits; nesting
    deeper than the parser's stack), where each raised a traceback."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None


def schema_argument(flag: str | None, default: str) -> str:
    """The schema ``--schema`` names, else ``TASKQ_SCHEMA``, else ``default``;
    ``ConfigurationError`` naming whichever gave a bad one."""
    env = os.environ.get("TASKQ_SCHEMA")
    if flag:
        schema, source = flag, "--schema"
    elif env:
        schema, source = env, "TASKQ_SCHEMA"
    else:
        schema, source = default, "the schema"
    try:
        return validate_schema_name(schema)
    except ValueError as exc:
        raise ConfigurationError(f"{source}: {exc}") from None
