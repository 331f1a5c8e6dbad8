"""Rendering for the ``taskq`` commands: aligned text tables, times, durations and JSON.

Text output is for people (aligned, long cells cut short); ``--json`` output
is for scripts and carries every field in full.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["compact", "format_duration", "format_time", "print_json", "table"]

_ELLIPSIS = "..."  # ASCII: a terminal with a non-UTF-8 encoding must not break the output

# C0 and C1 controls, DEL, and the bidirectional overrides: stored text (a queue name, a
# cancel reason) is anyone's, and printed raw it could retitle or clear the operator's
# terminal, or show one text as another.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _printable(text: str) -> str:
    """``text`` with the characters a terminal would act on written as escapes."""
    return _UNPRINTABLE.sub(_escaped, text) if not text.isprintable() else text


def print_json(value: Any) -> None:
    """Print ``value`` (pydantic models, or lists and dicts of them) as indented JSON."""
    from pydantic_core import to_jsonable_python

    print(json.dumps(to_jsonable_python(value), indent=2))


def format_time(value: datetime | None, *, ms: bool = False) -> str:
    """A UTC time, ``2024-05-01T12:00:03Z`` (``…03.250Z`` with ``ms``); empty for None."""
    if value is None:
        return ""
    return value.astimezone(UTC).isoformat(timespec="milliseconds" if ms else "seconds")[:-6] + "Z"


def format_duration(value: timedelta | None) -> str:
    """A duration at a precision fit for its size: ``850ms``, ``2.35s``, ``4m05s``, ``1h02m``."""
    if value is None:
        return ""
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def compact(value: Any, limit: int | None = None) -> str:
    """``value`` on one line: text (strings, ids, enum values) as is with its whitespace
    collapsed and its control characters escaped, anything else as JSON; cut to
    ``limit`` characters when given."""
    from pydantic_core import to_jsonable_python

    plain = to_jsonable_python(value)
    text = _printable(" ".join(plain.split())) if isinstance(plain, str) else json.dumps(plain)
    return _cut(text, limit)


def _cut(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[: max(limit - len(_ELLIPSIS), 0)] + _ELLIPSIS


def _columns(text: str) -> int:
    """The terminal columns ``text`` takes: two for a wide (CJK) character, none for a
    combining mark or a format character, where ``len`` counted one each and the
    columns after such a cell came out of line. A mark by its category (``Mn``,
    ``Me``), not its combining class: Thai's and Devanagari's vowel signs have class 0."""
    if text.isascii():
        return len(text)
    import unicodedata

    return sum(
        0
        if unicodedata.category(c) in ("Mn", "Me", "Cf")
        else 2
        if unicodedata.east_asian_width(c) in "WF"
        else 1
        for c in text
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], max_width: int = 40) -> str:
    """``rows`` under ``headers`` in left-aligned columns two spaces apart; a cell longer
    than ``max_width`` is cut short. Trailing blanks are stripped from every line."""
    cells = [[_cut(_printable(" ".join(c.split())), max_width) for c in row] for row in rows]
    widths = [_columns(h) for h in headers]
    for row in cells:
        widths = [max(w, _columns(c)) for w, c in zip(widths, row, strict=True)]
    lines = [
        "  ".join(c + " " * (w - _columns(c)) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), *cells]
    ]
    return "\n".join(lines)
