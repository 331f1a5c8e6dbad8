"""``taskq demo`` against a server and schema given on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskq_testing.postgres import PgSchema
from tests.demo._support import expected_statuses, taskq

JOBS = 40


@pytest.mark.postgres
def test_demo_runs_on_the_given_schema_and_reruns_alike(
    pg_schema: PgSchema, tmp_path: Path
) -> None:
    args = ("demo", "--dsn", pg_schema.dsn, "--schema", pg_schema.name, "--jobs", str(JOBS))
    # The second run finds the first one's jobs in the schema and reports its own only.
    for _ in range(2):
        result = taskq(*args, "--json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "embedded" not in result.stderr
        summary = json.loads(result.stdout)
        assert summary["schema"] == pg_schema.name
        assert summary["jobs"] == JOBS
        assert summary["statuses"] == expected_statuses(JOBS)
    assert not (tmp_path / ".taskq").exists()
