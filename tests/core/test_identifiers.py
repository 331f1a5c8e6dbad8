"""The one home of identifier validation."""

from __future__ import annotations

import pytest

from taskq.identifiers import (
    MAX_IDENTIFIER_BYTES,
    MAX_SCHEMA_NAME_BYTES,
    check_identifier,
    validate_schema_name,
)


@pytest.mark.parametrize("name", ["taskq", "_x", "tenant_42", "a" * MAX_SCHEMA_NAME_BYTES])
def test_plain_identifiers_pass(name: str) -> None:
    assert validate_schema_name(name) == name


def test_a_schema_name_comes_back_as_postgres_folds_it() -> None:
    # One spelling for every name derived from it (channels, lock keys).
    assert validate_schema_name("Tenant_42") == "tenant_42"


@pytest.mark.parametrize("name", ["order", "ORDER", "all", "user", "left", "system_user"])
def test_reserved_key_words_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="reserved SQL key word"):
        validate_schema_name(name)


@pytest.mark.parametrize(
    "name", ["time", "int", "values", "row", "interval", "none", "boolean", "Timestamp", "out"]
)
def test_key_words_that_cannot_name_a_type_are_refused(name: str) -> None:
    # They passed, then the first migration failed with a syntax error (`c int.job_status`,
    # `time.jobs`), leaving a half-made schema.
    with pytest.raises(ValueError, match="reserved SQL key word"):
        validate_schema_name(name)


@pytest.mark.parametrize("name", ["name", "type", "version", "schema", "data"])
def test_key_words_postgres_takes_as_names_pass(name: str) -> None:
    assert validate_schema_name(name) == name


@pytest.mark.parametrize("name", ["information_schema", "INFORMATION_SCHEMA"])
def test_the_standard_catalog_schema_is_refused(name: str) -> None:
    # pg_dump leaves it out of every backup: the jobs there were lost on a restore.
    with pytest.raises(ValueError, match="pg_dump leaves it out"):
        validate_schema_name(name)


@pytest.mark.parametrize("name", ["pg_foo", "PG_taskq"])
def test_postgres_own_schema_prefix_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="starts with pg_"):
        validate_schema_name(name)


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
