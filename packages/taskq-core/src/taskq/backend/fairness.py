"""Round robin's turns: which fairness cohorts a dispatcher served, and how long ago.

A job's rank in a round-robin dispatch is its position in its cohort plus the
cohort's running jobs; among the cohorts of one rank (most of them when jobs are
short) the one this dispatcher served longest ago goes first. Without the turns
every dispatch started afresh and the cohort with the oldest jobs won each tie:
one slot at a time, the third of three tenants waited until the first had drained.

Each dispatcher (a backend instance: one per worker process) keeps its own turns:
nothing is written or locked per dispatch (a shared table cost a third of a
round-robin dispatch, and its rows serialised the workers). Each worker rotates
through the cohorts, so none is starved by any of them.

The cohorts are those the ranks count: a fairness key (across the round-robin
queues of the call), the jobs without one, and, in a call that also asks for
strict-FIFO queues, those queues' jobs together (:data:`STRICT`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable
from enum import Enum
from typing import Final, TypeAlias

from taskq.models import JobRow

__all__ = ["STRICT", "Cohort", "CohortTurns", "cohort_of"]


class _Strict(Enum):
    STRICT = "strict"


STRICT: Final = _Strict.STRICT
"""The cohort of the strict-FIFO queues' jobs in a call that asks for round-robin ones too."""

Cohort: TypeAlias = str | None | _Strict
"""A fairness key, ``None`` (the jobs without one) or :data:`STRICT`."""

_REMEMBERED: Final = 10_000
"""Cohorts remembered; the one served longest ago is forgotten first, and a forgotten
cohort goes first, as it would anyway."""


def cohort_of(job: JobRow, round_robin_queues: Container[str]) -> Cohort:
    """The cohort ``job`` is ranked in."""
    return job.fairness_key if job.queue in round_robin_queues else STRICT


class CohortTurns:
    """The cohorts one dispatcher served, the most recent last."""

    def __init__(self) -> None:
        self._served: OrderedDict[Cohort, None] = OrderedDict()

    def served(self, cohorts: Iterable[Cohort]) -> None:
        """Record a dispatch's cohorts, in the order it took their jobs."""
        for cohort in cohorts:
            self._served.pop(cohort, None)
            self._served[cohort] = None
        while len(self._served) > _REMEMBERED:
            self._served.popitem(last=False)

    def turns(self) -> dict[Cohort, int]:
        """Each remembered cohort's turn: 1 for the one served longest ago, up to the
        most recent; a cohort absent here (never served) has turn 0 and goes first."""
        return {cohort: n for n, cohort in enumerate(self._served, 1)}
