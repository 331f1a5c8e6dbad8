"""The SQL of one schema, rendered once and shared by every backend on that schema."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from taskq.identifiers import check_identifier
from taskq_postgres._sql import (
    batch,
    cancel,
    dispatch,
    enqueue,
    fleet,
    reads,
    render,
    schedules,
    sweeps,
)
from taskq_postgres._sql import terminal as term

__all__ = ["Statements", "statements_for"]


@dataclass(frozen=True)
class Statements:
    """Every statement the backend runs, with the schema filled in."""

    # enqueue
    enqueue: str
    enqueue_one: str
    enqueue_one_plain: str
    existing_by_key: str
    singleton_locks: str
    enqueue_conflicts: str
    mark_singletons: str
    copy_clock_now: str
    notify: str
    # dispatch, leases, dispatch settings
    queue_settings: str
    dispatch_plain_head: str
    dispatch_strict_fifo: str
    dispatch_round_robin: str
    heartbeat_jobs: str
    held_jobs: str
    extend_reservation_leases: str
    register_actors: str
    configure_queue: str
    # terminal writes and history writes
    mark_succeeded: str
    mark_succeeded_many: str
    mark_failed_or_retry: str
    mark_cancelled: str
    mark_abandoned: str
    mark_snoozed: str
    mark_snoozed_many: str
    mark_retry_after: str
    write_cancel_escalation: str
    record_progress: str
    retry_job: str
    retry_target: str
    write_attempt: str
    late_outcome: str
    # sweeps and the reclaim outbox
    scheduled_to_pending: str
    deadline_sweep: str
    reclaim_expired_locks: str
    poll_reclaim_events: str
    reclaim_visibility_risk: str
    expire_results: str
    # cancellation
    cancel_jobs: str
    poll_cancel_flags: str
    # reads
    get_job: str
    list_jobs: str
    count_pending_jobs: str
    count_active_jobs: str
    get_actor_max_pending: str
    get_actor_job_defaults: str
    get_actor_queues: str
    get_attempts: str
    get_events: str
    schema_is_migrated: str
    # batches
    create_batch: str
    insert_batch_row: str
    add_batch_failures: str
    reset_batch_failures: str
    abort_batch: str
    cancel_aborted_children: str
    cancel_aborted_leftovers: str
    complete_batch: str
    complete_stale_batches: str
    get_batch: str
    batch_replay_jobs: str
    count_batch_non_terminal: str
    batch_has_active_children: str
    list_batches: str
    prune_old_batches: str
    # schedules
    schedule_clock_now: str
    insert_schedule: str
    lock_schedule: str
    update_schedule: str
    list_schedules: str
    delete_schedule: str
    # fleet statistics and the worker registry
    queue_depths: str
    stranded_jobs: str
    register_worker: str
    touch_worker: str
    deregister_worker: str
    cleanup_stale_workers: str


@lru_cache(maxsize=32)
def statements_for(schema: str) -> Statements:
    """The statements of ``schema`` (validated again here, before any rendering)."""
    s = check_identifier(schema)
    return Statements(
        enqueue=render(enqueue.ENQUEUE, s),
        enqueue_one=render(enqueue.ENQUEUE_ONE, s),
        enqueue_one_plain=render(enqueue.ENQUEUE_ONE_PLAIN, s),
        existing_by_key=render(enqueue.EXISTING_BY_KEY, s),
        singleton_locks=render(enqueue.SINGLETON_LOCKS, s),
        enqueue_conflicts=render(enqueue.ENQUEUE_CONFLICTS, s),
        mark_singletons=render(enqueue.MARK_SINGLETONS, s),
        copy_clock_now=render(enqueue.CLOCK_NOW, s),
        notify=render(enqueue.NOTIFY, s),
        queue_settings=render(dispatch.QUEUE_SETTINGS, s),
        dispatch_plain_head=dispatch.DISPATCH_PLAIN_HEAD.render(s),
        dispatch_strict_fifo=dispatch.DISPATCH_STRICT_FIFO.render(s),
        dispatch_round_robin=dispatch.DISPATCH_ROUND_ROBIN.render(s),
        heartbeat_jobs=render(dispatch.HEARTBEAT_JOBS, s),
        held_jobs=render(dispatch.HELD_JOBS, s),
        extend_reservation_leases=render(dispatch.EXTEND_RESERVATION_LEASES, s),
        register_actors=render(dispatch.REGISTER_ACTORS, s),
        configure_queue=render(dispatch.CONFIGURE_QUEUE, s),
        mark_succeeded=term.MARK_SUCCEEDED.render(s),
        mark_succeeded_many=term.MARK_SUCCEEDED_MANY.render(s),
        mark_failed_or_retry=term.MARK_FAILED_OR_RETRY.render(s),
        mark_cancelled=term.MARK_CANCELLED.render(s),
        mark_abandoned=term.MARK_ABANDONED.render(s),
        mark_snoozed=term.MARK_SNOOZED.render(s),
        mark_snoozed_many=term.MARK_SNOOZED_MANY.render(s),
        mark_retry_after=term.MARK_RETRY_AFTER.render(s),
        write_cancel_escalation=render(term.WRITE_CANCEL_ESCALATION, s),
        record_progress=render(term.RECORD_PROGRESS, s),
        retry_job=render(term.RETRY_JOB, s),
        retry_target=render(term.RETRY_TARGET, s),
        write_attempt=render(term.WRITE_ATTEMPT, s),
        late_outcome=render(term.LATE_OUTCOME, s),
        scheduled_to_pending=sweeps.SCHEDULED_TO_PENDING.render(s),
        deadline_sweep=render(sweeps.DEADLINE_SWEEP, s),
        reclaim_expired_locks=sweeps.RECLAIM_EXPIRED_LOCKS.render(s),
        poll_reclaim_events=render(sweeps.POLL_RECLAIM_EVENTS, s),
        reclaim_visibility_risk=render(sweeps.RECLAIM_VISIBILITY_RISK, s),
        expire_results=render(sweeps.EXPIRE_RESULTS, s),
        cancel_jobs=render(cancel.CANCEL_JOBS, s),
        poll_cancel_flags=render(cancel.POLL_CANCEL_FLAGS, s),
        get_job=render(reads.GET_JOB, s),
        list_jobs=render(reads.LIST_JOBS, s),
        count_pending_jobs=render(reads.COUNT_PENDING_JOBS, s),
        count_active_jobs=render(reads.COUNT_ACTIVE_JOBS, s),
        get_actor_max_pending=render(reads.GET_ACTOR_MAX_PENDING, s),
        get_actor_job_defaults=render(reads.GET_ACTOR_JOB_DEFAULTS, s),
        get_actor_queues=render(reads.GET_ACTOR_QUEUES, s),
        get_attempts=render(reads.GET_ATTEMPTS, s),
        get_events=render(reads.GET_EVENTS, s),
        schema_is_migrated=render(reads.SCHEMA_IS_MIGRATED, s),
        create_batch=render(batch.CREATE_BATCH, s),
        insert_batch_row=render(batch.INSERT_BATCH_ROW, s),
        add_batch_failures=render(batch.ADD_BATCH_FAILURES, s),
        reset_batch_failures=render(batch.RESET_BATCH_FAILURES, s),
        abort_batch=render(batch.ABORT_BATCH, s),
        cancel_aborted_children=render(batch.CANCEL_ABORTED_CHILDREN, s),
        cancel_aborted_leftovers=render(batch.CANCEL_ABORTED_LEFTOVERS, s),
        complete_batch=render(batch.COMPLETE_BATCH, s),
        complete_stale_batches=render(batch.COMPLETE_STALE_BATCHES, s),
        get_batch=render(batch.GET_BATCH, s),
        batch_replay_jobs=render(batch.BATCH_REPLAY_JOBS, s),
        count_batch_non_terminal=render(batch.COUNT_BATCH_NON_TERMINAL, s),
        batch_has_active_children=render(batch.BATCH_HAS_ACTIVE_CHILDREN, s),
        list_batches=render(batch.LIST_BATCHES, s),
        prune_old_batches=render(batch.PRUNE_OLD_BATCHES, s),
        schedule_clock_now=render(schedules.CLOCK_NOW, s),
        insert_schedule=render(schedules.INSERT_SCHEDULE, s),
        lock_schedule=render(schedules.LOCK_SCHEDULE, s),
        update_schedule=render(schedules.UPDATE_SCHEDULE, s),
        list_schedules=render(schedules.LIST_SCHEDULES, s),
        delete_schedule=render(schedules.DELETE_SCHEDULE, s),
        queue_depths=render(fleet.QUEUE_DEPTHS, s),
        stranded_jobs=render(fleet.STRANDED_JOBS, s),
        register_worker=render(fleet.REGISTER_WORKER, s),
        touch_worker=render(fleet.TOUCH_WORKER, s),
        deregister_worker=render(fleet.DEREGISTER_WORKER, s),
        cleanup_stale_workers=render(fleet.CLEANUP_STALE_WORKERS, s),
    )
