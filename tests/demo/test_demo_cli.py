"""``taskq demo``'s flags and messages, on the in-memory backend or with no backend at all."""

from __future__ import annotations

import io
import random
import sys
from pathlib import Path

import pytest

from taskq._dsn import NO_DSN_MESSAGE, resolve_dsn
from taskq.demo import ACTORS, BATCH_CHILDREN, MIN_JOBS, batch_done, plan, quick, tick
from taskq.errors import ConfigurationError
from tests.demo._support import taskq, taskq_without_pgserver


def test_without_the_embedded_extra_no_dsn_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pgserver", None)  # as if the extra were not installed
    monkeypatch.chdir(tmp_path)

    with pytest.raises(ConfigurationError) as raised:
        resolve_dsn(None, env={})

    assert str(raised.value) == NO_DSN_MESSAGE
    assert not (tmp_path / ".taskq").exists()


def test_flag_and_env_beat_the_embedded_default(tmp_path: Path) -> None:
    assert resolve_dsn("memory://flag", env={"TASKQ_DSN": "memory://env"}) == "memory://flag"
    assert resolve_dsn(None, env={"TASKQ_DSN": "memory://env"}) == "memory://env"


def test_demo_without_any_dsn_says_how_to_give_one(tmp_path: Path) -> None:
    result = taskq_without_pgserver("demo", cwd=tmp_path)

    assert result.returncode == 1
    # The demo needs no server at all: its error says so (the one the hint works for).
    assert result.stderr.splitlines() == [
        f"taskq: error: {NO_DSN_MESSAGE}; or --dsn memory:// to run the demo in this process"
    ]
    assert "--dsn" in NO_DSN_MESSAGE
    assert "TASKQ_DSN" in NO_DSN_MESSAGE
    assert not (tmp_path / ".taskq").exists()


