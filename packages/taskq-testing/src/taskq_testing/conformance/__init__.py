"""The backend conformance suite: the ``Backend`` contract as tests every backend runs.

Subclass :class:`BackendConformance` as ``class TestMyBackend(BackendConformance)``
and override its ``backend`` fixture (see the class docstring). The taskq pytest
plugin registers this package for assertion rewriting, so failures show values.
"""

from __future__ import annotations

from taskq_testing.conformance._suite import BackendConformance
from taskq_testing.conformance._support import AdvanceTime, covers

__all__ = ["AdvanceTime", "BackendConformance", "covers"]
