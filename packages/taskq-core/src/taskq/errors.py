"""The TaskQ error tree.

Every error TaskQ raises derives from :class:`TaskQError`. The branches are
organised by *who should catch them*:

* :class:`ConfigurationError` — a mistake in the user's code or settings,
  found before any job runs (missing DI provider, scope violation, bad
  setting, unknown actor). Fix the code; retrying will not help.
* :class:`PluginError` — a plugin distribution failed to load, a hook of it
  failed, or its backend cannot be used (another protocol version, not a
  backend at all, a factory that raised).
* :class:`ContractViolation` — an internal invariant was broken at run time
  (a worker lost ownership of a job it was running, an invalid state
  transition was attempted). These indicate a bug or a race that TaskQ
  guards against; they are logged loudly.
* :class:`EnqueueError` — the producer's enqueue was refused (payload
  invalid, backpressure, singleton collision). The caller decides.
* :class:`BatchError` — batch-level outcomes surfaced to the caller.

Each class's docstring is its default message (procrastinate's style), so
``raise MissingProvider()`` still says something useful; pass a message to
be specific. Actor control-flow signals (``Snooze``, ``RetryAfter``) do NOT
live here: they derive from :class:`taskq.signals.TaskQSignal` so that a
user's ``except TaskQError`` never swallows them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskq.models import JobRow

__all__ = [
    "BatchAbortedError",
    "BatchError",
    "ConfigurationError",
    "ContractViolation",
    "EmptyBatchError",
    "EnqueueError",
    "EnqueueOptionsError",
    "IncompatiblePluginError",
    "InvalidIdentifierError",
    "InvalidTransition",
    "JobFailedError",
    "LeaseLost",
    "MaxPendingExceededError",
    "MissingProvider",
    "OutcomeNotRecorded",
    "PayloadValidationError",
    "PluginError",
    "PluginHookError",
    "PluginLoadError",
    "ProtocolKeywordMissing",
    "ProtocolVersionMismatch",
    "ResultExpiredError",
    "RetryRefusedError",
    "ScopeViolation",
    "SingletonCollisionError",
    "TaskQError",
    "UnknownActorError",
    "UnknownBackendError",
    "UnstorableValueError",
    "WorkerOwnershipMismatch",
]


class TaskQError(Exception):
    """A TaskQ error occurred."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or type(self).__name__).strip())


# ------------------------------------------------------------ configuration


class ConfigurationError(TaskQError):
    """TaskQ is misconfigured; fix the code or settings named in the message."""


class MissingProvider(ConfigurationError):
    """An actor or provider needs a dependency that no provider is registered for.

    Raised by ``ProviderRegistry.validate()`` at worker start-up, before any
    job runs. Register a provider for the type named in the message, or
    remove the parameter from the actor's signature.
    """


class ScopeViolation(ConfigurationError):
    """A provider with a wide scope depends on a provider with a narrower scope.

    A PROCESS-scoped singleton cannot hold a LOOP- or TRANSIENT-scoped value:
    the narrower value may not exist (or may already be torn down) while the
    wider one lives. Raised at validation; the message shows the full path.
    """


class UnknownActorError(ConfigurationError):
    """No actor with this name is registered with the TaskQ application.

    Pass the actor function itself, or register it with ``TaskQ(actors=[...])``.
    """


class UnknownBackendError(ConfigurationError, ValueError):
    """No installed backend handles this URL scheme.

    The message lists the installed schemes and the distribution that adds
    the missing one. Also a ``ValueError`` for callers that validate URLs.
    """


class InvalidIdentifierError(ConfigurationError, ValueError):
    """A schema or other SQL identifier TaskQ cannot use; the message says why and what
    to use instead. Also a ``ValueError``."""


# ------------------------------------------------------------ plugins


class PluginError(TaskQError):
    """A TaskQ plugin could not be used."""


class PluginLoadError(PluginError):
    """A plugin's entry point raised while it was being imported.

    Other plugins still load; this error is recorded and reported by name
    (``taskq plugins`` lists it) rather than silently skipped.
    """

    def __init__(self, name: str, distribution: str | None, cause: BaseException) -> None:
        self.name = name
        self.distribution = distribution
        self.cause = cause
        where = f" (from {distribution})" if distribution else ""
        super().__init__(
            f"plugin {name!r}{where} failed to load: {type(cause).__name__}: {cause}. "
            f"Reinstall or upgrade it, or disable it with TASKQ_DISABLE_PLUGINS={name}."
        )


