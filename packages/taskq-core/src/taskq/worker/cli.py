"""``taskq-worker APP``: run a TaskQ application's actors."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from taskq.cli._exit_codes import EXIT_ERROR, EXIT_OK
from taskq.cli._parser import ArgumentParser
from taskq.errors import ConfigurationError, TaskQError

if TYPE_CHECKING:
    from taskq.app import TaskQ
    from taskq.settings import WorkerSettings
    from taskq.worker._runtime import Worker
    from taskq.worker.health import StartupProgress

__all__ = ["build_parser", "load_app", "main"]

_log = structlog.get_logger("taskq.worker")


def load_app(spec: str) -> TaskQ:
    """Import ``module:attribute`` naming a :class:`~taskq.TaskQ`."""
    from taskq.app import TaskQ

    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"APP must look like module:attribute, got {spec!r}")
    sys.path.insert(0, "")  # like `python -m`: apps in the current directory import
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r} for APP {spec!r}: {exc}") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, TaskQ):
        found = sorted(name for name, value in vars(module).items() if isinstance(value, TaskQ))
        said = (
            f"{module_name!r} has no attribute {attribute!r}"
            if not hasattr(module, attribute)
            else f"{spec} is of type {type(app).__name__}, not TaskQ"
        )
        hint = (
            f"; its TaskQ objects: {', '.join(f'{module_name}:{name}' for name in found)}"
            if found
            else f"; {module_name!r} defines no TaskQ object"
        )
        raise ConfigurationError(said + hint)
    return app


def build_parser() -> argparse.ArgumentParser:
    """The ``taskq-worker`` argument parser; flags override ``TASKQ_*`` env vars."""
    parser = ArgumentParser(
        prog="taskq-worker",
        description="Run the actors of a TaskQ application. Every flag also reads "
        "TASKQ_<NAME> from the environment (a flag wins).",
    )
    parser.add_argument("app", metavar="APP", help="module:attribute naming a TaskQ object")
    parser.add_argument("--dsn", help="backend URL (TASKQ_DSN); default: the app's URL")
    parser.add_argument("--schema", help="database schema (TASKQ_SCHEMA)")
    parser.add_argument(
        "--queues",
        help="comma-separated queues to work (TASKQ_QUEUES; default: 'default' and every "
        "queue of the app's actors)",
    )
    parser.add_argument("--concurrency", type=int, help="jobs run at once (TASKQ_CONCURRENCY)")
    parser.add_argument(
        "--until-idle",
        action="store_const",
        const=True,
        help="exit once the queues have no active job (TASKQ_UNTIL_IDLE)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        help="serve /healthz and /readyz on this port (TASKQ_HEALTH_PORT)",
    )
    parser.add_argument(
        "--migrate",
        action="store_const",
        const=True,
        help="apply pending database migrations first (TASKQ_MIGRATE)",
    )
    return parser


def _folded(schema: str | None) -> str | None:
    """``schema`` as Postgres names it (``TaskQ`` is ``taskq``); None if it is no name."""
    from taskq.identifiers import validate_schema_name

    try:
        return None if schema is None else validate_schema_name(schema)
    except ValueError:
        return None


def _rebuild_app(app: TaskQ, settings: WorkerSettings) -> TaskQ:
    """The app, its backend built anew on another DSN or schema, or with backend tuning,
    when the settings say so (the same object: the actors' code may use it)."""
    from taskq.settings import BACKEND_TUNABLES

    tuning = settings.backend_options()
    if not app.backend_from_url:
        # An instance the application built itself: nothing here can rebuild it.
        chosen = [
            name
            for name in ("dsn", "schema_name", *BACKEND_TUNABLES)
            if name in settings.model_fields_set
        ]
        if chosen:
            raise ConfigurationError(
                f"the application was given its backend (TaskQ(backend=...)), so "
                f"{', '.join(chosen)} cannot apply to it: unset them, or build the "
                f"application from a URL"
            )
        return app
    if settings.dsn is None and settings.schema_name is None and not tuning:
        return app
    schema = settings.schema_name  # folded, as Postgres folds it
    if schema is not None and _folded(os.environ.get("TASKQ_SCHEMA")) == schema != _folded(
        app._code_schema
    ):
        # The environment's schema, not the code's: producers built from the same code
        # in this environment enqueue where no worker of it looks. (A --schema flag is
        # this worker's own choice.)
        _log.warning(
            "taskq.schema-differs-from-code",
            schema=schema,
            code_schema=app._code_schema,
            hint=f"TASKQ_SCHEMA makes this worker work schema {schema!r}; an application "
            f"built from the code (a producer) uses {app._code_schema!r} unless given "
            f"schema={schema!r} too",
        )
    app._retarget(settings.dsn, settings.schema_name, tuning)
    return app


async def _serve(app: TaskQ, settings: WorkerSettings) -> int:
    from taskq.backend import SupportsMigrate
    from taskq.worker._runtime import Worker
    from taskq.worker._sync_pool import SyncActorPool
    from taskq.worker.signal_handlers import install_signal_handlers

    if settings.migrate and not isinstance(app.backend, SupportsMigrate):
        raise ConfigurationError(
            f"--migrate: {type(app.backend).__qualname__} has no migrations to apply"
        )
    worker = Worker(app, settings)
    # The loop's own threads (asyncio.to_thread, run_in_executor(None)) counted too: an
    # async actor's call in one held the exit as a sync actor's did, past the stop's
    # wall, while its job, handed back, could run elsewhere.
    loop_threads = SyncActorPool()
    asyncio.get_running_loop().set_default_executor(loop_threads)
    # Before the start, not once the backend opened: SIGHUP and SIGUSR2 ended a worker
    # waiting for its database (their default action), and SIGTERM killed it.
    install_signal_handlers(worker, "taskq-worker")
    # The health routes answer from here, not once the backend opened: a worker waiting
    # for its database is alive, not ready, and says why; refused probes looked dead
    # to an orchestrator, which restarted it while the database itself started.
    async with worker.health_served():
        if not await _unless_stopped(worker, _open_when_reachable(app, settings, worker.startup)):
            worker.shutdown_done()
            return EXIT_OK
        async with app:  # opened: entering is a no-op, leaving closes it
            await worker.run(disarm_when_done=False)
            lingering = worker.lingering_tasks()
    # Closing the backend is part of the stop that termination_grace_period bounds.
    worker.shutdown_done()
    code = EXIT_OK
    if worker.unconfirmed_at_stop:
        # A stop with the database away: those jobs stay locked until their lease lapses,
        # and the reclaim spends an attempt of each (a job on its last one ends crashed).
        # Not a clean exit, for whoever supervises the worker.
        _log.error(
            "taskq.stop-left-jobs-unconfirmed",
            jobs=worker.unconfirmed_at_stop,
            hint="their hand-back or outcome could not be written (is the database "
            "reachable?): the reclaim takes them once their lease lapses, spending an attempt",
        )
        code = EXIT_ERROR
    threads = worker.lingering_threads() + loop_threads.running
    if lingering or threads:
        # Tasks that swallowed cancellation, and threads (which nothing can cancel),
        # would hold the interpreter's exit for as long as they run, while their jobs,
        # handed back, may already run elsewhere: leave now.
        # Not with stderr gone (a log shipper's pipe): its BrokenPipeError skipped the
        # exit, which then waited for those threads.
        with contextlib.suppress(OSError):
            print(
                f"taskq-worker: exiting with {len(lingering)} job task(s) that ignored "
                f"cancellation and {threads} sync actor or thread call(s) still running",
                file=sys.stderr,
            )
        # None: a stream the process started without (`>&-`); its AttributeError, too,
        # skipped the exit, which then waited for those threads.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.flush()
        os._exit(code)
    return code


async def _unless_stopped(worker: Worker, start: Coroutine[Any, Any, None]) -> bool:
    """Run ``start``, cancelled if the worker is stopped first (nothing to drain yet: the
    wait for a database can last ``startup_wait``, a migration lock's for ever); whether
    it ran to its end."""
    starting = asyncio.ensure_future(start)
    stopped = asyncio.ensure_future(worker.stop_requested())
    try:
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        starting.cancel()
    try:
        await starting  # its error, if it failed; its own clean-up, if cancelled
    except asyncio.CancelledError:
        if not stopped.done() or stopped.cancelled():
            raise  # not the stop's doing: this task itself was cancelled
        return False
    return True


async def _open_when_reachable(
    app: TaskQ, settings: WorkerSettings, progress: StartupProgress
) -> None:
    """Migrate (``--migrate``) and open the backend, retrying for up to ``startup_wait``
    while it cannot be reached (each failed attempt told to ``progress``, which /readyz
    reports); an error that does not heal by itself is raised at once.
    """
    from taskq.backend import SupportsMigrate

    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.startup_wait.total_seconds()
    pause = 0.25
    while True:
        try:
            if settings.migrate and isinstance(app.backend, SupportsMigrate):
                await app.backend.migrate()
            await app.backend.open()
            progress.reached()
            return
        except Exception as exc:
            left = deadline - loop.time()
            lost = _unreachable(exc)
            if left <= 0 or lost is None:
                raise
            progress.failed(lost)
            wait = min(pause, left)
            _log.warning(
                "taskq.backend-unreachable-at-start",
                error=" ".join(str(exc).split()) or type(exc).__name__,
                retry_in=round(wait, 2),
                gives_up_in=round(left, 1),
            )
            await asyncio.sleep(wait)
            pause = min(pause * 2, 5.0)


def _unreachable(exc: BaseException) -> BaseException | None:
    """The transient error behind ``exc`` (``exc`` itself, or the driver's error a
    TaskQ error translates), else None.

    Never a ``ConfigurationError``, transient though a worker's loops take one (a
    read-only server's ``ReadOnlyDatabaseError``): the server answered, and a start
    waited ``startup_wait`` on it as on a server not up yet, saying it unreachable."""
    if isinstance(exc, ConfigurationError):
        return None
    lost = _lost_connection(exc)
    if lost is None and isinstance(exc, TaskQError) and exc.__cause__ is not None:
        lost = _lost_connection(exc.__cause__)
    return lost


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``taskq-worker`` console script; returns the exit code."""
    from taskq.logs import configure_logging, route_stdlib_logging
    from taskq.plugins._registry import plugin_trace_requested
    from taskq.settings import WorkerSettings

    try:
        configure_logging()
        plugin_trace_requested()
    except ConfigurationError as exc:  # TASKQ_LOG_LEVEL, TASKQ_TRACE_PLUGINS
        print(f"taskq-worker: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    args = build_parser().parse_args(argv)
    # Until the event loop's handlers (importing the app can take seconds), their
    # default action ended the process: a credential rotation's SIGHUP killed a worker
    # that was starting. Nothing is lost: the backend, not open yet, reads its
    # credentials when it opens.
    ignored = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGHUP, signal.SIGUSR2)}
    flags: dict[str, Any] = {
        "dsn": args.dsn,
        "schema": args.schema,
        "queues": args.queues,
        "concurrency": args.concurrency,
        "until_idle": args.until_idle,
        "migrate": args.migrate,
        "health_port": args.health_port,
    }
    try:
        settings = WorkerSettings.load(flags)
        for variable, setting in WorkerSettings.misspelt_env().items():
            _log.warning(
                "taskq.unknown-setting",
                variable=variable,
                hint=f"{variable} is no setting, and is ignored: did you mean {setting}?",
            )
        for name, needs in settings.inert_settings().items():
            _log.warning(
                "taskq.setting-without-effect",
                setting=name,
                hint=f"{name} takes effect with {needs}",
            )
        app = _rebuild_app(load_app(args.app), settings)
        route_stdlib_logging()  # after the app's own logging set-up, if it has one
        # What is loaded by now (modules, schemas, the app) lives as long as the
        # process: out of the cyclic collector, whose full passes over it would
        # otherwise stall the event loop for ~20 ms at a time.
        gc.freeze()
        return asyncio.run(_serve(app, settings))
    except TaskQError as exc:
        print(f"taskq-worker: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_ERROR
    except Exception as exc:
        lost = _lost_connection(exc)
        if lost is None:
            raise
        # Started against a database that went away mid-way (or a network cut): one line
        # to act on, not a driver's traceback; a supervisor restarts the worker.
        print(
            f"taskq-worker: error: the connection to the backend failed while the worker "
            f"ran ({type(lost).__name__}: {lost}); check that it is reachable, then start "
            f"again",
            file=sys.stderr,
        )
        return EXIT_ERROR
    finally:
        for sig, handler in ignored.items():  # main() called in a process that goes on
            signal.signal(sig, handler)
    return EXIT_OK


def _lost_connection(exc: BaseException) -> BaseException | None:
    """``exc`` (or the first of a group made only of them) when it is a transient
    backend error, else None."""
    from taskq.worker._transient import transient_cause

    return transient_cause(exc)
