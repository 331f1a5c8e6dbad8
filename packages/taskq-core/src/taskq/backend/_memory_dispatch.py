"""Which due jobs one in-memory dispatch takes, and in which order.

This is the in-memory twin of the Postgres dispatch CTE: the same ordering
(strict FIFO or round-robin by fairness key), the same caps (each actor's
and each queue's ``max_concurrent``) and the same identity serialization
(one running job per ``(actor, identity_key)``). The in-memory backend is
single-threaded, so a dispatch sees every running job and never over-counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from taskq.backend.fairness import Cohort, cohort_of
from taskq.backend.statemachine import JobStatus
from taskq.models import JobRow

__all__ = ["RunningLoad", "dispatch_order", "take_jobs"]


@dataclass
class RunningLoad:
    """What is already running, which the caps and identity serialization are checked against."""

    per_actor: Counter[str] = field(default_factory=Counter)
    per_queue: Counter[str] = field(default_factory=Counter)
    identities: set[tuple[str, str]] = field(default_factory=set)
    per_cohort: Counter[tuple[str, str | None]] = field(default_factory=Counter)
    """Running jobs per ``(queue, fairness_key)``, for round robin's ranks."""

    @classmethod
    def of(cls, jobs: Iterable[JobRow]) -> RunningLoad:
        load = cls()
        for job in jobs:
            if job.status is JobStatus.RUNNING:
                load.add(job)
        return load

    def actor_full(self, actor: str, caps: Mapping[str, int | None]) -> bool:
        """Whether ``actor`` runs as many jobs as its cap allows."""
        cap = caps.get(actor)
        return cap is not None and self.per_actor[actor] >= cap

    def identity_running(self, job: JobRow) -> bool:
        """Whether a job of ``job``'s actor and identity is running (so it must wait)."""
        return job.identity_key is not None and (job.actor, job.identity_key) in self.identities

    def add(self, job: JobRow) -> None:
        self.per_actor[job.actor] += 1
        self.per_queue[job.queue] += 1
        self.per_cohort[job.queue, job.fairness_key] += 1
        if job.identity_key is not None:
            self.identities.add((job.actor, job.identity_key))


def _priority_order(job: JobRow) -> tuple[int, datetime, UUID]:
    return (-job.priority, job.scheduled_at, job.id)


def dispatch_order(
    candidates: Iterable[JobRow],
    round_robin_queues: Container[str],
    load: RunningLoad | None = None,
    turns: Mapping[Cohort, int] | None = None,
) -> list[JobRow]:
    """Order due jobs for dispatch.

    Every job gets a *fairness rank*: its position within its cohort by
    ``priority DESC, scheduled_at, id``. Jobs of a ``round_robin`` queue form
    one cohort per ``fairness_key`` (no key is a cohort of its own); jobs of
    ``strict_fifo`` queues all form a single cohort. Sorting by ``(rank,
    priority DESC, scheduled_at, id)`` then gives plain priority/FIFO order
    when only strict queues are asked for, and interleaves the cohorts (first
    of each, then second of each, …) when round-robin queues are. A round-robin
    cohort's ranks start after its jobs already running there (``load``), and
    among the cohorts of one rank the one served longest ago goes first
    (``turns``, :mod:`taskq.backend.fairness`).
    """
    ranked: list[tuple[int, JobRow]] = []
    seen: Counter[Cohort] = Counter()
    for (queue, key), running in (load.per_cohort if load else {}).items():
        if queue in round_robin_queues:
            seen[key] += running
    for job in sorted(candidates, key=_priority_order):
        cohort = cohort_of(job, round_robin_queues)
        seen[cohort] += 1
        ranked.append((seen[cohort], job))
    served = turns or {}
    ranked.sort(
        key=lambda item: (
            item[0],
            served.get(cohort_of(item[1], round_robin_queues), 0),
            *_priority_order(item[1]),
        )
    )
    return [job for _, job in ranked]


def take_jobs(
    ordered: Iterable[JobRow],
    limit: int,
    load: RunningLoad,
    actor_caps: Mapping[str, int | None],
    queue_caps: Mapping[str, int | None],
) -> list[JobRow]:
    """The first ``limit`` jobs of ``ordered`` that no cap or running identity blocks.

    ``load`` is updated as jobs are taken, so two jobs of one identity are
    never taken together and a cap counts the jobs taken in this batch.
    """
    taken: list[JobRow] = []
    for job in ordered:
        if len(taken) >= limit:
            break
        if load.actor_full(job.actor, actor_caps):
            continue
        queue_cap = queue_caps.get(job.queue)
        if queue_cap is not None and load.per_queue[job.queue] >= queue_cap:
            continue
        if job.identity_key is not None and (job.actor, job.identity_key) in load.identities:
            continue
        taken.append(job)
        load.add(job)
    return taken