class PluginHookError(PluginError):
    """A loaded plugin's hook raised, or answered what the hook does not take.

    What that answer would have added is left out; the plugin's other hooks,
    and every other plugin, still work. Recorded once per process beside the
    load failures (``plugin_failures()``; ``taskq plugins`` lists it and exits
    1) and logged in one line, not with a traceback on every command.
    ``problem`` says what the hook did (``raised RuntimeError: ...``,
    ``returned 5432, not a database URL (str) or None``, a URL scheme another
    distribution owns); ``hint`` what to do; ``cause`` is the exception it
    raised, if it raised.
    """

    def __init__(
        self,
        name: str,
        distribution: str | None,
        hook: str,
        problem: str,
        *,
        cause: BaseException | None = None,
        hint: str | None = None,
    ) -> None:
        self.name = name
        self.distribution = distribution
        self.hook = hook
        self.problem = problem
        self.cause = cause
        self.hint = hint or f"fix or upgrade it, or disable it with TASKQ_DISABLE_PLUGINS={name}"
        where = f" (from {distribution})" if distribution else ""
        super().__init__(f"plugin {name!r}{where}: its {hook} hook {problem}; {self.hint}.")


class IncompatiblePluginError(PluginError):
    """A plugin's backend cannot be used by this core: it implements another backend
    protocol version, lacks protocol members, or is no backend at all."""


class ProtocolVersionMismatch(IncompatiblePluginError):
    """A backend declares a BACKEND_PROTOCOL_VERSION that differs from core's.

    Raised at import time by each backend implementation and again when
    ``open_backend`` hands out a backend. Upgrade the backend distribution
    (or core) so both speak the same protocol version.
    """


class ProtocolKeywordMissing(IncompatiblePluginError):
    """A backend declares this core's protocol version but a method of it lacks a
    keyword-only parameter that version gave it (``batch_ends``, ``up_to`` and others,
    added to protocol 3 before its release), which core passes by name.

    Raised when the backend is handed out (``open_backend``) and again when a worker
    starts: met at the call, a ``TypeError`` in a worker's stop left its prefetched jobs
    locked until their leases ran out, and one in its leader's sweep stopped the sweep
    there. Upgrade the backend distribution, or give the methods named the keyword.
    """


# ------------------------------------------------------------ contract violations


class ContractViolation(TaskQError):
    """An internal TaskQ invariant was violated at run time."""


class InvalidTransition(ContractViolation):
    """A job status transition outside ``VALID_TRANSITIONS`` was attempted.

    Raised by ``assert_valid_transition``. The SQL ``WHERE status = ...``
    guards remain the authoritative gate; this is the application-level check.
    """


class WorkerOwnershipMismatch(ContractViolation):
    """A worker tried to finish a job it no longer owns.

    The job's lock expired and it was reclaimed (and possibly re-dispatched)
    while this worker was still running it. The terminal write was a no-op;
    the newer attempt's outcome stands.
    """


# ------------------------------------------------------------ enqueue


class EnqueueError(TaskQError):
    """A job could not be enqueued."""


class UnstorableValueError(TaskQError, ValueError):
    """A value no backend can store as JSON (a payload, a result, progress, metadata): a
    NaN or infinite number, text with a lone surrogate, an integer too long to read
    back, nesting too deep, or more than the size limit. The message says which and
    what to send instead. Nothing was written."""


class PayloadValidationError(EnqueueError, ValueError):
    """The payload does not match the actor's payload model.

    The message names each offending field. Nothing was enqueued.
    """


class EnqueueOptionsError(EnqueueError, ValueError):
    """An enqueue option is unknown, out of range or of the wrong type.

    The message names each offending option. Nothing was enqueued.
    """


class MaxPendingExceededError(EnqueueError):
    """The actor already has ``max_pending`` jobs waiting; the enqueue was refused.

    Backpressure: retry later, or raise the actor's ``max_pending``.
    """


