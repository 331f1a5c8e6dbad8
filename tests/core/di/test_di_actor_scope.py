"""build_actor_scope: one invocation's TRANSIENT scope, teardown and cancellation."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import structlog

from taskq._di import ProviderRegistry, build_actor_scope, own_context, passthrough_scope
from taskq._di.solver import Container
from taskq._scope import Scope


class Pool:
    pass


class Session:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool


class Audit:
    pass


class Tx:
    def __init__(self, session: Session) -> None:
        self.session = session


class ThreadConn:
    def __init__(self) -> None:
        self.thread = threading.get_ident()


class Repo:
    """TRANSIENT and sync, on top of a THREAD-scoped connection."""

    def __init__(self, conn: ThreadConn, pool: Pool) -> None:
        self.conn = conn
        self.pool = pool


class Teardowns:
    """Counts every teardown, to prove each ran exactly once."""

    def __init__(self) -> None:
        self.order: list[str] = []

    def __call__(self, name: str) -> None:
        self.order.append(name)

    @property
    def counts(self) -> Counter[str]:
        return Counter(self.order)


def _register_transients(registry: ProviderRegistry, teardowns: Teardowns) -> None:
    """Pool (LOOP) <- Session (TRANSIENT, async gen) <- Tx (TRANSIENT, gen); Audit (TRANSIENT)."""

    async def session(pool: Pool) -> AsyncIterator[Session]:
        yield Session(pool)
        await asyncio.sleep(0)
        teardowns("session")

    def tx(session: Session) -> Iterator[Tx]:
        yield Tx(session)
        teardowns("tx")

    async def audit() -> AsyncIterator[Audit]:
        yield Audit()
        await asyncio.sleep(0)
        teardowns("audit")

    registry.register(Pool, Pool, scope=Scope.LOOP)
    registry.register(Session, session, scope=Scope.TRANSIENT)
    registry.register(Tx, tx, scope=Scope.TRANSIENT)
    registry.register(Audit, audit, scope=Scope.TRANSIENT)


async def job(payload: int, ctx: str, tx: Tx, audit: Audit, pool: Pool) -> int:
    return payload


async def test_the_scope_yields_ready_kwargs_and_tears_down_lifo_on_exit(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    teardowns = Teardowns()
    _register_transients(registry, teardowns)
    async with build_actor_scope(job, registry, containers, {"payload": 3, "ctx": "c"}) as scope:
        assert set(scope.kwargs) == {"payload", "ctx", "tx", "audit", "pool"}
        assert scope.kwargs["payload"] == 3
        assert scope.kwargs["ctx"] == "c"
        tx = scope.kwargs["tx"]
        assert isinstance(tx, Tx)
        assert tx.session.pool is scope.kwargs["pool"]
        assert await scope.invoke() == 3
        assert teardowns.order == []
    assert teardowns.order == ["audit", "tx", "session"]


def _with_a_failing_tx(registry: ProviderRegistry, message: str) -> Teardowns:
    """The transients of ``job``, their Tx's teardown raising ``ValueError(message)``."""
    teardowns = Teardowns()
    _register_transients(registry, teardowns)

    def broken_tx(session: Session) -> Iterator[Tx]:
        yield Tx(session)
        raise ValueError(message)

    registry.register(Tx, broken_tx, scope=Scope.TRANSIENT, replace=True)
    return teardowns


