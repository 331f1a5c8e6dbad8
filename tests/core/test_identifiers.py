"""The one home of identifier validation."""

from __future__ import annotations

import pytest

from taskq.identifiers import (
    MAX_IDENTIFIER_BYTES,
    MAX_SCHEMA_NAME_BYTES,
    check_identifier,
    validate_schema_name,
)


@pytest.mark.parametrize("name", ["taskq", "_x", "Tenant_42", "a" * MAX_SCHEMA_NAME_BYTES])
def test_plain_identifiers_pass(name: str) -> None:
    assert validate_schema_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "1abc",
        "x; drop table jobs",
        'x"',
        "x'",
        "taskq\n",  # `$` in a ^...$ regex would let this through
        "tаskq",  # Cyrillic а
        "ｔaskq",  # fullwidth t
        "a b",
        "a-b",
        "a" * (MAX_SCHEMA_NAME_BYTES + 1),
    ],
)
def test_unsafe_or_too_long_schema_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="invalid SQL identifier|too long"):
        validate_schema_name(name)


def test_identifier_limit_is_postgres_namedatalen() -> None:
    check_identifier("a" * MAX_IDENTIFIER_BYTES)
    with pytest.raises(ValueError, match="63-byte"):
        check_identifier("a" * (MAX_IDENTIFIER_BYTES + 1))


def test_derived_channel_names_fit() -> None:
    longest = "a" * MAX_SCHEMA_NAME_BYTES
    assert len(f"taskq_events_{longest}") <= MAX_IDENTIFIER_BYTES
    assert len(f"taskq_wake_{longest}") <= MAX_IDENTIFIER_BYTES
