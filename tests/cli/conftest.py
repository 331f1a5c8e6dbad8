"""Fixtures of the ``taskq`` command tests."""

from __future__ import annotations

import pytest

from taskq_testing.postgres import PgSchema
from tests.cli.cli_helpers import Cli


@pytest.fixture
def cli(pg_schema: PgSchema) -> Cli:
    """The ``taskq`` command on a freshly migrated schema of this test's own."""
    return Cli(pg_schema)
