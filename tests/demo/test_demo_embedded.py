"""``taskq demo`` with no DSN anywhere: it starts the embedded server under ./.taskq/."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.demo._support import expected_statuses, needs_pgserver, taskq

pytestmark = needs_pgserver

JOBS = 40


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """An empty working directory; whatever server the test starts there is stopped after."""
    yield tmp_path
    stopped = taskq("embedded", "stop", cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr


def test_demo_runs_on_the_embedded_server(project: Path) -> None:
    result = taskq("demo", "--jobs", str(JOBS), "--json", cwd=project)

    assert result.returncode == 0, result.stderr
    notices = [line for line in result.stderr.splitlines() if "embedded PostgreSQL" in line]
    assert notices == [
        (
            "taskq: no --dsn or TASKQ_DSN given; started an embedded PostgreSQL under ./.taskq/ "
            "(stop it with: taskq embedded stop)"
        )
    ]
    assert (project / ".taskq" / "pgdata" / "PG_VERSION").is_file()
    assert "Warning" not in result.stderr

    summary = json.loads(result.stdout)
    assert summary["schema"] == "taskq_demo"
    assert summary["jobs"] == JOBS
    assert summary["statuses"] == expected_statuses(JOBS)
    assert sum(summary["statuses"].values()) == JOBS
    # every job but the cancelled ones ran at least once; some ran more than once
    assert summary["attempts"] > JOBS - summary["statuses"]["cancelled"]
    assert summary["wall_seconds"] > 0
    assert summary["jobs_per_second"] > 0
    assert 0 < summary["run_seconds_median"] <= summary["run_seconds_p95"]
    assert summary["enqueue_to_start_seconds_median"] >= 0

    # stderr is a pipe here: plain progress lines, no carriage returns
    assert f"{JOBS}/{JOBS} jobs done" in result.stderr
    assert "\r" not in result.stderr

    status = json.loads(taskq("embedded", "status", "--json", cwd=project).stdout)
    assert status["running"] is True, "the server outlives the command that started it"
