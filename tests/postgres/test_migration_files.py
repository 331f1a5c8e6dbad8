"""The migration files and their loader, without a database."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from taskq_postgres._migrate import (
    NO_TRANSACTION_DIRECTIVE,
    Migration,
    MigrationError,
    bundled_migrations,
    load_migrations,
)


def _write(directory: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def test_bundled_migrations_are_all_transactional() -> None:
    # Bundled files must stay transactional (architecture.md, job_events
    # outbox): operators run CONCURRENTLY builds by hand instead.
    migrations = load_migrations()
    assert migrations
    offenders = [m.name for m in migrations if not m.transactional]
    assert offenders == []


def test_bundled_migrations_start_with_the_initial_schema() -> None:
    names = [m.name for m in load_migrations()]
    assert names[0] == "01.00.00_01_pre_initial.sql"
    assert "01.00.02_01_pre_job_events_outbox.sql" in names


def test_bundled_directory_is_the_repository_migrations_folder() -> None:
    repo_migrations = Path(__file__).resolve().parents[2] / "migrations"
    bundled = {entry.name for entry in bundled_migrations().iterdir()}
    assert bundled == {p.name for p in repo_migrations.iterdir()}


def test_pre_files_come_before_post_files_then_version_then_seq(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "01.00.00_50_post_drop_old.sql": "",
            "01.00.00_02_pre_b.sql": "",
            "01.00.00_01_pre_a.sql": "",
            "1.10.0_01_pre_newer.sql": "",
            "1.9.0_01_pre_older.sql": "",
            "00.09.00_50_post_first_post.sql": "",
            "README.md": "not a migration",
        },
    )
    assert [m.name for m in load_migrations(tmp_path)] == [
        "01.00.00_01_pre_a.sql",
        "01.00.00_02_pre_b.sql",
        "1.9.0_01_pre_older.sql",
        "1.10.0_01_pre_newer.sql",
        "00.09.00_50_post_first_post.sql",
        "01.00.00_50_post_drop_old.sql",
    ]


@pytest.mark.parametrize(
    "name",
    [
        "initial.sql",
        "01.00.00_pre_initial.sql",
        "01.00.00_01_during_initial.sql",
        "01.00_01_pre_initial.sql",
        "01.00.00_01_pre_Initial.sql",
        "01.00.00_01_pre_.sql",
    ],
)
def test_a_misnamed_sql_file_is_an_error_not_skipped(tmp_path: Path, name: str) -> None:
    _write(tmp_path, {name: "SELECT 1;"})
    with pytest.raises(MigrationError, match="does not follow"):
        load_migrations(tmp_path)


def test_render_replaces_only_the_schema_token() -> None:
    migration = Migration.from_file(
        "01.00.00_01_pre_x.sql",
        "CREATE TABLE {schema}.t (j jsonb DEFAULT '{}', c text CHECK (c ~ '^[a-f]{64}$'));"
        " -- {other} {schema_x}",
    )
    assert migration.render("tq") == (
        "CREATE TABLE tq.t (j jsonb DEFAULT '{}', c text CHECK (c ~ '^[a-f]{64}$'));"
        " -- {other} {schema_x}"
    )


def test_checksum_is_sha256_of_the_rendered_sql() -> None:
    import hashlib

    migration = Migration.from_file("01.00.00_01_pre_x.sql", "SELECT '{schema}';")
    assert migration.checksum("a") == hashlib.sha256(b"SELECT 'a';").hexdigest()
    assert migration.checksum("a") != migration.checksum("b")


@pytest.mark.parametrize(
    ("text", "transactional"),
    [
        (f"{NO_TRANSACTION_DIRECTIVE}\nCREATE INDEX CONCURRENTLY i ON {{schema}}.t (c);", False),
        (f"{NO_TRANSACTION_DIRECTIVE}  \r\nSELECT 1;", False),
        (f"-- a comment\n{NO_TRANSACTION_DIRECTIVE}\nSELECT 1;", True),
        ("SELECT 1;", True),
        ("", True),
    ],
)
def test_no_transaction_directive_counts_on_the_first_line_only(
    text: str, transactional: bool
) -> None:
    assert Migration.from_file("01.00.00_01_pre_x.sql", text).transactional is transactional


RELEASED = Path(__file__).resolve().with_name("released_migrations.sha256")
"""``sha256sum`` lines (hash, two spaces, name) of every migration file committed:
``cd migrations && sha256sum -c ../tests/postgres/released_migrations.sha256``."""


def _released() -> dict[str, str]:
    lines = RELEASED.read_text(encoding="utf-8").splitlines()
    pairs = [line.split("  ", 1) for line in lines if line.strip()]
    return {name: digest for digest, name in pairs}


def test_released_migration_files_never_change() -> None:
    # A schema that applied the released bytes never runs the file again: an edit
    # reaches new schemas only (the old ones merely log a checksum drift).
    bundled = {
        entry.name: hashlib.sha256(entry.read_bytes()).hexdigest()
        for entry in bundled_migrations().iterdir()
        if entry.name.endswith(".sql")
    }
    released = _released()
    problems = [
        f"{name} changed since it was released: put it back as it was and make the "
        f"change in a new migration file (migrations/README.md)"
        for name, digest in released.items()
        if name in bundled and bundled[name] != digest
    ]
    problems += [
        f"{name} was released and is gone: put it back (schemas have applied it); "
        f"a later file may undo what it did"
        for name in released.keys() - bundled.keys()
    ]
    problems += [
        f"{name} is new: add the line '{bundled[name]}  {name}' to "
        f"{RELEASED.relative_to(RELEASED.parents[2])} (once released, the file may not change)"
        for name in sorted(bundled.keys() - released.keys())
    ]
    assert not problems, "\n".join(problems)


def test_the_released_list_is_in_sha256sum_format() -> None:
    for line in RELEASED.read_text(encoding="utf-8").splitlines():
        digest, name = line.split("  ", 1)
        assert len(digest) == 64 and set(digest) <= set("0123456789abcdef"), line
        Migration.from_file(name, "")  # a well-formed name
