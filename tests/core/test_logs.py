"""``bind_job_context``: a job's fields on every record inside, the outer context after;
``bind_job_fields``: the same fields, for a task that ends with the job."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from uuid import uuid4

import pytest
import structlog

from taskq import JobStatus
from taskq.logs import bind_job_context, bind_job_fields
from taskq.models import JobRow


def _job(actor: str) -> JobRow:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return JobRow(
        id=uuid4(),
        actor=actor,
        queue="default",
        status=JobStatus.RUNNING,
        payload={},
        priority=0,
        attempt=2,
        max_attempts=3,
        created_at=now,
        scheduled_at=now,
        identity_key="k",
    )


def test_the_job_fields_are_bound_inside_and_the_outer_values_come_back() -> None:
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(actor="outer", request="r1")
    job = _job("inner")
    try:
        with bind_job_context(job):
            inside = structlog.contextvars.get_contextvars()
        after = structlog.contextvars.get_contextvars()
    finally:
        structlog.contextvars.clear_contextvars()
    assert inside == {
        "actor": "inner",
        "request": "r1",
        "job_id": str(job.id),
        "queue": "default",
        "attempt": 2,
        "identity_key": "k",
        "trace_id": None,
    }
    assert after == {"actor": "outer", "request": "r1"}


def test_the_context_is_restored_when_the_job_raises() -> None:
    structlog.contextvars.clear_contextvars()
    try:
        try:
            with bind_job_context(_job("boom")):
                raise RuntimeError("actor failed")
        except RuntimeError:
            pass
        assert structlog.contextvars.get_contextvars() == {}
    finally:
        structlog.contextvars.clear_contextvars()


async def test_job_fields_bound_in_a_task_end_with_it() -> None:
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request="r1")
    job = _job("tasked")

    async def run_job() -> dict[str, object]:
        bind_job_fields(job)
        await asyncio.sleep(0)
        return structlog.contextvars.get_contextvars()

    try:
        inside = await asyncio.create_task(run_job())
        after = structlog.contextvars.get_contextvars()
    finally:
        structlog.contextvars.clear_contextvars()
    assert inside["job_id"] == str(job.id) and inside["request"] == "r1"
    assert after == {"request": "r1"}


def test_the_fields_bound_are_job_fields_in_structlogs_own_variables() -> None:
    # Set directly on structlog's variables (cheaper than bind_contextvars): the same
    # keys as job_fields, and structlog's own unbind and bind still reach them.
    from contextvars import copy_context

    from taskq.logs import job_fields

    job = _job("own")

    def bound() -> tuple[dict[str, object], dict[str, object]]:
        structlog.contextvars.clear_contextvars()
        bind_job_fields(job)
        fields = structlog.contextvars.get_contextvars()
        structlog.contextvars.unbind_contextvars("job_id")
        structlog.contextvars.bind_contextvars(actor="rebound")
        return fields, structlog.contextvars.get_contextvars()

    fields, after = copy_context().run(bound)
    assert fields == job_fields(job)
    assert after == {k: v for k, v in fields.items() if k != "job_id"} | {"actor": "rebound"}


def test_a_librarys_stdlib_records_are_json_lines_too() -> None:
    # asyncpg logs its pool's failures through `logging`: in an outage, multi-line
    # plain-text tracebacks came out among the JSON lines a log shipper reads.
    import json
    import subprocess
    import sys

    script = """
import logging
import structlog
from taskq.logs import configure_logging, route_stdlib_logging
configure_logging(json=True)
route_stdlib_logging()
try:
    raise ConnectionResetError("connection reset")
except ConnectionResetError:
    logging.getLogger("asyncpg.pool").warning("Failed to restore the pool", exc_info=True)
logging.getLogger("asyncpg").info("chatter below warning stays out")
structlog.get_logger("taskq").warning("taskq.own-record", n=1)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert [r["event"] for r in records] == [
        "Failed to restore the pool: ConnectionResetError('connection reset')",
        "taskq.own-record",
    ]
    assert records[0]["logger"] == "asyncpg.pool" and records[0]["level"] == "warning"
    # An error the driver handles itself (a restart's): one line, no traceback.
    assert "exception" not in records[0]


def test_an_applications_own_logging_set_up_is_kept() -> None:
    # The worker routed the library's records before importing the application, whose
    # logging.basicConfig then did nothing: its lines vanished, its format replaced.
    import subprocess
    import sys

    script = """
import logging
from taskq.logs import configure_logging, route_stdlib_logging
configure_logging(json=True)
logging.basicConfig(level=logging.INFO, format="APP %(levelname)s %(message)s")  # the app's
route_stdlib_logging()
logging.getLogger("app").info("hello")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stderr.splitlines() == ["APP INFO hello"]


def test_a_terminals_tracebacks_show_no_local_variables() -> None:
    # rich's tracebacks list each frame's variables: a provider's DSN on screen.
    import subprocess
    import sys

    script = """
import structlog
from taskq.logs import configure_logging
configure_logging(json=False)
def open_db():
    db_url = "postgresql://app:s3cr3t@db/app"
    raise ConnectionError("refused")
