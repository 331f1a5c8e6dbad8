"""structlog set-up for TaskQ's commands: configured once per process.

Records go to stderr so that command output on stdout (tables, ``--json``)
stays machine-readable. On a terminal they are rendered for people; anywhere
else as JSON lines for log shippers, the standard library's records too (a
driver's warnings: asyncpg's pool logs through ``logging``), unless the process
configured ``logging`` itself.

An application may route TaskQ's events to the standard library with their fields as
``extra`` (structlog's ``stdlib.render_to_log_kwargs``): no field TaskQ logs is named as
a ``LogRecord`` attribute (``name``, ``created``, ``module``, ...), which ``logging``
refuses with a ``KeyError`` raised out of the logging call.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import Context, ContextVar, Token
from typing import TYPE_CHECKING, Any, Final, TextIO

import structlog

from taskq.errors import ConfigurationError

if TYPE_CHECKING:
    from taskq.models import JobRow

__all__ = [
    "LOG_LEVEL_ENV",
    "bind_job_context",
    "bind_job_fields",
    "configure_logging",
    "job_fields",
    "route_stdlib_logging",
]

LOG_LEVEL_ENV: Final = "TASKQ_LOG_LEVEL"
"""The level of a TaskQ command's log lines (``debug``, ``info``, ``warning``, ``error``,
``critical``; default ``info``)."""

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

_configured = False
_level = logging.INFO
_STAMPED: list[structlog.typing.Processor] = [
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]
_rendered: list[structlog.typing.Processor] = [structlog.processors.JSONRenderer()]


def configure_logging(*, level: int | None = None, json: bool | None = None) -> None:
    """Configure structlog for a TaskQ process (the first call wins).

    ``level=None`` takes :data:`LOG_LEVEL_ENV` (``TASKQ_LOG_LEVEL``), else info; a
    value it is not raises :class:`~taskq.errors.ConfigurationError` naming it, once
    logging is set up at info (the commands exit 1 with it, as for a setting's).
    ``json=None`` picks JSON lines unless stderr is a terminal.
    """
    global _configured, _rendered, _level
    if _configured:
        return
    _configured = True
    # A command's level could not be changed: the debug lines (a plugin's traceback,
    # which a hint asks to report) were out of reach.
    raw = os.environ.get(LOG_LEVEL_ENV, "").strip() if level is None else ""
    _level = level if level is not None else _LEVELS.get(raw.lower(), logging.INFO)
    if sys.stderr is None:
        # Started with descriptor 2 closed (`2>&-`, some supervisors): every write to
        # stderr (this set-up's isatty first) raised AttributeError and the command
        # died at once. Lines are dropped instead, and devnull takes descriptor 2,
        # which the next socket opened would otherwise get.
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the process's stderr from now on
    use_json = not sys.stderr.isatty() if json is None else json
    _rendered = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if use_json
        else [structlog.dev.ConsoleRenderer(exception_formatter=_console_tracebacks())]
    )
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *_STAMPED, *_rendered],
        wrapper_class=structlog.make_filtering_bound_logger(_level),
        logger_factory=functools.partial(_GoneStderrTolerated, sys.stderr),
        cache_logger_on_first_use=True,
    )
    if raw and raw.lower() not in _LEVELS:
        # A clear error at start-up, as an invalid setting is: a warning and info
        # went unseen by whoever asked for warning (or error) lines alone.
        raise ConfigurationError(
            f"invalid setting {LOG_LEVEL_ENV}={raw!r}: expected one of "
            f"{', '.join(_LEVELS)} (in any case), or leave it unset for info"
        )


class _GoneStderrTolerated(structlog.PrintLogger):
    """structlog's stderr logger, dropping a line stderr no longer takes (a log shipper's
    pipe closed): its BrokenPipeError came out of whatever logged, the first stop
    signal's stop among them, and the worker never stopped."""

    def __init__(self, file: TextIO, *_: Any) -> None:  # structlog adds get_logger's args
        super().__init__(file)

    def msg(self, message: str) -> None:
        with contextlib.suppress(OSError):
            super().msg(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _console_tracebacks() -> structlog.typing.ExceptionRenderer:
    """structlog's own traceback formatter for a terminal, without the frames' local
    variables that rich shows by default: a provider's DSN or a payload in one is a
    secret on screen."""
    if importlib.util.find_spec("rich") is not None:
        return structlog.dev.RichTracebackFormatter(show_locals=False)
    return structlog.dev.default_exception_formatter


def route_stdlib_logging() -> None:
    """Render the standard library's records (a driver's: asyncpg's pool warnings, whose
    multi-line tracebacks came out as plain text among the JSON lines) as TaskQ's own,
    with the job's fields, unless the process configured ``logging`` itself. Call it
    after :func:`configure_logging` and after the application is imported (its
    ``logging.basicConfig`` then wins)."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_one_line_driver_errors)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                structlog.stdlib.add_logger_name,
                *_STAMPED,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *_rendered],
        )
    )
    root.addHandler(handler)
    # libraries' info chatter stays out, and their warnings below a level asked for
    root.setLevel(max(logging.WARNING, _level))


def _one_line_driver_errors(record: logging.LogRecord) -> bool:
    """A driver's warning about an error it handles itself (asyncpg's pool retrying its
    connection floor through a database restart) on one line, the error's repr in place
    of its traceback: an expected condition, said 4 to 9 times per worker per restart."""
    if record.levelno < logging.ERROR and record.exc_info and record.name.startswith("asyncpg"):
        error = record.exc_info[1]
        record.msg, record.args = f"{record.getMessage()}: {error!r}", ()
        record.exc_info = record.exc_text = None
    return True


def job_fields(job: JobRow) -> dict[str, Any]:
    """The job's identity as log fields, those :func:`bind_job_context` binds: for a line
    about a job logged outside its context (the heartbeat's, the cancel controller's, a
    stop's), which carried its ``job_id`` alone and escaped a search by actor or queue."""
    return {
        "job_id": str(job.id),
        "actor": job.actor,
        "queue": job.queue,
        "attempt": job.attempt,
        "identity_key": job.identity_key,
        "trace_id": job.trace_id,
    }


_JOB_FIELDS: Final = ("job_id", "actor", "queue", "attempt", "identity_key", "trace_id")


@functools.cache
def _job_field_vars() -> tuple[ContextVar[Any], ...]:
    """structlog's own context variables for :func:`job_fields`' keys, in their order,
    as the tokens of a binding in a throwaway context name them: set directly, a job's
    fields cost about half of ``bind_contextvars``' per-key work (paid for every job)."""
    tokens = Context().run(structlog.contextvars.bind_contextvars, **dict.fromkeys(_JOB_FIELDS))
    return tuple(tokens[name].var for name in _JOB_FIELDS)


def bind_job_fields(job: JobRow) -> Mapping[str, Token[Any]]:
    """Put the job's identity on every later log record of this context (context vars).

    The fields of :func:`bind_job_context`, without undoing them: for a context
    that ends with the job (the worker runs each job in an asyncio task of its
    own, and a task's bindings end with it). Returns the tokens that would undo them.
    """
    job_id, actor, queue, attempt, identity_key, trace_id = _job_field_vars()
    return {
        "job_id": job_id.set(str(job.id)),
        "actor": actor.set(job.actor),
        "queue": queue.set(job.queue),
        "attempt": attempt.set(job.attempt),
        "identity_key": identity_key.set(job.identity_key),
        "trace_id": trace_id.set(job.trace_id),
    }


@contextmanager
def bind_job_context(job: JobRow) -> Iterator[None]:
    """Put the job's identity on every log record emitted inside (context vars).

    Fields: ``job_id``, ``actor``, ``queue``, ``attempt``, ``identity_key``
    and ``trace_id``. Bindings made in different asyncio tasks never mix.
    """
    # bind + reset by token: bound_contextvars would copy the whole context to
    # save what it overwrites.
    tokens = bind_job_fields(job)
    try:
        yield
    finally:
        for token in tokens.values():
            token.var.reset(token)
