"""Health endpoints of a real worker process, and the job context on log records."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import structlog

from taskq import JobStatus, TaskQ, WorkerSettings, actor
from taskq.worker import Worker
from taskq_testing.faults import TcpProxy
from taskq_testing.postgres import PgSchema
from tests.apps import basic

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def _request(port: int, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def _wait_for(port: int, path: str, status: int, seconds: float = 15) -> Any:
    deadline = time.monotonic() + seconds
    last: Any = None
    while time.monotonic() < deadline:
        try:
            code, body = _get(port, path)
            if code == status:
                return body
            last = (code, body)
        except (urllib.error.URLError, ConnectionError) as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{path} never answered {status}; last: {last}")


@pytest.mark.postgres
def test_readyz_follows_the_database_and_shutdown(pg_schema: PgSchema) -> None:
    port = _free_port()
    with TcpProxy(5432) as proxy:
        _readyz_scenario(pg_schema, proxy, port)


def _readyz_scenario(pg_schema: PgSchema, proxy: TcpProxy, port: int) -> None:
    # the worker reaches Postgres only through the proxy, which the test can cut
    parts = urlsplit(pg_schema.dsn)
    via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env.update(
        TASKQ_DSN=via_proxy,
        TASKQ_SCHEMA=pg_schema.name,
        TASKQ_HEARTBEAT_INTERVAL="100ms",
        TASKQ_LOCK_LEASE="2s",
        TASKQ_POLL_INTERVAL="100ms",
        TASKQ_HEALTH_TASKS_ENABLED="true",
    )
    proc = subprocess.Popen(
        [str(BIN / "taskq-worker"), "tests.apps.basic:tq", "--health-port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _wait_for(port, "/healthz", 200) == {"status": "alive"}
        status, headers, body = _request(port, "HEAD", "/healthz")
        assert (status, body) == (200, b"") and int(headers["Content-Length"]) > 0
        status, headers, _ = _request(port, "POST", "/healthz")
        assert (status, headers["Allow"]) == (405, "GET, HEAD")
        assert _wait_for(port, "/readyz", 200)["ready"] is True
        tasks = _wait_for(port, "/tasks", 200)
        assert any(t["name"] == "taskq-producer" for t in tasks)

        proxy.cut()
        try:
            body = _wait_for(port, "/readyz", 503)
            assert body["ready"] is False and "backend unreachable" in body["reason"]
            assert _get(port, "/healthz")[0] == 200  # alive, just not ready
        finally:
            proxy.restore()
        _wait_for(port, "/readyz", 200)

        # Through a partition (nothing answers, nothing is refused), within its second:
        # the check's cancelled query held it for a command timeout (5 s).
        proxy.stall()
        try:
            time.sleep(1.2)  # past the cached answer
            asked = time.monotonic()
            status, body = _get(port, "/readyz")
            assert time.monotonic() - asked < 3
            assert (status, body["reason"]) == (503, "backend unreachable: no answer within 1s")
        finally:
            proxy.restore()
        _wait_for(port, "/readyz", 200)

        # a job that keeps the worker busy while it shuts down: signalled once it runs
        # (a fixed 0.5 s came before the dispatch on a loaded machine; the idle worker
        # then stopped at once, its server gone before a probe saw "shutting down")
        async def enqueue_long() -> None:
            app = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=basic.tq.actors.values())
            async with app:
                job = await app.client.enqueue(basic.nap, {"seconds": 3})
                async with asyncio.timeout(30):
                    while (row := await app.client.get(job.id)) is None or (  # noqa: ASYNC110 - polling the store
                        row.status is not JobStatus.RUNNING
                    ):
                        await asyncio.sleep(0.02)

        asyncio.run(enqueue_long())
        proc.send_signal(signal.SIGTERM)
        body = _wait_for(port, "/readyz", 503)
        assert body["reason"] == "shutting down"
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-6000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start_worker(port: int, **env: str) -> subprocess.Popen[str]:
    """``taskq-worker tests.apps.basic:tq --health-port PORT`` with ``TASKQ_*`` ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    return subprocess.Popen(
        [str(BIN / "taskq-worker"), "tests.apps.basic:tq", "--health-port", str(port)],
        cwd=REPO,
        env={**base, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_reason(proc: subprocess.Popen[str], port: int, reason: str) -> Any:
    """The first /readyz body giving ``reason`` (bounded), the worker still up."""
    deadline = time.monotonic() + 15
    last: Any = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the worker exited ({proc.returncode}); last: {last}"
        try:
            last = _get(port, "/readyz")
            if last[1].get("reason") == reason:
                return last
        except (urllib.error.URLError, ConnectionError) as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"/readyz never said {reason!r}; last: {last}")


def test_probes_answer_while_the_worker_waits_for_its_database_until_it_gives_up() -> None:
    # Nothing listens on the database's port: each connection is refused. The probes
    # were refused too until the backend opened, which an orchestrator cannot tell from
    # a dead worker (a liveness probe restarted it while its database was starting).
    health_port, db_port = _free_port(), _free_port()
    proc = _start_worker(
        health_port,
        TASKQ_DSN=f"postgresql://postgres@127.0.0.1:{db_port}/test",
        TASKQ_STARTUP_WAIT="4s",
    )
    try:
        status, body = _wait_for_reason(proc, health_port, "waiting for the backend")
        assert status == 503
        assert body["ready"] is False and body["attempt"] >= 1
        assert body["last_error"] == "ConnectionRefusedError"
        assert _get(health_port, "/healthz") == (200, {"status": "alive"})
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-3000:]
    assert "taskq-worker: error: cannot connect to PostgreSQL" in err
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        _get(health_port, "/healthz")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signals_while_the_worker_waits_for_its_database_are_answered(
    stop: signal.Signals,
) -> None:
    # The handlers came once the backend opened: until then (startup_wait, 30 s by
    # default) SIGHUP and SIGUSR2 ended the worker (their default action), SIGTERM killed
    # it (exit 143) and SIGINT stopped it only once the whole wait ran out.
    health_port, db_port = _free_port(), _free_port()
    proc = _start_worker(
        health_port,
        TASKQ_DSN=f"postgresql://postgres@127.0.0.1:{db_port}/test",
        TASKQ_STARTUP_WAIT="600s",
    )
    try:
        _wait_for_reason(proc, health_port, "waiting for the backend")
        proc.send_signal(signal.SIGHUP)
        proc.send_signal(signal.SIGUSR2)
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("taskq task-stack [sigusr2]"):
                break
        else:
            raise AssertionError(f"no task-stack dump: the worker exited ({proc.wait()})")
        assert _get(health_port, "/healthz") == (200, {"status": "alive"})
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]