try:
    open_db()
except ConnectionError:
    structlog.get_logger("taskq").error("taskq.provider-failed", exc_info=True)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "ConnectionError" in done.stderr and "open_db" in done.stderr
    assert "s3cr3t" not in done.stderr


def test_a_worker_started_with_stderr_closed_runs() -> None:
    # Python gives such a process sys.stderr = None: the logging set-up's isatty()
    # raised AttributeError, and the worker exited 1 before starting, saying nothing.
    import subprocess
    import sys

    script = """
from taskq import TaskQ
from taskq.worker.cli import main
app = TaskQ("memory://")
raise SystemExit(main(["__main__:app", "--until-idle"]))
"""
    done = subprocess.run(
        ["sh", "-c", 'exec "$0" -c "$1" 2>&-', sys.executable, script],
        stdout=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout == ""  # the log lines went nowhere, not into stdout


def test_taskq_log_level_sets_the_commands_level() -> None:
    # The level was info whatever the environment said: the debug lines (a plugin's
    # traceback, which a hint asks to report) could not be had.
    import json
    import os
    import subprocess
    import sys

    script = """
import logging
import structlog
from taskq.logs import configure_logging, route_stdlib_logging
configure_logging(json=True)
route_stdlib_logging()
log = structlog.get_logger("taskq")
log.debug("taskq.a-debug-line")
log.info("taskq.an-info-line")
log.error("taskq.an-error-line")
logging.getLogger("asyncpg").warning("a library's warning")
"""

    def events(level: str) -> list[str]:
        env = {**os.environ, "TASKQ_LOG_LEVEL": level}
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env=env,
        )
        return [json.loads(line)["event"] for line in done.stderr.splitlines()]

    assert events("DEBUG") == [
        "taskq.a-debug-line",
        "taskq.an-info-line",
        "taskq.an-error-line",
        "a library's warning",
    ]
    assert events("error") == ["taskq.an-error-line"]
    assert events("") == ["taskq.an-info-line", "taskq.an-error-line", "a library's warning"]


_BAD_VARIABLES = [
    (
        "TASKQ_LOG_LEVEL",
        (
            "expected one of debug, info, warning, error, critical (in any case), or leave "
            "it unset for info"
        ),
    ),
    (
        "TASKQ_TRACE_PLUGINS",
        "expected true or false (or 1/0, yes/no, on/off, in any case), or leave it unset for false",
    ),
]


@pytest.mark.parametrize(("variable", "expected"), _BAD_VARIABLES)
@pytest.mark.parametrize("script", ["taskq-worker", "taskq"])
def test_an_invalid_variable_is_an_error_at_start_up_naming_it(
    script: str, variable: str, expected: str
) -> None:
    # As an invalid setting is: with a bad TASKQ_LOG_LEVEL a warning and info went unseen
    # by whoever asked for the warning (or error) lines alone, and the command ran on at a
    # level not asked for; with a bad TASKQ_TRACE_PLUGINS the trace was silently off.
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, variable: "verbose"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / script), "--help"],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1, done
    assert done.stdout == ""
    assert done.stderr == f"{script}: error: invalid setting {variable}='verbose': {expected}\n"


def test_events_routed_to_the_stdlib_with_their_fields_as_extra_are_logged() -> None:
    # structlog's recipe for the standard library (render_to_log_kwargs: the fields as
    # `extra`) raised "Attempt to overwrite 'name' in LogRecord" out of the SIGUSR2
    # dump (its field `name`), and out of a start stopped early (`created`).
    import json
    import subprocess
    import sys

    script = """
import asyncio
import json
import logging
import structlog
from taskq._di import ActorSpec, ProviderRegistry
from taskq._di.bootstrap import bootstrap
from taskq._di.scopes import ScopeContainer
from taskq._scope import Scope
from taskq.worker._stacks import dump_task_stacks

class Keep(logging.Handler):
    def emit(self, record):
        fields = {k: getattr(record, k, None) for k in ("task", "values", "left")}
        print(json.dumps({"event": record.getMessage(), **fields}))

logging.basicConfig(level=logging.DEBUG, handlers=[Keep()])
structlog.configure(
    processors=[structlog.stdlib.render_to_log_kwargs],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
)

class Model:
    pass

async def infer(payload: dict, model: Model) -> None:
    return None

async def main() -> None:
    dump_task_stacks("sigusr2")
    registry = ProviderRegistry()
    registry.register(Model, Model, scope=Scope.LOOP)
    stopping = asyncio.Event()
    stopping.set()
    actors = {"infer": ActorSpec(infer, ("payload",))}
    await bootstrap(registry, actors, {Scope.LOOP: ScopeContainer(Scope.LOOP)}, stopping=stopping)

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    stacks = [r for r in records if r["event"] == "taskq.task-stack"]
    assert [r["task"] for r in stacks] == ["Task-1"]
    stopped = [r for r in records if r["event"] == "taskq.di-bootstrap-stopped"]
    assert [(r["values"], r["left"]) for r in stopped] == [(0, 1)]