class SingletonCollisionError(EnqueueError):
    """A job with the same identity is already active, so this one was refused.

    ``retry_after`` (seconds, advisory) hints when the active one's deadline
    passes; it is never stored or used as a predicate.
    """

    def __init__(self, message: str | None = None, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    @classmethod
    def in_one_call(cls, actor: str, identity_key: str | None) -> SingletonCollisionError:
        """A singleton after another item of one batch with its identity: that item's
        job is no active job anyone could wait for (nothing of the call was written)."""
        return cls(
            f"a singleton of actor {actor!r} follows another item of this call with "
            f"identity_key {identity_key!r}: the call would make two active jobs of one "
            f"identity (nothing was written); drop one, or enqueue the singleton once the "
            f"other job ends"
        )

    @classmethod
    def on_retry(
        cls, job_id: object, actor: str, identity_key: str | None, holder: object
    ) -> SingletonCollisionError:
        """The refusal of an operator's retry of singleton ``job_id`` whose identity the
        active job ``holder`` holds."""
        return cls(
            f"job {job_id} is a singleton of actor {actor!r} and identity {identity_key!r}, "
            f"which active job {holder} holds: retried now it would be a second one; "
            f"retry it once that job has ended"
        )


class RetryRefusedError(TaskQError):
    """An operator's retry of a finished job was refused: run again, it could only fail
    at once (its ``schedule_to_close`` deadline has passed), or its batch was aborted (the
    leader's sweep cancelled it again). Enqueue a new job instead."""

    @classmethod
    def past_deadline(cls, job_id: object, deadline: object) -> RetryRefusedError:
        """The refusal of a retry of ``job_id``, whose deadline passed at ``deadline``."""
        return cls(
            f"job {job_id} cannot run again: its schedule_to_close deadline passed at "
            f"{deadline}, so a retry would fail at once (DeadlineExceeded); enqueue a new "
            f"job instead"
        )

    @classmethod
    def in_aborted_batch(cls, job_id: object, batch_id: object) -> RetryRefusedError:
        """The refusal of a retry of ``job_id``, a child of the aborted batch ``batch_id``."""
        return cls(
            f"job {job_id} cannot run again: its batch {batch_id} was aborted (its finalizer "
            f"has run), and the leader cancels the waiting children of an aborted batch; "
            f"enqueue a new job instead"
        )


# ------------------------------------------------------------ results


class JobFailedError(TaskQError):
    """The job ended without succeeding (failed, cancelled, crashed or abandoned).

    Raised by ``JobsClient.wait_for_result``; ``row`` is the job's final state
    and ``row.error`` the recorded error, if any.
    """

    def __init__(self, row: JobRow) -> None:
        self.row = row
        detail = f": {row.error.error_class}: {row.error.message}" if row.error else ""
        super().__init__(f"job {row.id} ({row.actor}) ended {row.status.value}{detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from the row: by default the message went where the row goes, and an
        # error pickled (to another process) or copied raised AttributeError.
        return type(self), (self.row,), self.__dict__


class ResultExpiredError(TaskQError):
    """The job succeeded, but its result outlived ``result_ttl`` (its
    ``result_expires_at`` has passed on the backend's clock) and is gone, or about to
    be: raised by ``JobsClient.wait_for_result`` instead of a ``None`` the actor never
    returned. ``row`` is the job. Read results within their ``result_ttl``, or give
    the actor a longer one."""

    def __init__(self, row: JobRow) -> None:
        self.row = row
        expired = row.result_expires_at.isoformat() if row.result_expires_at else "?"
        super().__init__(
            f"job {row.id} ({row.actor}) succeeded, but its result expired at {expired} "
            f"(result_ttl); read it sooner, or give {row.actor!r} a longer result_ttl"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # As JobFailedError's: rebuilt from the row.
        return type(self), (self.row,), self.__dict__


class OutcomeNotRecorded(TaskQError):
    """A job's outcome could not be stored (a result, progress or sub-job the database
    refuses, a retry backoff that raised): the job ends ``failed`` with this error
    instead of running again and again. Make the value storable (finite JSON numbers,
    in-range integers), or fix the backoff."""


class LeaseLost(TaskQError):
    """With ``lease_fence`` on, the worker could not renew the job's lease (cut off from
    the database) and stopped the attempt before the lease could lapse, so that no
    other worker would run the job at the same time. Retried as any failure is; raise
    ``lock_lease`` for jobs that should ride out longer outages."""


# ------------------------------------------------------------ batches


class BatchError(TaskQError):
    """A batch operation failed."""


class BatchAbortedError(BatchError):
    """The batch was aborted after too many consecutive failures."""


class EmptyBatchError(BatchError):
    """The batch has no jobs (or fewer than the caller expected)."""
