-- TaskQ initial schema.
--
-- {schema} is replaced by the validated schema name; the runner creates the
-- schema and its own bookkeeping table ({schema}.schema_migrations) first.
-- Every timestamp default is clock_timestamp(): the database clock is the
-- arbiter of every time predicate (architecture.md, Clock Domains).

-- Mirrors taskq.backend.statemachine.JobStatus; a meta-test keeps them equal.
CREATE TYPE {schema}.job_status AS ENUM (
    'pending',
    'scheduled',
    'running',
    'succeeded',
    'failed',
    'cancelled',
    'crashed',
    'abandoned'
);

-- Keeps updated_at honest without every writer having to remember it.
CREATE FUNCTION {schema}.touch_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := clock_timestamp();
    RETURN NEW;
END
$$;

-- ------------------------------------------------------------------ jobs
-- The hot table: the current snapshot of every job that has not been pruned.
CREATE TABLE {schema}.jobs (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    actor text NOT NULL,
    queue text NOT NULL DEFAULT 'default',
    status {schema}.job_status NOT NULL DEFAULT 'pending',
    priority integer NOT NULL DEFAULT 0,  -- higher dispatches first
    payload jsonb NOT NULL DEFAULT '{}',
    scheduled_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- created_at never changes; enqueued_at moves when an admin retry re-queues the job.
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    attempt integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts integer NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    -- No FK to workers(id): an FK would take FOR KEY SHARE on the worker row in
    -- every dispatch UPDATE (SLRU contention). Liveness is workers.last_seen_at.
    locked_by_worker uuid,
    lock_expires_at timestamptz,
    -- started_at: dispatched (pending -> running). execution_started_at: the
    -- actor body began. Drain re-pends locked rows whose body never started
    -- (execution_started_at IS NULL) without spending an attempt.
    started_at timestamptz,
    execution_started_at timestamptz,
    finished_at timestamptz,
    cancel_requested_at timestamptz,
    cancel_reason text,
    -- 0 none, 1 cooperative, 2 forced. Phase 3 (ABANDON_PENDING) is in-process
    -- only and must never reach the table.
    cancel_phase smallint NOT NULL DEFAULT 0 CHECK (cancel_phase BETWEEN 0 AND 2),
    idempotency_key text,
    identity_key text,  -- at most one running job per (actor, identity_key)
    fairness_key text,  -- round_robin queues interleave by this key
    schedule_to_close_deadline timestamptz,
    result jsonb,
    result_ttl interval,
    result_expires_at timestamptz,
    progress_seq bigint NOT NULL DEFAULT 0,
    progress_state jsonb,
    error_class text,
    error_message text,
    error_traceback text,
    trace_id text,
    span_id text,
    metadata jsonb NOT NULL DEFAULT '{}',  -- metadata.batch_id tags batch children
    tags text[] NOT NULL DEFAULT '{}',
    timeout interval,  -- per attempt
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- A running job is always held by a worker lock; sweeps rely on it.
    CONSTRAINT jobs_running_is_locked CHECK (
        status <> 'running' OR (locked_by_worker IS NOT NULL AND lock_expires_at IS NOT NULL)
    )
);

-- jobs is the hottest table, and a plpgsql call per updated row costs throughput:
-- TaskQ's own statements set updated_at themselves, and the WHEN clause (evaluated
-- without calling the function) fires the trigger only for other writers.
CREATE TRIGGER jobs_touch_updated_at BEFORE UPDATE ON {schema}.jobs
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION {schema}.touch_updated_at();

-- Dispatch: both CTE variants scan pending rows per (queue, actor) in
-- priority DESC, scheduled_at, id order. The INCLUDE columns let the
-- candidates phase (identity dedup, round_robin fairness) read the index only.
CREATE INDEX jobs_dispatch_idx ON {schema}.jobs
    (queue, actor, priority DESC, scheduled_at, id)
    INCLUDE (identity_key, fairness_key)
    WHERE status = 'pending';

-- Sweep 1 (reclaim_expired_locks) by expiry; heartbeat and cancel polling by worker.
CREATE INDEX jobs_running_lock_expiry_idx ON {schema}.jobs (lock_expires_at)
    WHERE status = 'running';
CREATE INDEX jobs_running_worker_idx ON {schema}.jobs (locked_by_worker, id)
    WHERE status = 'running';

-- Identity gate and the per-actor running count of the dispatch CTE.
CREATE INDEX jobs_running_identity_idx ON {schema}.jobs (actor, identity_key)
    WHERE status = 'running';