def test_demo_on_memory_prints_a_summary_table(tmp_path: Path) -> None:
    result = taskq("demo", "--dsn", "memory://", "--jobs", str(MIN_JOBS), cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines[0] == ["taskq", "demo:", str(MIN_JOBS), "jobs", "in", "schema", "taskq_demo"]
    counts = {line[0]: int(line[1]) for line in lines if len(line) == 2 and line[1].isdigit()}
    assert set(counts) == {"succeeded", "failed", "cancelled", "crashed", "abandoned", "total"}
    assert counts.pop("total") == sum(counts.values()) == MIN_JOBS
    for label in ("wall time", "throughput", "run time", "enqueue -> start", "cron schedule"):
        assert any(line.strip().startswith(label) for line in result.stdout.splitlines()), label
    assert "embedded" not in result.stderr
    assert "warning" not in result.stderr  # its stop's graces fit its grace period
    assert "the jobs stay" not in result.stdout  # gone with the process
    assert not (tmp_path / ".taskq").exists()


@pytest.mark.parametrize("jobs", [str(MIN_JOBS - 1), "10001", "many"])
def test_demo_refuses_a_job_count_outside_its_range(tmp_path: Path, jobs: str) -> None:
    result = taskq("demo", "--dsn", "memory://", "--jobs", jobs, cwd=tmp_path)
    assert result.returncode == 1  # a usage error; 2 is a watchdog trip
    assert "--jobs" in result.stderr


def test_demo_refuses_an_invalid_schema_in_one_line(tmp_path: Path) -> None:
    result = taskq("demo", "--dsn", "memory://", "--schema", "a;b", cwd=tmp_path)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("taskq: error: --schema: invalid SQL identifier")


@pytest.mark.parametrize("jobs", [MIN_JOBS, 300])
def test_the_mix_holds_every_kind_and_adds_up(jobs: int) -> None:
    items, cancelled = plan(jobs, random.Random(7), tags=["t"])

    fan_out_children, batch_jobs = 5, BATCH_CHILDREN + 1
    assert len(items) + fan_out_children + batch_jobs == jobs
    assert {item.actor for item in items} == {a.name for a in ACTORS} - {batch_done.name, tick.name}
    assert all(item.options["tags"] == ["t"] for item in items)
    assert any("delay" in item.options for item in items)
    # the jobs to cancel are plain quick jobs, due at once
    assert cancelled
    assert all(items[i].actor == quick.name and "delay" not in items[i].options for i in cancelled)


def test_the_mix_needs_a_minimum_of_jobs() -> None:
    with pytest.raises(ValueError, match=f"at least {MIN_JOBS}"):
        plan(MIN_JOBS - 1, random.Random(0))


def test_a_plain_progress_log_shows_the_final_count_once() -> None:
    from taskq.cli._demo_cmd import _ProgressLine

    stream = io.StringIO()  # a pipe or a CI log: plain lines, no carriage returns
    progress = _ProgressLine(stream, 300)
    progress.show(9)
    progress._last_plain = None  # as if the plain line's interval had passed
    progress.show(300)
    progress.finish(300)

    assert stream.getvalue().splitlines() == [
        "taskq demo: [..............................] 9/300 jobs done",
        "taskq demo: [##############################] 300/300 jobs done",
    ]


def test_a_plain_progress_log_ends_on_the_final_count() -> None:
    from taskq.cli._demo_cmd import _ProgressLine

    stream = io.StringIO()
    progress = _ProgressLine(stream, 300)
    progress.show(9)
    progress.show(250)  # within the interval: not written
    progress.finish(300)

    assert stream.getvalue().splitlines()[-1].endswith(" 300/300 jobs done")
    assert len(stream.getvalue().splitlines()) == 2


async def test_a_blip_while_counting_finished_jobs_does_not_end_the_demo() -> None:
    # The progress line's read failed with the database's blip, and its task failed the
    # TaskGroup around the worker: the whole demo ended with a traceback.
    import asyncio
    from typing import Any

    from taskq.cli._demo_cmd import _ProgressLine, _watch
    from taskq.models import JobFilter

    read_again = asyncio.Event()

    class BlippingClient:
        calls = 0

        async def list_jobs(self, filters: JobFilter) -> list[Any]:
            self.calls += 1
            if self.calls == 1:
                raise ConnectionResetError("connection reset by peer")
            read_again.set()
            return [object()] * 7

    stream = io.StringIO()
    progress = _ProgressLine(stream, 300)
    watcher = asyncio.create_task(_watch(BlippingClient(), JobFilter(), progress))  # type: ignore[arg-type]
    await asyncio.wait_for(read_again.wait(), 10)
    await asyncio.sleep(0)
    assert not watcher.done()
    watcher.cancel()
    assert stream.getvalue().splitlines() == [
        "taskq demo: [..............................] 7/300 jobs done"
    ]


async def test_a_bug_while_counting_finished_jobs_is_not_taken_for_a_blip() -> None:
    # asyncpg's InterfaceError is transient, but a plugin calls "another operation is in
    # progress" the calling code's fault: each look swallowed it, as the worker would
    # retry it, where a command shows it with its traceback.
    from typing import Any

    import asyncpg

    from taskq.cli._demo_cmd import _ProgressLine, _watch
    from taskq.models import JobFilter

    class BusyClient:
        calls = 0

        async def list_jobs(self, filters: JobFilter) -> list[Any]:
            self.calls += 1
            if self.calls > 1:
                raise LookupError("looked again: the bug was swallowed")
            raise asyncpg.InterfaceError(
                "cannot perform operation: another operation is in progress"
            )

    progress = _ProgressLine(io.StringIO(), 300)
    with pytest.raises(asyncpg.InterfaceError, match="another operation"):
        await _watch(BusyClient(), JobFilter(), progress)  # type: ignore[arg-type]


def test_ctrl_c_before_the_worker_starts_is_said_in_one_line(tmp_path: Path) -> None:
    from tests.demo._support import taskq_interrupted_while_enqueueing

    result = taskq_interrupted_while_enqueueing("demo", "--dsn", "memory://", cwd=tmp_path)

    assert result.returncode == 1
    # No jobs to point at: they were in that process only. (In memory the enqueueing
    # never waits, so the cancel lands once the worker's first steps do: a progress line
    # may come first.)
    assert result.stderr.splitlines()[-1] == "taskq demo: interrupted before its worker started"
    assert "Traceback" not in result.stderr


def test_ctrl_c_while_its_server_starts_is_said_in_the_demos_words(tmp_path: Path) -> None:
    # The embedded server starts as the DSN is resolved (taskq-postgres's plugin), before
    # the demo's own Ctrl-C message applied: the generic one said a change may have
    # been made and pointed at `taskq jobs list`, in the default schema.
    import subprocess
    import sys

    from tests.demo._support import user_env

    code = (
        "import os, signal, sys\n"
        "import taskq._dsn\n"
        "def starting(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return 'memory://'\n"
        "taskq._dsn.resolve_dsn = starting\n"
        "from taskq.cli import main\n"
        "sys.exit(main(['demo']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=tmp_path,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "taskq demo: interrupted before its worker started"
    assert "Traceback" not in result.stderr
