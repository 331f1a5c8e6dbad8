"""PgQueuer on the same scenarios, driven through bench/_pgqueuer_driver.py in its own virtualenv.

The virtualenv lives under /tmp (nothing is added to the repository); it is
created on first use with ``python -m venv`` and ``pip install pgqueuer==1.6.0
asyncpg``. When that fails, every PgQueuer scenario reports ``skipped`` with the
reason instead of figures.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import asyncpg
import psycopg
from bench._common import Result, analyze
from psycopg import sql

from taskq.identifiers import check_identifier
from taskq_testing.postgres import unique_schema_name

VENV: Final = Path("/tmp/taskq-bench-pgqueuer-venv")
VERSION: Final = "1.6.0"
DRIVER: Final = Path(__file__).with_name("_pgqueuer_driver.py")
_INSTALL_TIMEOUT_S: Final = 300


class Unavailable(RuntimeError):
    """PgQueuer could not be installed or run; the message is the reason."""


def _python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv() -> None:
    """Create the virtualenv with PgQueuer in it unless it is already there."""
    probe = [str(_python()), "-c", "import asyncpg, pgqueuer; print(pgqueuer.__version__)"]
    if _python().exists():
        found = subprocess.run(probe, capture_output=True, text=True, cwd="/tmp", check=False)
        if found.returncode == 0 and found.stdout.strip() == VERSION:
            return
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(VENV)],
        [str(_python()), "-m", "pip", "install", "-q", f"pgqueuer=={VERSION}", "asyncpg"],
    ]
    deadline = time.monotonic() + _INSTALL_TIMEOUT_S
    for step in steps:
        try:
            done = subprocess.run(
                step,
                capture_output=True,
                text=True,
                timeout=max(1.0, deadline - time.monotonic()),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise Unavailable(f"installing PgQueuer timed out: {' '.join(step)}") from exc
        if done.returncode != 0:
            tail = " ".join(done.stderr.strip().splitlines()[-2:])
            raise Unavailable(f"installing PgQueuer failed ({' '.join(step[:3])}): {tail}")


def _run(command: str, dsn: str, schema: str, timeout: float, *options: str) -> dict[str, Any]:
    # cwd=/tmp: PgQueuer's package has a types.py, so it must not be the working directory.
    argv = [str(_python()), str(DRIVER), command, "--dsn", dsn, "--schema", schema, *options]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, cwd="/tmp", check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise Unavailable(f"PgQueuer {command} timed out after {timeout:.0f} s") from exc
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-1:])
        raise Unavailable(f"PgQueuer {command} failed: {tail}")
    last = done.stdout.strip().splitlines()[-1:] or ["{}"]
    result: dict[str, Any] = json.loads(last[0])
    return result


@contextmanager
def installed_schema(dsn: str, timeout: float) -> Iterator[str]:
    """A fresh schema with PgQueuer's tables in it, dropped afterwards."""
    schema = unique_schema_name()
    try:
        _run("install", dsn, schema, timeout)
        yield schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    sql.Identifier(check_identifier(schema))
                )
            )


def enqueue_one(dsn: str, n: int, timeout: float) -> Result:
    """``n`` scalar ``Queries.enqueue`` calls, one after the other."""
    with installed_schema(dsn, timeout) as schema:
        seconds = _run("enqueue-one", dsn, schema, timeout, "--n", str(n))["seconds"]
    return Result("pgqueuer_enqueue_one", n, seconds)


def enqueue_batch(dsn: str, n: int, chunk: int, timeout: float) -> Result:
    """``n`` jobs through list ``Queries.enqueue`` calls of ``chunk`` jobs."""
    with installed_schema(dsn, timeout) as schema:
        options = ("--n", str(n), "--chunk", str(chunk))
        seconds = _run("enqueue-batch", dsn, schema, timeout, *options)["seconds"]
    return Result("pgqueuer_enqueue_batch", n, seconds, {"chunk": chunk})


async def _log_span(dsn: str, schema: str) -> tuple[int, float]:
    """Successful jobs and the server-clock seconds from the first pick to the last
    completion, read from ``pgqueuer_log`` (whose ``created`` is ``now()``)."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            f"""
            SELECT count(*) FILTER (WHERE status = 'successful') AS done,
                   extract(epoch FROM max(created) FILTER (WHERE status = 'successful')
                                      - min(created) FILTER (WHERE status = 'picked'))::float8
                       AS span
            FROM {check_identifier(schema)}.pgqueuer_log
            """
        )
    finally:
        await conn.close()
    assert row is not None
    return int(row["done"]), float(row["span"] or 0.0)


def drain(dsn: str, n: int, workers: int, concurrency: int, chunk: int, timeout: float) -> Result:
    """``workers`` drain-mode QueueManager processes over ``n`` pre-enqueued jobs."""
    extra: dict[str, Any] = {"workers": workers, "concurrency": concurrency}
    with installed_schema(dsn, timeout) as schema:
        _run("enqueue-batch", dsn, schema, timeout, "--n", str(n), "--chunk", str(chunk))
        asyncio.run(analyze(dsn, schema, "pgqueuer"))
        argv = [str(_python()), str(DRIVER), "work", "--dsn", dsn, "--schema", schema]
        argv += ["--concurrency", str(concurrency)]
        processes = [
            subprocess.Popen(argv, cwd="/tmp", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(workers)
        ]
        deadline = time.monotonic() + timeout
        for process in processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                extra["error"] = f"timed out after {timeout:.0f} s"
            _, stderr = process.communicate()
            if process.returncode != 0 and "error" not in extra:
                tail = " ".join(stderr.decode(errors="replace").strip().splitlines()[-1:])
                extra["error"] = f"worker exited with {process.returncode}: {tail}"
        done, span = asyncio.run(_log_span(dsn, schema))
    if done != n and "error" not in extra:
        extra["error"] = f"only {done} of {n} jobs succeeded"
    return Result(f"pgqueuer_drain_w{workers}_c{concurrency}", n, span, extra)