-- Sweep 3 (scheduled -> pending).
CREATE INDEX jobs_scheduled_idx ON {schema}.jobs (scheduled_at)
    WHERE status = 'scheduled';

-- Idempotency holds over every row still in jobs, terminal ones included: a
-- repeated key returns the existing job (and its result) until the prune
-- sweep moves it to jobs_archive, after which the key may be reused. Limiting
-- it to non-terminal rows would re-run a job that already succeeded whenever
-- a client retried its enqueue late.
CREATE UNIQUE INDEX jobs_idempotency_key_uq ON {schema}.jobs (actor, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- max_pending backpressure at enqueue, count_pending_jobs, stranded-jobs detector.
CREATE INDEX jobs_waiting_actor_idx ON {schema}.jobs (actor, status)
    WHERE status IN ('pending', 'scheduled');

-- Sweep 2 (deadline_sweep: pending/scheduled -> failed).
CREATE INDEX jobs_deadline_idx ON {schema}.jobs (schedule_to_close_deadline)
    WHERE schedule_to_close_deadline IS NOT NULL AND status IN ('pending', 'scheduled');

-- sweep_expired_results.
CREATE INDEX jobs_result_expiry_idx ON {schema}.jobs (result_expires_at)
    WHERE result_expires_at IS NOT NULL;

-- Sweep 5 (prune) applies a retention period per terminal status.
CREATE INDEX jobs_terminal_finished_idx ON {schema}.jobs (status, finished_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned');

-- Batch completion counts the children of one batch.
CREATE INDEX jobs_batch_id_idx ON {schema}.jobs ((metadata ->> 'batch_id'))
    WHERE metadata ? 'batch_id';

-- ------------------------------------------------------------ attempts
-- One row per execution attempt. A surrogate key, because a snoozed
-- execution does not consume an attempt and may share its number.
CREATE TABLE {schema}.job_attempts (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    attempt integer NOT NULL,
    worker_id uuid,
    -- NULL only for an attempt recorded without a start (write_attempt takes what it is given).
    started_at timestamptz,
    finished_at timestamptz,
    duration_ms bigint CHECK (duration_ms >= 0),
    outcome text NOT NULL,
    error_class text,
    error_message text,
    error_traceback text
);

CREATE INDEX job_attempts_job_idx ON {schema}.job_attempts (job_id, attempt);

-- ------------------------------------------------------------ events
-- Immutable audit log (state changes, cancel requests, reclaims). id and
-- occurred_at are stamped by the same INSERT, which poll_reclaim_events'
-- visibility-delay watermark relies on.
CREATE TABLE {schema}.job_events (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    occurred_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind text NOT NULL,
    detail jsonb NOT NULL DEFAULT '{}'
);

CREATE INDEX job_events_job_idx ON {schema}.job_events (job_id, id);

-- ------------------------------------------------------------ archive
-- Sweep 5 moves pruned terminal jobs here; Sweep 6 deletes them at expire_at.
-- LIKE copies columns and NOT NULLs only: archived rows are terminal, so the
-- hot table's defaults, checks and indexes do not apply. A later migration
-- that adds a column to jobs must add it here too (the drift test checks).
CREATE TABLE {schema}.jobs_archive (
    LIKE {schema}.jobs,
    archived_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expire_at timestamptz NOT NULL,
    PRIMARY KEY (id)
);

CREATE INDEX jobs_archive_expire_idx ON {schema}.jobs_archive (expire_at);

-- expire_at lives on the parent only: attempts go with it by cascade.
CREATE TABLE {schema}.job_attempts_archive (
    LIKE {schema}.job_attempts,
    archived_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (id),
    FOREIGN KEY (job_id) REFERENCES {schema}.jobs_archive (id) ON DELETE CASCADE
);

CREATE INDEX job_attempts_archive_job_idx ON {schema}.job_attempts_archive (job_id, attempt);

-- ------------------------------------------------------------ configuration
-- Queues absent from this table dispatch as strict_fifo with no cap.
CREATE TABLE {schema}.queues (
    name text PRIMARY KEY,
    mode text NOT NULL DEFAULT 'strict_fifo' CHECK (mode IN ('strict_fifo', 'round_robin')),
    max_concurrent integer CHECK (max_concurrent >= 0)  -- NULL: no fleet-wide cap
);

-- Written by workers at start-up from the actor registry; NULL means no limit.
CREATE TABLE {schema}.actor_config (
    actor text PRIMARY KEY,
    max_concurrent integer CHECK (max_concurrent >= 0),
    max_pending integer CHECK (max_pending >= 0),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TRIGGER actor_config_touch_updated_at BEFORE UPDATE ON {schema}.actor_config
    FOR EACH ROW EXECUTE FUNCTION {schema}.touch_updated_at();

-- ------------------------------------------------------------ workers
CREATE TABLE {schema}.workers (
    id uuid PRIMARY KEY,
    hostname text NOT NULL,
    pid integer NOT NULL,
    queues text[] NOT NULL DEFAULT '{}',
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- cleanup_stale_workers.
CREATE INDEX workers_last_seen_idx ON {schema}.workers (last_seen_at);

-- Observability only: the advisory lock is the authority on who leads.
-- The CHECK on a boolean key allows exactly one row.
CREATE TABLE {schema}.maintenance_leader (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    worker_id uuid NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- ------------------------------------------------------------ schedules
CREATE TABLE {schema}.schedules (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name text NOT NULL UNIQUE,
    actor text NOT NULL,
    queue text,  -- NULL: the actor's own queue
    cron text NOT NULL,
    timezone text NOT NULL DEFAULT 'UTC',
    payload jsonb NOT NULL DEFAULT '{}',
    enabled boolean NOT NULL DEFAULT true,
    next_fire_at timestamptz,
    last_fired_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    options jsonb NOT NULL DEFAULT '{}'  -- enqueue options (priority, max_attempts, ...)
);

CREATE TRIGGER schedules_touch_updated_at BEFORE UPDATE ON {schema}.schedules
    FOR EACH ROW EXECUTE FUNCTION {schema}.touch_updated_at();

-- The cron loop's due check.
CREATE INDEX schedules_due_idx ON {schema}.schedules (next_fire_at) WHERE enabled;

-- ------------------------------------------------------------ batches
-- A row exists only for batches with a failure policy or a finalizer.
CREATE TABLE {schema}.batches (
    id uuid PRIMARY KEY,  -- equals metadata.batch_id on the child jobs
    queue text NOT NULL,
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'complete', 'aborted')),
    expected_size integer NOT NULL CHECK (expected_size >= 0),
    consecutive_failures integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    failure_threshold integer CHECK (failure_threshold >= 1),  -- NULL: no failure policy
    -- No FK: the finalizer may be pruned to the archive before the batch row.
    finalizer_job_id uuid,
    originating_actor text,  -- reserved, always NULL for now
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at timestamptz,
    metadata jsonb NOT NULL DEFAULT '{}',
    CONSTRAINT batches_completed_at_iff_done CHECK ((status = 'active') = (completed_at IS NULL))
);

-- complete_stale_batches scans active batches; prune_old_batches finished ones.
CREATE INDEX batches_active_idx ON {schema}.batches (created_at) WHERE status = 'active';
CREATE INDEX batches_completed_idx ON {schema}.batches (completed_at) WHERE status <> 'active';

-- ------------------------------------------------------------ rate limiting
-- Token bucket state per limiter key; the refill math reads clock_timestamp().
CREATE TABLE {schema}.rate_limit_buckets (
    name text PRIMARY KEY,
    tokens double precision NOT NULL,
    refilled_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Sliding-window log: one row per admitted acquisition.
CREATE TABLE {schema}.rate_limit_window_entries (
    id bigserial PRIMARY KEY,
    name text NOT NULL,
    cost integer NOT NULL DEFAULT 1 CHECK (cost >= 1),
    occurred_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX rate_limit_window_entries_name_idx
    ON {schema}.rate_limit_window_entries (name, occurred_at);

-- Concurrency reservations: slots are pre-allocated; a held slot names its
-- job, worker and lease all together, a free slot none of them.
CREATE TABLE {schema}.reservation_slots (
    name text NOT NULL,
    slot integer NOT NULL CHECK (slot >= 0),
    job_id uuid,
    worker_id uuid,
    lease_expires_at timestamptz,
    PRIMARY KEY (name, slot),
    CONSTRAINT reservation_slots_held_consistently
        CHECK (num_nulls(job_id, worker_id, lease_expires_at) IN (0, 3))
);

-- extend_reservation_leases (per worker) and Sweep 4 (leaked leases).
CREATE INDEX reservation_slots_worker_idx ON {schema}.reservation_slots (worker_id)
    WHERE worker_id IS NOT NULL;
CREATE INDEX reservation_slots_lease_idx ON {schema}.reservation_slots (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;
