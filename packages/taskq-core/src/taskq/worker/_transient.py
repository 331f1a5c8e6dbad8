"""Transient errors and the backstop for unexpected ones, for every worker loop.

The transient set is assembled once from the ``taskq_transient_errors``
hook: core's generic shapes plus each backend's (taskq-postgres contributes
``TRANSIENT_PG_ERRORS``), so any error one loop learns, every loop learns.
"""

from __future__ import annotations

import functools
import time

import structlog

from taskq.plugins._registry import call_each, report_bad_answer

__all__ = [
    "LeaderLoopErrors",
    "RepeatedWarning",
    "UnexpectedLoopErrorGuard",
    "transient_cause",
    "transient_errors",
]

_log = structlog.get_logger("taskq.worker")


@functools.cache
def transient_errors() -> tuple[type[BaseException], ...]:
    """Every exception type a plugin declared transient (deduplicated, stable order)."""
    seen: dict[type[BaseException], None] = {}
    for answer in call_each("taskq_transient_errors"):
        types = answer.result
        if types is None:  # pluggy's "nothing from me"
            continue
        kinds = list(types) if isinstance(types, list | tuple | set | frozenset) else [types]
        for kind in kinds:
            # In an except clause anything else would raise TypeError at every error;
            # and every loop would swallow a cancellation (CancelledError: a stop hung
            # until the watchdog) or a shutdown (KeyboardInterrupt, SystemExit), or retry
            # every bug in silence (Exception itself).
            if isinstance(kind, type) and issubclass(kind, Exception) and kind is not Exception:
                seen.setdefault(kind, None)
            elif isinstance(kind, type) and issubclass(kind, BaseException):
                report_bad_answer(
                    "taskq_transient_errors",
                    answer,
                    "exception classes narrower than Exception (no CancelledError, "
                    "KeyboardInterrupt or SystemExit)",
                    kind,
                )
            else:
                report_bad_answer("taskq_transient_errors", answer, "exception classes", kind)
    return tuple(seen)


def transient_cause(exc: BaseException) -> BaseException | None:
    """``exc`` (or the first of a group made only of them) when it is a transient
    backend error (a lost connection, a statement the server cancelled) that no plugin
    calls a fault of the calling code (``taskq_client_fault``), else None."""
    transient = transient_errors()
    if isinstance(exc, BaseExceptionGroup):
        leaves = exc.exceptions
        if leaves and all(transient_cause(leaf) is not None for leaf in leaves):
            return transient_cause(leaves[0])
        return None
    return exc if isinstance(exc, transient) and not _client_fault(exc) else None


def _client_fault(exc: BaseException) -> bool:
    # A transient type's instance can still be a bug (asyncpg's "another operation is
    # in progress"): told as "the database failed", it lost the traceback that shows it.
    return any(answer.result is True for answer in call_each("taskq_client_fault", error=exc))


def _unexpected(loop: str, streak: int, max_consecutive: int, exc: BaseException) -> None:
    _log.error(
        "taskq.loop-unexpected-error",
        loop=loop,
        streak=streak,
        max_consecutive=max_consecutive,
        exc_info=exc,
    )


class UnexpectedLoopErrorGuard:
    """Tolerates isolated surprises in a loop, re-raises a persistent one.

    Each unexpected (non-transient) error is logged loudly; after
    ``max_consecutive`` in a row the error is re-raised so a permanent fault
    kills the worker instead of leaving a zombie that ticks but does no
    work. Only a fully successful iteration (:meth:`succeeded`) resets the
    streak: an idle or transiently failing one buys the fault no time.
    """

    def __init__(self, loop_name: str, max_consecutive: int = 5) -> None:
        self.loop_name = loop_name
        self.max_consecutive = max_consecutive
        self.streak = 0

    def failed(self, exc: BaseException) -> None:
        """Record an unexpected error; re-raises it once the streak is too long."""
        self.streak += 1
        _unexpected(self.loop_name, self.streak, self.max_consecutive, exc)
        if self.streak >= self.max_consecutive:
            raise exc

    def succeeded(self) -> None:
        """A whole iteration did its work: forget the streak."""
        self.streak = 0


class LeaderLoopErrors:
    """The maintenance leader's backstop for unexpected errors: each is logged with its
    traceback, as the guard logs it, and never re-raised. At ``max_consecutive`` in a
    row the loop is said to be failing (``taskq.leader-loop-failing``), then its errors
    are logged at most once per ``every`` seconds, with the count left out between.

    Not the guard's re-raise: a maintenance loop's permanent fault (a code bug, a row
    it cannot handle) is the same on every worker, so ending the worker ended each
    newly elected leader in turn, and every worker's jobs with it. The loop fails
    alone and loudly; the jobs and the leader's other loops go on.
    """

    def __init__(
        self, loop_name: str, max_consecutive: int = 5, every: float = 30.0, *, hint: str = ""
    ) -> None:
        self.loop_name = loop_name
        self.hint = hint or (
            "this maintenance loop fails at every try and keeps trying; the worker still "
            "runs jobs and the leader's other loops: fix the cause in the traceback"
        )
        self.max_consecutive = max_consecutive
        self.every = every
        self.streak = 0
        self._last = 0.0
        self._left_out = 0

    def failed(self, exc: BaseException) -> None:
        """Record an unexpected error of one iteration."""
        self.streak += 1
        if self.streak < self.max_consecutive:
            _unexpected(self.loop_name, self.streak, self.max_consecutive, exc)
            return
        now = time.monotonic()
        if self.streak > self.max_consecutive and now - self._last < self.every:
            self._left_out += 1
            return
        _log.error(
            "taskq.leader-loop-failing",
            loop=self.loop_name,
            streak=self.streak,
            repeated=self._left_out,
            hint=self.hint,
            exc_info=exc,
        )
        self._last, self._left_out = now, 0

    def succeeded(self) -> None:
        """A whole iteration did its work: the streak is over (said, if it was failing)."""
        if self.streak >= self.max_consecutive:
            _log.info("taskq.leader-loop-recovered", loop=self.loop_name, after=self.streak)
        self.streak = 0


class RepeatedWarning:
    """A transient error a loop meets each turn, logged once, then at most once per
    ``every`` seconds while it keeps coming (an outage), saying how many turns it left
    out (``repeated``): a dispatch loop polling each second wrote 3,600 lines an hour.
    :meth:`ok` ends the run, so the next error is logged at once."""

    def __init__(self, event: str, every: float = 30.0, **fields: str) -> None:
        self.event = event
        self.every = every
        self._fields = fields
        """Logged with every line (which loop)."""
        self._last: float | None = None
        self._left_out = 0

    def failed(self, exc: BaseException) -> None:
        """Log ``exc`` unless one was logged within ``every`` seconds."""
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every:
            self._left_out += 1
            return
        _log.warning(self.event, error=repr(exc), repeated=self._left_out, **self._fields)
        self._last, self._left_out = now, 0

    def ok(self) -> None:
        """The loop's turn went through: the run of errors, if any, is over (said, with
        the errors left out since the last line)."""
        if self._last is not None:
            _log.info(
                "taskq.transient-errors-over",
                of=self.event,
                repeated=self._left_out,
                **self._fields,
            )
        self._last, self._left_out = None, 0