def test_a_stop_signal_stops_the_worker_with_its_stderr_gone() -> None:
    # With stderr gone (a log shipper's pipe closed), the first stop's log line raised
    # BrokenPipeError out of the signal's stop, which then stopped nothing: the worker
    # ran on, and only a third signal ended it (exit 1), its jobs not handed back.
    health_port = _free_port()
    proc = _start_worker(health_port)
    try:
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                if _get(health_port, "/readyz")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.05)
        assert proc.stderr is not None
        proc.stderr.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.postgres
def test_readiness_turns_200_once_the_database_the_worker_waited_for_is_up(
    pg_schema: PgSchema,
) -> None:
    port = _free_port()
    with TcpProxy(5432) as proxy:
        proxy.cut()  # the database refuses connections, as one still starting does
        proc = _start_worker(
            port,
            TASKQ_DSN=proxy.through(pg_schema.dsn),
            TASKQ_SCHEMA=pg_schema.name,
            TASKQ_STARTUP_WAIT="60s",
            TASKQ_POLL_INTERVAL="100ms",
        )
        try:
            status, body = _wait_for_reason(proc, port, "waiting for the backend")
            assert status == 503 and body["last_error"] == "ConnectionRefusedError"
            assert _get(port, "/healthz")[0] == 200
            proxy.restore()
            assert _wait_for(port, "/readyz", 200) == {"ready": True, "reason": "ok"}
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err[-6000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_every_record_inside_a_job_carries_the_job_context() -> None:
    seen: list[dict[str, Any]] = []

    def keep(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        seen.append(dict(event))
        raise structlog.DropEvent

    @actor(name="chatty")
    async def chatty(payload: dict[str, Any]) -> None:
        structlog.get_logger("user.code").info("inside-the-actor")

    structlog.configure(processors=[structlog.contextvars.merge_contextvars, keep])
    try:
        tq = TaskQ("memory://", actors=[chatty])
        async with tq:
            job = await tq.client.enqueue(chatty, {}, identity_key="k9")
            settings = {
                "poll_interval": "50ms",
                "heartbeat_interval": "50ms",
                "lock_lease": "1s",
                "until_idle": True,
            }
            await Worker(tq, WorkerSettings.load(settings, env={})).run()
    finally:
        structlog.reset_defaults()
    [record] = [e for e in seen if e["event"] == "inside-the-actor"]
    assert record["job_id"] == str(job.id)
    assert (record["actor"], record["queue"], record["attempt"]) == ("chatty", "default", 1)
    assert record["identity_key"] == "k9" and "trace_id" in record
    outside = [e for e in seen if e["event"] == "taskq.worker-started"]
    assert outside and "job_id" not in outside[0]
    # Which database and schema it works, for telling a worker from its producers.
    assert (outside[0]["backend"], outside[0]["schema"]) == ("memory://", tq.schema)
    # The job's bindings end with its task: what the worker logs after it has none.
    after = [e for e in seen if e["event"] in ("taskq.idle", "taskq.worker-stopped")]
    assert len(after) == 2 and not any("job_id" in e for e in after)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /" + b"x" * 70_000 + b" HTTP/1.1\r\n\r\n", 431),  # past the 64 KiB line limit
        (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"y" * 70_000 + b"\r\n\r\n", 431),
        (b"", 400),  # connected and hung up: no request line at all
        # A request line that is none was routed: garbage (a TLS handshake on the plain
        # port) got 405 with "Allow: GET, HEAD", "GET" alone 404, and HTTP/0.9's line
        # without a version an HTTP/1.1 200 it cannot read.
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", 400),
        (b"GET\r\n\r\n", 400),
        (b"GET /healthz\r\n\r\n", 400),
        (b"GET /healthz SPDY/3\r\n\r\n", 400),
    ],
)
async def test_a_malformed_request_gets_an_error_status_not_a_traceback(
    request_bytes: bytes, status: int
) -> None:
    # An oversized line raised ValueError in the handler: no response, and asyncio
    # logged "Unhandled exception in client_connected_cb".
    from taskq_testing import TEST_SETTINGS

    async with TaskQ("memory://", actors=[basic.nap]) as tq:
        settings = WorkerSettings.load(
            {**TEST_SETTINGS, "health_port": 0, "health_host": "127.0.0.1"}, env={}
        )
        worker = Worker(tq, settings)
        running = asyncio.create_task(worker.run())
        try:
            while worker.health is None or worker.health._server is None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # the worker has no event for its server's start
            reader, writer = await asyncio.open_connection("127.0.0.1", worker.health.port)
            writer.write(request_bytes)
            writer.write_eof()
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:80]
            _, healthy = await asyncio.to_thread(_get, worker.health.port, "/healthz")
            assert healthy == {"status": "alive"}  # still serving
        finally:
            worker.stop()
            await asyncio.wait_for(running, 30)