async def test_a_failing_transient_teardown_does_not_stop_the_others_and_fails_the_call(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    teardowns = _with_a_failing_tx(registry, "commit failed")
    with structlog.testing.capture_logs() as logs, pytest.raises(ValueError, match="commit"):
        # The body returned, its work unfinished: the invocation fails (the job is
        # retried), where it succeeded with its commit lost.
        async with build_actor_scope(job, registry, containers, {"payload": 1, "ctx": ""}):
            pass
    assert teardowns.order == ["audit", "session"]
    assert [(log["event"], log["provider"]) for log in logs] == [("taskq.di-teardown-failed", "Tx")]


async def test_a_failing_transient_teardown_leaves_the_bodys_own_error_as_it_was(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    teardowns = _with_a_failing_tx(registry, "rollback failed")
    with pytest.raises(KeyError, match="the body's"):
        async with build_actor_scope(job, registry, containers, {"payload": 1, "ctx": ""}):
            raise KeyError("the body's")
    assert teardowns.order == ["audit", "session"]


async def test_the_body_exception_survives_teardown(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    teardowns = Teardowns()
    _register_transients(registry, teardowns)
    with pytest.raises(KeyError, match="body"):
        async with build_actor_scope(job, registry, containers, {"payload": 1, "ctx": ""}):
            raise KeyError("body")
    assert teardowns.counts == {"audit": 1, "tx": 1, "session": 1}


async def test_a_failed_resolution_tears_down_what_it_created(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    teardowns = Teardowns()
    _register_transients(registry, teardowns)

    async def no_audit() -> Audit:
        raise ConnectionError("audit service down")

    registry.register(Audit, no_audit, scope=Scope.TRANSIENT, replace=True)
    with pytest.raises(ConnectionError):
        async with build_actor_scope(job, registry, containers, {"payload": 1, "ctx": ""}):
            pytest.fail("the body must not run")
    assert teardowns.order == ["tx", "session"]


async def test_cancelling_the_actor_mid_body_runs_every_teardown_exactly_once(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    teardowns = Teardowns()
    _register_transients(registry, teardowns)
    in_body = asyncio.Event()

    async def blocking_job(payload: int, tx: Tx, audit: Audit) -> None:
        in_body.set()
        await asyncio.Event().wait()

    async def run() -> None:
        async with build_actor_scope(blocking_job, registry, containers, {"payload": 1}) as scope:
            await scope.invoke()

    task = asyncio.create_task(run())
    await in_body.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert teardowns.order == ["audit", "tx", "session"]
    assert set(teardowns.counts.values()) == {1}


async def test_cancellation_during_teardown_waits_for_all_teardowns_then_re_raises(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    teardowns = Teardowns()
    _register_transients(registry, teardowns)
    tearing_down = asyncio.Event()
    release = asyncio.Event()

    async def slow_audit() -> AsyncIterator[Audit]:
        yield Audit()
        tearing_down.set()
        await release.wait()
        teardowns("audit")

    registry.register(Audit, slow_audit, scope=Scope.TRANSIENT, replace=True)

    async def run() -> None:
        async with build_actor_scope(job, registry, containers, {"payload": 1, "ctx": ""}):
            pass

    task = asyncio.create_task(run())
    await tearing_down.wait()
    task.cancel()
    await asyncio.sleep(0)
    # Shielded: the cancelled task is still waiting for the teardown to finish.
    assert not task.done()
    task.cancel()  # a second cancel does not cut it short either
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert teardowns.order == ["audit", "tx", "session"]


async def test_a_teardown_raising_cancelled_error_is_re_raised_after_the_others(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    teardowns = Teardowns()
    _register_transients(registry, teardowns)

    async def cancelling_audit() -> AsyncIterator[Audit]:
        yield Audit()
        raise asyncio.CancelledError

    registry.register(Audit, cancelling_audit, scope=Scope.TRANSIENT, replace=True)
    with pytest.raises(asyncio.CancelledError):
        async with build_actor_scope(job, registry, containers, {"payload": 1, "ctx": ""}):
            pass
    assert teardowns.order == ["tx", "session"]


async def test_concurrent_invocations_own_their_transients_and_share_loop_values(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    teardowns = Teardowns()
    _register_transients(registry, teardowns)
    pools: list[Pool] = []
    all_resolved = asyncio.Barrier(5)

    async def slow_pool() -> Pool:
        # Every invocation asks for the pool before the first one has it.
        await asyncio.sleep(0.01)
        pools.append(Pool())
        return pools[-1]

    registry.register(Pool, slow_pool, scope=Scope.LOOP, replace=True)
    seen: list[dict[str, object]] = []

    async def invocation(n: int) -> None:
        async with build_actor_scope(job, registry, containers, {"payload": n, "ctx": ""}) as s:
            seen.append(s.kwargs)
            await all_resolved.wait()  # all five scopes are open at once

    await asyncio.gather(*(invocation(n) for n in range(5)))
    assert len(pools) == 1
    assert all(kwargs["pool"] is pools[0] for kwargs in seen)
    for name in ("tx", "audit"):
        assert len({id(kwargs[name]) for kwargs in seen}) == 5
    assert teardowns.counts == {"audit": 5, "tx": 5, "session": 5}


def sync_job(payload: int, conn: ThreadConn, repo: Repo, pool: Pool) -> tuple[int, int]:
    return threading.get_ident(), payload


async def test_sync_actors_get_the_thread_scoped_values_of_their_thread(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    registry.register(ThreadConn, ThreadConn, scope=Scope.THREAD)
    registry.register(Repo, Repo, scope=Scope.TRANSIENT)

    async def make_pool() -> Pool:
        # Async and LOOP-scoped: created on the loop even when a worker thread asks first.
        assert threading.current_thread() is threading.main_thread()
        return Pool()

    registry.register(Pool, make_pool, scope=Scope.LOOP)
    kwargs_seen: list[dict[str, object]] = []

    def recording_job(payload: int, conn: ThreadConn, repo: Repo, pool: Pool) -> int:
        kwargs_seen.append({"thread": threading.get_ident(), "conn": conn, "repo": repo})
        return payload

    with ThreadPoolExecutor(2) as pool:
        for n in range(6):
            async with build_actor_scope(recording_job, registry, containers, {"payload": n}) as s:
                assert s.kwargs == {"payload": n}  # resolved in the worker thread
                assert await s.invoke(pool) == n
    main = threading.get_ident()
    for seen in kwargs_seen:
        conn, repo = seen["conn"], seen["repo"]
        assert isinstance(conn, ThreadConn)
        assert isinstance(repo, Repo)
        assert conn.thread == seen["thread"] != main
        # The TRANSIENT repo was built in the worker thread too, with its connection.
        assert repo.conn is conn
    by_thread = {seen["thread"]: seen["conn"] for seen in kwargs_seen}
    assert all(seen["conn"] is by_thread[seen["thread"]] for seen in kwargs_seen)
    assert len({id(seen["repo"]) for seen in kwargs_seen}) == 6


async def test_async_actors_get_the_thread_scoped_values_of_the_loop_thread(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    registry.register(ThreadConn, ThreadConn, scope=Scope.THREAD)

    async def async_job(payload: int, conn: ThreadConn) -> None:
        pass

    async with build_actor_scope(async_job, registry, containers, {"payload": 1}) as scope:
        conn = scope.kwargs["conn"]
        assert isinstance(conn, ThreadConn)
        assert conn.thread == threading.get_ident()


async def test_call_sync_on_the_loop_thread_fails_instead_of_deadlocking(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    registry.register(Pool, Pool, scope=Scope.LOOP)
    registry.register(ThreadConn, ThreadConn, scope=Scope.THREAD)
    registry.register(Repo, Repo, scope=Scope.TRANSIENT)
    async with build_actor_scope(sync_job, registry, containers, {"payload": 1}) as scope:
        with pytest.raises(RuntimeError, match="event loop's thread"):
            scope.call_sync()


async def test_an_invocation_that_needs_nothing_resolved_runs_without_a_scope(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    teardowns = Teardowns()
    _register_transients(registry, teardowns)

    async def plain(payload: int, ctx: str, limit: int = 5) -> tuple[int, str, int]:
        return payload, ctx, limit

    def plain_sync(payload: int, ctx: str) -> int:
        return payload * 2

    passed = {"payload": 3, "ctx": "c"}
    scope = passthrough_scope(plain, registry, containers, passed)
    assert scope is not None and scope.kwargs == passed
    assert scope.kwargs is not passed  # the caller's mapping stays its own
    assert await scope.invoke() == (3, "c", 5)  # an unprovided default stays the default
    sync_scope = passthrough_scope(plain_sync, registry, containers, passed)
    assert sync_scope is not None
    with ThreadPoolExecutor(1) as executor:
        assert await sync_scope.invoke(executor) == 6
    # One parameter left to resolve (tx, audit, pool): the full scope is needed.
    assert passthrough_scope(job, registry, containers, passed) is None
    assert teardowns.order == []


class Conn:
    pass


@pytest.mark.parametrize("stage", ["creating", "running"])
async def test_a_sync_actor_cancelled_mid_thread_keeps_its_values_until_the_thread_ends(
    registry: ProviderRegistry, containers: dict[Scope, Container], stage: str
) -> None:
    # A timeout or a forced cancel stops the wait, not the thread: its TRANSIENT values
    # go once it ends, whether it was still creating them or already using them.
    order: list[str] = []
    started, release = threading.Event(), threading.Event()

    def conn() -> Iterator[Conn]:
        if stage == "creating":
            started.set()
            release.wait(5)
        order.append("open")
        yield Conn()
        order.append("close")

    def job(payload: int, conn: Conn) -> None:
        if stage == "running":
            started.set()
            release.wait(5)
        order.append("body")

    registry.register(Conn, conn, scope=Scope.TRANSIENT)
    with ThreadPoolExecutor(max_workers=1) as executor:
        async with build_actor_scope(job, registry, containers, {"payload": 1}) as scope:
            running = asyncio.ensure_future(scope.invoke(executor))
            assert await asyncio.to_thread(started.wait, 5)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
        assert "close" not in order  # the scope exited; the thread still holds its values
        release.set()
        async with asyncio.timeout(5):
            while "close" not in order:  # noqa: ASYNC110 - the teardown runs on the loop
                await asyncio.sleep(0.01)
    assert order == ["open", "body", "close"]


class _Exit(BaseException):
    """What a teardown calling sys.exit raises: no Exception."""


async def test_a_teardown_raising_a_base_exception_in_the_actors_thread_closes_the_rest(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # It escaped the thread's own close: the values made before it stayed open, and the
    # scope's async ones (closed on the loop once the thread ends) were never closed.
    order: list[str] = []

    async def pool() -> AsyncIterator[Pool]:
        yield Pool()
        order.append("close pool")

    def session() -> Iterator[Session]:
        yield Session(Pool())
        order.append("close session")

    def conn() -> Iterator[Conn]:
        yield Conn()
        order.append("close conn")
        raise _Exit

    def job(payload: int, pool: Pool, session: Session, conn: Conn) -> None:
        order.append("body")

    registry.register(Pool, pool, scope=Scope.TRANSIENT)
    registry.register(Session, session, scope=Scope.TRANSIENT)
    registry.register(Conn, conn, scope=Scope.TRANSIENT)
    with ThreadPoolExecutor(max_workers=1) as executor, pytest.raises(_Exit):
        async with build_actor_scope(job, registry, containers, {"payload": 1}) as scope:
            await scope.invoke(executor)
    assert order == ["body", "close conn", "close session", "close pool"]


async def test_every_teardown_failure_is_logged_after_an_interrupted_one(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # Once one teardown raised a BaseException, the later failures went unlogged.
    def failing() -> Iterator[Pool]:
        yield Pool()
        raise ValueError("close failed")

    def interrupted() -> Iterator[Session]:
        yield Session(Pool())
        raise _Exit

    async def job(payload: int, pool: Pool, session: Session) -> None:
        return None

    registry.register(Pool, failing, scope=Scope.TRANSIENT)
    registry.register(Session, interrupted, scope=Scope.TRANSIENT)
    with structlog.testing.capture_logs() as logs, pytest.raises(_Exit):
        async with build_actor_scope(job, registry, containers, {"payload": 1}):
            pass
    events = [e["event"] for e in logs]
    assert events == ["taskq.di-teardown-interrupted", "taskq.di-teardown-failed"]


_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")


async def test_an_async_teardown_runs_in_the_invocations_own_context(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # It ran in a copy: a provider resetting the context variable it set on entry
    # failed ("created in a different Context"), and so did the invocation.
    async def tenant_scope() -> AsyncIterator[Audit]:
        token = _tenant.set("acme")
        yield Audit()
        await asyncio.sleep(0)
        _tenant.reset(token)

    registry.register(Audit, tenant_scope, scope=Scope.TRANSIENT)

    async def tenanted(payload: int, audit: Audit) -> str:
        return _tenant.get()

    async def run() -> tuple[object, str]:  # invoke() returns an object
        async with build_actor_scope(tenanted, registry, containers, {"payload": 1}) as scope:
            seen = await scope.invoke()
        return seen, _tenant.get()

    task = asyncio.create_task(run(), context=own_context())
    assert await task == ("acme", "none")


async def test_cancelled_while_a_provider_enters_it_is_cut_and_cleaned_before_the_cancel_ends(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # The provider enters in a task of its own: a job's limit or cancel reaching the
    # invocation as it enters must reach the provider too, not leave it entering on.
    entering = asyncio.Event()
    steps: list[str] = []

    async def slow_audit() -> AsyncIterator[Audit]:
        entering.set()
        try:
            await asyncio.Event().wait()  # a connect that does not answer
        except asyncio.CancelledError:
            steps.append("connect cut")
            raise
        yield Audit()
        steps.append("closed")

    registry.register(Audit, slow_audit, scope=Scope.TRANSIENT)

    task = await _cut_while_entering(registry, containers, entering)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["connect cut"]


async def test_a_provider_that_enters_despite_its_cut_is_exited_before_the_cancel_ends(
    registry: ProviderRegistry, containers: dict[Scope, Container]
) -> None:
    # Its cut swallowed (asyncio.wait_for may, before Python 3.12, when what it waits for
    # ends as it is cancelled), the provider entered: its task waited for a release that
    # never came, so the value never closed and the job's cancel, waiting for it, never
    # ended (its slot held, a stop held up).
    entering = asyncio.Event()
    steps: list[str] = []

    async def stubborn_audit() -> AsyncIterator[Audit]:
        entering.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            steps.append("cut swallowed")
        yield Audit()
        steps.append("closed")

    registry.register(Audit, stubborn_audit, scope=Scope.TRANSIENT)

    task = await _cut_while_entering(registry, containers, entering)
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done, "the cancel never ended: it waited for the provider's task, held open"
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["cut swallowed", "closed"]
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("taskq-provider-")]


async def _cut_while_entering(
    registry: ProviderRegistry, containers: dict[Scope, Container], entering: asyncio.Event
) -> asyncio.Task[None]:
    """An invocation of an actor needing ``Audit``, cancelled once its provider is
    entering (``entering`` set); the actor's body must not run."""

    async def audited(payload: int, audit: Audit) -> None:
        pytest.fail("the body must not run")

    async def run() -> None:
        async with build_actor_scope(audited, registry, containers, {"payload": 1}) as scope:
            await scope.invoke()

    task = asyncio.create_task(run(), context=own_context())
    await entering.wait()
    task.cancel()
    return task