async def test_tasks_is_not_served_unless_enabled() -> None:
    # /tasks shows the code's await sites: off unless health_tasks_enabled says so.
    from taskq.worker.health import HealthServer

    for enabled, status in ((False, 404), (True, 200)):
        server = HealthServer("127.0.0.1", 0, tasks_enabled=enabled)
        await server.start()
        try:
            answer = await asyncio.to_thread(_request, server.port, "GET", "/tasks")
            assert answer[0] == status
        finally:
            await server.close()


async def test_stalled_connections_past_the_cap_make_room_and_probes_still_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each stalled connection held a file descriptor for its read timeout, with no
    # bound on how many: a flood ran the worker out of them (its database's too).
    from taskq.worker import health
    from taskq.worker.health import HealthServer

    monkeypatch.setattr(health, "_MAX_CONNECTIONS", 4)
    monkeypatch.setattr(health, "_EXCHANGE_SECONDS", 1.5)
    server = HealthServer("127.0.0.1", 0, tasks_enabled=False)
    await server.start()
    stalled = []
    for _ in range(4):
        stalled.append(await asyncio.open_connection("127.0.0.1", server.port))
        await asyncio.sleep(0.02)  # accepted in this order
    try:
        # At the cap, a probe is answered: the connection stalled longest makes room.
        answer = await asyncio.to_thread(_request, server.port, "GET", "/healthz")
        assert answer[0] == 200
        assert await asyncio.wait_for(stalled[0][0].read(), 0.5) == b""  # before its bound
        # The others are dropped at the exchange's bound.
        for stalled_reader, _ in stalled[1:]:
            assert await asyncio.wait_for(stalled_reader.read(), 3) == b""
    finally:
        for _, stalled_writer in stalled:
            stalled_writer.close()
        await server.close()


async def test_readyz_says_which_shutdown_phase_the_worker_is_in() -> None:
    # Each phase is recorded before its work begins so that the health endpoint can
    # show it (architecture.md, "Shutdown phases"); /readyz said only "shutting down",
    # the same through a drain of running jobs as through their abandonment.
    from taskq_testing import TEST_SETTINGS

    started, release = asyncio.Event(), asyncio.Event()

    @actor(name="health.holds_the_drain")
    async def holds(payload: dict[str, Any]) -> None:
        started.set()
        await release.wait()

    async with TaskQ("memory://", actors=[holds]) as tq:
        await tq.client.enqueue(holds, {})
        stop = {"drain_grace_period": "60s", "termination_grace_period": "90s"}
        settings = WorkerSettings.load(
            {**TEST_SETTINGS, **stop, "health_port": 0, "health_host": "127.0.0.1"}, env={}
        )
        worker = Worker(tq, settings)
        running = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(started.wait(), 5)
            assert worker.health is not None
            _, body = await asyncio.to_thread(_get, worker.health.port, "/readyz")
            assert "shutdown_phase" not in body  # running
            worker.stop()
            async with asyncio.timeout(5):
                while True:  # until the stop has begun its first phase (the drain)
                    status, body = await asyncio.to_thread(_get, worker.health.port, "/readyz")
                    if "shutdown_phase" in body:
                        break
            assert status == 503
            assert body == {"ready": False, "reason": "shutting down", "shutdown_phase": "DRAINING"}
        finally:
            release.set()
            worker.stop()
            await asyncio.wait_for(running, 30)


async def test_readyz_says_ready_only_once_the_worker_takes_jobs() -> None:
    # /readyz said ready from the end of the DI bootstrap, while the worker was still
    # registering and had no loop to take a job with (a registration held up by a slow
    # database kept it "ready" all that time).
    from taskq.backend.memory import InMemoryBackend
    from taskq_testing import TEST_SETTINGS

    registering, release = asyncio.Event(), asyncio.Event()

    class SlowRegistration(InMemoryBackend):
        async def register_worker(self, *args: Any, **kwargs: Any) -> Any:
            registering.set()
            await release.wait()
            return await super().register_worker(*args, **kwargs)

    async with TaskQ("memory://", backend=SlowRegistration(), actors=[basic.nap]) as tq:
        settings = WorkerSettings.load(
            {**TEST_SETTINGS, "health_port": 0, "health_host": "127.0.0.1"}, env={}
        )
        worker = Worker(tq, settings)
        running = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(registering.wait(), 5)
            assert worker.health is not None
            status, body = await asyncio.to_thread(_get, worker.health.port, "/readyz")
            assert (status, body) == (503, {"ready": False, "reason": "registering the worker"})
            release.set()
            async with asyncio.timeout(5):
                while (await asyncio.to_thread(_get, worker.health.port, "/readyz"))[0] != 200:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)  # polled over HTTP
            assert any(t.get_name() == "taskq-producer" for t in asyncio.all_tasks())
        finally:
            release.set()
            worker.stop()
            await asyncio.wait_for(running, 30)
